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
