//! The decoding core: everything that can be reasoned about without N-API
//! and, where possible, without a model. Tested with `cargo test`.

pub mod chat;
pub mod controller;
pub mod drafter;
pub mod error;
pub mod events;
#[cfg(test)]
mod fuzz;
pub mod gbnf;
pub mod invariance;
pub mod ngram;
pub mod options;
pub mod prompt;
pub mod random;
pub mod replay;
pub mod request;
pub mod schedule;
pub mod text;
pub mod verify;
