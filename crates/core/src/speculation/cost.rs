//! What decoding costs: the one owner of the batch-cost arithmetic. The
//! target's measured cost per batch size (`BatchCost`), what one step of
//! several requests costs, and what adding drafted tokens to it costs
//! (`StepPrice`, `DraftPrices`): the price the draft controller weighs
//! drafts against and the scheduler trims them by.
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

/// The target's cost to decode a batch of n tokens, n = 1..=max.
///
/// Costs are re-measured by every step the engine runs, but a size it has
/// not run lately (a draft length the controller stopped choosing) would
/// keep the cost of whenever it ran last — one busy moment at load could
/// price drafting out for the engine's life. So a size's cost is kept as
/// its ratio to the cost of one token, measured when both were fresh, and
/// follows the one-token cost, which plain decoding re-measures every step:
/// the machine's drift moves every size together.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatchCost {
    /// A batch of one (ms), running average.
    t1: Option<f64>,
    /// For n > 1: cost(n) / cost(1), running average; for a size measured
    /// before any batch of one, its cost in ms.
    ratio: Vec<Option<f64>>,
    ms: Vec<Option<f64>>,
}

/// Weight of a new measurement in the running averages.
const NEW_WEIGHT: f64 = 0.2;

fn average(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o * (1.0 - NEW_WEIGHT) + new * NEW_WEIGHT)
}

impl BatchCost {
    pub fn new(max: usize) -> Self {
        BatchCost { t1: None, ratio: vec![None; max + 1], ms: vec![None; max + 1] }
    }

    pub fn max(&self) -> usize {
        self.ms.len() - 1
    }

    /// Whether costs read from a file are usable: sizes 1..=`max_len` on
    /// both lists alike, every value a positive finite number.
    pub fn is_sane(&self, max_len: usize) -> bool {
        let ok = |v: &Option<f64>| v.is_none_or(|x| x.is_finite() && x > 0.0);
        (2..=max_len + 1).contains(&self.ms.len())
            && self.ratio.len() == self.ms.len()
            && ok(&self.t1)
            && self.ratio.iter().chain(&self.ms).all(ok)
    }

    /// Records a measured decode of `n` tokens.
    pub fn observe(&mut self, n: usize, ms: f64) {
        if n == 0 || n > self.max() || !ms.is_finite() || ms <= 0.0 {
            return;
        }
        if n == 1 {
            self.t1 = Some(average(self.t1, ms));
            return;
        }
        match self.t1 {
            Some(t1) => self.ratio[n] = Some(average(self.ratio[n], ms / t1)),
            None => self.ms[n] = Some(average(self.ms[n], ms)),
        }
    }

    /// The current cost of a batch of `n` (a size measured at some point,
    /// moved with the one-token cost since).
    pub fn measured(&self, n: usize) -> Option<f64> {
        if n == 1 {
            return self.t1;
        }
        match (self.t1, self.ratio.get(n).copied().flatten()) {
            (Some(t1), Some(r)) => Some(t1 * r),
            _ => self.ms.get(n).copied().flatten(),
        }
    }

    /// Estimated cost of a batch of `n`: measured if we have it, otherwise
    /// interpolated between the nearest measured sizes (or extrapolated from
    /// the last two), never decreasing with n.
    pub fn estimate(&self, n: usize) -> Option<f64> {
        let n = n.clamp(1, self.max());
        if let Some(v) = self.measured(n) {
            return Some(v);
        }
        let known: Vec<(usize, f64)> = (1..=self.max()).filter_map(|i| self.measured(i).map(|v| (i, v))).collect();
        match known.len() {
            0 => None,
            1 => Some(known[0].1 * n as f64 / known[0].0 as f64),
            _ => {
                let below = known.iter().rev().find(|(i, _)| *i < n);
                let above = known.iter().find(|(i, _)| *i > n);
                let ((i0, v0), (i1, v1)) = match (below, above) {
                    (Some(&b), Some(&a)) => (b, a),
                    (None, _) => (known[0], known[1]),
                    (Some(_), None) => (known[known.len() - 2], known[known.len() - 1]),
                };
                let slope = ((v1 - v0) / (i1 as f64 - i0 as f64)).max(0.0);
                Some((v0 + slope * (n as f64 - i0 as f64)).max(known[0].1.min(v0)))
            }
        }
    }
}

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

    /// This price with every cost times `factor` (the same step on a
    /// machine that much faster or slower).
    pub fn scaled(&self, factor: f64) -> StepPrice {
        let factor = if factor.is_finite() && factor > 0.0 { factor } else { 1.0 };
        StepPrice {
            base_tokens: self.base_tokens,
            base_ms: self.base_ms * factor,
            extra_ms: self.extra_ms.iter().map(|x| x * factor).collect(),
        }
    }
}

/// What drafting costs in the step being planned, for one request.
#[derive(Debug, Clone, Default)]
pub struct DraftPrices {
    /// For drafts that cost nothing to make (a lookup): this request's
    /// share of a step where every generating request drafts as much
    /// (`StepPrice::shared`). Optimistic on purpose: the step's joint trim
    /// (`schedule::trim`) then shortens what does not pay together.
    pub lookup: Option<StepPrice>,
    /// For drafts that take time to make (a draft model): what they add to
    /// the step as planned so far (`StepPrice::in_step`), so no time is
    /// spent on drafts the trim would drop.
    pub made: Option<StepPrice>,
}

impl DraftPrices {
    /// The same price for both kinds (a request alone).
    pub fn both(price: Option<StepPrice>) -> Self {
        DraftPrices { lookup: price.clone(), made: price }
    }
}

/// Cost tables for the tests of this module and of those that price with it.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{BatchCost, Part};

    pub fn p(seq: i32, tokens: usize) -> Part {
        Part { seq, tokens }
    }

    /// Round numbers up to 64 rows.
    pub fn costs() -> BatchCost {
        let mut c = BatchCost::new(600);
        for (n, ms) in [(1, 10.0), (2, 15.0), (4, 24.0), (8, 40.0), (16, 70.0), (33, 140.0), (64, 260.0)] {
            c.observe(n, ms);
        }
        c
    }

    /// The batch costs measured on the 2-core reference machine (docs/benchmarks.md).
    pub fn cpu_costs() -> BatchCost {
        let mut c = BatchCost::new(17);
        for (n, ms) in [(1, 7.9), (2, 14.5), (4, 21.0), (8, 33.5), (16, 62.0)] {
            c.observe(n, ms);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{costs, cpu_costs, p};
    use super::*;

    #[test]
    fn batch_cost_interpolates_and_extrapolates() {
        let c = cpu_costs();
        assert_eq!(c.estimate(2), Some(14.5));
        let t3 = c.estimate(3).unwrap();
        assert!(t3 > 14.5 && t3 < 21.0);
        let t17 = c.estimate(17).unwrap();
        assert!(t17 >= 62.0);
        assert!(BatchCost::new(8).estimate(3).is_none());
    }

    #[test]
    fn sizes_not_run_lately_follow_the_drift_of_one_token() {
        // Measured at load on a busy moment: t1 20, t4 80 (ratio 4).
        let mut c = BatchCost::new(16);
        c.observe(1, 20.0);
        c.observe(4, 80.0);
        // Then only plain decoding runs, on a machine twice as fast.
        for _ in 0..40 {
            c.observe(1, 10.0);
        }
        let t4 = c.measured(4).unwrap();
        assert!((t4 - 40.0).abs() < 0.5, "{t4}");
        // A size run again corrects its ratio.
        for _ in 0..40 {
            c.observe(4, 25.0);
        }
        assert!((c.measured(4).unwrap() - 25.0).abs() < 0.5);
        // Before any batch of one, sizes are kept as measured.
        let mut d = BatchCost::new(8);
        d.observe(3, 30.0);
        assert_eq!(d.measured(3), Some(30.0));
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
}
