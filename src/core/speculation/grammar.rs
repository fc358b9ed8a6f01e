//! The grammar drafter: what a request's constraint forces (braces, quotes,
//! key names, the only value an enum leaves, a tool call's closing tag) is
//! proposed as a draft, in the model's own tokenisation, and verified like
//! any other. llguidance gives the forced *bytes*; its own forced tokens
//! need a canonical tokenizer, which the llama.cpp vocabulary's trie is not.
//! So the bytes are tokenised by the model's tokenizer here, the last text
//! token is dropped (the model may merge it with what follows), and the
//! target decides: a draft it would not have produced token for token is
//! rejected and costs what the controller measured.

use std::cell::RefCell;
use std::rc::Rc;

use super::drafter::{Draft, Drafter};
use crate::core::sampling::constraint::{split_forced, Constraint, Forced};
use crate::core::text::events::TokenSource;

/// The model's tokenizer: text bytes to token ids (no BOS, no special tokens).
pub type Tokenize = Box<dyn Fn(&[u8]) -> Vec<i32>>;

pub struct GrammarDrafter {
    constraint: Rc<RefCell<Constraint>>,
    tokenize: Tokenize,
}

impl GrammarDrafter {
    /// `constraint` is the request's own, shared with its sampler.
    pub fn new(constraint: Rc<RefCell<Constraint>>, tokenize: Tokenize) -> Self {
        GrammarDrafter { constraint, tokenize }
    }
}

/// The draft for forced bytes: special tokens as they are, text through
/// `tokenize` cut at its last whole character, the last text token dropped
/// (unless a special token follows it, which nothing can merge with).
pub fn forced_draft(bytes: &[u8], tokenize: &dyn Fn(&[u8]) -> Vec<i32>, n_max: usize) -> Vec<i32> {
    let parts = split_forced(bytes);
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match part {
            Forced::Token(id) => match i32::try_from(*id) {
                Ok(id) => out.push(id),
                Err(_) => break,
            },
            Forced::Text(text) => {
                let text = whole_characters(text);
                let mut tokens = tokenize(text);
                let last = i + 1 == parts.len();
                if last {
                    tokens.pop();
                }
                out.extend(tokens);
                if last || text.len() < parts_len(part) {
                    break;
                }
            }
        }
        if out.len() >= n_max {
            break;
        }
    }
    out.truncate(n_max);
    out
}

fn parts_len(part: &Forced<'_>) -> usize {
    match part {
        Forced::Text(t) => t.len(),
        Forced::Token(_) => 0,
    }
}

/// The longest prefix of `bytes` that ends on a character boundary.
fn whole_characters(bytes: &[u8]) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes,
        Err(e) => &bytes[..e.valid_up_to()],
    }
}

impl Drafter for GrammarDrafter {
    fn name(&self) -> &'static str {
        "grammar"
    }

    fn draft(&mut self, _history: &[i32], n_max: usize, _position: usize) -> Option<Draft> {
        let bytes = self.constraint.borrow_mut().forced_bytes();
        if bytes.is_empty() {
            return None;
        }
        let tokens = forced_draft(&bytes, &*self.tokenize, n_max);
        (!tokens.is_empty()).then(|| Draft::new(tokens, TokenSource::Grammar, Vec::new()))
    }

    fn is_cheap(&self) -> bool {
        true
    }

    fn ms_per_token(&self) -> Option<f64> {
        // A few microseconds for the forced bytes and their tokenisation.
        Some(0.005)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer that makes one token per byte (ids = byte values).
    fn bytes(b: &[u8]) -> Vec<i32> {
        b.iter().map(|&x| x as i32).collect()
    }

    #[test]
    fn forced_text_drops_its_last_token() {
        assert_eq!(forced_draft(b"{\"a", &bytes, 16), vec![b'{' as i32, b'"' as i32]);
        assert_eq!(forced_draft(b"x", &bytes, 16), Vec::<i32>::new());
        assert_eq!(forced_draft(b"abcdef", &bytes, 3), vec![97, 98, 99]);
    }

    #[test]
    fn special_tokens_stand_and_text_before_them_is_kept_whole() {
        // "ab" then a special token then "cd": the text before a special
        // token cannot merge with it, so all of it stays.
        assert_eq!(forced_draft(b"ab\xFF[300]cd", &bytes, 16), vec![97, 98, 300, 99]);
        assert_eq!(forced_draft(b"\xFF[7]", &bytes, 16), vec![7]);
    }

    #[test]
    fn a_cut_character_ends_the_draft() {
        // "é" is two bytes; only its first is forced.
        assert_eq!(forced_draft(b"ab\xC3", &bytes, 16), vec![97]);
        assert_eq!(forced_draft(b"ab\xC3\xFF[5]", &bytes, 16), vec![97, 98]);
    }
}
