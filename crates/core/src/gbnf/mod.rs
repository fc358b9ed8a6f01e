//! GBNF, llama.cpp's grammar format, read once for everything that reads
//! it: `syntax` reads a grammar into a tree as llama.cpp's parser does,
//! with where each item is written; `check` takes users' grammars from the
//! tree to llama.cpp's rules, within bounds, before llama.cpp sees them.
//! The call grammars llama.cpp writes are converted from the tree to Lark
//! in `crate::chat::call_grammar`.

mod check;
pub(crate) mod syntax;

pub use check::{check_gbnf, CheckedGrammar, MAX_ELEMENTS, MAX_GRAMMAR_BYTES, MAX_LEFT_PATHS, MAX_REPEAT, MAX_REPEAT_TOTAL};
pub use syntax::MAX_NESTING;
