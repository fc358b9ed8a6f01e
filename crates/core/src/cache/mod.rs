//! Prompt state kept beyond its slot: a sequence's KV cells as llama.cpp
//! serialises them (`state`), the host-memory prompt cache of recent states
//! (`prompt_cache`) and session files (`session`), where their cells sit
//! (`positions`); and the load-time
//! self-check's verdicts kept across processes (`verdicts`).

pub mod positions;
pub mod prompt_cache;
pub mod session;
pub mod state;
pub mod verdicts;
