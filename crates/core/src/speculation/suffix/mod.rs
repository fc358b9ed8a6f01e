//! Suffix drafting (after SuffixDecoding, NeurIPS 2025, and vLLM's `suffix`
//! method): the longest suffix of the history found in this request's own
//! tokens or in earlier requests' outputs, continued the way its
//! occurrences went on. `index` holds the sequences and finds the matches;
//! `drafter` votes a draft out of them.

mod drafter;
mod index;
mod store;
#[cfg(test)]
mod tests;

pub use drafter::{vote, SuffixDrafter, ENTRY, SUFFIX_CLASSES, SUFFIX_PRIORS};
pub use index::{Match, SuffixIndex, ANCHOR, MAX_MATCH};
pub use store::{namespace_problem, SuffixStore, VocabId, MAX_FILE_TOKENS, MAX_NAMESPACE_BYTES};

/// Tokens the shared index keeps by default (`suffixCacheTokens`): about
/// 1 MiB of token ids and a few MiB of index.
pub const DEFAULT_SUFFIX_CACHE_TOKENS: usize = 1 << 18;
