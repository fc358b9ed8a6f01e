//! The n-gram drafter of a request: its context cache, built from the prompt
//! and the accepted output, beside the engine's shared dynamic and static
//! caches.

use std::sync::{Arc, Mutex};

use super::cache::{NgramCache, DYNAMIC_MAX_NGRAMS, NGRAM_MAX};
use super::lookup::{draft_tokens_classified, NgramParams, CLASS_PRIORS, NGRAM_PRIOR};
use crate::speculation::controller::DraftController;
use crate::speculation::drafter::{Draft, Drafter};
use crate::speculation::entry::{DrafterEntry, DrafterHost, Runs};
use crate::text::events::TokenSource;

/// Prompt lookup: in `auto`, needs nothing but the caches every engine has.
pub const ENTRY: DrafterEntry = DrafterEntry {
    name: "ngram",
    runs: Runs::Named { in_auto: true, needs_draft_model: false },
    prior: NGRAM_PRIOR,
    keeps_controller: false,
    make,
};

/// N-gram acceptance depends on how much the answer copies from this
/// prompt: every request starts with a fresh controller.
fn make<'m>(e: &DrafterEntry, host: &mut dyn DrafterHost<'m>) -> Option<(Box<dyn Drafter + 'm>, DraftController)> {
    let (dynamic, fixed) = host.ngram_caches();
    let ctl = DraftController::new(host.n_max(), host.adaptive(), e.prior).with_loss_check(false).with_classes(&CLASS_PRIORS);
    Some((Box::new(NgramDrafter::new(NgramParams::default(), dynamic, fixed)), ctl))
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
        ENTRY.name
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
        Some(Draft::new(tokens, TokenSource(ENTRY.name), classes))
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
