//! Verification maths for speculative decoding, on explicit distributions.
//!
//! Everything here is pure (std only). `p` is the target's distribution at a
//! position *after the request's whole sampler chain* (penalties, temperature,
//! top-k/top-p/min-p, grammar); `q` is the distribution the draft token was
//! actually drawn from (a greedy draft is the point mass `Dist::point(x)`).
//!
//! Losslessness: if `x ~ q` and the draft is verified with
//! [`verify_stochastic`], the emitted token is distributed exactly as `p`.
//! Accept `x` with probability `min(1, p(x)/q(x))`; on rejection draw from
//! `normalize(max(0, p − q))`. With a point-mass `q` that is "accept with
//! probability `p(x)`, else draw from `p` with `x` removed".
//!
//! Both `p` and `q` are expected to be normalised (sum 1, see
//! [`Dist::normalize`]) and to list each id at most once.

// `!(x > 0.0)` is deliberate throughout: it also catches NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use std::collections::HashMap;

use super::random::Rng;

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
                let e = (l - max).exp();
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

    /// The point mass at `id` (a greedy draft's distribution).
    pub fn point(id: i32) -> Dist {
        Dist { ids: vec![id], probs: vec![1.0] }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Total positive mass, accumulated in f64.
    pub fn total(&self) -> f64 {
        self.probs.iter().filter(|p| **p > 0.0).map(|&p| p as f64).sum()
    }

    /// Probability of `id`; 0 when absent. Linear scan: for many look-ups
    /// build an [`DistIndex`] with [`Dist::index`].
    pub fn prob(&self, id: i32) -> f32 {
        match self.ids.iter().position(|&t| t == id) {
            Some(i) => self.probs[i],
            None => 0.0,
        }
    }

    /// An O(1) look-up structure over this distribution.
    pub fn index(&self) -> DistIndex<'_> {
        DistIndex::new(self)
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

    /// Draw an id by inverse CDF (one uniform draw). Works on
    /// unnormalised weights; robust to rounding (if the cumulative sum never
    /// passes the draw, the last positive entry is returned). None if there
    /// is no positive mass.
    pub fn sample(&self, rng: &mut (impl Rng + ?Sized)) -> Option<i32> {
        let total = self.total();
        let u = rng.random::<f64>();
        if !(total > 0.0) || !total.is_finite() {
            return None;
        }
        let r = u * total;
        let mut acc = 0.0f64;
        let mut last = None;
        for (&id, &p) in self.ids.iter().zip(&self.probs) {
            if p > 0.0 {
                acc += p as f64;
                last = Some(id);
                if acc > r {
                    return Some(id);
                }
            }
        }
        last
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

    /// Drop non-positive / NaN entries and scale to sum 1. Returns false
    /// (leaving the distribution empty) if the total mass is 0.
    pub fn normalize(&mut self) -> bool {
        if self.probs.iter().any(|&p| !(p > 0.0)) {
            self.retain_positive();
        }
        let total = self.total();
        if !(total > 0.0) || !total.is_finite() {
            self.ids.clear();
            self.probs.clear();
            return false;
        }
        let inv = 1.0 / total;
        for p in self.probs.iter_mut() {
            *p = (*p as f64 * inv) as f32;
        }
        true
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

/// O(1) probability look-up over a [`Dist`]: a linear scan for tiny
/// distributions, a dense table when ids are small non-negative integers
/// (token ids), a hash map otherwise. Absent ids read as 0. For duplicate
/// ids the first entry wins, as in [`Dist::prob`].
pub enum DistIndex<'a> {
    Scan(&'a Dist),
    Dense(Vec<f32>),
    Map(HashMap<i32, f32>),
}

impl<'a> DistIndex<'a> {
    const SCAN_MAX: usize = 16;

    pub fn new(d: &'a Dist) -> DistIndex<'a> {
        if d.ids.len() <= Self::SCAN_MAX {
            return DistIndex::Scan(d);
        }
        let (mut lo, mut hi) = (i32::MAX, i32::MIN);
        for &id in &d.ids {
            lo = lo.min(id);
            hi = hi.max(id);
        }
        // Dense when the table is not much bigger than the entries (or is
        // small anyway): vocab-sized tables are a cheap memset.
        if lo >= 0 && (hi as usize) < (4 * d.ids.len()).max(1 << 18) {
            let mut t = vec![-1.0f32; hi as usize + 1];
            for (&id, &p) in d.ids.iter().zip(&d.probs) {
                let slot = &mut t[id as usize];
                if *slot < 0.0 {
                    *slot = p;
                }
            }
            for v in t.iter_mut() {
                if *v < 0.0 {
                    *v = 0.0;
                }
            }
            return DistIndex::Dense(t);
        }
        let mut m = HashMap::with_capacity(d.ids.len());
        for (&id, &p) in d.ids.iter().zip(&d.probs) {
            m.entry(id).or_insert(p);
        }
        DistIndex::Map(m)
    }

    #[inline]
    pub fn get(&self, id: i32) -> f32 {
        match self {
            DistIndex::Scan(d) => d.prob(id),
            DistIndex::Dense(t) => {
                if id >= 0 {
                    t.get(id as usize).copied().unwrap_or(0.0)
                } else {
                    0.0
                }
            }
            DistIndex::Map(m) => m.get(&id).copied().unwrap_or(0.0),
        }
    }
}

/// Iterates the positive part of p − q over p's support (ids only in q
/// contribute max(0, 0 − q) = 0). Builds a q index once, or none at all
/// when p and q list the same ids in the same order.
struct Excess<'a> {
    p: &'a Dist,
    q: &'a Dist,
    idx: Option<DistIndex<'a>>,
}

impl<'a> Excess<'a> {
    fn new(p: &'a Dist, q: &'a Dist) -> Excess<'a> {
        let aligned = p.ids.len() == q.ids.len() && p.ids == q.ids;
        let idx = if aligned { None } else { Some(DistIndex::new(q)) };
        Excess { p, q, idx }
    }

    #[inline]
    fn for_each(&self, mut f: impl FnMut(i32, f64)) {
        match &self.idx {
            None => {
                for i in 0..self.p.ids.len() {
                    let d = self.p.probs[i] as f64 - self.q.probs[i] as f64;
                    if d > 0.0 {
                        f(self.p.ids[i], d);
                    }
                }
            }
            Some(ix) => {
                for (&id, &pp) in self.p.ids.iter().zip(&self.p.probs) {
                    let d = pp as f64 - ix.get(id) as f64;
                    if d > 0.0 {
                        f(id, d);
                    }
                }
            }
        }
    }

    fn total(&self) -> f64 {
        let mut s = 0.0;
        self.for_each(|_, d| s += d);
        s
    }

    /// Draw from normalize(max(0, p − q)) without materialising it.
    fn sample(&self, rng: &mut (impl Rng + ?Sized)) -> Option<i32> {
        let total = self.total();
        let u = rng.random::<f64>();
        if !(total > 0.0) {
            return None;
        }
        let r = u * total;
        let mut acc = 0.0;
        let mut found = None;
        let mut last = None;
        self.for_each(|id, d| {
            if found.is_none() {
                acc += d;
                last = Some(id);
                if acc > r {
                    found = Some(id);
                }
            }
        });
        found.or(last)
    }
}

/// Probability that a draft `x` drawn from `q` is accepted against `p`:
/// min(1, p(x)/q(x)); 0 when p(x) = 0; 1 when p(x) > 0 but q(x) = 0
/// (the limit; such an x could not have come from q).
pub fn accept_probability(p: &Dist, q: &Dist, x: i32) -> f64 {
    let px = p.prob(x) as f64;
    if !(px > 0.0) {
        return 0.0;
    }
    let qx = q.prob(x) as f64;
    if !(qx > 0.0) {
        return 1.0;
    }
    (px / qx).min(1.0)
}

/// Outcome of verifying one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The draft token stands.
    Accept,
    /// The draft is rejected; emit `token` instead (and stop the chain).
    Reject { token: i32 },
}

/// Stochastic verification of one drafted token `x` drawn from `q`, against
/// target `p`. Accept with probability min(1, p(x)/q(x)) (one uniform
/// draw); on rejection draw from normalize(max(0, p − q)) (one more draw),
/// falling back to `p` when that is empty (p ≤ q everywhere, only reachable
/// through rounding). The emitted token is distributed exactly as `p`.
/// Degenerate `p` with no entries: the draft is accepted.
pub fn verify_stochastic(p: &Dist, q: &Dist, x: i32, rng: &mut (impl Rng + ?Sized)) -> Verdict {
    if p.is_empty() {
        return Verdict::Accept;
    }
    let a = accept_probability(p, q, x);
    if rng.random::<f64>() < a {
        return Verdict::Accept;
    }
    let token = Excess::new(p, q).sample(rng).or_else(|| p.sample(rng)).unwrap_or(x);
    Verdict::Reject { token }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::random::seeded;

    // The explicit forms of what the engine computes implicitly, as oracles.

    /// p minus q, clamped at 0, renormalised: the distribution to resample from
    /// after a rejection. None if p <= q everywhere (callers then fall back to
    /// p). With q a point mass at x this is p with x removed, renormalised.
    fn residual(p: &Dist, q: &Dist) -> Option<Dist> {
        let ex = Excess::new(p, q);
        let mut d = Dist { ids: Vec::with_capacity(p.ids.len()), probs: Vec::new() };
        let mut w: Vec<f64> = Vec::with_capacity(p.ids.len());
        let mut total = 0.0;
        ex.for_each(|id, x| {
            d.ids.push(id);
            w.push(x);
            total += x;
        });
        if !(total > 0.0) {
            return None;
        }
        let inv = 1.0 / total;
        d.probs = w.into_iter().map(|x| (x * inv) as f32).collect();
        if d.probs.iter().any(|&p| p <= 0.0) {
            d.retain_positive(); // f32 underflow of minuscule differences
        }
        if d.ids.is_empty() {
            None
        } else {
            Some(d)
        }
    }

    /// Greedy verification: accept iff `x == argmax(p)`, else
    /// `Reject { token: argmax(p) }`. Degenerate empty `p`: accepted.
    fn verify_greedy(p: &Dist, x: i32) -> Verdict {
        match p.argmax() {
            Some(t) if t != x => Verdict::Reject { token: t },
            _ => Verdict::Accept,
        }
    }

    /// Expected acceptance rate of one draft drawn from q against p:
    /// Σ min(p, q) = 1 − TV(p, q).
    fn expected_acceptance(p: &Dist, q: &Dist) -> f64 {
        let ex = Excess::new(p, q);
        (p.total() - ex.total()).clamp(0.0, 1.0)
    }

    /// Verify a whole chain of drafts. `ps[i]` is the target distribution at
    /// position i given the drafts before it (k draft positions plus the bonus
    /// position, `ps.len() == drafts.len() + 1`); `drafts[i] = (x_i, q_i)`.
    /// Returns the accepted draft prefix plus exactly one more token: the
    /// correction at the first rejection, or the bonus drawn from `ps[k]` when
    /// all are accepted. With `greedy`, argmax everywhere and q is ignored
    /// (token-for-token equal to greedy decoding). If `ps` is shorter than
    /// expected, verification stops where the targets run out (no extra token).
    fn verify_chain(ps: &[Dist], drafts: &[(i32, Dist)], greedy: bool, rng: &mut (impl Rng + ?Sized)) -> Vec<i32> {
        debug_assert!(ps.len() > drafts.len(), "need a target distribution per draft plus the bonus");
        let mut out = Vec::with_capacity(drafts.len() + 1);
        for (i, (x, q)) in drafts.iter().enumerate() {
            let Some(p) = ps.get(i) else { return out };
            let v = if greedy { verify_greedy(p, *x) } else { verify_stochastic(p, q, *x, rng) };
            match v {
                Verdict::Accept => out.push(*x),
                Verdict::Reject { token } => {
                    out.push(token);
                    return out;
                }
            }
        }
        if let Some(p) = ps.get(drafts.len()) {
            let t = if greedy { p.argmax() } else { p.sample(rng) };
            if let Some(t) = t {
                out.push(t);
            }
        }
        out
    }

    fn d(pairs: &[(i32, f32)]) -> Dist {
        let mut x = Dist { ids: pairs.iter().map(|p| p.0).collect(), probs: pairs.iter().map(|p| p.1).collect() };
        assert!(x.normalize());
        x
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Total variation between empirical counts and a distribution.
    fn tv_counts(counts: &HashMap<i32, u64>, n: u64, p: &Dist) -> f64 {
        let mut tv = 0.0;
        for (&id, &c) in counts {
            tv += (c as f64 / n as f64 - p.prob(id) as f64).abs();
        }
        for (&id, &pp) in p.ids.iter().zip(&p.probs) {
            if !counts.contains_key(&id) {
                tv += pp as f64;
            }
        }
        tv / 2.0
    }

    fn tv_maps(a: &HashMap<Vec<i32>, f64>, b: &HashMap<Vec<i32>, f64>) -> f64 {
        let mut tv = 0.0;
        for (k, &x) in a {
            tv += (x - b.get(k).copied().unwrap_or(0.0)).abs();
        }
        for (k, &y) in b {
            if !a.contains_key(k) {
                tv += y;
            }
        }
        tv / 2.0
    }

    fn assert_dist_eq(a: &Dist, b: &Dist, tol: f64) {
        for (&id, &p) in a.ids.iter().zip(&a.probs) {
            assert!(close(p as f64, b.prob(id) as f64, tol), "id {id}: {a:?} vs {b:?}");
        }
        for (&id, &p) in b.ids.iter().zip(&b.probs) {
            assert!(close(p as f64, a.prob(id) as f64, tol), "id {id}: {a:?} vs {b:?}");
        }
    }

    /// The (p, q) pairs of the statistical tests.
    fn pairs() -> Vec<(&'static str, Dist, Dist)> {
        vec![
            ("overlapping", d(&[(1, 0.5), (2, 0.3), (3, 0.15), (4, 0.05)]), d(&[(1, 0.2), (2, 0.5), (4, 0.25), (5, 0.05)])),
            ("disjoint", d(&[(1, 0.6), (2, 0.4)]), d(&[(7, 0.7), (8, 0.3)])),
            ("point-in-support", d(&[(3, 0.25), (1, 0.5), (2, 0.25)]), Dist::point(1)),
            ("point-minor", d(&[(3, 0.1), (1, 0.7), (2, 0.2)]), Dist::point(3)),
            ("point-outside", d(&[(1, 0.3), (2, 0.7)]), Dist::point(9)),
            ("target-point", Dist::point(2), d(&[(1, 0.3), (2, 0.4), (3, 0.3)])),
            ("equal", d(&[(1, 0.1), (2, 0.2), (3, 0.7)]), d(&[(3, 0.7), (1, 0.1), (2, 0.2)])),
            ("sharper-draft", d(&[(0, 0.2), (1, 0.2), (2, 0.2), (3, 0.2), (4, 0.2)]), d(&[(0, 0.9), (1, 0.05), (2, 0.05)])),
        ]
    }

    // ---------------------------------------------------------------- Dist

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
        assert!(close(x.total(), 1.0, 1e-6));
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
        assert_eq!(x.prob(3), 0.4);
        assert_eq!(x.prob(42), 0.0);
        assert_eq!(x.argmax(), Some(3)); // tie -> lowest position
        assert_eq!(x.top(2), vec![(3, 0.4), (9, 0.4)]);
        assert_eq!(x.top(10).len(), 4);
        assert_eq!(x.top(0), vec![]);
        assert_eq!(Dist::default().argmax(), None);
        let mut y = x.clone();
        assert!(y.normalize());
        assert_eq!(y.ids, vec![5, 3, 9]);
        let mut z = Dist { ids: vec![1, 2], probs: vec![0.0, 0.0] };
        assert!(!z.normalize());
        assert!(z.is_empty());
        let mut w = Dist { ids: vec![1, 2], probs: vec![2.0, 6.0] };
        assert!(w.normalize());
        assert_eq!(w.probs, vec![0.25, 0.75]);
        // index agrees with prob, on every representation
        let big = Dist { ids: (0..1000).rev().collect(), probs: vec![0.001; 1000] };
        let neg = Dist { ids: (0..1000).map(|i| i * 100_000 - 7).collect(), probs: vec![0.001; 1000] };
        for dd in [&x, &big, &neg] {
            let ix = dd.index();
            for id in -10..2000 {
                assert_eq!(ix.get(id), dd.prob(id));
            }
            for &id in &dd.ids {
                assert_eq!(ix.get(id), dd.prob(id));
            }
        }
        assert!(matches!(big.index(), DistIndex::Dense(_)));
        assert!(matches!(neg.index(), DistIndex::Map(_)));
    }

    #[test]
    fn sample_matches_distribution_and_is_robust() {
        let p = d(&[(1, 0.1), (2, 0.6), (3, 0.3)]);
        let mut rng = seeded(1);
        let n = 200_000;
        let mut c = HashMap::new();
        for _ in 0..n {
            *c.entry(p.sample(&mut rng).unwrap()).or_insert(0) += 1;
        }
        assert!(tv_counts(&c, n, &p) < 0.01);
        // weights that under-sum: never panics, never returns a zero entry
        let q = Dist { ids: vec![1, 2, 3], probs: vec![0.3, 0.3, 0.0] };
        for _ in 0..1000 {
            let t = q.sample(&mut rng).unwrap();
            assert!(t == 1 || t == 2);
        }
        assert_eq!(Dist::default().sample(&mut rng), None);
        assert_eq!(Dist { ids: vec![4], probs: vec![0.0] }.sample(&mut rng), None);
    }

    // ------------------------------------------------------------ residual

    #[test]
    fn residual_worked_example() {
        // p − q = {1: 0.3, 2: −0.2, 3: 0.2, 4: −0.3} -> {1: 0.6, 3: 0.4}
        let p = d(&[(3, 0.2), (1, 0.5), (2, 0.3)]);
        let q = d(&[(2, 0.5), (4, 0.3), (1, 0.2)]);
        let r = residual(&p, &q).unwrap();
        assert_dist_eq(&r, &d(&[(1, 0.6), (3, 0.4)]), 1e-6);
        assert!(!r.ids.contains(&2) && !r.ids.contains(&4));
        // p <= q everywhere
        assert!(residual(&p, &p).is_none());
        // disjoint q: residual is p
        assert_dist_eq(&residual(&p, &d(&[(9, 1.0)])).unwrap(), &p, 1e-6);
        // point mass: p without x, renormalised
        let r = residual(&p, &Dist::point(1)).unwrap();
        assert_dist_eq(&r, &d(&[(3, 0.4), (2, 0.6)]), 1e-6);
        // point mass on the target's only token: nothing left
        assert!(residual(&Dist::point(5), &Dist::point(5)).is_none());
    }

    #[test]
    fn residual_large_all_paths_agree() {
        // 50k-entry distributions: aligned, dense-indexed and hashed paths.
        let mut rng = seeded(5);
        let n = 50_000;
        let ids: Vec<i32> = (0..n).collect();
        let pl: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 8.0).collect();
        let ql: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 8.0).collect();
        let p = Dist::from_logits(&ids, &pl);
        let q = Dist::from_logits(&ids, &ql);
        let mut expect: Vec<(i32, f64)> = Vec::new();
        // exact reference via a dense table
        let mut qt = vec![0.0f64; n as usize];
        for (&id, &x) in q.ids.iter().zip(&q.probs) {
            qt[id as usize] = x as f64;
        }
        let mut s = 0.0;
        for (&id, &x) in p.ids.iter().zip(&p.probs) {
            let e = (x as f64 - qt[id as usize]).max(0.0);
            if e > 0.0 {
                expect.push((id, e));
                s += e;
            }
        }
        let aligned = residual(&p, &q).unwrap();
        assert_eq!(aligned.ids.len(), expect.len());
        let qi = aligned.index();
        for &(id, e) in &expect {
            assert!(close(qi.get(id) as f64, e / s, 1e-7));
        }
        // shuffled q -> dense index
        let mut perm: Vec<usize> = (0..n as usize).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.random_range(0..=i));
        }
        let qs = Dist { ids: perm.iter().map(|&i| q.ids[i]).collect(), probs: perm.iter().map(|&i| q.probs[i]).collect() };
        let dense = residual(&p, &qs).unwrap();
        assert_eq!(dense.ids, aligned.ids);
        assert_eq!(dense.probs, aligned.probs);
        // ids shifted far apart -> hash map; same residual up to relabelling
        let relabel = |x: &Dist| Dist { ids: x.ids.iter().map(|&i| i * 1000 - 3).collect(), probs: x.probs.clone() };
        let hashed = residual(&relabel(&p), &relabel(&qs)).unwrap();
        assert_eq!(hashed.probs, aligned.probs);
        // expected acceptance = 1 − TV
        let tv: f64 = expect.iter().map(|x| x.1).sum();
        assert!(close(expected_acceptance(&p, &qs), 1.0 - tv, 1e-5));
    }

    // ---------------------------------------------------- single position

    #[test]
    fn acceptance_probability_exact_and_empirical() {
        let p = d(&[(1, 0.5), (2, 0.3), (3, 0.2)]);
        let q = d(&[(1, 0.8), (2, 0.1), (3, 0.1)]);
        assert!(close(accept_probability(&p, &q, 1), 0.5 / 0.8, 1e-6));
        assert_eq!(accept_probability(&p, &q, 2), 1.0);
        assert_eq!(accept_probability(&p, &q, 3), 1.0);
        assert_eq!(accept_probability(&p, &q, 9), 0.0);
        assert_eq!(accept_probability(&p, &Dist::point(7), 1), 1.0); // q(x) = 0 limit
        assert!(close(accept_probability(&p, &Dist::point(2), 2), 0.3, 1e-6));

        let mut rng = seeded(11);
        let n = 200_000;
        for (x, q) in [(1, q.clone()), (2, Dist::point(2)), (3, d(&[(3, 0.5), (1, 0.5)]))] {
            let exact = accept_probability(&p, &q, x);
            let acc = (0..n).filter(|_| verify_stochastic(&p, &q, x, &mut rng) == Verdict::Accept).count() as f64 / n as f64;
            assert!(close(acc, exact, 0.005), "x {x}: {acc} vs {exact}");
        }
    }

    #[test]
    fn point_mass_draft() {
        let p = d(&[(1, 0.5), (2, 0.3), (3, 0.2)]);
        let q = Dist::point(2);
        let without = d(&[(1, 0.5), (3, 0.2)]);
        assert!(close(accept_probability(&p, &q, 2), 0.3, 1e-6));
        assert_dist_eq(&residual(&p, &q).unwrap(), &without, 1e-6);
        let mut rng = seeded(12);
        let n = 200_000u64;
        let (mut acc, mut rej) = (0u64, HashMap::new());
        for _ in 0..n {
            match verify_stochastic(&p, &q, 2, &mut rng) {
                Verdict::Accept => acc += 1,
                Verdict::Reject { token } => *rej.entry(token).or_insert(0u64) += 1,
            }
        }
        assert!(close(acc as f64 / n as f64, 0.3, 0.005));
        assert!(!rej.contains_key(&2));
        let nr: u64 = rej.values().sum();
        assert!(tv_counts(&rej, nr, &without) < 0.01);
    }

    #[test]
    fn disjoint_draft_always_rejected() {
        let p = d(&[(1, 0.6), (2, 0.3), (3, 0.1)]);
        let q = d(&[(7, 0.5), (8, 0.5)]);
        let mut rng = seeded(13);
        let n = 200_000;
        let mut c = HashMap::new();
        for _ in 0..n {
            let x = q.sample(&mut rng).unwrap();
            match verify_stochastic(&p, &q, x, &mut rng) {
                Verdict::Accept => panic!("accepted a token p gives probability 0"),
                Verdict::Reject { token } => *c.entry(token).or_insert(0) += 1,
            }
        }
        assert!(tv_counts(&c, n, &p) < 0.01);
        // greedy target with zero-prob draft
        assert_eq!(verify_stochastic(&Dist::point(4), &Dist::point(5), 5, &mut rng), Verdict::Reject { token: 4 });
    }

    #[test]
    fn greedy_verify() {
        let p = d(&[(1, 0.2), (2, 0.5), (3, 0.3)]);
        assert_eq!(verify_greedy(&p, 2), Verdict::Accept);
        assert_eq!(verify_greedy(&p, 1), Verdict::Reject { token: 2 });
        assert_eq!(verify_greedy(&p, 99), Verdict::Reject { token: 2 });
        let tie = Dist { ids: vec![4, 3], probs: vec![0.5, 0.5] };
        assert_eq!(verify_greedy(&tie, 3), Verdict::Reject { token: 4 });
        assert_eq!(verify_greedy(&Dist::default(), 3), Verdict::Accept);
    }

    /// Exact output distribution of (x ~ q, verify against p), computed from
    /// accept_probability and residual; must equal p.
    #[test]
    fn lossless_exact() {
        for (name, p, q) in pairs() {
            let mut out: HashMap<i32, f64> = HashMap::new();
            let mut p_acc = 0.0;
            for (&x, &qx) in q.ids.iter().zip(&q.probs) {
                let a = accept_probability(&p, &q, x);
                *out.entry(x).or_insert(0.0) += qx as f64 * a;
                p_acc += qx as f64 * a;
            }
            assert!(close(p_acc, expected_acceptance(&p, &q), 1e-6), "{name}");
            let r = residual(&p, &q).unwrap_or_else(|| p.clone());
            for (&y, &ry) in r.ids.iter().zip(&r.probs) {
                *out.entry(y).or_insert(0.0) += (1.0 - p_acc) * ry as f64;
            }
            for (&y, &v) in &out {
                assert!(close(v, p.prob(y) as f64, 1e-6), "{name}: token {y}: {v} vs {}", p.prob(y));
            }
            for &y in &p.ids {
                assert!(out.contains_key(&y), "{name}");
            }
        }
    }

    /// The key property: the token emitted by (draw x ~ q, verify against p)
    /// is distributed as p.
    #[test]
    fn lossless_statistical_single() {
        let mut rng = seeded(2024);
        let n = 200_000;
        for (name, p, q) in pairs() {
            let mut c = HashMap::new();
            for _ in 0..n {
                let x = q.sample(&mut rng).unwrap();
                let y = match verify_stochastic(&p, &q, x, &mut rng) {
                    Verdict::Accept => x,
                    Verdict::Reject { token } => token,
                };
                *c.entry(y).or_insert(0) += 1;
            }
            let tv = tv_counts(&c, n, &p);
            assert!(tv < 0.01, "{name}: TV {tv}");
        }
    }

    // ---------------------------------------------------------------- chain

    #[test]
    fn chain_all_accepted_when_q_equals_p() {
        let ps = vec![d(&[(1, 0.5), (2, 0.5)]), d(&[(1, 0.2), (3, 0.8)]), d(&[(4, 0.25), (5, 0.75)])];
        let mut rng = seeded(4);
        let n = 100_000;
        let mut bonus = HashMap::new();
        for _ in 0..n {
            let drafts: Vec<(i32, Dist)> = ps[..2].iter().map(|p| (p.sample(&mut rng).unwrap(), p.clone())).collect();
            let out = verify_chain(&ps, &drafts, false, &mut rng);
            assert_eq!(out.len(), 3);
            assert_eq!(out[0], drafts[0].0);
            assert_eq!(out[1], drafts[1].0);
            *bonus.entry(out[2]).or_insert(0) += 1;
        }
        assert!(tv_counts(&bonus, n, &ps[2]) < 0.01);
        // no drafts: one token from ps[0]
        assert_eq!(verify_chain(&ps[..1], &[], false, &mut rng).len(), 1);
    }

    #[test]
    fn chain_rejection_stops() {
        let ps = vec![d(&[(1, 1.0)]), d(&[(2, 1.0)]), d(&[(3, 1.0)])];
        let mut rng = seeded(6);
        let drafts = vec![(1, Dist::point(1)), (9, Dist::point(9))];
        assert_eq!(verify_chain(&ps, &drafts, false, &mut rng), vec![1, 2]);
        assert_eq!(verify_chain(&ps, &drafts, true, &mut rng), vec![1, 2]);
        let good = vec![(1, Dist::point(1)), (2, Dist::point(2))];
        assert_eq!(verify_chain(&ps, &good, false, &mut rng), vec![1, 2, 3]);
        assert_eq!(verify_chain(&ps, &good, true, &mut rng), vec![1, 2, 3]);
    }

    /// Synthetic "models" over a 4-token vocabulary whose next-token
    /// distribution depends on the previous token.
    fn target(prev: i32) -> Dist {
        match prev {
            0 => d(&[(0, 0.1), (1, 0.4), (2, 0.3), (3, 0.2)]),
            1 => d(&[(0, 0.6), (1, 0.05), (2, 0.05), (3, 0.3)]),
            2 => d(&[(2, 0.5), (3, 0.5)]),
            _ => d(&[(0, 0.25), (1, 0.25), (2, 0.25), (3, 0.25)]),
        }
    }

    fn draft(prev: i32) -> Dist {
        match prev {
            0 => d(&[(1, 0.7), (2, 0.2), (3, 0.1)]),
            1 => Dist::point(0), // greedy-ish drafter here
            2 => d(&[(0, 0.5), (3, 0.5)]),
            _ => d(&[(0, 0.4), (1, 0.4), (2, 0.2)]),
        }
    }

    #[test]
    fn chain_reproduces_joint_distribution() {
        // Exact joint of the first 3 tokens after context token 0.
        let mut exact2: HashMap<Vec<i32>, f64> = HashMap::new();
        let mut exact3: HashMap<Vec<i32>, f64> = HashMap::new();
        let p0 = target(0);
        for (&a, &pa) in p0.ids.iter().zip(&p0.probs) {
            let p1 = target(a);
            for (&b, &pb) in p1.ids.iter().zip(&p1.probs) {
                *exact2.entry(vec![a, b]).or_insert(0.0) += pa as f64 * pb as f64;
                let p2 = target(b);
                for (&c, &pc) in p2.ids.iter().zip(&p2.probs) {
                    exact3.insert(vec![a, b, c], pa as f64 * pb as f64 * pc as f64);
                }
            }
        }
        let mut rng = seeded(99);
        let n = 200_000u64;
        let mut emp2: HashMap<Vec<i32>, f64> = HashMap::new();
        let mut emp3: HashMap<Vec<i32>, f64> = HashMap::new();
        let mut lens = [0u64; 4];
        for _ in 0..n {
            // draft 2 tokens, autoregressively from the draft model
            let q0 = draft(0);
            let x0 = q0.sample(&mut rng).unwrap();
            let q1 = draft(x0);
            let x1 = q1.sample(&mut rng).unwrap();
            // target distributions given the drafted prefix (k + 1 = 3)
            let ps = [target(0), target(x0), target(x1)];
            let mut out = verify_chain(&ps, &[(x0, q0), (x1, q1)], false, &mut rng);
            assert!((1..=3).contains(&out.len()));
            lens[out.len()] += 1;
            // continue with plain target sampling, as the next step would
            while out.len() < 3 {
                let t = target(*out.last().unwrap()).sample(&mut rng).unwrap();
                out.push(t);
            }
            *emp2.entry(out[..2].to_vec()).or_insert(0.0) += 1.0 / n as f64;
            *emp3.entry(out).or_insert(0.0) += 1.0 / n as f64;
        }
        let tv2 = tv_maps(&emp2, &exact2);
        let tv3 = tv_maps(&emp3, &exact3);
        assert!(tv2 < 0.01, "2-token joint TV {tv2}");
        assert!(tv3 < 0.02, "3-token joint TV {tv3}");
        // every outcome length actually occurs
        assert!(lens[1] > 0 && lens[2] > 0 && lens[3] > 0, "{lens:?}");
    }

    #[test]
    fn greedy_chain_equals_greedy_decoding() {
        let greedy_decode = |n: usize| {
            let mut v = vec![0];
            for _ in 0..n {
                v.push(target(*v.last().unwrap()).argmax().unwrap());
            }
            v[1..].to_vec()
        };
        let want = greedy_decode(3);
        let mut rng = seeded(0);
        for x0 in 0..4 {
            for x1 in 0..4 {
                let ps = [target(0), target(x0), target(x1)];
                let drafts = [(x0, draft(0)), (x1, draft(x0))];
                let out = verify_chain(&ps, &drafts, true, &mut rng);
                assert_eq!(out[..], want[..out.len()], "drafts {x0} {x1}");
                if x0 == want[0] && x1 == want[1] {
                    assert_eq!(out, want);
                }
            }
        }
    }
}
