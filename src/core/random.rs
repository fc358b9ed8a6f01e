//! Where sampling randomness comes from: ChaCha8 of the rand project. A
//! request's `seed` seeds it, so the same seed gives the same stream on every
//! platform and run (rand_chacha's streams are stable across its releases,
//! unlike `StdRng`'s); without a seed it is seeded from the operating system.

pub use rand::Rng;
use rand::SeedableRng;

/// The generator behind token sampling, verification draws and draft sampling.
pub type SamplingRng = rand_chacha::ChaCha8Rng;

/// A generator whose whole stream is determined by `seed`.
pub fn seeded(seed: u64) -> SamplingRng {
    SamplingRng::seed_from_u64(seed)
}

/// A generator seeded from the operating system's randomness (`seed: -1`).
pub fn from_os() -> SamplingRng {
    SamplingRng::from_os_rng()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED: u64 = 13_080_132_717_333_068_652;

    #[test]
    fn a_seed_fixes_the_stream() {
        let a: Vec<u64> = (0..8).scan(seeded(42), |r, _| Some(r.random())).collect();
        let b: Vec<u64> = (0..8).scan(seeded(42), |r, _| Some(r.random())).collect();
        let c: Vec<u64> = (0..8).scan(seeded(43), |r, _| Some(r.random())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Pinned: a change of generator or seeding would change every
        // seeded output users have recorded.
        assert_eq!(seeded(0).random::<u64>(), PINNED);
    }

    #[test]
    fn os_seeds_differ() {
        assert_ne!(from_os().random::<u64>(), from_os().random::<u64>());
    }

    #[test]
    fn unit_draws_are_in_range() {
        let mut r = seeded(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x: f64 = r.random();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
    }
}
