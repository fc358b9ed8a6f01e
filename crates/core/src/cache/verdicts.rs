//! The load-time self-check's verdicts, kept across processes. The check
//! (`engine::calibrate`) decodes the same tokens alone and in batches and
//! compares every logit: seconds of compute at every load, and more beside
//! other work (4-8 s for a 135M model beside two busy processes). Its
//! verdict is a fact of this build on this CPU for one model and one
//! context shape, so a verdict that held is written to a small file and a
//! later load with the same key — a restarted isolated engine, the next
//! server process, a test suite's child processes — reuses it, with the
//! batch costs measured with it.
//!
//! The file is untrusted input like a session file: read whole (at most
//! [`MAX_BYTES`]), its magic, version and checksum checked, every count and
//! string bounded, and only verdicts that hold kept; anything else is an
//! error and the caller runs the check. It is written atomically, and what
//! it holds is at most [`MAX_ENTRIES`] verdicts, the least recently used
//! going first.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::speculation::cost::BatchCost;
use crate::speculation::invariance::InvarianceCheck;

const MAGIC: &[u8; 8] = b"LECHECKS";
const VERSION: u32 = 1;
/// The largest file read.
pub const MAX_BYTES: usize = 1 << 20;
/// Verdicts kept.
pub const MAX_ENTRIES: usize = 64;
/// Longest key and longest text in a verdict.
const MAX_KEY: usize = 4096;
const MAX_TEXT: usize = 4096;
/// Longest list in a verdict (batch sizes, cells, weight types, costs).
const MAX_LIST: usize = 4096;

/// One verdict: what it is for (`key`), what the check found, the batch
/// costs measured with it, and when it was last used (a counter).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    pub key: String,
    pub check: InvarianceCheck,
    pub costs: BatchCost,
    pub used: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdicts {
    entries: Vec<Verdict>,
}

impl Verdicts {
    /// Reads a file's bytes; `Err` says what is wrong with them.
    pub fn parse(bytes: &[u8]) -> Result<Verdicts, String> {
        if bytes.len() > MAX_BYTES {
            return Err(format!("larger than {MAX_BYTES} bytes"));
        }
        if bytes.len() < 20 || &bytes[..8] != MAGIC {
            return Err("not a file of self-check verdicts".into());
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(format!("version {version}, not {VERSION}"));
        }
        let sum = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let body = &bytes[20..];
        if xxh3_64(body) != sum {
            return Err("its checksum does not match".into());
        }
        let entries: Vec<Verdict> = serde_json::from_slice(body).map_err(|e| format!("unreadable: {e}"))?;
        if entries.len() > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} verdicts"));
        }
        for (i, v) in entries.iter().enumerate() {
            check_verdict(v).map_err(|why| format!("verdict {i}: {why}"))?;
        }
        Ok(Verdicts { entries })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let body = serde_json::to_vec(&self.entries).expect("verdicts serialise");
        let mut out = Vec::with_capacity(20 + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Verdict> {
        self.entries.iter().find(|v| v.key == key)
    }

    /// Keeps a verdict that holds (replacing one with its key), the least
    /// recently used going first past [`MAX_ENTRIES`]. Others are not kept.
    pub fn put(&mut self, key: &str, check: &InvarianceCheck, costs: &BatchCost) {
        let used = self.entries.iter().map(|v| v.used).max().unwrap_or(0).saturating_add(1);
        let v = Verdict {
            key: key.to_owned(),
            check: InvarianceCheck { reused: false, kept_in: None, ..check.clone() },
            costs: costs.clone(),
            used,
        };
        if check_verdict(&v).is_err() {
            return;
        }
        self.entries.retain(|e| e.key != key);
        self.entries.push(v);
        while self.entries.len() > MAX_ENTRIES {
            let oldest = self.entries.iter().enumerate().min_by_key(|(_, v)| v.used).map(|(i, _)| i).expect("not empty");
            self.entries.remove(oldest);
        }
    }
}

/// A verdict worth reusing: one that holds, every list and text bounded,
/// every cost a positive finite number.
fn check_verdict(v: &Verdict) -> Result<(), String> {
    let c = &v.check;
    if v.key.is_empty() || v.key.len() > MAX_KEY {
        return Err("its key is empty or too long".into());
    }
    if !c.holds() {
        return Err("it does not hold".into());
    }
    let texts = [&c.kernels].into_iter().chain(&c.matmul_types).chain(&c.matmul_elsewhere);
    if texts.into_iter().any(|t| t.len() > MAX_TEXT) {
        return Err("a text is too long".into());
    }
    if [c.sizes.len(), c.attention_cells.len(), c.matmul_types.len(), c.matmul_elsewhere.len()].iter().any(|&n| n > MAX_LIST) {
        return Err("a list is too long".into());
    }
    if !c.ms.is_finite() || c.ms < 0.0 {
        return Err("its time is not a duration".into());
    }
    if !v.costs.is_sane(MAX_LIST) {
        return Err("its batch costs are not positive finite numbers".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> (InvarianceCheck, BatchCost) {
        let mut check = InvarianceCheck::default();
        for n in [2, 4, 8] {
            check.passed(n);
        }
        check.kernels = "tinyBLAS".into();
        check.ms = 1234.5;
        let mut costs = BatchCost::new(16);
        costs.observe(1, 13.4);
        costs.observe(8, 63.4);
        (check, costs)
    }

    #[test]
    fn round_trip_keeps_what_held() {
        let (check, costs) = held();
        let mut v = Verdicts::default();
        v.put("model|1024|2", &check, &costs);
        let back = Verdicts::parse(&v.to_bytes()).unwrap();
        assert_eq!(back, v);
        let got = back.get("model|1024|2").unwrap();
        assert_eq!(got.check, check);
        assert_eq!(got.costs.estimate(8), costs.estimate(8));
        assert!(back.get("model|2048|2").is_none());
    }

    #[test]
    fn a_verdict_that_failed_is_not_kept() {
        let (mut check, costs) = held();
        check.fail("a decode failed");
        let mut v = Verdicts::default();
        v.put("k", &check, &costs);
        assert!(v.is_empty());
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let (check, costs) = held();
        let mut v = Verdicts::default();
        for i in 0..MAX_ENTRIES + 5 {
            v.put(&format!("k{i}"), &check, &costs);
        }
        assert_eq!(v.len(), MAX_ENTRIES);
        assert!(v.get("k0").is_none() && v.get("k4").is_none());
        assert!(v.get("k5").is_some() && v.get(&format!("k{}", MAX_ENTRIES + 4)).is_some());
    }

    #[test]
    fn damaged_files_are_refused() {
        let (check, costs) = held();
        let mut v = Verdicts::default();
        v.put("k", &check, &costs);
        let good = v.to_bytes();
        // Every cut.
        for n in 0..good.len() {
            assert!(Verdicts::parse(&good[..n]).is_err(), "cut at {n}");
        }
        // Every single bit flipped.
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[i] ^= 1 << bit;
                assert!(Verdicts::parse(&b).is_err(), "bit {bit} of byte {i}");
            }
        }
        // Bodies with a right checksum that say what a verdict cannot.
        let forge = |body: &str| {
            let mut out = MAGIC.to_vec();
            out.extend_from_slice(&VERSION.to_le_bytes());
            out.extend_from_slice(&xxh3_64(body.as_bytes()).to_le_bytes());
            out.extend_from_slice(body.as_bytes());
            out
        };
        let entry = serde_json::to_value(&v.entries[0]).unwrap();
        let mut failed = entry.clone();
        failed["check"]["failure"] = "x".into();
        let mut no_sizes = entry.clone();
        no_sizes["check"]["sizes"] = serde_json::json!([]);
        let mut bad_cost = entry.clone();
        bad_cost["costs"]["t1"] = serde_json::json!(-1.0);
        let mut long = entry.clone();
        long["check"]["kernels"] = "x".repeat(MAX_TEXT + 1).into();
        let many = serde_json::Value::Array(vec![entry.clone(); MAX_ENTRIES + 1]);
        for body in [
            serde_json::json!([failed]).to_string(),
            serde_json::json!([no_sizes]).to_string(),
            serde_json::json!([bad_cost]).to_string(),
            serde_json::json!([long]).to_string(),
            many.to_string(),
            "{}".into(),
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".into(),
        ] {
            assert!(Verdicts::parse(&forge(&body)).is_err(), "{body:.80}");
        }
        assert!(Verdicts::parse(&forge(&serde_json::json!([entry]).to_string())).is_ok());
        let mut other = good.clone();
        other[8] = 2;
        assert!(Verdicts::parse(&other).unwrap_err().contains("version"));
        assert!(Verdicts::parse(&vec![0u8; MAX_BYTES + 1]).is_err());
    }
}
