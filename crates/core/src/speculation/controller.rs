//! How many tokens to draft next. Speculation only pays when the tokens it
//! gains are worth more than the extra cost of drafting and of verifying a
//! bigger batch, and on a CPU a batch of k tokens costs far more than one
//! (k=2 ≈ 1.7x, k=8 ≈ 3.9x). So the controller keeps measured costs — the
//! target's batch cost per size, the drafter's cost per token — and the
//! acceptance seen at each draft position, and picks the draft length with
//! the best expected tokens per millisecond. Zero (plain decoding) is one of
//! the choices; while it wins, a cheap probe now and then keeps the
//! acceptance estimate fresh, with a back-off so probing stays rare.
//!
//! What a draft costs is a `StepPrice`: alone, a batch of 1 + k tokens
//! against one; beside other requests, what k tokens add to the batch that
//! is decoded anyway (`core::speculation::cost`), weighed against the step's tokens
//! per millisecond without them — so the same draft that pays alone is left
//! out when the batch is already large.

use super::cost::StepPrice;

/// Decay of the running estimates: about the last 30 observations matter.
const DECAY: f64 = 0.97;
/// Weight (pseudo-observations) of the prior of each position's estimate.
const PRIOR_WEIGHT: f64 = 2.0;
/// Weight (pseudo-observations) of a token class's prior in its estimate.
const CLASS_WEIGHT: f64 = 4.0;
/// Fading of the class records per decision.
const CLASS_FORGET: f64 = 0.99;
const PROBE_MIN: usize = 4;
const PROBE_MAX: usize = 32;
/// Weight of the latest outcome in the estimate of how often a draft that
/// was paid for comes to nothing (see [`DraftController::observe_empty`]).
const EMPTY_WEIGHT: f64 = 0.25;
/// The longest draft made at a cost before any was judged.
const FIRST_DRAFT_MAX: usize = 4;
/// Steps a one-time setup cost (a draft model's catch-up with a prompt) is
/// amortised over: about a short answer's worth of drafting steps.
pub const SETUP_HORIZON: f64 = 32.0;
/// How optimistic the planned acceptance is while it is uncertain: the
/// estimate plus this many standard errors of it (an upper confidence
/// bound). A drafter never tried is priced as if it might be good, so it is
/// tried; a few rejected drafts bring the bound down to what was measured.
const OPTIMISM: f64 = 1.0;
/// The bound never promises certainty.
const MAX_RATE: f64 = 0.98;
/// A cautious controller (a draft model the request did not name: `auto`)
/// tries its drafter only when drafts accepted at [`EXPLORE_RATE`] per
/// token (a good same-family pair, confidence-gated; or at the acceptance
/// measured, once its drafts were judged) would speed the step up by at
/// least [`EXPLORE_GAIN`] at the measured costs, in [`EXPLORE_STREAK`]
/// decisions running. Below that, what the drafter could win at best
/// cannot pay for finding out whether it does (the first drafts, the
/// probes): on 2 cores a 0.5B draft beside its 1.5B target costs 0.4-0.5
/// of a target step per token and gains ~13 % at 90 % acceptance, while
/// finding out cost 13-22 % of a 96-token answer.
const EXPLORE_RATE: f64 = 0.9;
const EXPLORE_GAIN: f64 = 1.2;
/// A batch size's cost is a running estimate: one noisy measurement can
/// lift the upside over the bar for a step or two.
const EXPLORE_STREAK: usize = 4;
/// Decisions a cautious controller watches the costs before it may try its
/// drafter: a fresh engine's first steps run slower than it will (weights
/// paged in, caches cold) and the target's price settles over about this
/// many (running averages of weight 0.2).
const CAUTION_STEPS: usize = 16;

/// A draft model's token classes: how sure it was of the token (its
/// probability), the lowest probability of each bucket. How sure the draft
/// is predicts acceptance best (SpecDec++, AdaEDL); the controller learns
/// the acceptance of each bucket and stops drafting below the first that
/// pays.
pub const CONFIDENCE_BUCKETS: [f32; 5] = [0.0, 0.3, 0.5, 0.7, 0.9];
/// Acceptance assumed per bucket before any is measured.
pub const CONFIDENCE_PRIORS: [f64; 5] = [0.3, 0.45, 0.6, 0.75, 0.9];

/// The bucket of a drafted token of probability `p`.
pub fn confidence_class(p: f32) -> u8 {
    CONFIDENCE_BUCKETS.iter().rposition(|&b| p >= b).unwrap_or(0) as u8
}

/// Running estimate for one drafter.
#[derive(Debug, Clone)]
pub struct DraftController {
    n_max: usize,
    adaptive: bool,
    /// Cost of drafting one token (ms), running average.
    draft_ms: Option<f64>,
    /// Acceptance assumed at position 0 before anything is measured.
    prior: f64,
    /// Per draft position i (0-based): decayed count of drafts that reached
    /// it and of those accepted there.
    reached: Vec<f64>,
    accepted: Vec<f64>,
    /// Whether measured wall time per token may overrule the cost model.
    check_loss: bool,
    /// For drafters that say how sure they are of each token (a class per
    /// token, e.g. which n-gram matched): decayed counts of tokens of each
    /// class the target judged, and of those it accepted.
    class_reached: Vec<f64>,
    class_accepted: Vec<f64>,
    class_prior: Vec<f64>,
    /// When the classes are confidence buckets (a draft model's): the
    /// lowest probability of each.
    buckets: Vec<f32>,
    /// Steps since the last draft, and how many to wait before probing.
    idle: usize,
    probe_every: usize,
    /// Measured wall time per produced token of plain steps and of this
    /// drafter's steps (drafting + verification): the ground truth that
    /// overrules the cost model when it is wrong (e.g. two models evicting
    /// each other from the CPU caches costs more than either alone).
    plain_ms_per_token: Option<f64>,
    drafted_ms_per_token: Option<f64>,
    drafted_steps: usize,
    /// Whether the last decision was a probe (a draft that is not expected
    /// to pay, taken to keep the estimate fresh).
    probing: bool,
    /// Whether the last decision explores: a probe, or the first draft
    /// made before any was judged. Such a draft is not cut by the learnt
    /// confidence floor, so the acceptance of tokens the draft model is
    /// unsure of gets measured instead of assumed.
    exploring: bool,
    /// How often a draft made at a cost (a draft model's) came to nothing:
    /// the drafter stopped before `n_min` tokens (its confidence floor), or
    /// the step's joint trim dropped it. The time was spent all the same,
    /// so it weighs against the next one (decayed; 0 before any is seen).
    empty: f64,
    /// Leaves the drafter out unless it can pay well (see
    /// [`EXPLORE_GAIN`]).
    cautious: bool,
    /// The lowest cost per token of a step it has seen priced (ms): the
    /// machine at its best, as when the drafter's cost was measured (at
    /// load, alone). The upside is judged at that speed: a spell of slow
    /// steps raises the target's price, not yet the drafter's, and must
    /// not make the drafter look cheap.
    best_ms_per_token: f64,
    /// Decisions it has judged the upside in, and how many in a row found
    /// it large enough.
    upside_seen: usize,
    upside_streak: usize,
}

impl DraftController {
    /// `prior_accept` is the acceptance assumed before anything is measured.
    pub fn new(n_max: usize, adaptive: bool, prior_accept: f64) -> Self {
        let prior = prior_accept.clamp(0.0, 1.0);
        DraftController {
            n_max,
            adaptive,
            draft_ms: None,
            prior,
            reached: vec![0.0; n_max],
            accepted: vec![0.0; n_max],
            check_loss: true,
            class_reached: Vec::new(),
            class_accepted: Vec::new(),
            class_prior: Vec::new(),
            buckets: Vec::new(),
            idle: 0,
            probe_every: PROBE_MIN,
            plain_ms_per_token: None,
            drafted_ms_per_token: None,
            drafted_steps: 0,
            probing: false,
            exploring: false,
            empty: 0.0,
            cautious: false,
            best_ms_per_token: f64::INFINITY,
            upside_seen: 0,
            upside_streak: 0,
        }
    }

    /// Whether measured wall time per token (drafting steps against plain
    /// ones) may overrule the cost model. On for a draft model, whose real
    /// cost the model misses (two models evicting each other from the CPU
    /// caches); off for a drafter that costs nothing, where the measured
    /// batch costs price every choice and the comparison of steps taken at
    /// different moments only adds this machine's noise (±20 % run to run).
    pub fn with_loss_check(mut self, on: bool) -> Self {
        self.check_loss = on;
        self
    }

    /// Cautious: drafts made at a cost are tried only when they could pay
    /// well (see [`EXPLORE_GAIN`]). For a drafter the request did not name
    /// (`auto`), which must never make decoding slower; a named one is
    /// tried and judged by what it does.
    pub fn set_cautious(&mut self, on: bool) {
        self.cautious = on;
    }

    /// Keeps acceptance per token class as well as per position, for drafts
    /// that come with classes; `priors[c]` is the acceptance assumed for
    /// class c before any is measured.
    pub fn with_classes(mut self, priors: &[f64]) -> Self {
        // Kept apart for the first token of a draft and for the rest: only
        // the first one's match is made of tokens the target produced.
        self.class_reached = vec![0.0; 2 * priors.len()];
        self.class_accepted = vec![0.0; 2 * priors.len()];
        self.class_prior = priors.iter().chain(priors).map(|p| p.clamp(0.0, 1.0)).collect();
        self
    }

    /// Classes that are how sure the drafter was of each token:
    /// `buckets[c]` is the lowest probability of class c, `priors[c]` the
    /// acceptance assumed for it. The plan then also gives the confidence
    /// below which drafting stops ([`confidence_floor`](Self::confidence_floor)).
    pub fn with_confidence_classes(mut self, buckets: &[f32], priors: &[f64]) -> Self {
        self = self.with_classes(priors);
        self.buckets = buckets.to_vec();
        self
    }

    /// A draft whose tokens had these classes had its first `n_accepted`
    /// accepted. Tokens after the first rejection were never judged.
    pub fn observe_classes(&mut self, classes: &[u8], n_accepted: usize) {
        let n = self.class_reached.len() / 2;
        for (i, &c) in classes.iter().enumerate() {
            let c = c as usize + if i == 0 { 0 } else { n };
            if c < self.class_reached.len() && (c < n) == (i == 0) {
                self.class_reached[c] = self.class_reached[c] * DECAY + 1.0;
                self.class_accepted[c] = self.class_accepted[c] * DECAY + if i < n_accepted { 1.0 } else { 0.0 };
            }
            if i >= n_accepted {
                break;
            }
        }
    }

    /// Probability that a token of class `c` is accepted (given those before
    /// it were): its class's record, shrunk towards the class's prior.
    pub fn class_rate(&self, c: u8, first: bool) -> f64 {
        let n = self.class_reached.len() / 2;
        if c as usize >= n {
            return self.prior;
        }
        let c = c as usize + if first { 0 } else { n };
        if c >= self.class_reached.len() {
            return self.prior;
        }
        ((self.class_accepted[c] + CLASS_WEIGHT * self.class_prior[c]) / (self.class_reached[c] + CLASS_WEIGHT)).clamp(0.0, 1.0)
    }

    /// For a drafter whose classes are confidence buckets (lower bounds in
    /// `buckets`): the lowest confidence at which one more drafted token
    /// pays — its class's acceptance (optimistic while unmeasured) times
    /// what a token costs, against drafting it and verifying one more row.
    /// `None` without classes or prices (or when not adaptive).
    pub fn confidence_floor(&self, price: Option<&StepPrice>) -> Option<f32> {
        let n = self.class_reached.len() / 2;
        let buckets = &self.buckets;
        let (Some(price), Some(cd)) = (price, self.draft_ms) else { return None };
        if !self.adaptive || n == 0 || n != buckets.len() || price.max_k() == 0 {
            return None;
        }
        let k = price.max_k().min(4);
        let verify = price.extra_ms[k] / k as f64;
        let cost = cd + verify;
        for (c, &lower) in buckets.iter().enumerate() {
            // The class of tokens after the first (most drafted tokens are).
            let r = self.optimistic_class_rate(c as u8, false);
            if r * price.ms_per_token() > cost {
                return Some(lower);
            }
        }
        Some(1.0)
    }

    /// [`class_rate`](Self::class_rate) raised as the plan's position rates
    /// are for confidence classes (a draft model's), while unmeasured; the
    /// n-gram classes keep their measured priors.
    fn optimistic_class_rate(&self, c: u8, first: bool) -> f64 {
        let r = self.class_rate(c, first);
        let n = self.class_reached.len() / 2;
        if self.buckets.is_empty() || c as usize >= n {
            return r;
        }
        let i = c as usize + if first { 0 } else { n };
        let seen = self.class_reached[i] + CLASS_WEIGHT;
        (r + OPTIMISM * (r * (1.0 - r) / (seen + 1.0)).sqrt()).min(MAX_RATE.max(r))
    }

    /// A step finished: `tokens` produced in `ms`, with or without a draft
    /// from this drafter.
    pub fn observe_step(&mut self, drafted: bool, tokens: usize, ms: f64) {
        if tokens == 0 || !ms.is_finite() || ms <= 0.0 {
            return;
        }
        let per = ms / tokens as f64;
        let slot = if drafted { &mut self.drafted_ms_per_token } else { &mut self.plain_ms_per_token };
        *slot = Some(slot.map_or(per, |o| o * 0.85 + per * 0.15));
        if drafted {
            self.drafted_steps += 1;
        }
    }

    /// True when measured drafting steps are not faster per token than
    /// plain ones.
    fn measured_loss(&self) -> bool {
        match (self.plain_ms_per_token, self.drafted_ms_per_token) {
            (Some(plain), Some(drafted)) => self.check_loss && self.drafted_steps >= 3 && drafted >= plain * 0.97,
            _ => false,
        }
    }

    pub fn observe_draft_cost(&mut self, n_tokens: usize, ms: f64) {
        if n_tokens == 0 || !ms.is_finite() || ms < 0.0 {
            return;
        }
        let per = ms / n_tokens as f64;
        self.draft_ms = Some(match self.draft_ms {
            None => per,
            Some(old) => old * 0.8 + per * 0.2,
        });
    }

    /// A draft of `n_drafted` tokens had its first `n_accepted` accepted.
    pub fn observe_acceptance(&mut self, n_drafted: usize, n_accepted: usize) {
        for i in 0..n_drafted.min(self.n_max) {
            self.reached[i] = self.reached[i] * DECAY + 1.0;
            self.accepted[i] = self.accepted[i] * DECAY + if i < n_accepted { 1.0 } else { 0.0 };
            if i >= n_accepted {
                break; // positions after the first rejection were never judged
            }
        }
    }

    /// Probability that the token at draft position i is accepted given that
    /// all before it were. Each position's estimate is shrunk towards the
    /// one before it (position 0 towards the prior) with a weight of
    /// [`PRIOR_WEIGHT`] observations: a depth never drafted so far inherits
    /// the acceptance of the depths that were, so the controller can grow
    /// into long accepted runs (a copied passage) instead of being held at
    /// the length it happened to try first.
    pub fn accept_rate(&self, i: usize) -> f64 {
        if i >= self.n_max {
            return 0.0;
        }
        self.rates(i + 1)[i]
    }

    /// accept_rate(0..n).
    fn rates(&self, n: usize) -> Vec<f64> {
        let n = n.min(self.n_max);
        let mut out = Vec::with_capacity(n);
        let mut rate = self.prior;
        for j in 0..n {
            rate = ((self.accepted[j] + PRIOR_WEIGHT * rate) / (self.reached[j] + PRIOR_WEIGHT)).clamp(0.0, 1.0);
            out.push(rate);
        }
        out
    }

    /// The acceptance the plan prices drafts at: each position's estimate
    /// raised by [`OPTIMISM`] standard errors of it (a beta posterior's, with
    /// the prior counted as [`PRIOR_WEIGHT`] observations), so that what has
    /// not been measured is tried rather than assumed away. The bound falls
    /// to the estimate as observations come in; with a drafter that cannot
    /// pay even at full acceptance (`ceiling` below 1) nothing is tried.
    fn optimistic_rates(&self, n: usize) -> Vec<f64> {
        let means = self.rates(n);
        means
            .iter()
            .enumerate()
            .map(|(j, &m)| {
                if !self.adaptive {
                    return m;
                }
                let seen = self.reached[j] + PRIOR_WEIGHT;
                (m + OPTIMISM * (m * (1.0 - m) / (seen + 1.0)).sqrt()).min(MAX_RATE.max(m))
            })
            .collect()
    }

    /// Expected tokens produced by a step that drafts k: the accepted run
    /// plus the one token the target always adds (at the optimistic rates
    /// the plan uses).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut run = 1.0;
        let mut total = 1.0;
        for rate in self.optimistic_rates(k) {
            run *= rate;
            total += run;
        }
        total
    }

    /// The draft length with the best expected throughput of the step, and
    /// that throughput relative to the step without drafts. Without cost
    /// data it falls back to the seeds' heuristic and drafts `n_max`.
    pub fn plan(&self, price: Option<&StepPrice>, draft_cost_ms: Option<f64>) -> (usize, f64) {
        self.plan_upto(price, draft_cost_ms, self.n_max)
    }

    /// [`plan`](Self::plan) among lengths up to `cap`.
    pub fn plan_upto(&self, price: Option<&StepPrice>, draft_cost_ms: Option<f64>, cap: usize) -> (usize, f64) {
        self.plan_with(price, draft_cost_ms, cap, |k| self.expected_tokens(k))
    }

    /// The best prefix of a draft whose tokens have these classes: the same
    /// choice, with each token's chance of acceptance taken from its class.
    pub fn plan_classified(&self, price: Option<&StepPrice>, classes: &[u8]) -> (usize, f64) {
        let rates: Vec<f64> = classes.iter().enumerate().map(|(i, &c)| self.class_rate(c, i == 0)).collect();
        self.plan_with(price, None, classes.len(), |k| {
            let (mut run, mut total) = (1.0, 1.0);
            for r in &rates[..k.min(rates.len())] {
                run *= r;
                total += run;
            }
            total
        })
    }

    /// The k maximising the step's tokens per ms: verifying k drafted
    /// tokens costs what they add to the batch decoded anyway
    /// (`price.extra_ms[k]`: the marginal cost under load, a batch of 1 + k
    /// against one token when the request is alone) plus drafting them.
    fn plan_with(
        &self,
        price: Option<&StepPrice>,
        draft_cost_ms: Option<f64>,
        cap: usize,
        expected: impl Fn(usize) -> f64,
    ) -> (usize, f64) {
        if !self.adaptive || self.n_max == 0 {
            return (self.n_max, 1.0);
        }
        let (Some(price), Some(cd)) = (price, draft_cost_ms.or(self.draft_ms)) else {
            return (self.n_max, 1.0);
        };
        let base = price.base_rate();
        let mut best = (0usize, 1.0f64);
        for k in 1..=self.n_max.min(cap).min(price.max_k()) {
            let gain = price.rate(k, expected(k), cd * k as f64) / base;
            if gain > best.1 {
                best = (k, gain);
            }
        }
        best
    }

    /// The best speed-up of the step this drafter could bring if every
    /// draft were accepted. Below 1 it can never pay at this price: not
    /// worth probing.
    pub fn ceiling(&self, price: Option<&StepPrice>, draft_cost_ms: Option<f64>) -> f64 {
        self.gain_at(price, draft_cost_ms, 1.0)
    }

    /// The best speed-up of the step if each drafted token were accepted
    /// with probability `rate` (given the ones before it were).
    pub fn gain_at(&self, price: Option<&StepPrice>, draft_cost_ms: Option<f64>, rate: f64) -> f64 {
        let (Some(price), Some(cd)) = (price, draft_cost_ms.or(self.draft_ms)) else {
            return f64::INFINITY;
        };
        let base = price.base_rate();
        let (mut run, mut total, mut best) = (1.0, 1.0, 0.0f64);
        for k in 1..=self.n_max.min(price.max_k()) {
            run *= rate;
            total += run;
            best = best.max(price.rate(k, total, cd * k as f64) / base);
        }
        best
    }

    /// Whether a cautious controller's drafter could pay enough to be
    /// tried (see [`set_cautious`](Self::set_cautious)), once the costs had
    /// steps to settle. Judged at the machine's best speed seen (as the
    /// drafter's cost was, at load), so that a spell of slow steps, which
    /// raises the target's price and not yet the drafter's, does not make
    /// the drafter look cheap.
    fn worth_trying(&mut self, price: Option<&StepPrice>) -> bool {
        if !self.cautious {
            return true;
        }
        let Some(price) = price else { return true }; // nothing measured yet to judge by
        let per_token = price.ms_per_token();
        if !(per_token.is_finite() && per_token > 0.0) {
            return false;
        }
        self.best_ms_per_token = self.best_ms_per_token.min(per_token);
        self.upside_seen += 1;
        let at_best = price.scaled(self.best_ms_per_token / per_token);
        let measured = if self.reached.first().is_some_and(|&r| r > 0.0) { self.rates(1)[0] } else { 0.0 };
        let large = self.gain_at(Some(&at_best), None, EXPLORE_RATE.max(measured)) >= EXPLORE_GAIN;
        self.upside_streak = if large { self.upside_streak + 1 } else { 0 };
        self.upside_seen > CAUTION_STEPS && self.upside_streak >= EXPLORE_STREAK
    }

    /// The length to draft this step. `available` caps it (what the drafter
    /// can offer, the room left in the context, the tokens left to predict).
    pub fn next_length(&mut self, price: Option<&StepPrice>, available: usize) -> usize {
        self.decide(price, available, 0.0, None, false)
    }

    /// As [`next_length`](Self::next_length), when drafting now first costs
    /// `setup_ms` once (a draft model catching up with a prompt or with
    /// tokens it has not seen). A planned draft must win that back within
    /// [`SETUP_HORIZON`] steps; a probe is only taken when its setup costs
    /// no more than two plain tokens.
    ///
    /// For drafts made at a cost: a draft that may come to nothing (see
    /// [`observe_empty`](Self::observe_empty)) is planned only when its
    /// expected saving, weighed by the chance it is used, beats what an
    /// unused one wastes (the catch-up and k draft steps).
    pub fn next_length_with_setup(&mut self, price: Option<&StepPrice>, available: usize, setup_ms: f64) -> usize {
        self.decide(price, available, setup_ms, None, true)
    }

    /// How much of a draft whose tokens have these classes to verify.
    pub fn next_length_classified(&mut self, price: Option<&StepPrice>, classes: &[u8]) -> usize {
        self.decide(price, classes.len(), 0.0, Some(classes), false)
    }

    /// A draft made at a cost came to nothing (`true`: the drafter stopped
    /// short, or the step's joint trim dropped it), or was verified
    /// (`false`).
    pub fn observe_empty(&mut self, empty: bool) {
        self.empty = self.empty * (1.0 - EMPTY_WEIGHT) + if empty { EMPTY_WEIGHT } else { 0.0 };
    }

    /// The estimated chance that a draft made at a cost comes to nothing.
    pub fn empty_rate(&self) -> f64 {
        self.empty
    }

    fn decide(&mut self, price: Option<&StepPrice>, available: usize, setup_ms: f64, classes: Option<&[u8]>, made: bool) -> usize {
        self.probing = false;
        self.exploring = false;
        if self.adaptive && self.ceiling(price, None) < 1.0 {
            return 0;
        }
        if self.adaptive && made && !self.worth_trying(price) {
            return 0;
        }
        let classified = classes.is_some() && !self.class_reached.is_empty();
        if classified {
            // Class records fade back towards their priors (about 100 steps
            // to lose two thirds of their weight), so a class that failed in
            // one stretch of text is tried again later without probes.
            for x in self.class_reached.iter_mut().chain(self.class_accepted.iter_mut()) {
                *x *= CLASS_FORGET;
            }
        }
        // A draft made at a cost before any of this drafter's drafts was
        // judged is a guess from the prior: a short one, so a wrong prior
        // costs a few draft steps, not a long draft.
        // (A catch-up is won back by the drafts that follow it, so it is
        // weighed against the length planned without that cap.)
        let first = made && self.adaptive && self.reached.first().is_none_or(|&r| r == 0.0);
        let (k, _) = match classes {
            Some(c) if classified => self.plan_classified(price, c),
            _ => self.plan_upto(price, None, available),
        };
        let mut k = if self.adaptive && self.measured_loss() { 0 } else { k.min(available) };
        if self.adaptive && k > 0 && setup_ms > 0.0 && self.saving_ms(price, k) * SETUP_HORIZON < setup_ms {
            k = 0;
        }
        if first {
            k = k.min(FIRST_DRAFT_MAX);
        }
        if self.adaptive && made && k > 0 && self.empty > 0.0 {
            let wasted = self.draft_ms.unwrap_or(0.0) * (k + 1) as f64;
            if (1.0 - self.empty) * self.saving_ms(price, k) <= self.empty * wasted {
                k = 0;
            }
        }
        if k > 0 || !self.adaptive {
            self.idle = 0;
            self.exploring = first && self.adaptive;
            return k;
        }
        // Not worth it now. Probe with a short draft once in a while, so a
        // change in the text (a quoted passage, repetition) is noticed.
        // Classified drafts need no probes: their records fade instead.
        if classified {
            return 0;
        }
        self.idle += 1;
        let per_token = price.map_or(f64::INFINITY, StepPrice::ms_per_token);
        if self.idle >= self.probe_every && available > 0 && setup_ms <= 2.0 * per_token {
            self.idle = 0;
            self.probe_every = (self.probe_every * 2).min(PROBE_MAX);
            self.probing = true;
            self.exploring = true;
            return available.min(2);
        }
        0
    }

    /// Expected time (ms) a step drafting k saves against producing the
    /// same tokens without drafts, at the step's cost per token; negative
    /// when it loses.
    pub fn saving_ms(&self, price: Option<&StepPrice>, k: usize) -> f64 {
        let (Some(price), Some(cd)) = (price, self.draft_ms) else {
            return 0.0;
        };
        (self.expected_tokens(k) - 1.0) * price.ms_per_token() - (price.extra_ms[k.min(price.max_k())] + cd * k as f64)
    }

    /// Whether draft lengths are chosen by price (else always `n_max`).
    pub fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    /// Whether the last length decided was a probe.
    pub fn probed(&self) -> bool {
        self.probing
    }

    /// Whether the last length decided explores (a probe, or the first
    /// draft): the drafter should not cut it by its learnt confidence.
    pub fn exploring(&self) -> bool {
        self.exploring
    }

    /// Expected tokens of a step verifying the first j tokens of a draft,
    /// j = 0..=len (`[0]` is 1: the token the target always adds); with
    /// `classes` (one per token) each token's chance is its class's.
    pub fn expected_curve(&self, len: usize, classes: &[u8]) -> Vec<f64> {
        let rates: Vec<f64> = if classes.len() >= len && !self.class_reached.is_empty() {
            classes[..len].iter().enumerate().map(|(i, &c)| self.optimistic_class_rate(c, i == 0)).collect()
        } else {
            let mut r = self.optimistic_rates(len);
            r.resize(len, 0.0);
            r
        };
        let mut out = Vec::with_capacity(len + 1);
        let (mut run, mut total) = (1.0, 1.0);
        out.push(total);
        for r in rates {
            run *= r;
            total += run;
            out.push(total);
        }
        out
    }

    /// A probe or draft showed speculation pays again: probe eagerly.
    pub fn reset_backoff(&mut self) {
        self.probe_every = PROBE_MIN;
    }

    pub fn draft_ms(&self) -> Option<f64> {
        self.draft_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculation::cost::fixtures::cpu_costs;
    use crate::speculation::cost::BatchCost;

    /// The price of a request alone, for every length the table knows.
    fn alone(c: &BatchCost) -> Option<StepPrice> {
        StepPrice::alone(c, c.max() - 1)
    }

    /// The F32 target and its Q4_1 draft as measured here: t1 27.4 ms …
    fn pair_costs(scale: f64) -> BatchCost {
        let mut c = BatchCost::new(17);
        for (n, ms) in [(1, 27.4), (2, 36.0), (4, 48.1), (8, 64.1), (16, 104.5)] {
            c.observe(n, ms * scale);
        }
        c
    }

    /// A deterministic stream of uniform numbers in [0, 1).
    fn uniform(seed: &mut u64) -> f64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Runs `steps` steps of a draft model (9.6 ms a token, a 300 ms catch-up
    /// with the prompt before its first draft) whose tokens the target
    /// accepts with probability `p` each; returns the steps that drafted.
    fn stream(c: &mut DraftController, costs: &BatchCost, p: f64, steps: usize, seed: &mut u64, caught_up: &mut bool) -> usize {
        let mut drafted = 0;
        for _ in 0..steps {
            let setup = if *caught_up { 0.0 } else { 300.0 };
            let k = c.next_length_with_setup(alone(costs).as_ref(), 8, setup);
            if k == 0 {
                continue;
            }
            *caught_up = true;
            drafted += 1;
            let n_accepted = (0..k).take_while(|_| uniform(seed) < p).count();
            // What `DrafterChain::judged` tells the controller.
            c.observe_acceptance(k, n_accepted);
            if n_accepted == k {
                c.reset_backoff();
            }
        }
        drafted
    }

    #[test]
    fn a_good_draft_model_is_tried_from_the_start_dropped_when_it_fails_and_taken_back() {
        // A prior of 0.7 prices a 1-token draft at barely break-even, which
        // (with the catch-up to pay first) once meant it was never tried.
        let mut c = DraftController::new(8, true, 0.7);
        c.observe_draft_cost(1, 9.6);
        let costs = pair_costs(1.0);
        let (mut seed, mut caught_up) = (7u64, false);
        let first = stream(&mut c, &costs, 0.95, 100, &mut seed, &mut caught_up);
        assert!(first >= 90, "drafted in {first} of 100 steps at 95 % acceptance");
        assert!(c.plan(alone(&costs).as_ref(), None).0 >= 2, "drafts several tokens once it knows");
        // The text changes: the draft model is mostly wrong now.
        stream(&mut c, &costs, 0.1, 50, &mut seed, &mut caught_up);
        let bad = stream(&mut c, &costs, 0.1, 100, &mut seed, &mut caught_up);
        assert!(bad <= 12, "drafted in {bad} of 100 steps at 10 % acceptance (probes only)");
        // And back: probes find out, and it drafts again.
        let back = stream(&mut c, &costs, 0.95, 100, &mut seed, &mut caught_up);
        let then = stream(&mut c, &costs, 0.95, 50, &mut seed, &mut caught_up);
        assert!(back >= 10 && then >= 45, "drafted in {back} of 100 steps after the phase change, then {then} of 50");
    }

    #[test]
    fn the_confidence_where_drafting_stops_is_learnt() {
        let costs = pair_costs(1.0);
        let price = alone(&costs);
        let fresh = || {
            let mut c = DraftController::new(8, true, 0.7).with_confidence_classes(&CONFIDENCE_BUCKETS, &CONFIDENCE_PRIORS);
            c.observe_draft_cost(1, 9.6);
            c
        };
        assert_eq!(confidence_class(0.1), 0);
        assert_eq!(confidence_class(0.55), 2);
        assert_eq!(confidence_class(0.95), 4);
        // A same-weights draft: its unsure tokens are accepted all the same.
        let mut same = fresh();
        let start = same.confidence_floor(price.as_ref()).unwrap();
        for _ in 0..40 {
            same.observe_classes(&[4, 1, 0, 2], 4);
        }
        let low = same.confidence_floor(price.as_ref()).unwrap();
        assert!(low <= 0.3 && low <= start, "floor {low} (from {start})");
        // A draft that is right only when sure: it stops early.
        let mut unsure = fresh();
        for _ in 0..40 {
            unsure.observe_classes(&[4, 4, 1], 2);
            unsure.observe_classes(&[4, 2, 0], 1);
            unsure.observe_classes(&[3, 0], 1);
        }
        let high = unsure.confidence_floor(price.as_ref()).unwrap();
        assert!(high >= 0.7, "floor {high}");
        // Without confidence classes (n-grams) there is no floor.
        assert!(DraftController::new(8, true, 0.7).confidence_floor(price.as_ref()).is_none());
    }

    #[test]
    fn a_draft_that_cannot_pay_is_not_tried_however_optimistic() {
        // The Q2_K draft (5.6 ms) for the Q4_1 target: loses even when always right.
        let mut c = DraftController::new(8, true, 0.75);
        c.observe_draft_cost(1, 5.6);
        let (mut seed, mut caught_up) = (1u64, true);
        assert_eq!(stream(&mut c, &cpu_costs(), 0.75, 200, &mut seed, &mut caught_up), 0);
    }

    #[test]
    fn drifting_costs_move_the_choice() {
        // Load measured on a busy moment (every size twice its cost) …
        let mut costs = pair_costs(2.0);
        let mut c = DraftController::new(8, true, 0.7);
        c.observe_draft_cost(1, 9.6);
        // … while the draft step cost was measured quiet: drafting looks better
        // than it is. Plain steps then re-measure t1 at its real cost, and
        // every size follows it, so the plan is the one of the real costs.
        for _ in 0..60 {
            costs.observe(1, 27.4);
        }
        let real = pair_costs(1.0);
        for _ in 0..30 {
            c.observe_acceptance(4, 4);
        }
        let drifted = c.plan(alone(&costs).as_ref(), None);
        let truth = c.plan(alone(&real).as_ref(), None);
        assert_eq!(drifted.0, truth.0);
        assert!((drifted.1 - truth.1).abs() < 0.05, "{drifted:?} vs {truth:?}");
    }

    #[test]
    fn a_draft_model_nearly_as_slow_as_the_target_is_not_used() {
        // Q2_K draft at 5.6 ms/token, 75 % acceptance: never pays on this CPU.
        let mut c = DraftController::new(16, true, 0.75);
        c.observe_draft_cost(1, 5.6);
        for _ in 0..50 {
            c.observe_acceptance(4, 3);
        }
        assert_eq!(c.plan(alone(&cpu_costs()).as_ref(), None).0, 0);
    }

    /// Qwen2.5-Coder-1.5B (Q4_K_M) as measured here on 2 threads: a batch
    /// of 1..4 tokens; its 0.5B draft at 37.6-50 ms a token.
    fn coder_costs() -> BatchCost {
        coder_costs_scaled(1.0)
    }

    fn coder_costs_scaled(scale: f64) -> BatchCost {
        let mut c = BatchCost::new(17);
        for (n, ms) in [(1, 97.0), (2, 132.0), (3, 162.0), (4, 196.0), (8, 330.0)] {
            c.observe(n, ms * scale);
        }
        c
    }

    #[test]
    fn a_cautious_controller_leaves_out_a_draft_model_whose_best_case_is_small() {
        let costs = coder_costs();
        let price = alone(&costs);
        let cautious = |draft_ms: f64| {
            let mut c = DraftController::new(8, true, 0.7).with_confidence_classes(&CONFIDENCE_BUCKETS, &CONFIDENCE_PRIORS);
            c.observe_draft_cost(1, draft_ms);
            c.set_cautious(true);
            c
        };
        for draft_ms in [37.6, 45.0, 50.0] {
            let mut c = cautious(draft_ms);
            assert!(c.gain_at(price.as_ref(), None, 0.9) < 1.2);
            // Named (`draft`): tried from the start, as before.
            let mut named = c.clone();
            named.set_cautious(false);
            assert!(named.next_length_with_setup(price.as_ref(), 8, 0.0) > 0, "{draft_ms} ms");
            // In `auto`: neither tried nor probed, however long it waits.
            let drafted = (0..200).filter(|_| c.next_length_with_setup(price.as_ref(), 8, 0.0) > 0).count();
            assert_eq!(drafted, 0, "{draft_ms} ms");
            // Unless its measured acceptance (a kept controller's, ~98 %
            // here) says drafts would pay well: at 37.6 ms they would
            // (1.35x), at 50 ms not even then (1.09x).
            for _ in 0..40 {
                c.observe_acceptance(8, 8);
            }
            let tried = (0..10).any(|_| c.next_length_with_setup(price.as_ref(), 8, 0.0) > 0);
            assert_eq!(tried, draft_ms < 40.0, "{draft_ms} ms: gain {}", c.gain_at(price.as_ref(), None, c.accept_rate(0)));
        }
        // A spell of slow steps (the target's price up a third, the draft's
        // not yet) does not make the draft model look cheap.
        let mut c = cautious(36.5);
        for _ in 0..20 {
            assert_eq!(c.next_length_with_setup(price.as_ref(), 8, 0.0), 0);
        }
        let slowed = alone(&coder_costs_scaled(1.33));
        assert!(c.gain_at(slowed.as_ref(), None, 0.9) >= 1.2);
        assert!((0..20).all(|_| c.next_length_with_setup(slowed.as_ref(), 8, 0.0) == 0));
        // Nor do a fresh engine's first steps, slowed.
        let mut c = cautious(36.5);
        let cold = alone(&coder_costs_scaled(1.6));
        let tried = (0..40).filter(|&i| c.next_length_with_setup(if i < 12 { cold.as_ref() } else { price.as_ref() }, 8, 0.0) > 0).count();
        assert_eq!(tried, 0);
        // A cheap draft (the F32 target's Q4_1, 9.6 ms against 27.4) is
        // tried in `auto` too, once the costs settled.
        let costs = pair_costs(1.0);
        let mut c = cautious(9.6);
        assert!(c.gain_at(alone(&costs).as_ref(), None, 0.9) >= 1.2);
        let first: Vec<usize> = (0..20).map(|_| c.next_length_with_setup(alone(&costs).as_ref(), 8, 0.0)).collect();
        assert!(first[..16].iter().all(|&k| k == 0), "it watches the costs settle first: {first:?}");
        assert!(first[16..].iter().all(|&k| k > 0), "then it drafts: {first:?}");
    }

    #[test]
    fn free_drafts_with_long_accepted_runs_are_used() {
        // An n-gram drafter (cost ~0) whose drafts are almost always accepted.
        let mut c = DraftController::new(16, true, 0.5);
        c.observe_draft_cost(1, 0.01);
        for _ in 0..60 {
            c.observe_acceptance(16, 16);
        }
        let (k, gain) = c.plan(alone(&cpu_costs()).as_ref(), None);
        assert!(k >= 8, "k = {k}");
        assert!(gain > 1.5, "gain = {gain}");
    }

    #[test]
    fn a_cheap_draft_with_high_acceptance_pays_a_few_tokens() {
        let mut c = DraftController::new(16, true, 0.9);
        c.observe_draft_cost(1, 0.5);
        for _ in 0..60 {
            c.observe_acceptance(8, 8);
            c.observe_acceptance(8, 5);
        }
        let (k, gain) = c.plan(alone(&cpu_costs()).as_ref(), None);
        assert!(k >= 2, "k = {k}");
        assert!(gain > 1.0);
    }

    #[test]
    fn a_drafter_that_cannot_pay_even_when_always_right_is_never_probed() {
        let mut c = DraftController::new(16, true, 1.0);
        c.observe_draft_cost(1, 5.6);
        assert!(c.ceiling(alone(&cpu_costs()).as_ref(), None) < 1.0);
        assert!((0..500).all(|_| c.next_length(alone(&cpu_costs()).as_ref(), 16) == 0));
        // A slower target (F16, ~10.8 ms/token) makes the same draft worth a try.
        let mut f16 = BatchCost::new(17);
        for (n, ms) in [(1, 10.8), (2, 13.0), (4, 17.0), (8, 30.0), (16, 55.0)] {
            f16.observe(n, ms);
        }
        assert!(c.ceiling(alone(&f16).as_ref(), None) > 1.0);
    }

    #[test]
    fn made_drafts_that_come_to_nothing_are_priced_in() {
        // The F32 target and its Q4_1 draft at 90 % acceptance: it pays…
        let costs = pair_costs(1.0);
        let mut c = DraftController::new(8, true, 0.9);
        c.observe_draft_cost(1, 9.6);
        for _ in 0..20 {
            c.observe_acceptance(3, 3);
        }
        assert!(c.next_length_with_setup(alone(&costs).as_ref(), 8, 0.0) > 0);
        // …until its drafts keep coming to nothing (trimmed by the step, or
        // stopped by the confidence floor): then only probes remain.
        for _ in 0..12 {
            c.observe_empty(true);
        }
        let drafted = (0..100).filter(|_| c.next_length_with_setup(alone(&costs).as_ref(), 8, 0.0) > 0 && !c.probed()).count();
        assert_eq!(drafted, 0);
        // A lookup (no cost to make) is not affected.
        assert!(c.next_length(alone(&costs).as_ref(), 8) > 0);
        // Drafts that are verified again bring it back.
        for _ in 0..12 {
            c.observe_empty(false);
        }
        assert!(c.next_length_with_setup(alone(&costs).as_ref(), 8, 0.0) > 0);
    }

    #[test]
    fn measured_losses_overrule_the_cost_model() {
        // The model says drafting pays (cheap drafter, always accepted)…
        let mut c = DraftController::new(8, true, 0.9);
        c.observe_draft_cost(1, 0.5);
        for _ in 0..30 {
            c.observe_acceptance(8, 8);
        }
        let costs = cpu_costs();
        assert!(c.next_length(alone(&costs).as_ref(), 8) > 0);
        // …but the steps that drafted were measured slower per token.
        for _ in 0..5 {
            c.observe_step(false, 1, 8.0);
            c.observe_step(true, 4, 40.0);
        }
        let drafted = (0..40).filter(|_| c.next_length(alone(&costs).as_ref(), 8) > 0).count();
        assert!(drafted <= 5, "only probes remain, drafted {drafted} times");
        // Once drafting steps measure faster, it drafts again.
        for _ in 0..20 {
            c.observe_step(true, 8, 30.0);
        }
        assert!(c.next_length(alone(&costs).as_ref(), 8) > 0);
    }

    #[test]
    fn acceptance_is_estimated_per_position() {
        let mut c = DraftController::new(4, true, 0.5);
        for _ in 0..200 {
            c.observe_acceptance(4, 0); // always rejected at once
        }
        assert!(c.accept_rate(0) < 0.05);
        assert!((c.expected_tokens(4) - 1.0).abs() < 0.1);
    }

    #[test]
    fn untried_depths_inherit_the_acceptance_of_tried_ones() {
        // Short n-gram drafts that were always accepted (a copied passage):
        // the depths never drafted are expected to be accepted too, so the
        // plan grows past the length tried so far.
        let mut c = DraftController::new(16, true, 0.6);
        c.observe_draft_cost(1, 0.01);
        for _ in 0..20 {
            c.observe_acceptance(3, 3);
        }
        assert!(c.accept_rate(10) > 0.9, "{}", c.accept_rate(10));
        let (k, gain) = c.plan(alone(&cpu_costs()).as_ref(), None);
        assert!(k > 3, "k = {k}");
        assert!(gain > 1.5, "gain = {gain}");
        // Where drafts break off at depth 2, deeper positions are not trusted.
        let mut d = DraftController::new(16, true, 0.6);
        d.observe_draft_cost(1, 0.01);
        for _ in 0..40 {
            d.observe_acceptance(4, 2);
        }
        assert!(d.accept_rate(2) < 0.2, "{}", d.accept_rate(2));
        assert!(d.plan(alone(&cpu_costs()).as_ref(), None).0 <= 2);
    }

    #[test]
    fn without_the_loss_check_only_the_cost_model_decides() {
        let costs = cpu_costs();
        let mut c = DraftController::new(8, true, 0.9).with_loss_check(false);
        c.observe_draft_cost(1, 0.01);
        for _ in 0..30 {
            c.observe_acceptance(8, 8);
        }
        // Noisy wall times that make drafting steps look slow change nothing.
        for _ in 0..10 {
            c.observe_step(false, 1, 8.0);
            c.observe_step(true, 4, 40.0);
        }
        assert!((0..20).all(|_| c.next_length(alone(&costs).as_ref(), 8) > 0));
    }

    #[test]
    fn token_classes_decide_how_much_of_a_draft_to_verify() {
        // Class 0: a weak match (rarely accepted), class 1: a strong one.
        let costs = cpu_costs();
        let mut c = DraftController::new(16, true, 0.6).with_loss_check(false).with_classes(&[0.3, 0.9]);
        c.observe_draft_cost(1, 0.01);
        // Before anything is measured the priors decide: a draft that starts
        // on a weak match is not verified, one on a strong match is, and
        // only as far as its tokens stay strong.
        assert_eq!(c.next_length_classified(alone(&costs).as_ref(), &[0, 0, 0, 0]), 0);
        let k = c.next_length_classified(alone(&costs).as_ref(), &[1, 1, 1, 1, 1, 1, 0, 0]);
        assert!((2..=6).contains(&k), "k = {k}");
        // Strong matches that keep being rejected lose their standing.
        for _ in 0..40 {
            c.observe_classes(&[1, 1, 1, 1], 0);
        }
        assert!(c.class_rate(1, true) < 0.2);
        assert_eq!(c.plan_classified(alone(&costs).as_ref(), &[1, 1, 1, 1]).0, 0);
        // Later tokens of a draft are kept apart from its first token.
        assert!(c.class_rate(1, false) > 0.8);
    }

    #[test]
    fn not_adaptive_always_drafts_n_max() {
        let mut c = DraftController::new(6, false, 0.1);
        assert_eq!(c.next_length(alone(&cpu_costs()).as_ref(), 100), 6);
        assert_eq!(c.next_length(alone(&cpu_costs()).as_ref(), 3), 3);
    }

    #[test]
    fn idle_controller_probes_with_backoff() {
        // A cheap drafter that is rarely right: idle, but worth a look now and then.
        let mut c = DraftController::new(8, true, 0.1);
        c.observe_draft_cost(1, 0.05);
        let costs = cpu_costs();
        let mut probes = Vec::new();
        for step in 0..200 {
            if c.next_length(alone(&costs).as_ref(), 8) > 0 {
                probes.push(step);
            }
        }
        assert!(probes.len() >= 3 && probes.len() <= 10, "{probes:?}");
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    }
}
