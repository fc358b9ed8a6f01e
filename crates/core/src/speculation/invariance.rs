//! The verdict of the load-time self-check: are a position's logits
//! bit-identical whether it is decoded alone or inside a batch of several
//! rows? Exact greedy speculation rests on it (a verification batch must
//! score each drafted position exactly as plain decoding would), and so does
//! reusing a KV cache written by batches of another size.
//!
//! The engine decodes a run of tokens one at a time, as plain decoding does,
//! then the same tokens as batches of several sizes, and compares every row
//! (`engine::calibrate`); this module compares what came out and says what
//! it found. It is a sample, not a proof: a kernel whose rounding differs
//! only for some values can pass it, which is why the test suite also
//! compares speculative and plain decoding on real prompts.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Batch sizes the self-check decodes, in order. 2 is where llamafile,
/// repacked and AMX kernels take over from `vec_dot`; 8 where the tiled
/// K-quant path does; 16 and 33 are its narrow and wide paths (16 rows is
/// its micro-tile; 33 leaves a ragged tail). Sizes that do not fit the
/// context or the batch size are skipped: the engine never decodes them.
pub const CHECK_SIZES: [usize; 5] = [2, 4, 8, 16, 33];

/// Index and values of the first logit whose bits differ (so `0.0` and
/// `-0.0` differ, and a NaN equals only the same NaN), or of the first index
/// past the shorter slice when the lengths differ.
pub fn first_difference(alone: &[f32], batched: &[f32]) -> Option<(usize, f32, f32)> {
    if let Some(i) = alone.iter().zip(batched).position(|(a, b)| a.to_bits() != b.to_bits()) {
        return Some((i, alone[i], batched[i]));
    }
    let n = alone.len().min(batched.len());
    (alone.len() != batched.len()).then(|| (n, alone.get(n).copied().unwrap_or(f32::NAN), batched.get(n).copied().unwrap_or(f32::NAN)))
}

/// Where a batched row first differed from the same row decoded alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    pub batch: usize,
    pub row: usize,
    pub token: usize,
    pub alone: f32,
    pub batched: f32,
}

/// What the self-check did and found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InvarianceCheck {
    /// Batch sizes compared so far, all identical.
    pub sizes: Vec<usize>,
    pub mismatch: Option<Mismatch>,
    /// Why the check could not finish (a decode failed); not invariant then.
    pub failure: Option<String>,
    /// Whether two sequences sharing a batch (each in its own KV stream)
    /// were also compared, and were identical.
    pub mixed: bool,
    /// Cache lengths (cells) over which the attention kernel gave each row
    /// the same bits alone, in batches and with other thread counts.
    pub attention_cells: Vec<usize>,
    /// Where the attention kernel did not.
    pub attention_mismatch: Option<String>,
    /// Weight types whose mat-mul kernels gave each row the same bits alone,
    /// in batches and with other thread counts.
    pub matmul_types: Vec<String>,
    /// Where a mat-mul kernel of a type the models hold did not.
    pub matmul_mismatch: Option<String>,
    /// Where one of a type they do not hold did not (said, not a failure).
    pub matmul_elsewhere: Vec<String>,
    /// The fast kernels on (named by the back end), said with the verdict.
    pub kernels: String,
    /// Time the whole calibration took (ms), batch costs included.
    pub ms: f64,
    /// The verdict of an earlier load of the same model with the same
    /// settings (a check that held is not run again): in this process, or
    /// kept in the file `kept_in` names (`cache::verdicts`).
    #[serde(default, skip_serializing)]
    pub reused: bool,
    #[serde(default, skip_serializing)]
    pub kept_in: Option<String>,
}

impl InvarianceCheck {
    /// Records the comparison of one row; returns false once a difference is found.
    pub fn compare(&mut self, batch: usize, row: usize, alone: &[f32], batched: &[f32]) -> bool {
        if self.mismatch.is_some() {
            return false;
        }
        match first_difference(alone, batched) {
            Some((token, a, b)) => {
                self.mismatch = Some(Mismatch { batch, row, token, alone: a, batched: b });
                false
            }
            None => true,
        }
    }

    /// A batch size whose compared rows were all identical.
    pub fn passed(&mut self, batch: usize) {
        if self.mismatch.is_none() && !self.sizes.contains(&batch) {
            self.sizes.push(batch);
        }
    }

    /// Two sequences decoded in one batch gave the reference logits too.
    pub fn passed_mixed(&mut self) {
        if self.mismatch.is_none() {
            self.mixed = true;
        }
    }

    pub fn fail(&mut self, why: impl Into<String>) {
        self.failure.get_or_insert_with(|| why.into());
    }

    /// True when at least one multi-row batch was compared and nothing differed.
    pub fn holds(&self) -> bool {
        self.mismatch.is_none()
            && self.attention_mismatch.is_none()
            && self.matmul_mismatch.is_none()
            && self.failure.is_none()
            && !self.sizes.is_empty()
    }
}

impl fmt::Display for InvarianceCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sizes = self.sizes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ");
        if let Some(m) = &self.mismatch {
            write!(
                f,
                "row {} of a batch of {} differs from the same token decoded alone (logit of token {}: {:e} alone, {:e} in the batch)",
                m.row, m.batch, m.token, m.alone, m.batched
            )?;
            if !sizes.is_empty() {
                write!(f, "; identical in batches of {sizes}")?;
            }
            Ok(())
        } else if let Some(m) = &self.attention_mismatch {
            write!(f, "flash attention: {m}")
        } else if let Some(m) = &self.matmul_mismatch {
            write!(f, "mat-mul: {m}")?;
            if !self.kernels.is_empty() {
                write!(f, "; fast kernels on: {}", self.kernels)?;
            }
            Ok(())
        } else if let Some(why) = &self.failure {
            write!(f, "the check could not finish: {why}")
        } else if self.sizes.is_empty() {
            write!(f, "no batch of several rows fits this context and batch size; nothing was compared")
        } else {
            let mixed = if self.mixed { ", also beside another sequence" } else { "" };
            let cells = self.attention_cells.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" and ");
            let attention = if cells.is_empty() {
                String::new()
            } else {
                format!("; attention over {cells} cells identical alone, batched and on other thread counts")
            };
            let matmul = if self.matmul_types.is_empty() {
                String::new()
            } else {
                format!("; mat-mul of {} identical alone, batched and on other thread counts", self.matmul_types.join(", "))
            };
            let elsewhere = if self.matmul_elsewhere.is_empty() {
                String::new()
            } else {
                format!("; not invariant for weight types these models do not hold: {}", self.matmul_elsewhere.join("; "))
            };
            let kernels = if self.kernels.is_empty() { String::new() } else { format!("; fast kernels on: {}", self.kernels) };
            write!(
                f,
                "identical alone and in batches of {sizes}{mixed}{attention}{matmul}{elsewhere}{kernels} ({}calibration took {:.0} ms)",
                match (&self.kept_in, self.reused) {
                    (Some(file), _) =>
                        format!("checked at an earlier load of this model with these settings on this machine, kept in {file}, whose "),
                    (None, true) => "checked at an earlier load of this model with these settings in this process, whose ".to_string(),
                    (None, false) => String::new(),
                },
                self.ms
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_bits_not_values() {
        assert_eq!(first_difference(&[1.0, 2.0], &[1.0, 2.0]), None);
        assert_eq!(first_difference(&[0.0], &[-0.0]).map(|d| d.0), Some(0));
        let nan = f32::NAN;
        assert_eq!(first_difference(&[nan], &[nan]), None);
        assert_eq!(first_difference(&[nan], &[f32::from_bits(nan.to_bits() ^ 1)]).map(|d| d.0), Some(0));
        // One ulp apart: what a different summation order gives.
        let x = 0.7365f32;
        let y = f32::from_bits(x.to_bits() + 1);
        assert_eq!(first_difference(&[1.0, x, 3.0], &[1.0, y, 3.0]), Some((1, x, y)));
        assert_eq!(first_difference(&[1.0, 2.0], &[1.0]).map(|d| d.0), Some(1));
    }

    #[test]
    fn sizes_cover_the_kernel_thresholds() {
        assert!(CHECK_SIZES.windows(2).all(|w| w[0] < w[1]));
        assert!(CHECK_SIZES.contains(&2) && CHECK_SIZES.contains(&8) && CHECK_SIZES.iter().any(|&n| n > 16));
    }

    #[test]
    fn verdicts() {
        let mut c = InvarianceCheck::default();
        assert!(!c.holds(), "nothing compared is no claim");
        assert!(c.compare(2, 1, &[1.0, 2.0], &[1.0, 2.0]));
        c.passed(2);
        assert!(c.holds());
        assert_eq!(c.to_string(), "identical alone and in batches of 2 (calibration took 0 ms)");
        assert!(!c.compare(8, 7, &[1.0, 2.0], &[1.0, 2.5]));
        c.passed(8);
        assert!(!c.holds());
        assert_eq!(c.sizes, vec![2]);
        assert_eq!(c.mismatch, Some(Mismatch { batch: 8, row: 7, token: 1, alone: 2.0, batched: 2.5 }));
        assert!(c.to_string().starts_with("row 7 of a batch of 8 differs"), "{c}");
        let mut c = InvarianceCheck::default();
        c.passed(2);
        c.attention_cells = vec![600, 4200];
        assert!(c.to_string().contains("attention over 600 and 4200 cells identical"), "{c}");
        c.attention_mismatch = Some("row 3 of a batch of 9 over 4200 cells, 1 thread(s), differs from the row alone".into());
        assert!(!c.holds());
        assert!(c.to_string().starts_with("flash attention: row 3"), "{c}");
        let mut c = InvarianceCheck::default();
        c.passed(2);
        c.fail("llama_decode failed");
        assert!(!c.holds());
        assert!(c.to_string().contains("could not finish"));
    }
}
