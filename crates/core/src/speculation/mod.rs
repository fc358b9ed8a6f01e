//! Speculative decoding: what proposes tokens (`registry`: the table of
//! drafters; `drafter`: the one interface and its chain; `ngram`: prompt
//! lookup; `suffix`: the longest match in this request and earlier
//! requests' outputs; `grammar`: what a constraint forces; `draft_model`: the draft
//! model's entry — the drafter runs llama.cpp, so the engine makes it), what a draft costs (`cost`), how long
//! a draft should be (`controller`), how a step's drafts are trimmed
//! together (`schedule`), how they are verified (`verify`), and the
//! load-time self-check exactness rests on (`invariance`).

pub mod controller;
pub mod cost;
pub mod draft_model;
pub mod drafter;
pub mod entry;
pub mod grammar;
pub mod invariance;
pub mod ngram;
pub mod registry;
pub mod schedule;
pub mod suffix;
pub mod verify;
