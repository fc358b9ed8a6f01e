//! How a step is put together beside other requests: the joint trim of the
//! step's drafts (`trim`) and how much of a prompt a request evaluates in
//! one step (`prefill_chunk`). Prices come from `cost`.

use super::cost::{step_ms, BatchCost, Part};

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

/// A step that prefills beside streaming requests is kept within this long
/// (or three of their plain steps, on a model where one step is longer)
/// by the measured batch costs: they wait at most that between two tokens.
pub const PREFILL_STEP_MS: f64 = 100.0;
/// The least a prompt advances in a step, whatever the costs say.
pub const MIN_PREFILL_CHUNK: usize = 16;

/// How many prompt tokens a request being prefilled may evaluate this step,
/// with `used` tokens already in the batch (`others_generating`: some of
/// them stream): all it has left (up to the batch, `room`) when nobody
/// else is generating; else as many as keep the step within its time
/// budget by `costs` (at least `MIN_PREFILL_CHUNK` when `first`, the
/// step's first prompt chunk, so that every prompt advances).
pub fn prefill_chunk(left: usize, used: usize, others_generating: bool, room: usize, costs: &BatchCost, first: bool) -> usize {
    let cap = left.min(room);
    if !others_generating {
        return cap;
    }
    let Some(plain) = costs.estimate(used.max(1)) else { return cap.min(MIN_PREFILL_CHUNK) };
    let budget = PREFILL_STEP_MS.max(3.0 * plain);
    // The batch cost grows with its size: the largest chunk within budget.
    let (mut lo, mut hi) = (0, cap);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if costs.estimate(used + mid).is_some_and(|ms| ms <= budget) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if first {
        lo.max(MIN_PREFILL_CHUNK.min(cap))
    } else {
        lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculation::cost::fixtures::{costs, p};

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
    fn prefill_chunks_only_when_others_are_generating_and_within_the_step_budget() {
        let c = costs(); // 10 ms for 1, 40 for 8, 70 for 16, 140 for 33, 260 for 64
                         // Alone: all it has left, up to the batch.
        assert_eq!(prefill_chunk(1000, 0, false, 512, &c, true), 512);
        assert_eq!(prefill_chunk(100, 0, false, 512, &c, true), 100);
        // Beside one stream: the step stays within 100 ms (or 3 plain steps).
        let n = prefill_chunk(1000, 1, true, 511, &c, true);
        assert!(c.estimate(1 + n).unwrap() <= PREFILL_STEP_MS && c.estimate(2 + n).unwrap() > PREFILL_STEP_MS, "{n}");
        assert_eq!(prefill_chunk(5, 1, true, 511, &c, true), 5);
        assert_eq!(prefill_chunk(1000, 1, true, 10, &c, true), 10);
        // Where one plain step is long (30 streams here), three of them.
        let n = prefill_chunk(1000, 30, true, 400, &c, false);
        assert!(n > 0 && c.estimate(30 + n).unwrap() <= 3.0 * c.estimate(30).unwrap(), "{n}");
        // Unmeasured costs: a small chunk.
        assert_eq!(prefill_chunk(1000, 1, true, 400, &BatchCost::new(600), true), MIN_PREFILL_CHUNK);
    }
}
