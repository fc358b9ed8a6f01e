//! Sampling maths that needs no model: distributions over token ids
//! (`dist`) and the per-position noise that makes a sampled token the same
//! whether it was decoded plainly or verified in a draft (`noise`).

pub mod dist;
pub mod noise;

pub use dist::Dist;
