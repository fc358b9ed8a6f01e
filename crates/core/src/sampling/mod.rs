//! Sampling maths that needs no model: distributions over token ids
//! (`dist`), the per-position noise that makes a sampled token the same
//! whether it was decoded plainly or verified in a draft (`noise`), and the
//! constraints llguidance computes (`constraint`) and the canonical tokens
//! of the text they force (`forced`); the thinking budget (`budget`).

pub mod budget;
pub mod constraint;
pub mod dist;
pub mod forced;
pub mod math;
pub mod noise;

pub use dist::Dist;
