//! The decoding core: everything that can be reasoned about without N-API
//! and, where possible, without a model. Tested with `cargo test`.
//!
//! - `request`: what callers send (requests, load options, grammars), parsed
//!   and validated, and the one list of request fields;
//! - `gbnf`: GBNF grammars read once, as llama.cpp reads them: users'
//!   checked before llama.cpp sees them, llama.cpp's call grammars
//!   converted for llguidance (in `chat`);
//! - `cache`: prompt state beyond its slot — llama.cpp's sequence states
//!   checked, the host-memory prompt cache, session files;
//! - `chat`: chat messages and their rendering with a Jinja template;
//! - `sampling`: distributions and the per-position noise;
//! - `speculation`: drafters, n-gram caches, pricing, the controller,
//!   verification;
//! - `text`: UTF-8 and stop strings, events and results;
//! - `embed`: embedding requests checked, token vectors pooled;
//! - `threads`: how many threads a step computes with, by measurement;
//! - `error`: the one error type and its stable codes;
//! - `files`: atomic writes;
//! - `gguf`: model files read and checked before llama.cpp sees them;
//! - `json`: JSON schemas checked, values named in error messages.

pub mod cache;
pub mod chat;
pub mod embed;
pub mod error;
pub mod files;
pub mod gbnf;
pub mod gguf;
pub mod json;
pub mod request;
pub mod sampling;
pub mod speculation;
pub mod text;
pub mod threads;
