//! Verifying drafts: sample and match.
//!
//! At every position the target chooses its token exactly as plain decoding
//! would — the argmax when greedy, else the Gumbel-max of `p`, the
//! distribution left by the request's whole sampler chain (penalties,
//! temperature, top-k/top-p/min-p, grammar), with the position's noise
//! (`sampling::noise::PositionNoise`). A drafted token is accepted when it is that
//! choice; the first that is not is replaced by it and ends the step; when
//! every draft is accepted the next position adds one more. The output is
//! therefore token for token what plain decoding gives with the same seed,
//! whoever drafted, however much, beside whichever other requests. A draft
//! is accepted with probability `p(x)` when it was chosen deterministically
//! (n-grams, a greedy or tree draft), and with the probability that two
//! Gumbel-max draws with shared noise agree when the draft model sampled it
//! with the same noise (at least (1 − TV)/(1 + TV) of its distribution and
//! the target's).

/// One step's verification. `draft` holds the drafted tokens; `choose(i)`
/// is the target's own choice at row i of the step (row 0 follows the
/// pending token) together with whatever the caller keeps with it; `ends`
/// tells a token that ends generation; at most `max_tokens` are produced.
/// Returns how many drafts were accepted, and the step's tokens, each with
/// whether it came from the draft.
pub fn verify_draft<T>(
    draft: &[i32],
    max_tokens: usize,
    ends: impl Fn(i32) -> bool,
    mut choose: impl FnMut(usize) -> (i32, T),
) -> (usize, Vec<(i32, bool, T)>) {
    let mut out = Vec::with_capacity(draft.len() + 1);
    for (i, &x) in draft.iter().enumerate() {
        let (t, extra) = choose(i);
        let ok = t == x;
        out.push((t, ok, extra));
        if !ok || ends(t) || out.len() >= max_tokens {
            return (i + usize::from(ok), out);
        }
    }
    // Every draft accepted (or none proposed): the target adds one more.
    let (t, extra) = choose(draft.len());
    out.push((t, false, extra));
    (draft.len(), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::noise::PositionNoise;
    use crate::sampling::Dist;

    fn d(pairs: &[(i32, f32)]) -> Dist {
        let total: f32 = pairs.iter().map(|p| p.1).sum();
        Dist { ids: pairs.iter().map(|p| p.0).collect(), probs: pairs.iter().map(|p| p.1 / total).collect() }
    }

    /// A toy model: what the target's distribution is after a token.
    fn target(prev: i32) -> Dist {
        match prev.rem_euclid(3) {
            0 => d(&[(1, 0.6), (2, 0.3), (3, 0.1)]),
            1 => d(&[(2, 0.5), (3, 0.5)]),
            _ => d(&[(0, 0.2), (1, 0.2), (3, 0.6)]),
        }
    }

    #[test]
    fn any_drafts_give_the_output_of_plain_sampling() {
        // Plain sampling of 40 tokens, one per position...
        let seed = 11;
        let plain: Vec<i32> = (0..40u64)
            .scan(0, |prev, pos| {
                *prev = target(*prev).sample(&mut PositionNoise::new(seed, pos)).unwrap();
                Some(*prev)
            })
            .collect();
        // ...equals steps verifying drafts of every length, right or wrong.
        for (k, wrong_every) in [(1, 2), (3, 3), (8, 5), (16, 1000)] {
            let mut out: Vec<i32> = Vec::new();
            while out.len() < plain.len() {
                let pos = out.len();
                let draft: Vec<i32> = (0..k)
                    .map(|i| if (pos + i).is_multiple_of(wrong_every) { 99 } else { plain.get(pos + i).copied().unwrap_or(0) })
                    .collect();
                let mut prev = out.last().copied().unwrap_or(0);
                let (n_ok, tokens) = verify_draft(
                    &draft,
                    plain.len() - pos,
                    |_| false,
                    |i| {
                        let t = target(prev).sample(&mut PositionNoise::new(seed, (pos + i) as u64)).unwrap();
                        prev = t;
                        (t, ())
                    },
                );
                assert!(tokens.iter().take(n_ok).all(|t| t.1));
                assert!(n_ok <= draft.len() && tokens.len() <= n_ok + 1);
                out.extend(tokens.iter().map(|t| t.0));
            }
            assert_eq!(out, plain, "k = {k}");
        }
    }

    #[test]
    fn verification_stops_at_an_end_and_at_the_budget() {
        let (n_ok, t) = verify_draft(&[5, 6, 7], 10, |t| t == 6, |i| ([5, 6, 7, 8][i], ()));
        assert_eq!((n_ok, t.iter().map(|x| x.0).collect::<Vec<_>>()), (2, vec![5, 6]));
        let (n_ok, t) = verify_draft(&[5, 6, 7], 2, |_| false, |i| ([5, 6, 7, 8][i], ()));
        assert_eq!((n_ok, t.len()), (2, 2));
        let (n_ok, t) = verify_draft(&[5, 6, 7], 10, |_| false, |i| ([5, 6, 7, 8][i], ()));
        assert_eq!((n_ok, t.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>()), (3, vec![(5, true), (6, true), (7, true), (8, false)]));
        let (n_ok, t) = verify_draft(&[], 10, |_| false, |_| (4, ()));
        assert_eq!((n_ok, t.len()), (0, 1));
    }
}
