//! The suffix indexes an engine shares between its slots: one per
//! namespace (an app keeps one per agent or project, so that one agent's
//! records do not vote in another's drafts), under one memory cap, and
//! their file.
//!
//! The cap counts the tokens of every namespace together; past it the
//! oldest output of the whole store is dropped first, whichever namespace
//! holds it, and a namespace left empty is forgotten.
//!
//! The file (little-endian) is written atomically and checked whole before
//! anything of it is used:
//!
//! ```text
//! magic "LESUFFIX" | version u32 | n_vocab u32 | vocabulary hash u64
//! namespaces u32 | (length u32, UTF-8 name) per namespace
//! outputs u32 | (namespace u32, length u32, tokens u32 × length) per output, oldest first
//! xxh3-64 of every byte before it
//! ```
//!
//! A file of another vocabulary, a newer version, a bad checksum, a token
//! outside the vocabulary, a name too long or not UTF-8, an output of no
//! tokens, trailing bytes or a truncation is refused with `INVALID_REQUEST`
//! (field "suffix cache") and the byte offset. Outputs beyond the cap (a
//! file saved by an engine with a larger one) are dropped oldest first, as
//! they would have been.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use super::index::{Match, SuffixIndex};
use crate::error::{EngineError, Result};
use crate::files::{write_atomically, WriteError};

const FIELD: &str = "suffix cache";
const MAGIC: &[u8; 8] = b"LESUFFIX";
const VERSION: u32 = 1;
/// Longest namespace name, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = 128;
/// No output in a file is longer, and no file has more outputs or
/// namespaces: the largest `suffixCacheTokens`.
pub const MAX_FILE_TOKENS: usize = 1 << 26;

/// Which vocabulary the token ids are of: a file is used only by an engine
/// whose model tokenizes the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabId {
    pub n_vocab: u32,
    /// A hash of every token's text (the engine's `vocab_hash`).
    pub hash: u64,
}

impl VocabId {
    /// The id of a vocabulary given every token's text, in id order.
    pub fn of<'a>(texts: impl IntoIterator<Item = &'a [u8]>) -> VocabId {
        let mut h = Xxh3::new();
        let mut n: u32 = 0;
        for text in texts {
            h.update(&(text.len() as u32).to_le_bytes());
            h.update(text);
            n += 1;
        }
        VocabId { n_vocab: n, hash: h.digest() }
    }
}

#[derive(Debug, Clone)]
pub struct SuffixStore {
    spaces: HashMap<String, SuffixIndex>,
    /// Every output kept, oldest first: its namespace and its length.
    order: VecDeque<(String, usize)>,
    cap: usize,
    n_tokens: usize,
}

impl Default for SuffixStore {
    fn default() -> Self {
        SuffixStore::new(super::DEFAULT_SUFFIX_CACHE_TOKENS)
    }
}

/// Why a namespace name is refused (`None`: it is fine).
pub fn namespace_problem(name: &str) -> Option<String> {
    (name.len() > MAX_NAMESPACE_BYTES).then(|| format!("at most {MAX_NAMESPACE_BYTES} bytes, got {}", name.len()))
}

impl SuffixStore {
    /// A store holding at most `cap` tokens over all namespaces (0: none).
    pub fn new(cap: usize) -> Self {
        SuffixStore { spaces: HashMap::new(), order: VecDeque::new(), cap, n_tokens: 0 }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn n_sequences(&self) -> usize {
        self.order.len()
    }

    pub fn n_namespaces(&self) -> usize {
        self.spaces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The index of one namespace, if it holds anything.
    pub fn space(&self, namespace: &str) -> Option<&SuffixIndex> {
        self.spaces.get(namespace)
    }

    /// Adds an output to `namespace`; drops the store's oldest outputs while
    /// it is over the cap (an output longer than the cap keeps its end).
    pub fn push(&mut self, namespace: &str, tokens: &[i32]) {
        if self.cap == 0 || tokens.is_empty() {
            return;
        }
        let tokens = if tokens.len() > self.cap { &tokens[tokens.len() - self.cap..] } else { tokens };
        self.spaces.entry(namespace.to_owned()).or_insert_with(SuffixIndex::unbounded).push(tokens);
        self.order.push_back((namespace.to_owned(), tokens.len()));
        self.n_tokens += tokens.len();
        while self.n_tokens > self.cap {
            let Some((ns, len)) = self.order.pop_front() else { break };
            self.n_tokens -= len;
            if let Some(index) = self.spaces.get_mut(&ns) {
                index.drop_oldest();
                if index.is_empty() {
                    self.spaces.remove(&ns);
                }
            }
        }
    }

    /// The matches of `history`'s suffix in `namespace` (see
    /// [`SuffixIndex::matches`]).
    pub fn matches(&self, namespace: &str, history: &[i32], n: usize) -> Vec<Match> {
        self.spaces.get(namespace).map_or_else(Vec::new, |index| index.matches(history, n))
    }

    /// The store in its file format (see the module's documentation).
    pub fn write_to(&self, w: &mut dyn Write, vocab: VocabId) -> io::Result<()> {
        let mut w = HashingWriter { inner: w, hash: Xxh3::new() };
        w.put(MAGIC)?;
        w.put(&VERSION.to_le_bytes())?;
        w.put(&vocab.n_vocab.to_le_bytes())?;
        w.put(&vocab.hash.to_le_bytes())?;
        // Namespaces in the order their oldest output was kept.
        let mut names: Vec<&str> = Vec::new();
        let mut number: HashMap<&str, u32> = HashMap::new();
        for (ns, _) in &self.order {
            if !number.contains_key(ns.as_str()) {
                number.insert(ns, names.len() as u32);
                names.push(ns);
            }
        }
        w.put(&(names.len() as u32).to_le_bytes())?;
        for name in &names {
            w.put(&(name.len() as u32).to_le_bytes())?;
            w.put(name.as_bytes())?;
        }
        w.put(&(self.order.len() as u32).to_le_bytes())?;
        // Each namespace's outputs come out of its index oldest first, in
        // the order the store kept them.
        let mut next: HashMap<&str, (Vec<&[i32]>, usize)> =
            self.spaces.iter().map(|(ns, index)| (ns.as_str(), (index.sequences().collect(), 0))).collect();
        let mut record = Vec::new();
        for (ns, len) in &self.order {
            let tokens = next.get_mut(ns.as_str()).and_then(|(seqs, i)| {
                *i += 1;
                seqs.get(*i - 1).copied()
            });
            let tokens = tokens.unwrap_or(&[]);
            debug_assert_eq!(tokens.len(), *len);
            record.clear();
            record.extend_from_slice(&number[ns.as_str()].to_le_bytes());
            record.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
            for &t in tokens {
                record.extend_from_slice(&(t as u32).to_le_bytes());
            }
            w.put(&record)?;
        }
        let digest = w.hash.digest();
        w.inner.write_all(&digest.to_le_bytes())
    }

    /// Reads a store written by [`write_to`](Self::write_to) into one of
    /// `cap` tokens, for an engine of vocabulary `vocab`.
    pub fn read_from(r: &mut impl Read, cap: usize, vocab: VocabId) -> Result<SuffixStore> {
        let mut r = Reader { inner: r, hash: Xxh3::new(), offset: 0 };
        let mut magic = [0u8; 8];
        r.exact(&mut magic, "its magic")?;
        if &magic != MAGIC {
            return Err(corrupt("not a suffix cache file (bad magic at byte 0)".into()));
        }
        let version = r.u32("its version")?;
        if version != VERSION {
            return Err(corrupt(format!("version {version} at byte 8; this engine reads version {VERSION}")));
        }
        let n_vocab = r.u32("its vocabulary size")?;
        let hash = r.u64("its vocabulary hash")?;
        if (VocabId { n_vocab, hash }) != vocab {
            return Err(corrupt(format!(
                "saved for another vocabulary ({n_vocab} tokens, hash {hash:016x}); this model's has {} tokens, hash {:016x}",
                vocab.n_vocab, vocab.hash
            )));
        }
        let n_names = r.count("the namespace count")?;
        let mut names = Vec::new();
        for k in 0..n_names {
            let at = r.offset;
            let len = r.u32("a namespace's length")? as usize;
            if len > MAX_NAMESPACE_BYTES {
                return Err(corrupt(format!("namespace {k} at byte {at} is {len} bytes long (at most {MAX_NAMESPACE_BYTES})")));
            }
            let mut bytes = vec![0u8; len];
            r.exact(&mut bytes, "a namespace's name")?;
            let name = String::from_utf8(bytes).map_err(|_| corrupt(format!("namespace {k} at byte {at} is not UTF-8")))?;
            names.push(name);
        }
        let n_outputs = r.count("the output count")?;
        let mut store = SuffixStore::new(cap);
        let mut tokens = Vec::new();
        let mut bytes = Vec::new();
        for k in 0..n_outputs {
            let at = r.offset;
            let ns = r.u32("an output's namespace")? as usize;
            if ns >= names.len() {
                return Err(corrupt(format!("output {k} at byte {at} names namespace {ns} of {}", names.len())));
            }
            let len = r.u32("an output's length")? as usize;
            if len == 0 || len > MAX_FILE_TOKENS {
                return Err(corrupt(format!("output {k} at byte {at} has length {len} (1 to {MAX_FILE_TOKENS})")));
            }
            // Read in pieces: a length the file does not back allocates nothing.
            tokens.clear();
            let mut left = len;
            while left > 0 {
                let piece = left.min(1 << 14);
                bytes.resize(piece * 4, 0);
                r.exact(&mut bytes, "an output's tokens")?;
                for (i, b) in bytes.chunks_exact(4).enumerate() {
                    let t = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                    if t >= vocab.n_vocab {
                        let pos = r.offset - bytes.len() as u64 + 4 * i as u64;
                        return Err(corrupt(format!("token {t} at byte {pos} is outside the vocabulary ({} tokens)", vocab.n_vocab)));
                    }
                    tokens.push(t as i32);
                }
                left -= piece;
            }
            store.push(&names[ns], &tokens);
        }
        let at = r.offset;
        let digest = r.hash.digest();
        let mut stored = [0u8; 8];
        r.inner.read_exact(&mut stored).map_err(|_| corrupt(format!("truncated at byte {at}: the checksum is missing")))?;
        if u64::from_le_bytes(stored) != digest {
            return Err(corrupt(format!("checksum mismatch at byte {at}: the file is damaged")));
        }
        let mut extra = [0u8; 1];
        if r.inner.read(&mut extra).map_err(|e| corrupt(format!("read failed: {e}")))? != 0 {
            return Err(corrupt(format!("trailing bytes after the checksum at byte {}", at + 8)));
        }
        Ok(store)
    }

    /// Writes the store to `path` atomically (a temporary file beside it,
    /// synced, renamed over it). A path that cannot be created is
    /// `INVALID_REQUEST`; a failure after that (disk full, ...) `INTERNAL`.
    pub fn save(&self, path: &Path, vocab: VocabId) -> Result<()> {
        write_atomically(path, |w| self.write_to(w, vocab)).map_err(|e| match e {
            WriteError::Create(e) => EngineError::invalid(FIELD, format!("cannot write {}: {e}", path.display())),
            WriteError::Write(e) => EngineError::internal(format!("{FIELD}: saving {} failed: {e}", path.display())),
        })
    }

    /// Reads the file at `path` (see [`read_from`](Self::read_from)); every
    /// error, a missing file included, is `INVALID_REQUEST` naming the path.
    pub fn load(path: &Path, cap: usize, vocab: VocabId) -> Result<SuffixStore> {
        let file = File::open(path).map_err(|e| EngineError::invalid(FIELD, format!("cannot open {}: {e}", path.display())))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        SuffixStore::read_from(&mut reader, cap, vocab)
            .map_err(|e| EngineError { message: format!("{} (in {})", e.message, path.display()), ..e })
    }
}

fn corrupt(why: String) -> EngineError {
    EngineError::invalid(FIELD, why)
}

struct HashingWriter<'a> {
    inner: &'a mut dyn Write,
    hash: Xxh3,
}

impl HashingWriter<'_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hash.update(bytes);
        self.inner.write_all(bytes)
    }
}

struct Reader<'a, R: Read> {
    inner: &'a mut R,
    hash: Xxh3,
    offset: u64,
}

impl<R: Read> Reader<'_, R> {
    fn exact(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(corrupt(format!("truncated at byte {}: the file ends in {what}", self.offset + got as u64)));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(corrupt(format!("read failed at byte {}: {e}", self.offset + got as u64))),
            }
        }
        self.hash.update(buf);
        self.offset += buf.len() as u64;
        Ok(())
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let mut b = [0u8; 4];
        self.exact(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let mut b = [0u8; 8];
        self.exact(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A count of namespaces or outputs: no more than a file can hold.
    fn count(&mut self, what: &str) -> Result<usize> {
        let at = self.offset;
        let n = self.u32(what)? as usize;
        if n > MAX_FILE_TOKENS {
            return Err(corrupt(format!("{what} at byte {at} is {n} (at most {MAX_FILE_TOKENS})")));
        }
        Ok(n)
    }
}
