//! Speculative decoding: what proposes tokens (`drafter`: the one interface
//! and its chain; `ngram`: prompt lookup; `grammar`: what a constraint forces; the draft model lives in the
//! engine, since it runs llama.cpp), what a draft costs (`cost`), how long
//! a draft should be (`controller`), how a step's drafts are trimmed
//! together (`schedule`), how they are verified (`verify`), and the
//! load-time self-check exactness rests on (`invariance`).

pub mod controller;
pub mod cost;
pub mod drafter;
pub mod grammar;
pub mod invariance;
pub mod ngram;
pub mod schedule;
pub mod verify;
