//! Looking a draft up in the caches: which n-gram sizes and thresholds,
//! and the class each drafted token gets (which cache matched it, and with
//! how long an n-gram).

use super::cache::{Followers, Ngram, NgramCache, NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC, PAD};

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

/// Acceptance the engine assumes for n-gram drafts before it has measured
/// any.
pub const NGRAM_PRIOR: f64 = 0.6;
