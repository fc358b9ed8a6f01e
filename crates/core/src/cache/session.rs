//! Session files: a conversation's (or a prompt's) KV cells on disk, with
//! what makes loading them safe.
//!
//! ```text
//! 8 bytes   "LLESESS\x1a"
//! u32       format version (1)
//! u32       header length, then the header: JSON (engine, model identity,
//!           KV settings, back end, whether restoring is exact, the conversation)
//! u32       token count n, then n × i32 tokens
//! cells     (state::Cells::write_to)
//! 16 bytes  xxh3-128 of everything before
//! ```
//!
//! Everything is checked before llama.cpp sees a byte: the magic, the
//! version, the checksum (a truncated or altered file), the model's
//! fingerprint and the KV settings (a file of another model or engine), the
//! tokens (in the vocabulary, within the context) and the cells' structure
//! (`state::Cells::check`).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use super::positions::{Positions, Span};
use super::state::Cells;

pub const MAGIC: &[u8; 8] = b"LLESESS\x1a";
pub const VERSION: u32 = 1;
const MAX_HEADER: usize = 64 << 20;
const CHECKSUM: usize = 16;

/// The model a session was saved with.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ModelId {
    /// The GGUF's file name (for messages).
    pub file: String,
    /// `fingerprint` of the GGUF.
    pub fingerprint: String,
    pub n_vocab: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// "llama-engine <version>".
    pub engine: String,
    pub model: ModelId,
    /// The KV cache settings the cells depend on (type, attention kernel).
    pub kv: String,
    /// The back end that computed the cells (`status().cpuBackend` or the
    /// GPU): restored elsewhere they are valid, but not bit-identical to
    /// what that back end would compute.
    pub backend: String,
    /// Whether restoring gives the cells computing the tokens gives (true
    /// for every state this version writes; a reader may see false from a
    /// future writer that cannot promise it).
    pub exact: bool,
    /// A sliding-window model's state longer than its window: it can only
    /// be continued from its last token.
    #[serde(default)]
    pub windowed: bool,
    /// The media chunks that take fewer positions than tokens (M-RoPE
    /// images): where the cells after them sit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media_positions: Vec<Span>,
    /// `{ messages }` or `{ prompt }`, as given to `saveSession`.
    pub conversation: Value,
}

pub struct Session {
    pub header: Header,
    pub tokens: Vec<i32>,
    pub cells: Cells,
}

/// What a session must match to be loaded by this engine.
pub struct Expect<'a> {
    pub model: &'a ModelId,
    pub kv: &'a str,
    pub n_ctx: usize,
}

impl Session {
    /// Where its cells sit (checked when it was read).
    pub fn positions(&self) -> Positions {
        Positions::new(self.header.media_positions.iter().copied()).unwrap_or_default()
    }

    pub fn encode(&self) -> Vec<u8> {
        let header = serde_json::to_vec(&self.header).expect("a header serialises");
        let mut out = Vec::with_capacity(40 + header.len() + 4 * self.tokens.len() + self.cells.len() + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        self.cells.write_to(&mut out);
        let sum = xxh3_128(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Reads and checks a session file's bytes. The error says what is
    /// wrong, in words for the person who picked the file.
    pub fn decode(bytes: &[u8], expect: &Expect<'_>) -> Result<Session, String> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err("not a llama-engine session file".into());
        }
        let version = bytes.get(8..12).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        match version {
            Some(VERSION) => {}
            Some(v) => return Err(format!("session format version {v}; this llama-engine reads version {VERSION}")),
            None => return Err("truncated (no format version)".into()),
        }
        if bytes.len() < 12 + 4 + 4 + CHECKSUM {
            return Err("truncated".into());
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM);
        if xxh3_128(body).to_le_bytes() != sum {
            return Err("truncated or corrupted (its checksum does not match)".into());
        }
        let mut at = 12;
        let mut take = |n: usize| -> Result<&[u8], String> {
            let end = at + n;
            if end > body.len() {
                return Err("malformed (a length past its end)".into());
            }
            let out = &body[at..end];
            at = end;
            Ok(out)
        };
        let header_len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        if header_len > MAX_HEADER {
            return Err("malformed (a header of more than 64 MiB)".into());
        }
        let header: Header = serde_json::from_slice(take(header_len)?).map_err(|e| format!("malformed header ({e})"))?;
        if header.model.fingerprint != expect.model.fingerprint || header.model.n_vocab != expect.model.n_vocab {
            return Err(format!(
                "saved with another model ({}, fingerprint {}); this engine runs {} (fingerprint {})",
                header.model.file, header.model.fingerprint, expect.model.file, expect.model.fingerprint
            ));
        }
        if header.kv != expect.kv {
            return Err(format!("saved with other KV cache settings ({}); this engine uses {}", header.kv, expect.kv));
        }
        let n = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        if n == 0 {
            return Err("holds no tokens".into());
        }
        if n >= expect.n_ctx {
            return Err(format!("holds {n} tokens; this engine's context holds {} per slot", expect.n_ctx));
        }
        let tokens: Vec<i32> = take(4 * n)?.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        // (Media chunks stand as their content's ids: `request::media`.)
        if let Some(t) = tokens.iter().find(|&&t| !(0..expect.model.n_vocab).contains(&t) && !crate::request::media::is_media_token(t)) {
            return Err(format!("malformed (token {t} is not in the vocabulary)"));
        }
        let rest = &body[at..];
        let (cells, used) = Cells::read_from(rest).map_err(|e| format!("malformed KV cells ({e})"))?;
        if used != rest.len() {
            return Err("malformed (bytes after the KV cells)".into());
        }
        let positions = Positions::new(header.media_positions.iter().copied()).map_err(|e| format!("malformed header ({e})"))?;
        for s in positions.spans() {
            let run = tokens.get(s.start..s.end()).ok_or("malformed header (a media chunk past its tokens)")?;
            if !crate::request::media::is_media_token(run[0]) || run.iter().any(|&t| t != run[0]) {
                return Err(format!("malformed header (tokens {}..{} are not one media chunk)", s.start, s.end()));
            }
        }
        let layout = cells.check(n, &positions).map_err(|e| format!("malformed KV cells ({e})"))?;
        if layout.windowed != header.windowed {
            return Err("malformed (its header and its cells disagree on a sliding window)".into());
        }
        Ok(Session { header, tokens, cells })
    }
}

/// A GGUF's identity: xxh3-128 of its size, its first MiB (the header:
/// architecture, hyperparameters, tokenizer, tensor table) and 64 KiB at
/// 32 places through the weights. Reads about 3 MiB whatever the model's size.
pub fn fingerprint(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let mut h = Xxh3::new();
    h.update(&size.to_le_bytes());
    let mut buf = vec![0u8; 1 << 20];
    let n = read_up_to(&mut f, &mut buf)?;
    h.update(&buf[..n]);
    let chunk = 64 << 10;
    for i in 1..=32u64 {
        let at = size.saturating_sub(chunk as u64) * i / 32;
        f.seek(SeekFrom::Start(at))?;
        let n = read_up_to(&mut f, &mut buf[..chunk])?;
        h.update(&buf[..n]);
    }
    Ok(format!("{:032x}", h.digest128()))
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::state::tests::fake_blob;
    use serde_json::json;

    fn model() -> ModelId {
        ModelId { file: "m.gguf".into(), fingerprint: "ab".repeat(16), n_vocab: 1000 }
    }

    fn session(n: u32) -> Session {
        Session {
            header: Header {
                engine: "llama-engine 0.1.0".into(),
                model: model(),
                kv: "f16".into(),
                backend: "cpu".into(),
                exact: true,
                windowed: false,
                media_positions: Vec::new(),
                conversation: json!({ "messages": [{ "role": "user", "content": "hi" }] }),
            },
            tokens: (0..n as i32).collect(),
            cells: Cells::from_blob(&fake_blob(n, 1, 2, None)).unwrap(),
        }
    }

    fn expect(m: &ModelId) -> Expect<'_> {
        Expect { model: m, kv: "f16", n_ctx: 64 }
    }

    #[test]
    fn a_session_reads_back() {
        let s = session(6);
        let m = model();
        let back = Session::decode(&s.encode(), &expect(&m)).unwrap();
        assert_eq!((back.header, back.tokens, back.cells), (s.header, s.tokens, s.cells));
    }

    #[test]
    fn wrong_files_are_refused_with_what_is_wrong() {
        let m = model();
        let bytes = session(6).encode();
        let err = |b: &[u8]| Session::decode(b, &expect(&m)).err().expect("refused");
        assert_eq!(err(b"hello world, not a session"), "not a llama-engine session file");
        assert!(err(&bytes[..bytes.len() - 1]).contains("checksum"));
        assert!(err(&bytes[..10]).contains("truncated"));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(err(&v2).contains("version 2"));
        let mut flipped = bytes.clone();
        flipped[bytes.len() / 2] ^= 4;
        assert!(err(&flipped).contains("checksum"));
        let other = ModelId { fingerprint: "cd".repeat(16), ..model() };
        assert!(Session::decode(&bytes, &expect(&other)).err().unwrap().contains("another model"));
        assert!(Session::decode(&bytes, &Expect { model: &m, kv: "q8_0", n_ctx: 64 }).err().unwrap().contains("KV cache settings"));
        assert!(Session::decode(&bytes, &Expect { model: &m, kv: "f16", n_ctx: 6 }).err().unwrap().contains("context"));
    }

    #[test]
    fn a_well_formed_file_with_bad_contents_is_refused_after_its_checksum() {
        let m = model();
        // Tokens that do not match the cells, re-checksummed.
        let mut s = session(6);
        s.tokens.push(7);
        assert!(Session::decode(&s.encode(), &expect(&m)).err().unwrap().contains("KV cells"));
        let mut s = session(6);
        s.tokens[0] = 5000;
        assert!(Session::decode(&s.encode(), &expect(&m)).err().unwrap().contains("vocabulary"));
    }

    #[test]
    fn media_positions_are_checked_against_tokens_and_cells() {
        let m = model();
        // Tokens 0..6 whose cells are at 0..6: a header claiming an M-RoPE
        // image in them is refused (its tokens are not a media chunk; cells
        // not where it says).
        let mut s = session(6);
        s.header.media_positions = vec![Span { start: 1, n_tokens: 3, n_pos: 1 }];
        assert!(Session::decode(&s.encode(), &expect(&m)).err().unwrap().contains("not one media chunk"));
        let id = crate::request::media::media_token_id("00000abc");
        s.tokens[1..4].fill(id);
        assert!(Session::decode(&s.encode(), &expect(&m)).err().unwrap().contains("out of place"));
        s.header.media_positions = vec![Span { start: 4, n_tokens: 3, n_pos: 1 }];
        assert!(Session::decode(&s.encode(), &expect(&m)).err().unwrap().contains("past its tokens"));
        s.header.media_positions = vec![Span { start: 1, n_tokens: 3, n_pos: 3 }];
        let back = Session::decode(&s.encode(), &expect(&m)).unwrap();
        assert!(back.positions().is_identity());
    }

    #[test]
    fn mutated_files_never_panic() {
        let m = model();
        let bytes = session(5).encode();
        let mut rng = 7u64;
        for round in 0..3000 {
            let mut b = bytes.clone();
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            match round % 3 {
                0 => b.truncate((rng >> 33) as usize % b.len()),
                1 => {
                    let at = (rng >> 33) as usize % b.len();
                    b[at] ^= 1 << (rng % 8);
                }
                _ => {
                    // Re-checksummed garbage in the body.
                    let at = 12 + (rng >> 33) as usize % (b.len() - 28);
                    b[at] = (rng >> 8) as u8;
                    let n = b.len() - 16;
                    let sum = xxh3_128(&b[..n]).to_le_bytes();
                    b[n..].copy_from_slice(&sum);
                }
            }
            let _ = Session::decode(&b, &expect(&m));
        }
    }

    #[test]
    fn fingerprints_tell_files_apart() {
        let dir = std::env::temp_dir().join(format!("llama-engine-fp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a");
        let b = dir.join("b");
        let mut data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&a, &data).unwrap();
        data[2_500_000 - (2_500_000 % (64 << 10))] ^= 1; // not necessarily sampled: flip inside a sampled chunk
        let at = ((3_000_000u64 - (64 << 10)) * 16 / 32) as usize;
        data[at + 5] ^= 1;
        std::fs::write(&b, &data).unwrap();
        assert_eq!(fingerprint(&a).unwrap(), fingerprint(&a).unwrap());
        assert_ne!(fingerprint(&a).unwrap(), fingerprint(&b).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
