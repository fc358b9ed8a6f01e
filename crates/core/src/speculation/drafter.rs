//! One interface for everything that proposes tokens (the draft model, the
//! n-gram caches) and their chain. Verification does not care where drafts
//! came from: it only needs each token and the distribution it was drawn
//! from.

use std::time::Instant;

use super::controller::DraftController;
use super::cost::DraftPrices;
use crate::text::events::{DrafterStats, TokenSource};

/// Up to `n` tokens proposed to continue the sequence.
#[derive(Debug, Clone)]
pub struct Draft {
    pub tokens: Vec<i32>,
    pub source: TokenSource,
    /// How sure the drafter is of each token, as a class the controller
    /// keeps acceptance statistics for (the n-gram drafter: which cache and
    /// n-gram size matched, see `ngram::DRAFT_CLASSES`); empty when the
    /// drafter has none.
    pub classes: Vec<u8>,
    /// Filled in by the chain from the drafter's controller: the expected
    /// tokens of the step for each length the draft could be cut to
    /// (`expected[j]` for its first j tokens; `[0]` is 1).
    pub expected: Vec<f64>,
    /// Not to be shortened by the step's joint trim (`schedule::trim`): a
    /// fixed length the request asked for, or a probe.
    pub fixed: bool,
}

impl Draft {
    pub fn new(tokens: Vec<i32>, source: TokenSource, classes: Vec<u8>) -> Self {
        Draft { tokens, source, classes, expected: Vec::new(), fixed: false }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps the first `n` tokens.
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.classes.truncate(n);
        self.expected.truncate(n + 1);
    }
}

/// Something that proposes tokens: the draft model, the n-gram caches.
/// Several are chained (`DrafterChain`); each keeps its own counters.
pub trait Drafter {
    /// Stable name used in the per-drafter counters ("draft", "ngram").
    fn name(&self) -> &'static str;
    /// A new request starts; `prompt` is every token the target has seen.
    fn begin(&mut self, _prompt: &[i32]) {}
    /// Proposes up to `n_max` tokens to follow `history` (every token so far,
    /// the last one included); the first would be the request's
    /// `position`-th generated token (a drafter that samples uses that
    /// position's noise, as the target does). `None` when it has nothing
    /// worth proposing.
    fn draft(&mut self, history: &[i32], n_max: usize, position: usize) -> Option<Draft>;
    /// The target kept the first `n_accepted` tokens of the last draft.
    fn accept(&mut self, _n_accepted: usize) {}
    /// The request ended (an n-gram drafter hands what it learnt to the
    /// shared cache).
    fn end(&mut self) {}
    /// Drafting costs next to nothing (a lookup): the chain drafts first and
    /// then decides how much of the draft is worth verifying.
    fn is_cheap(&self) -> bool {
        false
    }
    /// What drafting one token costs (ms), as measured so far.
    fn ms_per_token(&self) -> Option<f64>;
    /// For a drafter whose tokens carry a confidence class: the confidence
    /// below which drafting one more token no longer pays, as the
    /// controller measured it.
    fn set_floor(&mut self, _floor: f32) {}
    /// What drafting now would first cost once (ms): catching up with
    /// tokens the drafter has not seen, such as a new prompt.
    fn setup_ms(&self, _history: &[i32]) -> f64 {
        0.0
    }
}

/// A drafter in a chain, with the controller that prices its drafts and
/// its counters.
pub struct ChainEntry<'a> {
    drafter: Box<dyn Drafter + 'a>,
    pub ctl: DraftController,
    pub stats: DrafterStats,
}

/// The drafters of a request, in order: at each step the first one whose
/// draft pays at the step's price proposes it (llama.cpp's
/// `common_speculative` chain). Drafts shorter than `n_min` are dropped.
pub struct DrafterChain<'a> {
    entries: Vec<ChainEntry<'a>>,
    n_min: usize,
    /// The entry whose draft is being verified, with the classes and length
    /// of what it proposed.
    pending: Option<(usize, Vec<u8>, usize)>,
    /// The entry that drafted in the last step, for `observe_step`, and
    /// what its draft first cost once (a catch-up, not the step's price).
    last: Option<usize>,
    last_setup_ms: f64,
    /// What making that draft took (ms): part of the step's wall time.
    last_draft_ms: f64,
    /// Time spent drafting (ms).
    pub draft_ms: f64,
}

impl<'a> DrafterChain<'a> {
    pub fn new(n_min: usize) -> Self {
        DrafterChain {
            entries: Vec::new(),
            n_min: n_min.max(1),
            pending: None,
            last: None,
            last_setup_ms: 0.0,
            last_draft_ms: 0.0,
            draft_ms: 0.0,
        }
    }

    pub fn push(&mut self, drafter: Box<dyn Drafter + 'a>, ctl: DraftController) {
        self.entries.push(ChainEntry { drafter, ctl, stats: DrafterStats::default() });
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn begin(&mut self, prompt: &[i32]) {
        for e in &mut self.entries {
            e.drafter.begin(prompt);
        }
    }

    /// A draft to verify this step, at most `available` tokens, from the
    /// first drafter whose draft pays at its price; `None` to decode
    /// plainly. The draft carries its drafter's expected-token curve (for
    /// the step's joint trim); cut it with [`trim`](Self::trim).
    pub fn propose(&mut self, history: &[i32], position: usize, available: usize, prices: &DraftPrices) -> Option<Draft> {
        self.last = None;
        self.last_setup_ms = 0.0;
        self.last_draft_ms = 0.0;
        if available == 0 {
            return None;
        }
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let Some(cost) = e.drafter.ms_per_token() {
                e.ctl.observe_draft_cost(1, cost);
            }
            let start = Instant::now();
            let made = !e.drafter.is_cheap();
            let draft = if !made {
                let price = prices.lookup.as_ref();
                // Look first (it costs microseconds), then decide how much
                // of what was found is worth verifying.
                let found = e.drafter.draft(history, available, position);
                self.draft_ms += start.elapsed().as_secs_f64() * 1000.0;
                let Some(mut d) = found else { continue };
                let k =
                    if d.classes.is_empty() { e.ctl.next_length(price, d.len()) } else { e.ctl.next_length_classified(price, &d.classes) };
                d.truncate(k);
                d
            } else {
                let price = prices.made.as_ref();
                let setup = e.drafter.setup_ms(history);
                let k = e.ctl.next_length_with_setup(price, available, setup);
                if k == 0 {
                    continue;
                }
                // An exploring draft goes as far as asked (its tokens teach
                // the acceptance of each confidence); otherwise the draft
                // stops at the confidence that pays (1.0: at `p_min`).
                let floor = if e.ctl.exploring() { Some(0.0) } else { e.ctl.confidence_floor(price) };
                e.drafter.set_floor(floor.unwrap_or(1.0));
                self.last_setup_ms = setup;
                let drafted = e.drafter.draft(history, k, position);
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                self.draft_ms += ms;
                self.last_draft_ms = ms;
                let Some(mut d) = drafted else {
                    e.ctl.observe_empty(true);
                    continue;
                };
                d.truncate(k);
                d
            };
            if draft.len() < self.n_min {
                if made {
                    e.ctl.observe_empty(true);
                }
                continue;
            }
            let mut draft = draft;
            draft.expected = e.ctl.expected_curve(draft.len(), &draft.classes);
            draft.fixed = !e.ctl.is_adaptive() || e.ctl.probed();
            self.pending = Some((i, draft.classes.clone(), draft.len()));
            self.last = Some(i);
            return Some(draft);
        }
        None
    }

    /// The step's joint trim keeps only the first `n` tokens of the last
    /// proposal (none: the request decodes plainly this step).
    pub fn trim(&mut self, n: usize) {
        let Some((i, classes, len)) = self.pending.as_mut() else { return };
        if n >= *len {
            return;
        }
        if n == 0 {
            let e = &mut self.entries[*i];
            if !e.drafter.is_cheap() {
                e.ctl.observe_empty(true);
            }
            e.drafter.accept(0);
            self.pending = None;
            self.last = None;
            return;
        }
        classes.truncate(n);
        *len = n;
    }

    /// The target judged the last proposal: its first `n_accepted` tokens
    /// stand.
    pub fn judged(&mut self, n_accepted: usize) {
        let Some((i, classes, len)) = self.pending.take() else { return };
        let e = &mut self.entries[i];
        let n_accepted = n_accepted.min(len);
        e.ctl.observe_acceptance(len, n_accepted);
        e.ctl.observe_classes(&classes, n_accepted);
        if !e.drafter.is_cheap() {
            e.ctl.observe_empty(false);
        }
        e.stats.n_drafted += len;
        e.stats.n_accepted += n_accepted;
        e.drafter.accept(n_accepted);
        if n_accepted == len {
            e.ctl.reset_backoff();
        }
    }

    /// The step this request just took produced `tokens` in `ms` of
    /// decoding: with the last proposal (whose making is added), or plainly.
    pub fn observe_step(&mut self, tokens: usize, ms: f64) {
        // A catch-up is paid once: it is not what drafting steps cost.
        let setup = std::mem::take(&mut self.last_setup_ms);
        let made = std::mem::take(&mut self.last_draft_ms);
        let drafted_ms = ms + (made - setup).max(0.0);
        for (i, e) in self.entries.iter_mut().enumerate() {
            match self.last {
                Some(j) if j == i => e.ctl.observe_step(true, tokens, drafted_ms),
                None => e.ctl.observe_step(false, tokens, ms),
                _ => {}
            }
        }
    }

    pub fn end(&mut self) {
        for e in &mut self.entries {
            e.drafter.end();
        }
    }

    /// Tokens drafted and accepted, per drafter name.
    pub fn stats(&self) -> impl Iterator<Item = (&'static str, &DrafterStats)> {
        self.entries.iter().map(|e| (e.drafter.name(), &e.stats))
    }

    /// The controller of the drafter named `name` (to keep it for the next
    /// request), leaving a fresh one in its place.
    pub fn take_controller(&mut self, name: &str) -> Option<DraftController> {
        let e = self.entries.iter_mut().find(|e| e.drafter.name() == name)?;
        let fresh = DraftController::new(0, false, 0.0);
        Some(std::mem::replace(&mut e.ctl, fresh))
    }
}

/// The branches of a draft tree that were not proposed, kept for the steps
/// that follow: where the target rejects the proposed branch at a split and
/// its own token starts another branch, the rest of that branch is the next
/// draft, with no drafting work.
#[derive(Debug, Clone, Default)]
pub struct SpareBranches {
    /// Each as the whole sequence: the history at the tree's root, then the branch.
    seqs: Vec<Vec<i32>>,
}

impl SpareBranches {
    /// Replaces the kept branches with `branches`, grown from `root`.
    pub fn keep(&mut self, root: &[i32], branches: impl IntoIterator<Item = Vec<i32>>) {
        self.seqs = branches.into_iter().filter(|b| !b.is_empty()).map(|b| root.iter().copied().chain(b).collect()).collect();
    }

    pub fn clear(&mut self) {
        self.seqs.clear();
    }

    /// Up to `n` tokens of a kept branch that continue `history`. Branches
    /// the history has left (or used up) are dropped.
    pub fn continuation(&mut self, history: &[i32], n: usize) -> Option<Vec<i32>> {
        self.seqs.retain(|s| s.len() > history.len() && s.starts_with(history));
        let s = self.seqs.first()?;
        Some(s[history.len()..].iter().copied().take(n).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculation::cost::{BatchCost, DraftPrices, StepPrice};

    /// A drafter that proposes a fixed continuation, free or at a cost.
    struct Fixed {
        name: &'static str,
        tokens: Vec<i32>,
        cheap: bool,
        accepted: usize,
    }

    impl Drafter for Fixed {
        fn name(&self) -> &'static str {
            self.name
        }
        fn draft(&mut self, _history: &[i32], n_max: usize, _position: usize) -> Option<Draft> {
            let tokens: Vec<i32> = self.tokens.iter().copied().take(n_max).collect();
            (!tokens.is_empty()).then(|| Draft::new(tokens, TokenSource("ngram"), vec![]))
        }
        fn accept(&mut self, n: usize) {
            self.accepted += n;
        }
        fn is_cheap(&self) -> bool {
            self.cheap
        }
        fn ms_per_token(&self) -> Option<f64> {
            Some(if self.cheap { 0.01 } else { 50.0 })
        }
    }

    fn price() -> Option<StepPrice> {
        let mut c = BatchCost::new(33);
        for (n, ms) in [(1, 10.0), (2, 11.0), (4, 12.0), (8, 14.0), (16, 18.0), (32, 26.0)] {
            c.observe(n, ms);
        }
        StepPrice::alone(&c, 32)
    }

    #[test]
    fn the_first_drafter_with_a_paying_draft_proposes() {
        let mut chain = DrafterChain::new(0);
        // An expensive drafter first: at 50 ms a token it never pays here.
        chain.push(Box::new(Fixed { name: "slow", tokens: vec![1, 2, 3], cheap: false, accepted: 0 }), DraftController::new(8, true, 0.9));
        chain.push(
            Box::new(Fixed { name: "ngram", tokens: vec![7, 8, 9, 10], cheap: true, accepted: 0 }),
            DraftController::new(8, true, 0.9),
        );
        let d = chain.propose(&[0], 0, 8, &DraftPrices::both(price())).expect("the cheap one pays");
        assert_eq!(d.tokens[0], 7);
        chain.judged(2);
        let stats: Vec<(&str, usize, usize)> = chain.stats().map(|(n, s)| (n, s.n_drafted, s.n_accepted)).collect();
        assert_eq!(stats, vec![("slow", 0, 0), ("ngram", d.len(), 2)]);
        // Nothing to verify without room.
        assert!(chain.propose(&[0], 0, 0, &DraftPrices::both(price())).is_none());
    }

    /// A costly drafter (2 ms a token) that always comes back empty, as a
    /// draft model does when its confidence floor stops it at once; counts
    /// how often it is asked.
    struct Empty<'c> {
        calls: &'c std::cell::Cell<usize>,
    }

    impl Drafter for Empty<'_> {
        fn name(&self) -> &'static str {
            "draft"
        }
        fn draft(&mut self, _history: &[i32], _n_max: usize, _position: usize) -> Option<Draft> {
            self.calls.set(self.calls.get() + 1);
            None
        }
        fn ms_per_token(&self) -> Option<f64> {
            Some(2.0)
        }
    }

    #[test]
    fn a_costly_drafter_whose_drafts_come_to_nothing_is_asked_less_and_less() {
        // On paper a 2 ms draft pays against 10 ms steps; every draft is
        // empty, and each cost its catch-up and a draft step.
        let calls = std::cell::Cell::new(0);
        let mut chain = DrafterChain::new(1);
        chain.push(Box::new(Empty { calls: &calls }), DraftController::new(4, true, 0.9));
        for _ in 0..400 {
            assert!(chain.propose(&[0], 0, 8, &DraftPrices::both(price())).is_none());
            chain.observe_step(1, 10.0);
        }
        // After a few empty drafts only probes remain (backing off to one
        // in 32 steps): about 20 calls in 400 steps, not 400.
        assert!(calls.get() <= 30, "asked {} times in 400 steps", calls.get());
        // Trimmed to nothing by the step counts the same: a draft made and dropped.
        let mut chain = DrafterChain::new(0);
        chain.push(Box::new(Fixed { name: "draft", tokens: vec![1, 2, 3], cheap: false, accepted: 0 }), DraftController::new(8, true, 0.9));
        chain.propose(&[0], 0, 8, &DraftPrices::both(slow_steps())).expect("pays");
        chain.trim(0);
        assert!(chain.entries[0].ctl.empty_rate() > 0.2);
        chain.propose(&[0], 0, 8, &DraftPrices::both(slow_steps())).expect("still pays at that price");
        chain.judged(3);
        assert!(chain.entries[0].ctl.empty_rate() < 0.2);
    }

    /// A draft model as the pair F32 + Q4_1 has it (6 ms a token against
    /// 10 for the target): every token accepted,
    /// but the draft model is unsure of most of them (confidence 0.4), so a
    /// floor learnt from priors alone would stop it at once. Records the
    /// floors it was given.
    struct Unsure<'c> {
        floors: &'c std::cell::RefCell<Vec<f32>>,
        floor: f32,
    }

    impl Drafter for Unsure<'_> {
        fn name(&self) -> &'static str {
            "draft"
        }
        fn draft(&mut self, _history: &[i32], n_max: usize, _position: usize) -> Option<Draft> {
            self.floors.borrow_mut().push(self.floor);
            let n = if 0.4 < self.floor { 0 } else { n_max };
            let classes = vec![crate::speculation::controller::confidence_class(0.4); n];
            (n > 0).then(|| Draft::new(vec![5; n], TokenSource("draft"), classes))
        }
        fn set_floor(&mut self, floor: f32) {
            self.floor = floor;
        }
        fn ms_per_token(&self) -> Option<f64> {
            Some(6.0)
        }
    }

    #[test]
    fn unsure_tokens_are_explored_and_drafted_once_they_prove_accepted() {
        use crate::speculation::controller::{CONFIDENCE_BUCKETS, CONFIDENCE_PRIORS};
        let floors = std::cell::RefCell::new(Vec::new());
        let mut chain = DrafterChain::new(0);
        let ctl = DraftController::new(8, true, 0.7).with_confidence_classes(&CONFIDENCE_BUCKETS, &CONFIDENCE_PRIORS);
        chain.push(Box::new(Unsure { floors: &floors, floor: 0.75 }), ctl);
        let mut drafted = 0;
        for _ in 0..60 {
            if let Some(d) = chain.propose(&[0], 0, 8, &DraftPrices::both(price())) {
                drafted += 1;
                chain.judged(d.len());
            }
            chain.observe_step(1, 10.0);
        }
        let floors = floors.borrow();
        // The first draft explores: no floor.
        assert_eq!(floors[0], 0.0);
        // What it taught (tokens of confidence 0.4 are accepted) brings the
        // learnt floor down to them: drafting goes on, not only in probes.
        assert!(drafted >= 50, "drafted in {drafted} of 60 steps; floors {floors:?}");
        assert!(floors.last().is_some_and(|&f| f <= 0.4), "floors {floors:?}");
    }

    /// Steps of a second: a 50 ms draft token pays.
    fn slow_steps() -> Option<StepPrice> {
        let mut p = price()?;
        p.base_ms = 1000.0;
        Some(p)
    }

    #[test]
    fn drafts_shorter_than_n_min_are_dropped() {
        let mut chain = DrafterChain::new(3);
        chain.push(Box::new(Fixed { name: "ngram", tokens: vec![7, 8], cheap: true, accepted: 0 }), DraftController::new(8, false, 0.9));
        assert!(chain.propose(&[0], 0, 8, &DraftPrices::both(price())).is_none());
        let mut chain = DrafterChain::new(2);
        chain.push(Box::new(Fixed { name: "ngram", tokens: vec![7, 8], cheap: true, accepted: 0 }), DraftController::new(8, false, 0.9));
        assert_eq!(chain.propose(&[0], 0, 8, &DraftPrices::both(price())).map(|d| d.tokens), Some(vec![7, 8]));
    }

    #[test]
    fn a_draft_carries_its_expected_tokens_and_a_trim_is_what_was_verified() {
        let mut chain = DrafterChain::new(0);
        chain.push(
            Box::new(Fixed { name: "ngram", tokens: vec![7, 8, 9, 10], cheap: true, accepted: 0 }),
            DraftController::new(8, true, 0.9),
        );
        let d = chain.propose(&[0], 0, 8, &DraftPrices::both(price())).expect("pays");
        assert!(!d.fixed);
        assert_eq!(d.expected.len(), d.len() + 1);
        assert_eq!(d.expected[0], 1.0);
        assert!(d.expected.windows(2).all(|w| w[1] > w[0]), "{:?}", d.expected);
        // Cut to 1: the chain counts one drafted token.
        chain.trim(1);
        chain.judged(1);
        let stats: Vec<(usize, usize)> = chain.stats().map(|(_, s)| (s.n_drafted, s.n_accepted)).collect();
        assert_eq!(stats, vec![(1, 1)]);
        // Cut to nothing: nothing is judged.
        chain.propose(&[0], 0, 8, &DraftPrices::both(price())).expect("pays");
        chain.trim(0);
        chain.judged(0);
        let stats: Vec<(usize, usize)> = chain.stats().map(|(_, s)| (s.n_drafted, s.n_accepted)).collect();
        assert_eq!(stats, vec![(1, 1)]);
        // A fixed length is marked so.
        let mut chain = DrafterChain::new(0);
        chain.push(Box::new(Fixed { name: "ngram", tokens: vec![7, 8], cheap: true, accepted: 0 }), DraftController::new(8, false, 0.9));
        assert!(chain.propose(&[0], 0, 8, &DraftPrices::both(price())).unwrap().fixed);
    }

    #[test]
    fn a_controller_can_be_kept_for_the_next_request() {
        let mut chain = DrafterChain::new(0);
        let mut ctl = DraftController::new(8, true, 0.9);
        ctl.observe_acceptance(4, 4);
        chain.push(Box::new(Fixed { name: "draft", tokens: vec![1], cheap: false, accepted: 0 }), ctl);
        let kept = chain.take_controller("draft").unwrap();
        assert!(kept.accept_rate(0) > 0.9);
        assert!(chain.take_controller("ngram").is_none());
    }

    #[test]
    fn a_spare_branch_continues_where_the_target_took_it() {
        let mut spares = SpareBranches::default();
        // Root [1, 2]; proposed branch [3, 4, 5]; spares split at depth 0 and 1.
        spares.keep(&[1, 2], [vec![7, 8, 9], vec![3, 6, 10], vec![]]);
        // The target accepted nothing and chose 7: the first spare goes on.
        assert_eq!(spares.continuation(&[1, 2, 7], 8), Some(vec![8, 9]));
        // ...and keeps going while its tokens are accepted, cut to n.
        assert_eq!(spares.continuation(&[1, 2, 7, 8], 1), Some(vec![9]));
        // Used up, or left: nothing, and it is dropped.
        assert_eq!(spares.continuation(&[1, 2, 7, 8, 9], 4), None);
        spares.keep(&[1, 2], [vec![7, 8, 9], vec![3, 6, 10]]);
        assert_eq!(spares.continuation(&[1, 2, 3, 6], 4), Some(vec![10]));
        assert_eq!(spares.continuation(&[1, 2, 3, 4], 4), None);
        assert_eq!(spares.continuation(&[1, 2, 7], 4), None, "dropped once the history left it");
        spares.keep(&[1], [vec![2]]);
        spares.clear();
        assert_eq!(spares.continuation(&[1], 4), None);
    }
}
