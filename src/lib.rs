//! llama-engine: a Node.js addon over llama.cpp with exact speculative decoding.
//!
//! Three layers, each in its own directory:
//! - `binding`: N-API types and conversions, the threadsafe event callback;
//! - `engine`: the background thread, its job queue, request lifecycle and
//!   everything that touches llama.cpp;
//! - `core`: request validation, sampling maths, verification, drafters, stop
//!   strings and UTF-8 streaming — no N-API, tested with `cargo test`.

pub mod binding;
pub mod core;
pub mod engine;
