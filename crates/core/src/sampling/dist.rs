//! A probability distribution over token ids, as the request's whole sampler
//! chain leaves it, and drawing from it: the argmax when greedy, else the
//! Gumbel-max with the noise of the token's position (`noise`), so that a
//! token is a function of (seed, position, distribution) alone.

// `!(x > 0.0)` is deliberate throughout: it also catches NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use super::noise::PositionNoise;

/// A probability distribution over token ids, sparse (only tokens with
/// p > 0). Not necessarily sorted. Each id appears at most once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dist {
    pub ids: Vec<i32>,
    pub probs: Vec<f32>,
}

impl Dist {
    /// Numerically stable softmax over `logits` (paired with `ids`).
    /// `-inf` and NaN logits are dropped, as are entries whose probability
    /// underflows to 0. If some logits are `+inf`, the mass is split
    /// uniformly among them. All logits `-inf` (or no input) gives an empty
    /// distribution.
    pub fn from_logits(ids: &[i32], logits: &[f32]) -> Dist {
        debug_assert_eq!(ids.len(), logits.len(), "ids and logits differ in length");
        let n = ids.len().min(logits.len());
        let (ids, logits) = (&ids[..n], &logits[..n]);

        let mut max = f32::NEG_INFINITY;
        for &l in logits {
            if l > max {
                max = l; // NaN never compares greater
            }
        }
        if max == f32::NEG_INFINITY {
            return Dist::default();
        }
        if max == f32::INFINITY {
            let k = logits.iter().filter(|&&l| l == f32::INFINITY).count();
            let mut d = Dist { ids: Vec::with_capacity(k), probs: Vec::with_capacity(k) };
            for (&id, &l) in ids.iter().zip(logits) {
                if l == f32::INFINITY {
                    d.ids.push(id);
                    d.probs.push(1.0 / k as f32);
                }
            }
            return d;
        }

        let mut out_ids = Vec::with_capacity(n);
        let mut w = Vec::with_capacity(n);
        let mut sum = 0.0f64;
        for (&id, &l) in ids.iter().zip(logits) {
            if l > f32::NEG_INFINITY {
                let e = super::math::exp_f32(l - max);
                if e > 0.0 {
                    out_ids.push(id);
                    w.push(e);
                    sum += e as f64;
                }
            }
        }
        // sum >= 1 (the max contributes exp(0) = 1).
        let inv = 1.0 / sum;
        let mut d = Dist { ids: out_ids, probs: w };
        for p in d.probs.iter_mut() {
            *p = (*p as f64 * inv) as f32;
        }
        if d.probs.iter().any(|&p| p <= 0.0) {
            d.retain_positive();
        }
        d
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The most probable id (ties: lowest position in the vector). None if
    /// there is no positive entry.
    pub fn argmax(&self) -> Option<i32> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &p) in self.probs.iter().enumerate() {
            if p > 0.0 && best.is_none_or(|(_, b)| p > b) {
                best = Some((i, p));
            }
        }
        best.map(|(i, _)| self.ids[i])
    }

    /// A sample: the id maximising `ln p + g(id)` for the position's Gumbel
    /// noise `g` (None if there is no positive mass). Exactly distributed as
    /// the (normalised) distribution, and a function of the noise alone: the
    /// same noise gives the same id.
    pub fn sample(&self, noise: &mut PositionNoise) -> Option<i32> {
        let mut best: Option<(i32, f64)> = None;
        for (&id, &p) in self.ids.iter().zip(&self.probs) {
            if !(p > 0.0) {
                continue;
            }
            let key = super::math::ln_f64(p as f64) + noise.gumbel(id);
            if best.is_none_or(|(b, k)| key > k || (key == k && id < b)) {
                best = Some((id, key));
            }
        }
        best.map(|(id, _)| id)
    }

    /// The probability of `id` (0 when the distribution does not hold it).
    pub fn prob_of(&self, id: i32) -> f32 {
        self.ids.iter().position(|&i| i == id).map_or(0.0, |i| self.probs[i])
    }

    /// The `n` most probable entries, descending by probability (ties:
    /// lower position first).
    pub fn top(&self, n: usize) -> Vec<(i32, f32)> {
        let len = self.ids.len();
        if n == 0 || len == 0 {
            return Vec::new();
        }
        let probs = &self.probs;
        let cmp = |a: &usize, b: &usize| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b));
        let mut idx: Vec<usize> = (0..len).collect();
        if n < len {
            idx.select_nth_unstable_by(n, cmp);
            idx.truncate(n);
        }
        idx.sort_unstable_by(cmp);
        idx.into_iter().map(|i| (self.ids[i], self.probs[i])).collect()
    }

    fn retain_positive(&mut self) {
        let mut j = 0;
        for i in 0..self.ids.len() {
            if self.probs[i] > 0.0 {
                self.ids[j] = self.ids[i];
                self.probs[j] = self.probs[i];
                j += 1;
            }
        }
        self.ids.truncate(j);
        self.probs.truncate(j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn prob(x: &Dist, id: i32) -> f32 {
        x.prob_of(id)
    }

    fn total(x: &Dist) -> f64 {
        x.probs.iter().filter(|p| **p > 0.0).map(|&p| p as f64).sum()
    }

    /// Drops non-positive entries and scales to sum 1; false if nothing is left.
    fn normalize(x: &mut Dist) -> bool {
        x.retain_positive();
        let t = total(x);
        if !(t > 0.0) || !t.is_finite() {
            x.ids.clear();
            x.probs.clear();
            return false;
        }
        for p in x.probs.iter_mut() {
            *p = (*p as f64 / t) as f32;
        }
        true
    }

    fn d(pairs: &[(i32, f32)]) -> Dist {
        let mut x = Dist { ids: pairs.iter().map(|p| p.0).collect(), probs: pairs.iter().map(|p| p.1).collect() };
        assert!(normalize(&mut x));
        x
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Total variation between empirical counts and a distribution.
    fn tv_counts(counts: &HashMap<i32, u64>, n: u64, p: &Dist) -> f64 {
        let mut tv = 0.0;
        for (&id, &c) in counts {
            tv += (c as f64 / n as f64 - prob(p, id) as f64).abs();
        }
        for (&id, &pp) in p.ids.iter().zip(&p.probs) {
            if !counts.contains_key(&id) {
                tv += pp as f64;
            }
        }
        tv / 2.0
    }

    fn tv(p: &Dist, q: &Dist) -> f64 {
        let mut ids: Vec<i32> = p.ids.iter().chain(&q.ids).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        ids.iter().map(|&i| (prob(p, i) as f64 - prob(q, i) as f64).abs()).sum::<f64>() / 2.0
    }

    #[test]
    fn from_logits_softmax() {
        let ids = [10, 11, 12, 13];
        let logits = [1000.0, 1001.0, f32::NEG_INFINITY, 999.0];
        let x = Dist::from_logits(&ids, &logits);
        assert_eq!(x.ids, vec![10, 11, 13]);
        let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
        let s: f64 = e.iter().sum();
        for (i, &p) in x.probs.iter().enumerate() {
            assert!(close(p as f64, e[i] / s, 1e-6));
        }
        assert!(close(total(&x), 1.0, 1e-6));
        assert!(Dist::from_logits(&[1, 2], &[f32::NEG_INFINITY; 2]).is_empty());
        assert!(Dist::from_logits(&[], &[]).is_empty());
        let inf = Dist::from_logits(&[1, 2, 3], &[f32::INFINITY, 0.0, f32::INFINITY]);
        assert_eq!(inf.ids, vec![1, 3]);
        assert_eq!(inf.probs, vec![0.5, 0.5]);
        // underflowing entries are dropped
        let u = Dist::from_logits(&[1, 2], &[0.0, -1e6]);
        assert_eq!(u.ids, vec![1]);
    }

    #[test]
    fn prob_argmax_top_normalize() {
        let x = Dist { ids: vec![5, 3, 9, 4], probs: vec![0.2, 0.4, 0.4, 0.0] };
        assert_eq!(prob(&x, 3), 0.4);
        assert_eq!(prob(&x, 42), 0.0);
        assert_eq!(x.argmax(), Some(3)); // tie -> lowest position
        assert_eq!(x.top(2), vec![(3, 0.4), (9, 0.4)]);
        assert_eq!(x.top(10).len(), 4);
        assert_eq!(x.top(0), vec![]);
        assert_eq!(Dist::default().argmax(), None);
        let mut y = x.clone();
        assert!(normalize(&mut y));
        assert_eq!(y.ids, vec![5, 3, 9]);
        let mut z = Dist { ids: vec![1, 2], probs: vec![0.0, 0.0] };
        assert!(!normalize(&mut z));
        assert!(z.is_empty());
        let mut w = Dist { ids: vec![1, 2], probs: vec![2.0, 6.0] };
        assert!(normalize(&mut w));
        assert_eq!(w.probs, vec![0.25, 0.75]);
    }

    #[test]
    fn gumbel_max_samples_follow_the_distribution() {
        let n = 200_000u64;
        for p in [
            d(&[(1, 0.1), (2, 0.6), (3, 0.3)]),
            d(&[(7, 0.001), (9, 0.999)]),
            d(&(0..100).map(|i| (i, 1.0 + i as f32)).collect::<Vec<_>>()),
        ] {
            let mut c = HashMap::new();
            for pos in 0..n {
                *c.entry(p.sample(&mut PositionNoise::new(3, pos)).unwrap()).or_insert(0) += 1;
            }
            assert!(tv_counts(&c, n, &p) < 0.01, "{p:?}");
        }
        // Unnormalised weights are fine; zero weights never chosen; empty: None.
        let q = Dist { ids: vec![1, 2, 3], probs: vec![0.3, 0.3, 0.0] };
        assert!((0..1000).all(|pos| q.sample(&mut PositionNoise::new(1, pos)).unwrap() != 3));
        assert_eq!(Dist::default().sample(&mut PositionNoise::new(1, 0)), None);
        assert_eq!(Dist { ids: vec![4], probs: vec![0.0] }.sample(&mut PositionNoise::new(1, 0)), None);
    }

    #[test]
    fn a_sample_is_a_function_of_seed_and_position() {
        let p = d(&[(1, 0.2), (2, 0.5), (3, 0.3)]);
        let a: Vec<i32> = (0..50).map(|pos| p.sample(&mut PositionNoise::new(9, pos)).unwrap()).collect();
        let b: Vec<i32> = (0..50).map(|pos| p.sample(&mut PositionNoise::new(9, pos)).unwrap()).collect();
        let c: Vec<i32> = (0..50).map(|pos| p.sample(&mut PositionNoise::new(10, pos)).unwrap()).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Listing the candidates in another order changes nothing.
        let r = Dist { ids: vec![3, 1, 2], probs: vec![0.3, 0.2, 0.5] };
        assert!((0..50).all(|pos| r.sample(&mut PositionNoise::new(9, pos)).unwrap() == a[pos as usize]));
    }

    #[test]
    fn drafts_sampled_with_the_same_noise_agree_as_often_as_the_distributions_allow() {
        let n = 100_000u64;
        for (p, q) in [
            (d(&[(1, 0.5), (2, 0.3), (3, 0.15), (4, 0.05)]), d(&[(1, 0.4), (2, 0.35), (3, 0.2), (5, 0.05)])),
            (d(&[(1, 0.1), (2, 0.2), (3, 0.7)]), d(&[(3, 0.7), (1, 0.1), (2, 0.2)])),
            (d(&[(1, 0.6), (2, 0.4)]), d(&[(7, 0.7), (8, 0.3)])),
        ] {
            let agree =
                (0..n).filter(|&pos| p.sample(&mut PositionNoise::new(5, pos)) == q.sample(&mut PositionNoise::new(5, pos))).count();
            let rate = agree as f64 / n as f64;
            let t = tv(&p, &q);
            assert!(rate >= (1.0 - t) / (1.0 + t) - 0.01 && rate <= 1.0 - t + 0.01, "rate {rate}, tv {t}");
        }
    }
}
