//! Offline replay of prompt-lookup drafting on a known greedy output, priced
//! with measured target batch costs: the **ceiling** (an oracle that drafts
//! exactly the tokens the target will accept, when that pays) and the
//! engine's own **policy** (the lookup plus the adaptive controller, as
//! the engine runs them). Both are free of timing noise, so the
//! policy's loss to the oracle can be measured, and tested, exactly.
//! Used by this example (`npm run bench`); its tests run with
//! `cargo test --release --example ngram_ceiling`.

use llama_engine_core::speculation::controller::DraftController;
use llama_engine_core::speculation::cost::{BatchCost, StepPrice};
use llama_engine_core::speculation::ngram::{draft_tokens_classified, NgramCache, NgramParams, CLASS_PRIORS, NGRAM_PRIOR};

/// Largest batch priced: longer drafts than speculative.n_max allows.
const MAX_BATCH: usize = 65;

/// Cost of a target batch of n tokens from the measured sizes, estimated by
/// the engine's own cost table (`BatchCost`).
#[derive(Debug, Clone)]
pub struct Prices {
    costs: BatchCost,
}

impl Prices {
    /// `batch_ms[n]` = measured cost of n tokens; needs t(1) and one more.
    pub fn new(batch_ms: &[Option<f64>]) -> Result<Prices, String> {
        let known: Vec<(usize, f64)> =
            batch_ms.iter().enumerate().filter_map(|(n, m)| m.filter(|v| n > 0 && v.is_finite() && *v > 0.0).map(|v| (n, v))).collect();
        if known.len() < 2 || known[0].0 != 1 {
            return Err("batch_ms: needs t(1) and at least one more measured size".into());
        }
        let mut costs = BatchCost::new(MAX_BATCH);
        for (n, ms) in known {
            costs.observe(n, ms);
        }
        Ok(Prices { costs })
    }

    pub fn t(&self, n: usize) -> f64 {
        self.costs.estimate(n).expect("t(1) is measured")
    }
}

/// The lookup's state along a replay: the history so far and a context
/// cache over it (default parameters, empty dynamic and static caches: a
/// fresh engine), starting from prompt + the first output token.
struct Lookup {
    params: NgramParams,
    empty: NgramCache,
    context: NgramCache,
    history: Vec<i32>,
}

impl Lookup {
    fn new(prompt: &[i32], first: i32) -> Lookup {
        let params = NgramParams::default();
        let mut history = prompt.to_vec();
        history.push(first);
        let mut context = NgramCache::new();
        context.update(&history, params.ngram_min, params.ngram_max, history.len());
        Lookup { params, empty: NgramCache::new(), context, history }
    }

    fn draft(&self, n: usize) -> (Vec<i32>, Vec<u8>) {
        draft_tokens_classified(&self.history, n, &self.params, &self.context, &self.empty, &self.empty)
    }

    /// The step produced `tokens`.
    fn advance(&mut self, tokens: &[i32]) {
        self.history.extend_from_slice(tokens);
        self.context.update(&self.history, self.params.ngram_min, self.params.ngram_max, tokens.len());
    }
}

/// What the oracle did.
#[derive(Debug, Clone, PartialEq)]
pub struct Oracle {
    /// Speed-up against plain decoding: N·t(1) / total.
    pub ceiling: f64,
    /// Target passes, tokens drafted (= accepted), tokens the lookup had
    /// right (drafted or not), total cost (ms), N = tokens from target passes.
    pub steps: usize,
    pub drafted: usize,
    pub matched: usize,
    pub total_ms: f64,
    pub tokens: usize,
}

/// The ceiling. The history starts as prompt + first output token (which
/// the prompt pass yields), with a context n-gram cache over it (default
/// parameters, empty dynamic and static caches: a fresh engine). At each
/// position the lookup drafts up to `n_max` tokens; `a` is the length of the
/// draft's prefix equal to the actual next output tokens (at most the tokens
/// left minus one, the bonus token). Verifying those `a` yields a+1 tokens
/// for t(a+1), against (a+1)·t(1) plainly: the oracle drafts exactly them
/// when t(a+1) < (a+1)·t(1), otherwise decodes one token plainly.
pub fn oracle(prompt: &[i32], output: &[i32], prices: &Prices, n_max: usize) -> Oracle {
    let t1 = prices.t(1);
    if output.len() < 2 {
        return Oracle { ceiling: 1.0, steps: 0, drafted: 0, matched: 0, total_ms: 0.0, tokens: 0 };
    }
    let mut lookup = Lookup::new(prompt, output[0]);
    let n = output.len() - 1; // tokens produced by target passes
    let mut i = 1; // next output token to produce
    let (mut total, mut steps, mut drafted, mut matched) = (0.0f64, 0usize, 0usize, 0usize);
    while i < output.len() {
        let left = output.len() - i;
        let (draft, _) = lookup.draft(n_max);
        let a = draft.iter().zip(&output[i..]).take_while(|(d, o)| d == o).count().min(left - 1);
        matched += a;
        let take = if a > 0 && prices.t(a + 1) < (a + 1) as f64 * t1 { a } else { 0 };
        total += if take > 0 { prices.t(take + 1) } else { t1 };
        drafted += take;
        steps += 1;
        lookup.advance(&output[i..i + take + 1]);
        i += take + 1;
    }
    Oracle { ceiling: n as f64 * t1 / total, steps, drafted, matched, total_ms: total, tokens: n }
}

/// The engine's n-gram policy replayed on the same output and priced the
/// same way: the lookup drafts up to `n_max` (never past the last output
/// token), the adaptive controller decides from each token's class how much
/// of it to verify, the target accepts the prefix that matches the output
/// and adds one token. Returns the speed-up against plain decoding.
pub fn policy(prompt: &[i32], output: &[i32], prices: &Prices, n_max: usize) -> f64 {
    if output.len() < 2 {
        return 1.0;
    }
    let price = StepPrice::alone(&prices.costs, n_max);
    let mut ctl = DraftController::new(n_max, true, NGRAM_PRIOR).with_loss_check(false).with_classes(&CLASS_PRIORS);
    ctl.observe_draft_cost(1, 0.01);
    let mut lookup = Lookup::new(prompt, output[0]);
    let n = output.len() - 1;
    let mut i = 1;
    let mut total = 0.0f64;
    while i < output.len() {
        let left = output.len() - i;
        let (mut draft, classes) = lookup.draft(n_max.min(left - 1));
        let k = if draft.is_empty() { 0 } else { ctl.next_length_classified(price.as_ref(), &classes) };
        draft.truncate(k);
        let a = draft.iter().zip(&output[i..]).take_while(|(d, o)| d == o).count();
        if k > 0 {
            ctl.observe_acceptance(k, a);
            ctl.observe_classes(&classes[..k], a);
            if a == k {
                ctl.reset_backoff();
            }
        }
        total += prices.t(k + 1);
        lookup.advance(&output[i..i + a + 1]);
        i += a + 1;
    }
    n as f64 * prices.t(1) / total
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_engine_core::sampling::noise::{seeded, Rng, SamplingRng};

    /// Batch costs measured on the 2-core reference machine by `npm run bench`.
    fn prices() -> Prices {
        let mut ms = vec![None; 17];
        for (n, v) in [(1, 18.9), (2, 30.3), (4, 51.7), (8, 90.4), (16, 146.0)] {
            ms[n] = Some(v);
        }
        Prices::new(&ms).unwrap()
    }

    fn words(rng: &mut SamplingRng, n: usize) -> Vec<i32> {
        (0..n).map(|_| rng.random_range(1000..6000)).collect()
    }

    #[test]
    fn prices_interpolate_between_measured_sizes() {
        let p = prices();
        assert_eq!(p.t(2), 30.3);
        assert!((p.t(3) - 41.0).abs() < 0.01);
        assert!(p.t(32) > 146.0);
        assert!(Prices::new(&[None, Some(10.0)]).is_err());
    }

    #[test]
    fn copying_a_passage_with_a_few_edits_gets_most_of_the_ceiling() {
        // The answer repeats the prompt's passage with an inserted word every
        // 40 tokens: long runs to copy, each broken once.
        let mut rng = seeded(7);
        let passage = words(&mut rng, 240);
        let mut prompt = vec![1, 2, 3];
        prompt.extend_from_slice(&passage);
        prompt.extend_from_slice(&[4, 5]);
        let mut output = Vec::new();
        for chunk in passage.chunks(40) {
            output.extend_from_slice(chunk);
            output.push(7);
        }
        let o = oracle(&prompt, &output, &prices(), 16);
        let p = policy(&prompt, &output, &prices(), 16);
        assert!(o.ceiling > 1.5, "ceiling {}", o.ceiling);
        // Measured: ceiling 1.88x, policy 1.61x (86 %).
        assert!(p > 1.4, "policy {p}");
        assert!(p >= 0.8 * o.ceiling, "policy {p} vs ceiling {}", o.ceiling);
    }

    #[test]
    fn free_text_loses_almost_nothing() {
        // An answer that shares nothing with the prompt beyond chance.
        let mut rng = seeded(11);
        let prompt = words(&mut rng, 100);
        let output = words(&mut rng, 300);
        let o = oracle(&prompt, &output, &prices(), 16);
        let p = policy(&prompt, &output, &prices(), 16);
        assert!(o.ceiling < 1.05, "ceiling {}", o.ceiling);
        assert!(p >= 0.97, "policy {p}");
    }

    #[test]
    fn text_that_repeats_itself_is_drafted_from_its_own_output() {
        // Nothing to copy from the prompt, but the answer repeats a line.
        let mut rng = seeded(3);
        let prompt = words(&mut rng, 20);
        let line = words(&mut rng, 30);
        let output: Vec<i32> = line.iter().cycle().take(300).copied().collect();
        let o = oracle(&prompt, &output, &prices(), 16);
        let p = policy(&prompt, &output, &prices(), 16);
        // Measured: ceiling 1.87x, policy 1.84x.
        assert!(o.ceiling > 1.5, "ceiling {}", o.ceiling);
        assert!(p >= 0.9 * o.ceiling, "policy {p} vs ceiling {}", o.ceiling);
    }
}
