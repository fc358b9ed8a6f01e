//! Where a prompt's tokens sit in the KV cache. Token i is at position i,
//! except after a media chunk that spans fewer positions than it has tokens
//! (M-RoPE: an image of nx × ny tokens takes max(nx, ny) positions; its
//! tokens' cells share the image's first position in the first dimension,
//! the other dimensions in the cells' extra fields, and the text after it
//! goes on from its last position). Cells are cut and checked by position,
//! counted by token; states kept (prompt cache, session files) carry these
//! spans so that their cells can be checked and placed again.

use serde::{Deserialize, Serialize};

/// A media chunk of `n_tokens` tokens from token `start` that spans
/// `n_pos` positions, fewer than its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub start: usize,
    pub n_tokens: usize,
    pub n_pos: usize,
}

impl Span {
    pub fn end(&self) -> usize {
        self.start + self.n_tokens
    }
}

/// The spans of a token list that shift positions (none: identity).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions(Vec<Span>);

impl Positions {
    /// Positions of a token list with these media chunks (sorted, apart);
    /// those that take a position per token change nothing and are left out.
    pub fn new(spans: impl IntoIterator<Item = Span>) -> Result<Positions, String> {
        let mut out: Vec<Span> = Vec::new();
        for s in spans {
            if s.n_pos == 0 || s.n_pos > s.n_tokens {
                return Err(format!("a media chunk of {} tokens spanning {} positions", s.n_tokens, s.n_pos));
            }
            if out.last().is_some_and(|p| p.end() > s.start) {
                return Err(format!("media chunks overlap or are out of order (one starts at token {})", s.start));
            }
            if s.n_pos < s.n_tokens {
                out.push(s);
            }
        }
        Ok(Positions(out))
    }

    pub fn spans(&self) -> &[Span] {
        &self.0
    }

    /// Whether every token is at its own index.
    pub fn is_identity(&self) -> bool {
        self.0.is_empty()
    }

    /// The positions taken before token `i` (the position of token `i`,
    /// when it is not inside a chunk): what the chunks it follows take
    /// less than their tokens.
    pub fn pos(&self, i: usize) -> usize {
        i - self.0.iter().filter(|s| s.end() <= i).map(|s| s.n_tokens - s.n_pos).sum::<usize>()
    }

    /// The positions the cell of token `i` may have: its own outside a
    /// chunk; inside one, the chunk's (first dimension of M-RoPE: every
    /// image token at the chunk's first position; other layouts step
    /// through its positions).
    pub fn cell_range(&self, i: usize) -> (usize, usize) {
        match self.0.iter().find(|s| s.start <= i && i < s.end()) {
            Some(s) => {
                let p = self.pos(s.start);
                (p, p + s.n_pos - 1)
            }
            None => (self.pos(i), self.pos(i)),
        }
    }

    /// These positions for the first `n` tokens (chunks that end after `n`
    /// dropped; a token list is never cut inside one).
    pub fn prefix(&self, n: usize) -> Positions {
        Positions(self.0.iter().copied().filter(|s| s.end() <= n).collect())
    }

    /// Checks that the cells of `n` tokens have these positions, in order:
    /// text cells exactly theirs, a chunk's within its positions and never
    /// going back.
    pub fn check_cells(&self, cells: &[i32], n: usize) -> Result<(), String> {
        let start = n.checked_sub(cells.len()).ok_or_else(|| format!("{} cells for {n} tokens", cells.len()))?;
        let mut last = i64::MIN;
        for (j, &p) in cells.iter().enumerate() {
            let (lo, hi) = self.cell_range(start + j);
            let p = i64::from(p);
            if p < lo as i64 || p > hi as i64 || p < last {
                return Err(if self.is_identity() {
                    format!("cells out of place (positions must be {start}..{n} in order)")
                } else {
                    format!("cells out of place (the cell of token {} is at position {p}, not {lo}..={hi})", start + j)
                });
            }
            last = p;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(start: usize, n_tokens: usize, n_pos: usize) -> Span {
        Span { start, n_tokens, n_pos }
    }

    #[test]
    fn identity_without_shrinking_chunks() {
        let p = Positions::new([image(3, 16, 16)]).unwrap();
        assert!(p.is_identity());
        assert_eq!(p.pos(40), 40);
        assert_eq!(p.cell_range(5), (5, 5));
    }

    #[test]
    fn text_after_an_mrope_image_goes_on_from_its_last_position() {
        // 4 text tokens, an image of 16 tokens over 4 positions, text.
        let p = Positions::new([image(4, 16, 4)]).unwrap();
        assert_eq!(p.pos(4), 4);
        assert_eq!(p.pos(20), 8);
        assert_eq!(p.pos(25), 13);
        assert_eq!(p.cell_range(10), (4, 7));
        assert_eq!(p.cell_range(21), (9, 9));
        // Two images.
        let q = Positions::new([image(4, 16, 4), image(22, 9, 3)]).unwrap();
        assert_eq!(q.pos(31), 31 - 12 - 6);
        assert_eq!(q.prefix(25), p);
        assert_eq!(q.prefix(31), q);
    }

    #[test]
    fn cells_are_checked_against_the_positions() {
        let p = Positions::new([image(2, 4, 2)]).unwrap();
        // Tokens: t t [i i i i] t t -> cells 0 1 [2 2 2 2] 4 5.
        assert!(p.check_cells(&[0, 1, 2, 2, 2, 2, 4, 5], 8).is_ok());
        assert!(p.check_cells(&[0, 1, 2, 2, 3, 3, 4, 5], 8).is_ok());
        assert!(p.check_cells(&[0, 1, 2, 3, 2, 2, 4, 5], 8).unwrap_err().contains("token 4"));
        assert!(p.check_cells(&[0, 1, 2, 2, 2, 2, 6, 7], 8).is_err());
        assert!(p.check_cells(&[0, 1, 2, 3, 4, 5, 6, 7], 8).is_err());
        // A window: the last cells only.
        assert!(p.check_cells(&[4, 5], 8).is_ok());
        assert!(Positions::default().check_cells(&[0, 1, 3], 3).unwrap_err().contains("0..3"));
    }

    #[test]
    fn malformed_spans_are_refused() {
        assert!(Positions::new([image(0, 4, 0)]).is_err());
        assert!(Positions::new([image(0, 4, 5)]).is_err());
        assert!(Positions::new([image(4, 4, 2), image(6, 4, 2)]).is_err());
        assert!(Positions::new([image(8, 4, 2), image(0, 4, 2)]).is_err());
    }
}
