//! Fitting a prompt into the context window, as the legacy server did:
//! keep the first `n_keep` tokens, drop whole blocks after them.

/// `n_keep` as the request gave it (-1 = the whole prompt), clamped so that
/// at least a few positions remain for generation.
pub fn effective_n_keep(n_keep: i32, n_prompt: usize, n_ctx: usize) -> usize {
    let wanted = if n_keep < 0 { n_prompt } else { n_keep as usize };
    wanted.min(n_ctx.saturating_sub(4)).min(n_prompt)
}

/// Truncates `tokens` when it does not fit in `n_ctx`: keeps the first
/// `n_keep`, then erases blocks of half the remaining window from just after
/// them until the rest fits with room to generate. Returns whether it cut.
pub fn truncate_prompt<T: Copy>(tokens: &mut Vec<T>, n_keep: usize, n_ctx: usize) -> bool {
    let n = tokens.len();
    if n < n_ctx {
        return false;
    }
    let block = ((n_ctx - n_keep) / 2).max(1);
    let erased_blocks = (n - n_keep - block - 1) / block + 1;
    let erase = (erased_blocks * block).min(n - n_keep - 1);
    tokens.drain(n_keep..n_keep + erase);
    true
}

/// Positions to discard when generation fills the context (the legacy
/// context shift): half of what lies after the kept prefix.
pub fn shift_discard(n_past: usize, n_keep: usize) -> usize {
    (n_past.saturating_sub(n_keep + 1) / 2).max(1)
}

/// Length of the common prefix of the cached tokens and the new prompt.
pub fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_prompts_are_untouched() {
        let mut t: Vec<i32> = (0..10).collect();
        assert!(!truncate_prompt(&mut t, 2, 16));
        assert_eq!(t.len(), 10);
    }

    #[test]
    fn long_prompt_keeps_prefix_and_tail_and_fits() {
        for n in [16usize, 17, 40, 100, 1000] {
            for keep in [0usize, 1, 5] {
                let mut t: Vec<usize> = (0..n).collect();
                let n_ctx = 16;
                let n_keep = effective_n_keep(keep as i32, n, n_ctx);
                assert!(truncate_prompt(&mut t, n_keep, n_ctx));
                assert!(t.len() < n_ctx, "n={n} keep={keep} len={}", t.len());
                assert_eq!(&t[..n_keep], &(0..n_keep).collect::<Vec<_>>()[..]);
                assert_eq!(*t.last().unwrap(), n - 1, "the end of the prompt survives");
                assert!(t.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }

    #[test]
    fn n_keep_minus_one_keeps_whole_prompt_but_leaves_room() {
        assert_eq!(effective_n_keep(-1, 10, 100), 10);
        assert_eq!(effective_n_keep(-1, 500, 100), 96);
        assert_eq!(effective_n_keep(1000, 10, 100), 10);
    }

    #[test]
    fn shift_discards_half_after_keep() {
        assert_eq!(shift_discard(100, 10), 44);
        assert_eq!(shift_discard(3, 10), 1);
    }

    #[test]
    fn common_prefix_lengths() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix::<i32>(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
