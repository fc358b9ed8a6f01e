//! One interface for everything that proposes tokens (the draft model, the
//! n-gram caches, their chain). Verification does not care where drafts came
//! from: it only needs each token and the distribution it was drawn from.

use crate::core::events::TokenSource;
use crate::core::verify::Dist;

/// Up to `n` tokens proposed to continue the sequence.
#[derive(Debug, Clone)]
pub struct Draft {
    pub tokens: Vec<i32>,
    /// The distribution each token was drawn from; `None` = chosen
    /// deterministically (a point mass on the token).
    pub dists: Vec<Option<Dist>>,
    pub source: TokenSource,
    /// How sure the drafter is of each token, as a class the controller
    /// keeps acceptance statistics for (the n-gram drafter: which cache and
    /// n-gram size matched, see `ngram::DRAFT_CLASSES`); empty when the
    /// drafter has none.
    pub classes: Vec<u8>,
}

impl Draft {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps the first `n` tokens.
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.dists.truncate(n);
        self.classes.truncate(n);
    }
}

pub trait Drafter {
    /// Stable name used in the per-drafter counters ("draft", "ngram").
    fn name(&self) -> &'static str;
    /// A new request starts; `prompt` is every token the target has seen.
    fn begin(&mut self, prompt: &[i32]);
    /// Proposes up to `n_max` tokens to follow `history` (every token so far,
    /// the last one included). `None` when it has nothing worth proposing.
    fn draft(&mut self, history: &[i32], n_max: usize) -> Option<Draft>;
    /// The target kept the first `n_accepted` tokens of the last draft.
    fn accept(&mut self, n_accepted: usize);
}
