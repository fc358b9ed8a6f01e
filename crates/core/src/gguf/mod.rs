//! Model files are untrusted input: a GGUF file is read and checked here,
//! before llama.cpp sees it, so that a damaged or hostile file is refused
//! with its cause instead of reaching one of llama.cpp's asserts (which
//! abort the process).
//!
//! - `read`: the container (header, metadata, tensor table, where each
//!   tensor's bytes lie), every length checked against the file;
//! - `check`: the hyperparameters llama.cpp asserts on;
//! - `types`: ggml's tensor types (block sizes, bytes per block).

mod check;
mod read;
mod types;

#[cfg(test)]
mod tests;

pub use check::{check_adapter, check_model, check_projector, check_split_part, split_parts};
pub use read::{read_from, read_gguf, GgufError, GgufFile, TensorInfo, Value, ValueType};
pub use types::TensorType;
