//! The n-gram cache: an n-gram (1 to [`NGRAM_MAX`] tokens) mapped to the
//! tokens seen right after it, with counts, and its file format
//! (llama.cpp's, see the module above).

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use crate::error::{EngineError, ErrorCode, Result};
use crate::files::{write_atomically, WriteError};

/// The longest n-gram (llama.cpp's `LLAMA_NGRAM_MAX`).
pub const NGRAM_MAX: usize = 4;
/// The shortest n-gram (llama.cpp's `LLAMA_NGRAM_MIN`).
pub const NGRAM_MIN: usize = 1;
/// The n-gram size of static caches (llama.cpp's `LLAMA_NGRAM_STATIC`).
pub const NGRAM_STATIC: usize = 2;

/// Fills the unused slots of an [`Ngram`] (llama.cpp's `LLAMA_TOKEN_NULL`).
pub(super) const PAD: i32 = -1;
/// The field name errors about cache files start with.
const FIELD: &str = "ngram cache";
/// More followers than any vocabulary has tokens: the count is corrupt.
const MAX_FOLLOWERS: i32 = 1 << 24;
/// Bytes of a record's head (the n-gram and its follower count).
const HEAD_BYTES: usize = NGRAM_MAX * 4 + 4;
/// Most distinct n-grams the dynamic cache learns from requests (about
/// 150 bytes each: ~75 MB). Past it, only known n-grams gain counts.
pub const DYNAMIC_MAX_NGRAMS: usize = 500_000;

// ---------------------------------------------------------------------------
// Hashing: keys are small integer tuples; SipHash would dominate the hot path.

/// An Fx-style multiplicative hasher with a final avalanche step, so the low
/// bits the table indexes by depend on every token of the key.
#[derive(Default, Clone, Copy)]
pub struct TokenHasher(u64);

impl TokenHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for TokenHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 32;
        x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
        x ^ (x >> 32)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8-byte chunk")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_i32(&mut self, i: i32) {
        self.add(i as u32 as u64);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

type BuildTokenHasher = BuildHasherDefault<TokenHasher>;
/// Follower token -> count (llama.cpp's `common_ngram_cache_part`).
pub(super) type Followers = HashMap<i32, i32, BuildTokenHasher>;

// ---------------------------------------------------------------------------

/// An n-gram of 1..=4 tokens, padded with -1 (llama.cpp's common_ngram).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ngram(pub [i32; NGRAM_MAX]);

impl Ngram {
    /// Panics if `tokens` has more than [`NGRAM_MAX`] tokens.
    #[inline]
    pub fn new(tokens: &[i32]) -> Ngram {
        assert!(tokens.len() <= NGRAM_MAX, "an n-gram has at most {NGRAM_MAX} tokens");
        let mut slots = [PAD; NGRAM_MAX];
        slots[..tokens.len()].copy_from_slice(tokens);
        Ngram(slots)
    }

    /// The number of tokens before the padding.
    pub fn len(&self) -> usize {
        self.0.iter().take_while(|&&t| t != PAD).count()
    }

    pub fn is_empty(&self) -> bool {
        self.0[0] == PAD
    }

    pub fn tokens(&self) -> &[i32] {
        &self.0[..self.len()]
    }

    /// At least one token, all tokens valid (>= 0), then only padding: the
    /// shape of every n-gram llama.cpp or this module writes.
    pub(super) fn is_well_formed(&self) -> bool {
        let n = self.len();
        n >= 1 && self.0[..n].iter().all(|&t| t >= 0) && self.0[n..].iter().all(|&t| t == PAD)
    }
}

/// n-gram -> (next token -> count).
#[derive(Default, Clone, Debug, PartialEq)]
pub struct NgramCache {
    pub(super) map: HashMap<Ngram, Followers, BuildTokenHasher>,
}

impl NgramCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of distinct n-grams.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// How many times `token` followed `ngram` (0 if never).
    pub fn count(&self, ngram: &Ngram, token: i32) -> i32 {
        self.map.get(ngram).and_then(|f| f.get(&token)).copied().unwrap_or(0)
    }

    /// The tokens seen after `ngram` with their counts, sorted by token.
    pub fn followers(&self, ngram: &Ngram) -> Vec<(i32, i32)> {
        let mut out: Vec<(i32, i32)> = self.map.get(ngram).map(|f| f.iter().map(|(&t, &c)| (t, c)).collect()).unwrap_or_default();
        out.sort_unstable();
        out
    }

    #[inline]
    fn add(&mut self, ngram: Ngram, token: i32, count: i32) {
        let slot = self.map.entry(ngram).or_default().entry(token).or_insert(0);
        *slot = slot.saturating_add(count);
    }

    /// Adds the n-grams of sizes ngram_min..=ngram_max that end in the last
    /// `n_new` tokens of `tokens`, each counted with the token that follows
    /// it (incremental: call after every step with the tokens just accepted).
    ///
    /// Precisely, as llama.cpp's `common_ngram_cache_update`: for every
    /// position `i` among the last `n_new` and every size `n`, the n-gram
    /// `tokens[i-n..i]` is counted with follower `tokens[i]`. Calling it with
    /// `n_new = k` after appending k tokens is the same as one call over the
    /// whole sequence. Sizes are clamped to 1..=[`NGRAM_MAX`]; windows that
    /// contain a negative (invalid) token are skipped.
    pub fn update(&mut self, tokens: &[i32], ngram_min: usize, ngram_max: usize, n_new: usize) {
        let len = tokens.len();
        let first_new = len.saturating_sub(n_new);
        for size in ngram_min.max(NGRAM_MIN)..=ngram_max.min(NGRAM_MAX) {
            for i in first_new.max(size)..len {
                let window = &tokens[i - size..=i];
                if window.iter().any(|&t| t < 0) {
                    continue;
                }
                self.add(Ngram::new(&window[..size]), tokens[i], 1);
            }
        }
    }

    /// Adds every count of `other` to this cache (`common_ngram_cache_merge`).
    pub fn merge(&mut self, other: &NgramCache) {
        if self.map.is_empty() {
            self.map.clone_from(&other.map);
            return;
        }
        for (ngram, theirs) in &other.map {
            match self.map.get_mut(ngram) {
                None => {
                    self.map.insert(*ngram, theirs.clone());
                }
                Some(mine) => {
                    for (&token, &count) in theirs {
                        let slot = mine.entry(token).or_insert(0);
                        *slot = slot.saturating_add(count);
                    }
                }
            }
        }
    }

    /// Like [`merge`](Self::merge), consuming `other`, but once this cache
    /// holds `max` n-grams no new ones are added (the counts of those it has still
    /// grow), so a long-running engine's dynamic cache stays bounded.
    pub fn merge_capped(&mut self, other: NgramCache, max: usize) {
        if self.map.is_empty() && other.len() <= max {
            *self = other;
            return;
        }
        for (ngram, theirs) in other.map {
            let full = self.map.len() >= max;
            match self.map.get_mut(&ngram) {
                Some(mine) => {
                    for (token, count) in theirs {
                        let slot = mine.entry(token).or_insert(0);
                        *slot = slot.saturating_add(count);
                    }
                }
                None if !full => {
                    self.map.insert(ngram, theirs);
                }
                None => {}
            }
        }
    }

    /// llama.cpp's binary format: repeated [4 x i32 ngram][i32 n][(i32 token,
    /// i32 count) x n], little-endian.
    ///
    /// Records are written sorted (n-grams, then followers by token) so the
    /// same cache always gives the same bytes; llama.cpp writes them in hash
    /// order, which its reader (and ours) does not care about. One
    /// `write_all` per record: wrap slow writers in a `BufWriter`.
    pub fn write_to(&self, w: &mut dyn Write) -> io::Result<()> {
        let mut ngrams: Vec<(&Ngram, &Followers)> = self.map.iter().filter(|(_, f)| !f.is_empty()).collect();
        ngrams.sort_unstable_by_key(|(ngram, _)| ngram.0);

        let mut followers: Vec<(i32, i32)> = Vec::new();
        let mut record: Vec<u8> = Vec::new();
        for (ngram, part) in ngrams {
            followers.clear();
            followers.extend(part.iter().map(|(&t, &c)| (t, c)));
            followers.sort_unstable();
            let n = i32::try_from(followers.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "too many followers"))?;

            record.clear();
            for t in ngram.0 {
                record.extend_from_slice(&t.to_le_bytes());
            }
            record.extend_from_slice(&n.to_le_bytes());
            for &(token, count) in &followers {
                record.extend_from_slice(&token.to_le_bytes());
                record.extend_from_slice(&count.to_le_bytes());
            }
            w.write_all(&record)?;
        }
        Ok(())
    }

    /// Writes the cache to `path` atomically: to a temporary file in the same
    /// directory, synced, then renamed over `path`. A failure leaves `path`
    /// as it was. A path that cannot be created is `INVALID_REQUEST`; a
    /// failure after that (disk full, ...) is `INTERNAL`.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomically(path, |w| self.write_to(w)).map_err(|e| match e {
            WriteError::Create(e) => EngineError::invalid(FIELD, format!("cannot write {}: {e}", path.display())),
            WriteError::Write(e) => EngineError::internal(format!("{FIELD}: saving {} failed: {e}", path.display())),
        })
    }

    /// Reads a cache in llama.cpp's format (see [`write_to`](Self::write_to)).
    ///
    /// An empty input is an empty cache (llama.cpp's loader agrees). Errors
    /// are `INVALID_REQUEST` with field "ngram cache" and the byte offset:
    /// a partial record, a follower count <= 0 or absurdly large, a malformed
    /// n-gram (no token, a negative token, a token after the padding), a
    /// negative follower token, a count <= 0, or a failed read. llama.cpp
    /// never writes an n-gram twice or a follower twice within a record; if
    /// a file does, the counts add up (so concatenated files read as their
    /// merge), where llama.cpp would keep the first. Reads in small pieces:
    /// pass a buffered reader.
    pub fn read_from(r: &mut impl Read) -> Result<NgramCache> {
        let mut input = CountingReader { inner: r, offset: 0 };
        let mut cache = NgramCache::new();
        loop {
            let start = input.offset;
            let mut head = [0u8; HEAD_BYTES];
            let got = input.fill(&mut head)?;
            if got == 0 {
                break;
            }
            if got < HEAD_BYTES {
                return Err(corrupt(format!(
                    "truncated record at byte {start}: the file ends after {got} of the \
                     {HEAD_BYTES} bytes of its n-gram and follower count"
                )));
            }
            let mut slots = [PAD; NGRAM_MAX];
            for (k, slot) in slots.iter_mut().enumerate() {
                *slot = le_i32(&head[4 * k..4 * k + 4]);
            }
            let ngram = Ngram(slots);
            if !ngram.is_well_formed() {
                return Err(corrupt(format!("malformed n-gram {:?} at byte {start}", ngram.0)));
            }
            let n = le_i32(&head[HEAD_BYTES - 4..]);
            if n <= 0 || n > MAX_FOLLOWERS {
                return Err(corrupt(format!(
                    "invalid follower count {n} at byte {} (record at byte {start})",
                    start + HEAD_BYTES as u64 - 4
                )));
            }
            for k in 0..n {
                let at = input.offset;
                let mut pair = [0u8; 8];
                let got = input.fill(&mut pair)?;
                if got < pair.len() {
                    return Err(corrupt(format!(
                        "truncated record at byte {at}: the file ends after {got} of the 8 bytes \
                         of follower {} of {n} (record at byte {start})",
                        k + 1
                    )));
                }
                let token = le_i32(&pair[..4]);
                let count = le_i32(&pair[4..]);
                if token < 0 {
                    return Err(corrupt(format!("negative follower token {token} at byte {at} (record at byte {start})")));
                }
                if count <= 0 {
                    return Err(corrupt(format!("non-positive count {count} at byte {} (record at byte {start})", at + 4)));
                }
                cache.add(ngram, token, count);
            }
        }
        Ok(cache)
    }

    /// Reads the file at `path` (see [`read_from`](Self::read_from)); every
    /// error, a missing file included, is `INVALID_REQUEST` naming the path.
    pub fn load(path: &Path) -> Result<NgramCache> {
        let file = File::open(path).map_err(|e| EngineError::invalid(FIELD, format!("cannot open {}: {e}", path.display())))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        NgramCache::read_from(&mut reader).map_err(|e| EngineError { message: format!("{} (in {})", e.message, path.display()), ..e })
    }
}

fn le_i32(bytes: &[u8]) -> i32 {
    i32::from_le_bytes(bytes.try_into().expect("4 bytes"))
}

fn corrupt(why: String) -> EngineError {
    EngineError::invalid(FIELD, why)
}

/// A sibling of `path` no other save (in this process or another) uses.
struct CountingReader<'a, R: Read> {
    inner: &'a mut R,
    offset: u64,
}

impl<R: Read> CountingReader<'_, R> {
    /// Reads until `buf` is full or the input ends; returns the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(k) => {
                    got += k;
                    self.offset += k as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(EngineError::new(ErrorCode::InvalidRequest, format!("{FIELD}: read failed at byte {}: {e}", self.offset)))
                }
            }
        }
        Ok(got)
    }
}
