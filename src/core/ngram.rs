//! Prompt-lookup drafting from n-gram caches, after llama.cpp's
//! `common/ngram-cache.{h,cpp}` and its `lookup` example.
//!
//! An [`NgramCache`] maps an n-gram (1 to [`NGRAM_MAX`] tokens) to the tokens
//! seen right after it, with counts. Three caches take part in a draft:
//!
//! * the **context** cache: built from this request's prompt and the tokens
//!   accepted so far, updated incrementally; trusted with lax thresholds;
//! * the **dynamic** cache: the context caches of earlier requests merged
//!   together (shared between requests, saved to disk by the engine); strict
//!   thresholds;
//! * the **static** cache: bigrams ([`NGRAM_STATIC`] tokens) counted over a
//!   large corpus (llama.cpp's `lookup-create`); it breaks ties among the
//!   candidates of the two caches above and drafts on its own only as a last
//!   resort.
//!
//! Files use llama.cpp's binary format, so caches written by its lookup tools
//! load here and the other way round: a sequence of records
//! `[4 x i32 n-gram, padded with -1][i32 n][(i32 token, i32 count) x n]`,
//! little-endian, in no particular order.

use std::collections::HashMap;
use std::fs::{self, File};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::drafter::{Draft, Drafter};
use crate::core::error::{EngineError, ErrorCode, Result};
use crate::core::events::TokenSource;

/// The longest n-gram (llama.cpp's `LLAMA_NGRAM_MAX`).
pub const NGRAM_MAX: usize = 4;
/// The shortest n-gram (llama.cpp's `LLAMA_NGRAM_MIN`).
pub const NGRAM_MIN: usize = 1;
/// The n-gram size of static caches (llama.cpp's `LLAMA_NGRAM_STATIC`).
pub const NGRAM_STATIC: usize = 2;

/// Fills the unused slots of an [`Ngram`] (llama.cpp's `LLAMA_TOKEN_NULL`).
const PAD: i32 = -1;
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
type Followers = HashMap<i32, i32, BuildTokenHasher>;

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
    fn is_well_formed(&self) -> bool {
        let n = self.len();
        n >= 1 && self.0[..n].iter().all(|&t| t >= 0) && self.0[n..].iter().all(|&t| t == PAD)
    }
}

/// n-gram -> (next token -> count).
#[derive(Default, Clone, Debug, PartialEq)]
pub struct NgramCache {
    map: HashMap<Ngram, Followers, BuildTokenHasher>,
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
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
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
        let tmp = temp_path(path);
        let file = File::create(&tmp).map_err(|e| EngineError::invalid(FIELD, format!("cannot write {}: {e}", path.display())))?;
        let written = (|| -> io::Result<()> {
            let mut w = BufWriter::with_capacity(1 << 16, file);
            self.write_to(&mut w)?;
            let file = w.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, path)
        })();
        written.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            EngineError::internal(format!("{FIELD}: saving {} failed: {e}", path.display()))
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
        NgramCache::read_from(&mut reader)
            .map_err(|e| EngineError { code: e.code, message: format!("{} (in {})", e.message, path.display()) })
    }
}

fn le_i32(bytes: &[u8]) -> i32 {
    i32::from_le_bytes(bytes.try_into().expect("4 bytes"))
}

fn corrupt(why: String) -> EngineError {
    EngineError::invalid(FIELD, why)
}

/// A sibling of `path` no other save (in this process or another) uses.
fn temp_path(path: &Path) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{seq}.tmp", std::process::id()))
}

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

// ---------------------------------------------------------------------------
// Drafting

/// Parameters of the lookup drafter. Threshold tables are indexed by n-gram
/// size - 1; their defaults are llama.cpp's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgramParams {
    /// Shortest n-gram looked up in the context and dynamic caches (>= 1).
    pub ngram_min: usize,
    /// Longest n-gram looked up (<= [`NGRAM_MAX`]); longer ones are tried first.
    pub ngram_max: usize,
    /// Context cache: fewest observations of an n-gram to draft from it.
    pub draft_min_sample_size_lax: [u32; NGRAM_MAX],
    /// Context cache: least share (percent) of the best follower.
    pub draft_min_percent_lax: [u32; NGRAM_MAX],
    /// Dynamic cache: fewest observations of an n-gram to draft from it.
    pub draft_min_sample_size_strict: [u32; NGRAM_MAX],
    /// Dynamic cache: least share (percent) of the best follower.
    pub draft_min_percent_strict: [u32; NGRAM_MAX],
}

impl Default for NgramParams {
    fn default() -> Self {
        NgramParams {
            ngram_min: NGRAM_MIN,
            ngram_max: NGRAM_MAX,
            draft_min_sample_size_lax: [2, 2, 1, 1],
            draft_min_percent_lax: [66, 50, 50, 50],
            draft_min_sample_size_strict: [4, 3, 2, 2],
            draft_min_percent_strict: [75, 66, 66, 66],
        }
    }
}

/// The best follower by count weighted with the static cache, and the total
/// count; ties go to the smaller token id (llama.cpp's go to whichever its
/// hash map yields first).
fn best_follower(followers: &Followers, static_part: Option<&Followers>) -> Option<(i32, u64, u64)> {
    let mut best: Option<(i32, u64, u64)> = None; // (token, count, weighted)
    let mut sum = 0u64;
    for (&token, &count) in followers {
        let count = count.max(0) as u64;
        let weight = static_part.and_then(|p| p.get(&token)).map_or(1, |&s| 100 * s.max(0) as u64);
        let weighted = count * weight;
        let better = match best {
            None => true,
            Some((t, _, w)) => weighted > w || (weighted == w && token < t),
        };
        if better {
            best = Some((token, count, weighted));
        }
        sum += count;
    }
    best.map(|(token, count, _)| (token, count, sum))
}

/// Enough observations, and the best follower holds a large enough share.
#[inline]
fn passes(count: u64, sum: u64, min_sample: u32, min_percent: u32) -> bool {
    sum >= u64::from(min_sample) && 100 * count >= u64::from(min_percent) * sum
}

/// Drafts from the context or dynamic cache: the longest n-gram whose best
/// follower passes the thresholds wins. `ngrams` are (size, n-gram), longest
/// first.
fn try_primary(
    cache: &NgramCache,
    ngrams: &[(usize, Ngram)],
    static_part: Option<&Followers>,
    min_sample: &[u32; NGRAM_MAX],
    min_percent: &[u32; NGRAM_MAX],
) -> Option<(i32, usize)> {
    ngrams.iter().find_map(|&(size, ngram)| {
        let (token, count, sum) = best_follower(cache.map.get(&ngram)?, static_part)?;
        passes(count, sum, min_sample[size - 1], min_percent[size - 1]).then_some((token, size))
    })
}

/// Where a drafted token came from, as a small number for statistics:
/// 0..=3 the context cache with an n-gram of 1..=4 tokens, 4..=7 the dynamic
/// cache likewise, 8 the static cache alone. How often the target accepts a
/// token depends a lot on this (a 4-token match in the prompt is a copy in
/// progress; a 1-token match is a guess).
pub const DRAFT_CLASSES: usize = 9;

/// Acceptance of a greedy target for tokens of each class, to start from
/// before a request has measured its own: measured by replaying SmolLM2-135M's
/// greedy answers to 8 prompts (copying, code edits, list making, quoting,
/// summaries, two free-form) that are not in the benchmark: a context 4-gram
/// 0.93 (5,915 tokens), 3-gram 0.70 (96), 2-gram 0.54 (48), 1-gram 0.33 (45).
/// The dynamic and static caches (not in that replay) get the rates of one
/// n-gram size lower, the static cache alone the lowest.
pub const CLASS_PRIORS: [f64; DRAFT_CLASSES] = [0.35, 0.5, 0.65, 0.9, 0.3, 0.35, 0.5, 0.65, 0.3];

/// Drafts from the static cache alone, with the lax thresholds of its size.
fn try_static(static_part: &Followers, params: &NgramParams) -> Option<i32> {
    let (token, count, sum) = best_follower(static_part, None)?;
    let i = NGRAM_STATIC - 1;
    passes(count, sum, params.draft_min_sample_size_lax[i], params.draft_min_percent_lax[i]).then_some(token)
}

/// llama.cpp's common_ngram_cache_draft: extend `draft` (starting with the
/// last token) using the context cache first (lax thresholds, longest n-gram
/// first), then the dynamic cache (strict thresholds), then the static cache
/// as a tiebreaker/validator.
///
/// `history` is every token so far, the last one included; returns up to
/// `n_draft` tokens to follow it (without the last token, unlike llama.cpp's
/// `draft` vector). Each step looks up the tail of history + drafts so far:
/// the static cache's followers of the last [`NGRAM_STATIC`] tokens weight
/// the candidates (x100 when the static cache knows them), the context cache
/// is tried with n-grams of `ngram_max` down to `ngram_min` tokens, then the
/// dynamic cache likewise, then the static cache on its own. Drafting stops
/// at the first step none of them passes. Fewer than [`NGRAM_STATIC`] tokens
/// of history give no draft (as in llama.cpp).
pub fn draft_tokens(
    history: &[i32],
    n_draft: usize,
    params: &NgramParams,
    ctx: &NgramCache,
    dynamic: &NgramCache,
    stat: &NgramCache,
) -> Vec<i32> {
    draft_tokens_classified(history, n_draft, params, ctx, dynamic, stat).0
}

/// [`draft_tokens`], with the class (see [`DRAFT_CLASSES`]) of each token.
pub fn draft_tokens_classified(
    history: &[i32],
    n_draft: usize,
    params: &NgramParams,
    ctx: &NgramCache,
    dynamic: &NgramCache,
    stat: &NgramCache,
) -> (Vec<i32>, Vec<u8>) {
    let mut out: Vec<i32> = Vec::with_capacity(n_draft.min(256));
    let mut classes: Vec<u8> = Vec::with_capacity(n_draft.min(256));
    if history.len() < NGRAM_STATIC {
        return (out, classes);
    }
    let lo = params.ngram_min.max(NGRAM_MIN);
    let hi = params.ngram_max.min(NGRAM_MAX);

    while out.len() < n_draft {
        // The last `n` tokens of history ++ out.
        let tail = |n: usize| -> Ngram {
            let mut slots = [PAD; NGRAM_MAX];
            let from_out = n.min(out.len());
            let from_history = n - from_out;
            slots[..from_history].copy_from_slice(&history[history.len() - from_history..]);
            slots[from_history..n].copy_from_slice(&out[out.len() - from_out..]);
            Ngram(slots)
        };
        let total = history.len() + out.len();

        let static_part = stat.map.get(&tail(NGRAM_STATIC));
        let mut ngrams = [(0usize, Ngram([PAD; NGRAM_MAX])); NGRAM_MAX];
        let mut n_ngrams = 0;
        for size in (lo..=hi.min(total)).rev() {
            ngrams[n_ngrams] = (size, tail(size));
            n_ngrams += 1;
        }
        let ngrams = &ngrams[..n_ngrams];

        let token = try_primary(ctx, ngrams, static_part, &params.draft_min_sample_size_lax, &params.draft_min_percent_lax)
            .map(|(t, size)| (t, size as u8 - 1))
            .or_else(|| {
                try_primary(dynamic, ngrams, static_part, &params.draft_min_sample_size_strict, &params.draft_min_percent_strict)
                    .map(|(t, size)| (t, NGRAM_MAX as u8 + size as u8 - 1))
            })
            .or_else(|| static_part.and_then(|part| try_static(part, params)).map(|t| (t, 2 * NGRAM_MAX as u8)));

        match token {
            Some((token, class)) => {
                out.push(token);
                classes.push(class);
            }
            None => break,
        }
    }
    (out, classes)
}

/// The n-gram drafter: a context cache built from the prompt and accepted
/// output (updated incrementally), plus shared dynamic and static caches.
pub struct NgramDrafter {
    params: NgramParams,
    context: NgramCache,
    dynamic: Arc<Mutex<NgramCache>>,
    stat: Arc<NgramCache>,
    /// How many tokens of the history the context cache has counted.
    n_seen: usize,
    /// The last (up to [`NGRAM_MAX`]) tokens counted, to notice a history
    /// that was rewritten rather than extended (a context shift).
    seen_tail: Vec<i32>,
    last_draft: usize,
    n_drafted: usize,
    n_accepted: usize,
}

impl NgramDrafter {
    pub fn new(params: NgramParams, dynamic: Arc<Mutex<NgramCache>>, stat: Option<Arc<NgramCache>>) -> Self {
        NgramDrafter {
            params,
            context: NgramCache::new(),
            dynamic,
            stat: stat.unwrap_or_default(),
            n_seen: 0,
            seen_tail: Vec::with_capacity(NGRAM_MAX),
            last_draft: 0,
            n_drafted: 0,
            n_accepted: 0,
        }
    }

    /// This request's context cache.
    pub fn context(&self) -> &NgramCache {
        &self.context
    }

    pub fn params(&self) -> &NgramParams {
        &self.params
    }

    /// Tokens drafted and accepted since this drafter was made.
    pub fn counts(&self) -> (usize, usize) {
        (self.n_drafted, self.n_accepted)
    }

    fn forget(&mut self) {
        self.n_seen = 0;
        self.seen_tail.clear();
        self.last_draft = 0;
    }

    /// Counts the tokens of `history` the context cache has not seen; starts
    /// over when `history` is not an extension of what it saw.
    fn catch_up(&mut self, history: &[i32]) {
        let extends = history.len() >= self.n_seen && history[self.n_seen - self.seen_tail.len()..self.n_seen] == self.seen_tail[..];
        if !extends {
            self.context.clear();
            self.n_seen = 0;
        }
        let n_new = history.len() - self.n_seen;
        if n_new == 0 && extends {
            return;
        }
        self.context.update(history, self.params.ngram_min, self.params.ngram_max, n_new);
        self.n_seen = history.len();
        self.seen_tail.clear();
        self.seen_tail.extend_from_slice(&history[history.len().saturating_sub(NGRAM_MAX)..]);
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn begin(&mut self, prompt: &[i32]) {
        self.context.clear();
        self.forget();
        self.catch_up(prompt);
    }

    fn draft(&mut self, history: &[i32], n_max: usize, _position: usize) -> Option<Draft> {
        self.catch_up(history);
        self.last_draft = 0;
        if n_max == 0 {
            return None;
        }
        let tokens = {
            let dynamic = self.dynamic.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            draft_tokens_classified(history, n_max, &self.params, &self.context, &dynamic, &self.stat)
        };
        let (tokens, classes) = tokens;
        if tokens.is_empty() {
            return None;
        }
        self.last_draft = tokens.len();
        self.n_drafted += tokens.len();
        Some(Draft::new(tokens, TokenSource::Ngram, classes))
    }

    fn accept(&mut self, n_accepted: usize) {
        self.n_accepted += n_accepted.min(self.last_draft);
        self.last_draft = 0;
    }

    /// At the end of a request the context cache is merged into the dynamic
    /// cache (llama.cpp's lookup does this). The context cache is emptied, so
    /// a second `end` adds nothing. A request that never reaches `end` (the
    /// next `begin` comes first) leaves the dynamic cache untouched.
    fn end(&mut self) {
        let context = std::mem::take(&mut self.context);
        self.forget();
        if context.is_empty() {
            return;
        }
        self.dynamic.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).merge_capped(context, DYNAMIC_MAX_NGRAMS);
    }

    fn is_cheap(&self) -> bool {
        true
    }

    fn ms_per_token(&self) -> Option<f64> {
        // A lookup in hash maps: microseconds for a whole draft.
        Some(0.01)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ng(tokens: &[i32]) -> Ngram {
        Ngram::new(tokens)
    }

    fn full(tokens: &[i32]) -> NgramCache {
        let mut c = NgramCache::new();
        c.update(tokens, NGRAM_MIN, NGRAM_MAX, tokens.len());
        c
    }

    /// llama.cpp's record layout, built by hand.
    fn record(ngram: [i32; 4], followers: &[(i32, i32)]) -> Vec<u8> {
        let mut b = Vec::new();
        for t in ngram {
            b.extend_from_slice(&t.to_le_bytes());
        }
        b.extend_from_slice(&(followers.len() as i32).to_le_bytes());
        for &(t, c) in followers {
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&c.to_le_bytes());
        }
        b
    }

    fn read(bytes: &[u8]) -> Result<NgramCache> {
        NgramCache::read_from(&mut &bytes[..])
    }

    #[test]
    fn ngram_shape() {
        let g = ng(&[5, 6]);
        assert_eq!(g.0, [5, 6, -1, -1]);
        assert_eq!(g.len(), 2);
        assert_eq!(g.tokens(), &[5, 6]);
        assert!(g.is_well_formed());
        assert!(!Ngram([-1; 4]).is_well_formed());
        assert!(!Ngram([1, -1, 2, -1]).is_well_formed());
    }

    #[test]
    fn update_counts() {
        // 1 2 3 1 2 4
        let c = full(&[1, 2, 3, 1, 2, 4]);
        assert_eq!(c.followers(&ng(&[1])), vec![(2, 2)]);
        assert_eq!(c.followers(&ng(&[2])), vec![(3, 1), (4, 1)]);
        assert_eq!(c.followers(&ng(&[1, 2])), vec![(3, 1), (4, 1)]);
        assert_eq!(c.count(&ng(&[3, 1, 2]), 4), 1);
        assert_eq!(c.count(&ng(&[2, 3, 1, 2]), 4), 1);
        assert_eq!(c.count(&ng(&[4]), 1), 0);
        // 1-grams: 1,2,3,1,2 -> {1,2,3} ; 2-grams: 12,23,31,12 -> 3 ; 3-grams: 3 ; 4-grams: 2
        assert_eq!(c.len(), 3 + 3 + 3 + 2);
        assert_eq!(NgramCache::new().len(), 0);
        assert!(NgramCache::new().is_empty());
    }

    #[test]
    fn incremental_update_equals_one_shot() {
        let tokens = [7, 8, 9, 7, 8, 9, 10, 7, 8, 11, 7, 8, 9];
        let mut inc = NgramCache::new();
        inc.update(&tokens[..3], 1, 4, 3);
        for end in 4..=tokens.len() {
            inc.update(&tokens[..end], 1, 4, 1);
        }
        assert_eq!(inc, full(&tokens));

        let mut chunked = NgramCache::new();
        chunked.update(&tokens[..5], 1, 4, 5);
        chunked.update(&tokens[..9], 1, 4, 4);
        chunked.update(&tokens, 1, 4, 4);
        assert_eq!(chunked, full(&tokens));

        // n_new larger than the input is the whole input
        let mut big = NgramCache::new();
        big.update(&tokens, 1, 4, 1000);
        assert_eq!(big, full(&tokens));
    }

    #[test]
    fn update_respects_sizes_and_skips_invalid_tokens() {
        let mut c = NgramCache::new();
        c.update(&[1, 2, 3], 2, 2, 3);
        assert_eq!(c.len(), 1);
        assert_eq!(c.count(&ng(&[1, 2]), 3), 1);

        let mut c = NgramCache::new();
        c.update(&[1, -1, 2, 3], 1, 4, 4);
        assert_eq!(c.len(), 1);
        assert_eq!(c.count(&ng(&[2]), 3), 1);
    }

    #[test]
    fn drafts_a_repeated_passage() {
        let passage: Vec<i32> = (100..120).collect();
        let empty = NgramCache::new();
        let params = NgramParams::default();

        // ... A B C -> D E F ...: a 3-gram seen once is enough (lax table).
        let mut history = passage.clone();
        history.extend_from_slice(&[1, 2, 3]);
        history.extend_from_slice(&passage[..3]);
        let ctx = full(&history);
        let draft = draft_tokens(&history, 8, &params, &ctx, &empty, &empty);
        assert_eq!(draft, passage[3..11].to_vec());
        // The rest of the passage, then what followed it, then the passage
        // again: the lookup goes round the cycle until n_draft.
        let draft = draft_tokens(&history, 60, &params, &ctx, &empty, &empty);
        let cycle = [&passage[..], &[1, 2, 3][..]].concat();
        let expected: Vec<i32> = cycle.iter().cycle().skip(3).take(60).copied().collect();
        assert_eq!(draft, expected);

        // ... A B: a 2-gram seen once is not (llama.cpp wants two samples).
        history.pop();
        let ctx = full(&history);
        assert!(draft_tokens(&history, 8, &params, &ctx, &empty, &empty).is_empty());
    }

    #[test]
    fn drafted_tokens_carry_the_cache_and_ngram_size_that_matched() {
        let passage: Vec<i32> = (100..120).collect();
        let empty = NgramCache::new();
        let params = NgramParams::default();
        let mut history = passage.clone();
        history.extend_from_slice(&[1, 2, 3]);
        history.extend_from_slice(&passage[..3]);
        // Context cache: the first token follows a 3-gram (class 2), the
        // rest 4-grams (class 3); same tokens as draft_tokens.
        let (tokens, classes) = draft_tokens_classified(&history, 8, &params, &full(&history), &empty, &empty);
        assert_eq!(tokens, draft_tokens(&history, 8, &params, &full(&history), &empty, &empty));
        assert_eq!(classes, vec![2, 3, 3, 3, 3, 3, 3, 3]);
        // From the dynamic cache alone (strict thresholds: seen twice).
        let mut dynamic = full(&passage);
        dynamic.merge(&full(&passage));
        let (tokens, classes) = draft_tokens_classified(&passage[..6], 3, &params, &empty, &dynamic, &empty);
        assert_eq!(tokens, passage[6..9].to_vec());
        assert_eq!(classes, vec![NGRAM_MAX as u8 + 3; 3]);
        assert!(classes.iter().all(|&c| (c as usize) < DRAFT_CLASSES));
    }

    #[test]
    fn no_draft_from_too_little_history() {
        let ctx = full(&[5, 6, 5]);
        let empty = NgramCache::new();
        assert!(draft_tokens(&[5], 4, &NgramParams::default(), &ctx, &empty, &empty).is_empty());
        assert!(draft_tokens(&[], 4, &NgramParams::default(), &ctx, &empty, &empty).is_empty());
        assert!(draft_tokens(&[6, 5], 0, &NgramParams::default(), &ctx, &empty, &empty).is_empty());
    }

    #[test]
    fn rare_continuations_are_not_drafted() {
        let empty = NgramCache::new();
        let params = NgramParams::default();
        // 1-gram "9" seen once: fewer than the 2 samples the lax table wants.
        let ctx = full(&[9, 4, 0, 0, 9]);
        assert!(draft_tokens(&[0, 9], 4, &params, &ctx, &empty, &empty).is_empty());

        // "5" followed by 1, 2, 3, 1: best share 50% < 66% for 1-grams.
        let ctx = full(&[5, 1, 5, 2, 5, 3, 5, 1]);
        assert!(draft_tokens(&[0, 5], 1, &params, &ctx, &empty, &empty).is_empty());
        // ... while 2 of 3 passes (66.7% >= 66%).
        let ctx = full(&[5, 1, 5, 2, 5, 1]);
        assert_eq!(draft_tokens(&[0, 5], 1, &params, &ctx, &empty, &empty), vec![1]);

        // The dynamic cache is strict: 3 of 4 passes 75%, 2 of 3 does not.
        let dynamic = full(&[5, 1, 5, 2, 5, 1]);
        assert!(draft_tokens(&[0, 5], 1, &params, &empty, &dynamic, &empty).is_empty());
        let dynamic = full(&[5, 1, 5, 2, 5, 1, 5, 1]);
        assert_eq!(draft_tokens(&[0, 5], 1, &params, &empty, &dynamic, &empty), vec![1]);
    }

    #[test]
    fn longest_ngram_wins_then_shorter_fallback() {
        let empty = NgramCache::new();
        let params = NgramParams::default();
        // after "7 8" came 9 (once); after "8" came 3 twice and 9 once.
        // The 2-gram [7,8] has one sample (< 2): fall back to the 1-gram.
        let ctx = full(&[8, 3, 8, 3, 7, 8, 9]);
        assert_eq!(draft_tokens(&[7, 8], 1, &params, &ctx, &empty, &empty), vec![3]);
        // The 3-gram [6,7,8] needs only one sample: it wins.
        let ctx = full(&[8, 3, 8, 3, 6, 7, 8, 9]);
        assert_eq!(draft_tokens(&[6, 7, 8], 1, &params, &ctx, &empty, &empty), vec![9]);
    }

    #[test]
    fn static_cache_breaks_ties_and_drafts_last() {
        let empty = NgramCache::new();
        let params = NgramParams::default();
        // "2 5" followed by 1 and by 3 once each: 50% passes the lax 2-gram
        // threshold; the tie goes to the smaller token without a static cache ...
        let ctx = full(&[2, 5, 1, 0, 2, 5, 3]);
        assert_eq!(draft_tokens(&[2, 5], 1, &params, &ctx, &empty, &empty), vec![1]);
        // ... and to the token the static cache knows with one.
        let mut stat = NgramCache::new();
        stat.update(&[2, 5, 3, 2, 5, 3], NGRAM_STATIC, NGRAM_STATIC, 6);
        assert_eq!(draft_tokens(&[2, 5], 1, &params, &ctx, &empty, &stat), vec![3]);
        // Alone, the static cache drafts with the lax 2-gram thresholds.
        assert_eq!(draft_tokens(&[2, 5], 1, &params, &empty, &empty, &stat), vec![3]);
        let mut thin = NgramCache::new();
        thin.update(&[2, 5, 3], NGRAM_STATIC, NGRAM_STATIC, 3);
        assert!(draft_tokens(&[2, 5], 1, &params, &empty, &empty, &thin).is_empty());
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = full(&[1, 2, 3]);
        let b = full(&[1, 2, 4, 1, 2, 3]);
        a.merge(&b);
        assert_eq!(a.followers(&ng(&[1, 2])), vec![(3, 2), (4, 1)]);
        assert_eq!(a.count(&ng(&[2, 4]), 1), 1);
        assert_eq!(a.count(&ng(&[1]), 2), 3);

        let mut empty = NgramCache::new();
        empty.merge(&b);
        assert_eq!(empty, b);
        let mut owned = full(&[1, 2, 3]);
        owned.merge_capped(b.clone(), usize::MAX);
        assert_eq!(owned, a);
    }

    #[test]
    fn file_round_trip() {
        let c = full(&[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]);
        let mut bytes = Vec::new();
        c.write_to(&mut bytes).unwrap();
        let back = read(&bytes).unwrap();
        assert_eq!(back, c);
        // deterministic bytes
        let mut again = Vec::new();
        back.write_to(&mut again).unwrap();
        assert_eq!(again, bytes);

        let dir = std::env::temp_dir().join(format!("ngram-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache.bin");
        c.save(&path).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
        assert_eq!(NgramCache::load(&path).unwrap(), c);
        NgramCache::new().save(&path).unwrap(); // overwrite
        assert!(NgramCache::load(&path).unwrap().is_empty());
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary files left behind");

        let missing = NgramCache::load(&dir.join("nope.bin")).unwrap_err();
        assert_eq!(missing.code, ErrorCode::InvalidRequest);
        assert!(missing.message.starts_with("ngram cache: "));
        let bad = NgramCache::new().save(&dir.join("no-such-dir").join("x.bin")).unwrap_err();
        assert_eq!(bad.code, ErrorCode::InvalidRequest);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_llama_cpp_bytes() {
        let mut bytes = record([10, 20, -1, -1], &[(30, 5), (31, 2)]);
        bytes.extend(record([7, -1, -1, -1], &[(8, 1)]));
        let c = read(&bytes).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.followers(&ng(&[10, 20])), vec![(30, 5), (31, 2)]);
        assert_eq!(c.followers(&ng(&[7])), vec![(8, 1)]);
        // and drafts from it as a dynamic cache: 5 of 7 = 71% >= 66%, 7 >= 3.
        let empty = NgramCache::new();
        let d = draft_tokens(&[10, 20], 1, &NgramParams::default(), &empty, &c, &empty);
        assert_eq!(d, vec![30]);
        // and writes the same bytes back (records sorted: [7] first)
        let mut out = Vec::new();
        c.write_to(&mut out).unwrap();
        let mut expected = record([7, -1, -1, -1], &[(8, 1)]);
        expected.extend(record([10, 20, -1, -1], &[(30, 5), (31, 2)]));
        assert_eq!(out, expected);
    }

    #[test]
    fn empty_input_is_an_empty_cache() {
        assert!(read(&[]).unwrap().is_empty());
    }

    #[test]
    fn duplicate_records_add_up() {
        let mut bytes = record([1, -1, -1, -1], &[(2, 3)]);
        bytes.extend(record([1, -1, -1, -1], &[(2, 4), (5, 1)]));
        let c = read(&bytes).unwrap();
        assert_eq!(c.followers(&ng(&[1])), vec![(2, 7), (5, 1)]);
    }

    fn rejected(bytes: &[u8]) -> String {
        let e = read(bytes).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert!(e.message.starts_with("ngram cache: "), "{}", e.message);
        e.message
    }

    #[test]
    fn rejects_truncated_files() {
        let mut bytes = record([10, 20, -1, -1], &[(30, 5), (31, 2)]);
        let second = bytes.len(); // 36
        bytes.extend(record([7, -1, -1, -1], &[(8, 1)]));
        // mid-follower of the second record
        let m = rejected(&bytes[..bytes.len() - 3]);
        assert!(m.contains("truncated") && m.contains(&format!("byte {}", second + 20)), "{m}");
        assert!(m.contains(&format!("record at byte {second}")), "{m}");
        // mid-head of the second record
        let m = rejected(&bytes[..second + 7]);
        assert!(m.contains(&format!("truncated record at byte {second}")), "{m}");
        // after the head, before any follower
        let m = rejected(&bytes[..second + 20]);
        assert!(m.contains("follower 1 of 1"), "{m}");
        // a stray byte
        rejected(&[0]);
    }

    #[test]
    fn rejects_corrupt_values() {
        let mut bytes = record([1, -1, -1, -1], &[(2, 3)]);
        bytes[16..20].copy_from_slice(&(-2i32).to_le_bytes());
        let m = rejected(&bytes);
        assert!(m.contains("invalid follower count -2 at byte 16"), "{m}");

        let zero = record([1, -1, -1, -1], &[]);
        assert!(rejected(&zero).contains("invalid follower count 0"));

        let mut absurd = record([1, -1, -1, -1], &[(2, 3)]);
        absurd[16..20].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(rejected(&absurd).contains("invalid follower count"));

        let m = rejected(&record([1, -1, -1, -1], &[(2, 3), (4, -1)]));
        assert!(m.contains("non-positive count -1 at byte 32"), "{m}");
        let m = rejected(&record([1, -1, -1, -1], &[(-5, 1)]));
        assert!(m.contains("negative follower token -5 at byte 20"), "{m}");
        let m = rejected(&record([-1, -1, -1, -1], &[(2, 1)]));
        assert!(m.contains("malformed n-gram"), "{m}");
        let m = rejected(&record([1, -1, 3, -1], &[(2, 1)]));
        assert!(m.contains("malformed n-gram"), "{m}");
    }

    #[test]
    fn default_params_are_consistent() {
        let p = NgramParams::default();
        assert!((NGRAM_MIN..=NGRAM_MAX).contains(&p.ngram_max));
        assert!((NGRAM_MIN..=p.ngram_max).contains(&p.ngram_min));
        assert!(p.draft_min_percent_lax.iter().chain(&p.draft_min_percent_strict).all(|&pc| pc <= 100));
    }

    #[test]
    fn drafter_begin_draft_end() {
        let dynamic = Arc::new(Mutex::new(full(&[50, 51])));
        let mut d = NgramDrafter::new(NgramParams::default(), dynamic.clone(), None);
        assert_eq!(d.name(), "ngram");

        let prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3];
        d.begin(&prompt);
        assert_eq!(d.context(), &full(&prompt));

        let draft = d.draft(&prompt, 3, 0).expect("a draft");
        assert_eq!(draft.tokens, vec![4, 5, 6]);
        assert_eq!(draft.source, TokenSource::Ngram);
        d.accept(2);

        // history grows by the accepted tokens plus a correction
        let mut history = prompt.to_vec();
        history.extend_from_slice(&[4, 5, 9]);
        assert!(d.draft(&history, 4, 0).is_none(), "nothing follows 9");
        assert_eq!(d.context(), &full(&history), "incremental = one-shot");
        d.accept(0);
        assert_eq!(d.counts(), (3, 2));
        assert!(d.draft(&history, 0, 0).is_none());

        // a rewritten history (context shift) rebuilds the context cache
        let shifted = [1, 2, 4, 9, 1, 2];
        let _ = d.draft(&shifted, 2, 0);
        assert_eq!(d.context(), &full(&shifted));
        let mut same_len = shifted;
        same_len[5] = 7;
        let _ = d.draft(&same_len, 2, 0);
        assert_eq!(d.context(), &full(&same_len));

        // begin starts over; end merges the context into the dynamic cache
        d.begin(&prompt);
        assert_eq!(d.context(), &full(&prompt));
        let _ = d.draft(&history, 1, 0);
        assert_eq!(d.context(), &full(&history));
        d.end();
        assert!(d.context().is_empty());
        let mut expected = full(&[50, 51]);
        expected.merge(&full(&history));
        assert_eq!(*dynamic.lock().unwrap(), expected);
        d.end(); // nothing more to merge
        assert_eq!(*dynamic.lock().unwrap(), expected);

        // The next request drafts from the dynamic cache alone (strict
        // thresholds): [1,2,3] -> 4 and [1,2,3,4] -> 5 were seen twice, but
        // [2,3,4,5] was followed once by 6 and once by 9 (50% < 66%).
        let mut d2 = NgramDrafter::new(NgramParams::default(), dynamic.clone(), None);
        d2.begin(&[40, 1, 2, 3]);
        assert_eq!(d2.draft(&[40, 1, 2, 3], 8, 0).expect("a draft").tokens, vec![4, 5]);
    }

    #[test]
    fn shareable_across_threads() {
        fn send<T: Send>() {}
        fn sync<T: Send + Sync>() {}
        send::<NgramDrafter>();
        sync::<NgramCache>();
    }

    #[test]
    fn drafter_uses_static_cache() {
        let mut stat = NgramCache::new();
        stat.update(&[8, 9, 10, 8, 9, 10], NGRAM_STATIC, NGRAM_STATIC, 6);
        let dynamic = Arc::new(Mutex::new(NgramCache::new()));
        let mut d = NgramDrafter::new(NgramParams::default(), dynamic, Some(Arc::new(stat)));
        d.begin(&[8, 9]);
        let draft = d.draft(&[8, 9], 4, 0).expect("static draft");
        assert_eq!(draft.tokens[0], 10);
    }

    #[test]
    fn merge_capped_stops_adding_ngrams_at_the_cap() {
        let mut a = NgramCache::new();
        a.update(&[1, 2, 3], 1, 1, 3); // [1]->2, [2]->3
        let mut b = NgramCache::new();
        b.update(&[1, 2, 7, 8, 9], 1, 1, 5); // [1]->2, [2]->7, [7]->8, [8]->9
        a.merge_capped(b.clone(), 3);
        assert_eq!(a.len(), 3);
        assert_eq!(a.followers(&Ngram::new(&[1])), vec![(2, 2)]);
        assert_eq!(a.followers(&Ngram::new(&[2])), vec![(3, 1), (7, 1)]);
        // Under the cap it equals merge.
        let mut c = NgramCache::new();
        c.update(&[1, 2, 3], 1, 1, 3);
        let mut d = c.clone();
        c.merge_capped(b.clone(), usize::MAX);
        d.merge(&b);
        assert_eq!(c, d);
        // An empty cache takes a small one whole, and a big one only up to the cap.
        let mut e = NgramCache::new();
        e.merge_capped(b.clone(), 2);
        assert_eq!(e.len(), 2);
    }
}
