//! What one decoding step of several requests costs, and what adding tokens
//! to it costs: the price the draft controller weighs drafts against.
//!
//! Each request (slot) decodes in its own llama.cpp sequence, and the engine's
//! context keeps one KV stream per sequence (not a unified cache), so a
//! request's attention sums over its own cells in the order plain decoding
//! uses, whatever its neighbours do. llama.cpp then splits a batch into
//! micro-batches with `split_equal`: each micro-batch takes the same number
//! of tokens from every sequence in it, and only from sequences with
//! consecutive ids. A step's cost is the sum of its micro-batches' costs,
//! and the marginal cost of k more tokens for one request is
//! `cost(step + k) - cost(step)` — small when they ride along with others,
//! a whole extra micro-batch when they do not.

use super::controller::BatchCost;

/// Tokens one sequence puts into a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub seq: i32,
    pub tokens: usize,
}

/// The sizes of the micro-batches llama.cpp makes of a batch holding
/// `parts` (in sequence order), for a context with `n_stream` KV streams and
/// micro-batches of at most `n_ubatch` tokens. With one stream it cuts the
/// batch in order (`split_simple`); with several it groups equal shares of
/// sequences with consecutive ids (`split_equal`, sequential).
pub fn ubatches(parts: &[Part], n_stream: usize, n_ubatch: usize) -> Vec<usize> {
    let n_ubatch = n_ubatch.max(1);
    let total: usize = parts.iter().map(|p| p.tokens).sum();
    if n_stream <= 1 {
        let mut out = vec![n_ubatch; total / n_ubatch];
        if !total.is_multiple_of(n_ubatch) {
            out.push(total % n_ubatch);
        }
        return out;
    }
    let mut left: Vec<(i32, usize)> = parts.iter().filter(|p| p.tokens > 0).map(|p| (p.seq, p.tokens)).collect();
    let mut out = Vec::new();
    while !left.is_empty() {
        // The sequences of this micro-batch: from the first with tokens left,
        // those that follow it with consecutive ids.
        let mut group = vec![0usize];
        for i in 1..left.len() {
            if left[i].0 == left[group[group.len() - 1]].0 + 1 {
                group.push(i);
            }
            if group.len() > n_ubatch {
                break;
            }
        }
        group.truncate(n_ubatch);
        let share = group.iter().map(|&i| left[i].1).min().unwrap_or(0).min(n_ubatch / group.len()).max(1);
        for &i in &group {
            left[i].1 -= share.min(left[i].1);
        }
        out.push(share * group.len());
        left.retain(|p| p.1 > 0);
    }
    out
}

/// The estimated time (ms) of a step decoding `parts`.
pub fn step_ms(parts: &[Part], n_stream: usize, n_ubatch: usize, costs: &BatchCost) -> Option<f64> {
    ubatches(parts, n_stream, n_ubatch).into_iter().map(|n| costs.estimate(n)).sum()
}

/// What verifying drafted tokens costs in the step being planned, for one
/// request: the step yields `base_tokens` and takes `base_ms` without its
/// drafts; `extra_ms[k]` is what k drafted tokens add (`extra_ms[0] == 0`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepPrice {
    pub base_tokens: f64,
    pub base_ms: f64,
    pub extra_ms: Vec<f64>,
}

impl StepPrice {
    /// The price of a request decoding alone: a batch of 1 + k tokens
    /// against a plain step of one.
    pub fn alone(costs: &BatchCost, k_max: usize) -> Option<StepPrice> {
        let t1 = costs.estimate(1)?;
        let extra_ms = (0..=k_max).map(|k| costs.estimate(k + 1).map(|t| (t - t1).max(0.0))).collect::<Option<Vec<f64>>>()?;
        Some(StepPrice { base_tokens: 1.0, base_ms: t1, extra_ms })
    }

    /// The price of `k_max` more tokens for sequence `seq` in a step whose
    /// other parts are `others` (each generating request counts one token
    /// of output; prefill chunks none). `seq` itself decodes one token
    /// (its pending one) before any drafts.
    pub fn in_step(
        others: &[Part],
        generating: usize,
        seq: i32,
        k_max: usize,
        n_stream: usize,
        n_ubatch: usize,
        costs: &BatchCost,
    ) -> Option<StepPrice> {
        let with = |k: usize| {
            let mut parts: Vec<Part> = others.to_vec();
            parts.push(Part { seq, tokens: 1 + k });
            parts.sort_by_key(|p| p.seq);
            step_ms(&parts, n_stream, n_ubatch, costs)
        };
        let base_ms = with(0)?;
        let extra_ms = (0..=k_max).map(|k| with(k).map(|t| (t - base_ms).max(0.0))).collect::<Option<Vec<f64>>>()?;
        Some(StepPrice { base_tokens: generating.max(1) as f64, base_ms, extra_ms })
    }

    /// One request's share of a step in which every generating request
    /// (`generating`, their sequences) drafts as many tokens as it does,
    /// beside the prompt chunks `prefill`: the price of a lookup, whose
    /// drafts cost nothing to make. Drafts of equal length fill llama.cpp's
    /// micro-batches evenly, so this is what drafting costs when others
    /// draft too; where they do not, [`trim`] shortens what does not pay.
    pub fn shared(
        prefill: &[Part],
        generating: &[i32],
        k_max: usize,
        n_stream: usize,
        n_ubatch: usize,
        costs: &BatchCost,
    ) -> Option<StepPrice> {
        let n = generating.len().max(1) as f64;
        let with = |k: usize| {
            let mut parts: Vec<Part> = prefill.to_vec();
            parts.extend(generating.iter().map(|&seq| Part { seq, tokens: 1 + k }));
            parts.sort_by_key(|p| p.seq);
            step_ms(&parts, n_stream, n_ubatch, costs)
        };
        let base_ms = with(0)?;
        let extra_ms = (0..=k_max).map(|k| with(k).map(|t| (t - base_ms).max(0.0) / n)).collect::<Option<Vec<f64>>>()?;
        Some(StepPrice { base_tokens: 1.0, base_ms: base_ms / n, extra_ms })
    }

    pub fn max_k(&self) -> usize {
        self.extra_ms.len().saturating_sub(1)
    }

    /// The step's throughput (tokens per ms) when k drafted tokens are added
    /// for `draft_ms` of drafting, yielding `expected` tokens for this
    /// request instead of 1.
    pub fn rate(&self, k: usize, expected: f64, draft_ms: f64) -> f64 {
        (self.base_tokens - 1.0 + expected) / (self.base_ms + self.extra_ms[k.min(self.max_k())] + draft_ms)
    }

    /// The step's throughput without drafts.
    pub fn base_rate(&self) -> f64 {
        self.base_tokens / self.base_ms
    }

    /// What one token costs in this step, on average (ms).
    pub fn ms_per_token(&self) -> f64 {
        self.base_ms / self.base_tokens
    }
}

/// The least gain in expected tokens per ms for which a step beside other
/// requests verifies drafts at all (see [`trim`]).
pub const LOAD_MARGIN: f64 = 0.05;

/// A draft planned for a step that may be shortened: its request's
/// sequence and the expected tokens of the step for each length it could
/// keep (`expected[j]` for the first j tokens; `expected[0]` is 1, the
/// token the target always adds).
#[derive(Debug, Clone)]
pub struct Trimmable<'a> {
    pub seq: i32,
    pub expected: &'a [f64],
}

/// How much of each draft in a step to verify: the lengths (each at most
/// what was drafted) that give the step the most expected tokens per ms.
/// `fixed` are the step's parts that stay as they are (prompt chunks,
/// requests decoding without a draft or with a fixed one), which yield
/// `fixed_tokens`. The drafts are already made: only verifying them costs.
///
/// Drafts were planned one request at a time; together they may split a
/// batch into more micro-batches than any one of them expected (a draft
/// beside requests without one is a micro-batch of its own). A common cap
/// for all drafts is tried first (equal lengths keep the micro-batches
/// whole), then each draft's length with the others held. Drafts that
/// promise the step less than [`LOAD_MARGIN`] more are all dropped: beside
/// other requests a batch is near the CPU's throughput, and a draft's
/// estimated acceptance is not sure enough to gamble a slower step on.
pub fn trim(fixed: &[Part], fixed_tokens: f64, drafts: &[Trimmable], n_stream: usize, n_ubatch: usize, costs: &BatchCost) -> Vec<usize> {
    let mut ks: Vec<usize> = drafts.iter().map(|d| d.expected.len().saturating_sub(1)).collect();
    let rate = |ks: &[usize]| -> Option<f64> {
        let mut parts: Vec<Part> = fixed.to_vec();
        parts.extend(drafts.iter().zip(ks).map(|(d, &k)| Part { seq: d.seq, tokens: 1 + k }));
        parts.sort_by_key(|p| p.seq);
        let ms = step_ms(&parts, n_stream, n_ubatch, costs)?;
        let tokens = fixed_tokens + drafts.iter().zip(ks).map(|(d, &k)| d.expected.get(k).copied().unwrap_or(1.0)).sum::<f64>();
        (ms > 0.0).then_some(tokens / ms)
    };
    let Some(mut best) = rate(&ks) else { return ks };
    let none = vec![0; ks.len()];
    let Some(plain) = rate(&none) else { return ks };
    // Strictly better only, so ties keep the longer drafts.
    let better = |r: f64, best: f64| r > best * (1.0 + 1e-9);
    let longest = ks.iter().copied().max().unwrap_or(0);
    let mut capped = ks.clone();
    for cap in 0..longest {
        let trial: Vec<usize> = ks.iter().map(|&k| k.min(cap)).collect();
        if let Some(r) = rate(&trial) {
            if better(r, best) {
                best = r;
                capped = trial;
            }
        }
    }
    ks = capped;
    for _ in 0..4 {
        let mut changed = false;
        for i in 0..ks.len() {
            for k in 0..ks[i] {
                let mut trial = ks.clone();
                trial[i] = k;
                if let Some(r) = rate(&trial) {
                    if better(r, best) {
                        best = r;
                        ks = trial;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if best < plain * (1.0 + LOAD_MARGIN) {
        return none;
    }
    ks
}

/// How many prompt tokens a request being prefilled may evaluate this step:
/// all it has left (up to the batch) when nobody else is generating, else a
/// chunk, so the requests that stream wait at most one chunk between tokens.
pub fn prefill_chunk(left: usize, others_generating: bool, room: usize, chunk: usize) -> usize {
    let cap = if others_generating { chunk.min(room) } else { room };
    left.min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(seq: i32, tokens: usize) -> Part {
        Part { seq, tokens }
    }

    fn costs() -> BatchCost {
        let mut c = BatchCost::new(600);
        for (n, ms) in [(1, 10.0), (2, 15.0), (4, 24.0), (8, 40.0), (16, 70.0), (33, 140.0), (64, 260.0)] {
            c.observe(n, ms);
        }
        c
    }

    #[test]
    fn one_stream_cuts_in_order() {
        assert_eq!(ubatches(&[p(0, 700)], 1, 512), vec![512, 188]);
        assert_eq!(ubatches(&[p(0, 3), p(1, 4)], 1, 512), vec![7]);
    }

    #[test]
    fn streams_take_equal_shares_of_consecutive_sequences() {
        // Four requests decoding one token each: one micro-batch.
        assert_eq!(ubatches(&[p(0, 1), p(1, 1), p(2, 1), p(3, 1)], 4, 512), vec![4]);
        // One prefilling 256 beside three decoding: the shares, then the rest.
        assert_eq!(ubatches(&[p(0, 1), p(1, 1), p(2, 256), p(3, 1)], 4, 512), vec![4, 255]);
        // Drafts of different lengths come apart in levels.
        assert_eq!(ubatches(&[p(0, 1), p(1, 4), p(2, 9), p(3, 17)], 4, 512), vec![4, 9, 10, 8]);
        // A gap in the sequence ids splits the batch.
        assert_eq!(ubatches(&[p(0, 1), p(2, 1)], 4, 512), vec![1, 1]);
        // The micro-batch limit holds.
        assert_eq!(ubatches(&[p(0, 300), p(1, 300)], 4, 512), vec![512, 88]);
        assert_eq!(ubatches(&[], 4, 512), Vec::<usize>::new());
    }

    #[test]
    fn alone_the_price_is_the_batch_cost() {
        let c = costs();
        let price = StepPrice::alone(&c, 8).unwrap();
        assert_eq!(price.base_ms, 10.0);
        assert_eq!(price.extra_ms[0], 0.0);
        assert_eq!(price.extra_ms[1], 5.0);
        assert_eq!(price.extra_ms[7], 30.0);
        // in_step with nobody else is the same.
        assert_eq!(StepPrice::in_step(&[], 1, 0, 8, 4, 512, &c), Some(price));
    }

    #[test]
    fn drafts_riding_along_cost_less_than_an_extra_micro_batch() {
        let c = costs();
        // Three others decode one token each; this request is seq 1.
        let others = [p(0, 1), p(2, 1), p(3, 1)];
        let price = StepPrice::in_step(&others, 4, 1, 8, 4, 512, &c).unwrap();
        assert_eq!(price.base_ms, 24.0);
        assert_eq!(price.base_tokens, 4.0);
        // k drafts become a micro-batch of their own: t(k), not t(4+k) - t(4).
        assert_eq!(price.extra_ms[3], c.estimate(3).unwrap());
        // Under load the same drafts pay only with a higher expected return.
        let alone = StepPrice::alone(&c, 8).unwrap();
        let k = 3;
        let gain_alone = alone.rate(k, 3.0, 0.0) / alone.base_rate();
        let gain_loaded = price.rate(k, 3.0, 0.0) / price.base_rate();
        assert!(gain_alone > 1.0 && gain_loaded < gain_alone, "{gain_alone} {gain_loaded}");
    }

    #[test]
    fn the_shared_price_is_a_share_of_a_step_where_everyone_drafts() {
        let c = costs();
        // Alone it is the batch cost.
        assert_eq!(StepPrice::shared(&[], &[0], 8, 4, 512, &c), StepPrice::alone(&c, 8));
        // Two requests drafting 3 each: one micro-batch of 8 against 2.
        let price = StepPrice::shared(&[], &[0, 1], 8, 4, 512, &c).unwrap();
        assert_eq!(price.base_ms, 7.5);
        assert_eq!(price.extra_ms[3], (40.0 - 15.0) / 2.0);
        // Cheaper per request than drafting alone beside one that does not.
        let marginal = StepPrice::in_step(&[p(1, 1)], 2, 0, 8, 4, 512, &c).unwrap();
        assert!(price.extra_ms[3] < marginal.extra_ms[3]);
    }

    /// Expected tokens for a draft of `n` whose tokens are each accepted
    /// with chance `a` (given the ones before).
    fn curve(n: usize, a: f64) -> Vec<f64> {
        let (mut run, mut total) = (1.0, 1.0);
        let mut out = vec![1.0];
        for _ in 0..n {
            run *= a;
            total += run;
            out.push(total);
        }
        out
    }

    #[test]
    fn trim_keeps_drafts_that_fill_the_micro_batch_together() {
        let c = costs();
        let (a, b) = (curve(3, 0.9), curve(3, 0.9));
        let drafts = [Trimmable { seq: 0, expected: &a }, Trimmable { seq: 1, expected: &b }];
        // Two drafts of 3: one micro-batch of 8; worth it (3.4 tokens each at 40 ms against 2 at 15).
        assert_eq!(trim(&[], 0.0, &drafts, 4, 512, &c), vec![3, 3]);
    }

    #[test]
    fn trim_drops_a_weak_lone_draft_that_would_split_the_batch() {
        let c = costs();
        let a = curve(3, 0.5);
        // Seq 0 drafts beside three requests without drafts: its 3 tokens
        // would be a micro-batch of their own (t3 on top of t4) for 0.875
        // expected tokens more; the step is better without.
        let fixed = [p(1, 1), p(2, 1), p(3, 1)];
        assert_eq!(trim(&fixed, 3.0, &[Trimmable { seq: 0, expected: &a }], 4, 512, &c), vec![0]);
        // A sure, long draft pays even so.
        let sure = curve(8, 1.0);
        assert_eq!(trim(&fixed, 3.0, &[Trimmable { seq: 0, expected: &sure }], 4, 512, &c), vec![8]);
    }

    #[test]
    fn trim_drops_drafts_that_promise_the_step_little() {
        let c = costs();
        // One token at 15 ms against none at 10: pays from 50 % acceptance,
        // is verified from 57.5 % (the margin).
        assert_eq!(trim(&[], 0.0, &[Trimmable { seq: 0, expected: &curve(1, 0.55) }], 4, 512, &c), vec![0]);
        assert_eq!(trim(&[], 0.0, &[Trimmable { seq: 0, expected: &curve(1, 0.65) }], 4, 512, &c), vec![1]);
    }

    #[test]
    fn trim_evens_out_unequal_drafts() {
        let c = costs();
        // Equal lengths keep one micro-batch; the long one's tail, likely
        // rejected, would cost a micro-batch of its own.
        let (a, b) = (curve(8, 0.6), curve(2, 0.9));
        let drafts = [Trimmable { seq: 0, expected: &a }, Trimmable { seq: 1, expected: &b }];
        let ks = trim(&[], 0.0, &drafts, 4, 512, &c);
        assert_eq!(ks[1], 2);
        assert!(ks[0] <= 2, "{ks:?}");
        // Never longer than drafted, and nothing to trim gives nothing.
        assert!(trim(&[], 0.0, &[], 4, 512, &c).is_empty());
        let none = [1.0];
        assert_eq!(trim(&[p(1, 1)], 1.0, &[Trimmable { seq: 0, expected: &none }], 4, 512, &c), vec![0]);
    }

    #[test]
    fn prefill_chunks_only_when_others_are_generating() {
        assert_eq!(prefill_chunk(1000, false, 512, 256), 512);
        assert_eq!(prefill_chunk(1000, true, 512, 256), 256);
        assert_eq!(prefill_chunk(100, true, 512, 256), 100);
        assert_eq!(prefill_chunk(1000, true, 50, 256), 50);
    }
}
