//! A small, fast, seedable pseudo-random number generator (xoshiro256**,
//! seeded through splitmix64). Deterministic for a given seed; std only.
//!
//! Not cryptographic. Used for sampling tokens and for the accept/reject
//! draws of speculative verification.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// xoshiro256** generator.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

#[inline]
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        let mut s = [0u64; 4];
        for w in s.iter_mut() {
            *w = splitmix64(&mut sm);
        }
        // splitmix64 never yields four zero words in a row, but be explicit:
        // the all-zero state is the one fixed point of xoshiro.
        if s == [0; 4] {
            s[0] = 0x9E37_79B9_7F4A_7C15;
        }
        Rng { s }
    }

    /// A generator seeded from the clock, a stack address, a process-wide
    /// counter and std's per-process random hasher keys. No external deps.
    pub fn from_entropy() -> Rng {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64 ^ ((d.as_nanos() >> 64) as u64)).unwrap_or(0);
        let local = 0u8;
        let addr = &local as *const u8 as usize as u64;
        let mut h = RandomState::new().build_hasher();
        h.write_u64(nanos);
        h.write_u64(addr);
        h.write_u64(n);
        h.write_u64(std::process::id() as u64);
        let mixed = h.finish();
        let mut sm = mixed ^ nanos.rotate_left(17) ^ addr.rotate_left(41) ^ n;
        Rng::new(splitmix64(&mut sm))
    }

    /// The next 64 uniformly distributed bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1), 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1), 24 bits of precision.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform integer in [0, n); returns 0 when n == 0.
    /// (Multiply-high reduction; the bias is below 2^-64 * n, negligible.)
    #[inline]
    pub fn next_below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_for_a_seed() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = Rng::new(43);
        let mut a = Rng::new(42);
        let same = (0..100).filter(|_| a.next_u64() == c.next_u64()).count();
        assert!(same < 3);
    }

    #[test]
    fn zero_seed_works() {
        let mut r = Rng::new(0);
        let v: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert!(v.iter().any(|&x| x != 0));
    }

    #[test]
    fn f64_mean_and_range() {
        let mut r = Rng::new(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        let mean = sum / n as f64;
        // sd of the mean = sqrt(1/12 / n) ~ 0.0009
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
    }

    #[test]
    fn f32_range_and_mean() {
        let mut r = Rng::new(8);
        let n = 100_000;
        let mut sum = 0.0f64;
        for _ in 0..n {
            let x = r.next_f32();
            assert!((0.0..1.0).contains(&x));
            sum += x as f64;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(9);
        let mut counts = [0u32; 5];
        for _ in 0..50_000 {
            counts[r.next_below(5) as usize] += 1;
        }
        for c in counts {
            assert!((c as i64 - 10_000).abs() < 500, "{counts:?}");
        }
        assert_eq!(r.next_below(0), 0);
    }

    #[test]
    fn entropy_seeds_differ() {
        let mut a = Rng::from_entropy();
        let mut b = Rng::from_entropy();
        assert_ne!(a.next_u64(), b.next_u64());
    }
}
