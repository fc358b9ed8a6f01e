//! Prompt-lookup drafting from n-gram caches, after llama.cpp's
//! `common/ngram-cache.{h,cpp}` and its `lookup` example.
//!
//! An [`NgramCache`] maps an n-gram (1 to [`NGRAM_MAX`] tokens) to the tokens
//! seen right after it, with counts. Three caches take part in a draft:
//!
//! * the **context** cache: built from this request's prompt and the tokens
//!   accepted so far, updated incrementally; trusted with lax thresholds;
//! * the **dynamic** cache: the context caches of earlier requests merged
//!   together (shared between requests, saved to disk by the engine); strict
//!   thresholds;
//! * the **static** cache: bigrams ([`NGRAM_STATIC`] tokens) counted over a
//!   large corpus (llama.cpp's `lookup-create`); it breaks ties among the
//!   candidates of the two caches above and drafts on its own only as a last
//!   resort.
//!
//! Files use llama.cpp's binary format, so caches written by its lookup tools
//! load here and the other way round: a sequence of records
//! `[4 x i32 n-gram, padded with -1][i32 n][(i32 token, i32 count) x n]`,
//! little-endian, in no particular order.

mod cache;
mod drafter;
mod lookup;
#[cfg(test)]
mod tests;

pub use cache::{NgramCache, TokenHasher, DYNAMIC_MAX_NGRAMS, NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC};
pub use drafter::{NgramDrafter, ENTRY};
pub use lookup::{draft_tokens, draft_tokens_classified, NgramParams, CLASS_PRIORS, DRAFT_CLASSES, NGRAM_PRIOR};
