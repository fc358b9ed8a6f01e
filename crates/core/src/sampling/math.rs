//! `exp` and `ln` computed the same, bit for bit, on every machine.
//!
//! Rust's `f32::exp` and `f64::ln` call the platform's libm (glibc picks an
//! FMA variant on CPUs that have it; Windows has its own), whose last bit
//! may differ. Sampling turns logits into probabilities and draws with
//! Gumbel noise; with these the probabilities a request reports and the
//! tokens it samples depend only on the logits and the seed. Plain IEEE
//! arithmetic in a fixed order (Rust never fuses a multiply and an add), the
//! same algorithms as the portable CPU kernels (patch 0012,
//! `ggml-cpu/portable.c`).

// The constants are written as in portable.c (Cephes' decimals): both
// compilers round them to the same nearest float.
#![allow(clippy::excessive_precision)]

/// e^x in single precision (about 1 ulp): Cody–Waite reduction by ln 2 and
/// Cephes' degree-7 polynomial. Below -87: 0; above 88: +inf; NaN stays NaN.
pub fn exp_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < -87.0 {
        return 0.0;
    }
    if x > 88.0 {
        return f32::INFINITY;
    }
    // round to nearest, ties to even (1.5 * 2^23)
    let t = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    let r = x - t * 0.693_359_4;
    let r = r - t * -2.121_944_4e-4;
    let r2 = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    p = p * r2 + r;
    p += 1.0;
    p * f32::from_bits(((t as i32 + 127) as u32) << 23)
}

/// ln x in double precision (error below 1e-16 relative): x = m·2^e with m
/// in [√½, √2), ln m = 2·atanh((m−1)/(m+1)) by its series. ln 0 = −inf,
/// negative or NaN → NaN.
pub fn ln_f64(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x == f64::INFINITY {
        return x;
    }
    let mut bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i32;
    if e == 0 {
        // subnormal
        bits = (x * 18_014_398_509_481_984.0).to_bits(); // 2^54
        e = ((bits >> 52) & 0x7ff) as i32 - 54;
    }
    e -= 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let f = (m - 1.0) / (m + 1.0);
    let f2 = f * f;
    let mut s = 1.0 / 23.0;
    for k in [21.0, 19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0] {
        s = s * f2 + 1.0 / k;
    }
    const LN2_HI: f64 = 6.931_471_803_691_238_164_9e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    let e = f64::from(e);
    e * LN2_HI + (e * LN2_LO + 2.0 * f * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_close_to_libm_everywhere_in_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.000_97;
        }
        assert!(worst < 3.0e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn ln_is_close_to_libm() {
        let mut worst = 0.0f64;
        for i in 1..200_000u64 {
            let x = (i as f64) * 1.234_567e-3;
            let want = x.ln();
            let got = ln_f64(x);
            if want != 0.0 {
                worst = worst.max(((got - want) / want).abs());
            }
            let u = i as f64 / 200_000.0;
            assert!((ln_f64(u) - u.ln()).abs() <= 4.0 * f64::EPSILON * u.ln().abs().max(1.0), "{u}");
        }
        assert!(worst < 1e-14, "worst relative error {worst}");
        assert_eq!(ln_f64(1.0), 0.0);
        assert_eq!(ln_f64(0.0), f64::NEG_INFINITY);
        assert!(ln_f64(-1.0).is_nan());
        assert!((ln_f64(5e-324) - (5e-324f64).ln()).abs() < 1e-12);
    }

    // The bits these give: the same on every machine (any change to the
    // algorithms changes sampled tokens, and must change these).
    #[test]
    fn pinned_bits() {
        let got: Vec<u32> = [-20.25f32, -3.1, -0.5, 0.125, 7.75].iter().map(|&x| exp_f32(x).to_bits()).collect();
        let got64: Vec<u64> = [1e-300f64, 0.001, 0.5, 0.999_999, 3.0].iter().map(|&x| ln_f64(x).to_bits()).collect();
        assert_eq!(got, PINNED_EXP, "exp_f32");
        assert_eq!(got64, PINNED_LN, "ln_f64");
    }

    const PINNED_EXP: [u32; 5] = [819_764_977, 1_027_114_372, 1_058_751_896, 1_066_470_146, 1_158_748_456];
    const PINNED_LN: [u64; 5] = [
        13_872_659_378_474_614_709,
        13_842_835_496_307_261_344,
        13_827_790_571_168_217_583,
        13_740_701_232_324_203_055,
        4_607_626_529_066_517_259,
    ];
}
