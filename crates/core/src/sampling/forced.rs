//! Forced text: what a constraint allows only one way of writing (braces,
//! quotes, key names, the rest of an enum value, a tool call's closing tag).
//! llguidance gives it as bytes, special tokens written `\xFF[id]`; here it
//! becomes the model's tokens, canonically: text tokenised by the model's
//! own tokenizer, cut at its last whole character, the last text token
//! dropped (the model may merge it with what follows). The constraint forces
//! the first of these tokens (so a key is written as the model's tokenizer
//! writes it, not spelled out in pieces the mask would also allow), and the
//! grammar drafter drafts them all.

/// The model's tokenizer: text bytes to token ids (no BOS, no special tokens).
/// Shared and `Send`: a constraint is compiled on its own thread.
pub type Tokenize = std::sync::Arc<dyn Fn(&[u8]) -> Vec<i32> + Send + Sync>;

/// The tokens of forced bytes: special tokens as they are, text through
/// `tokenize` cut at its last whole character, the last text token dropped
/// (unless a special token follows it, which nothing can merge with).
pub fn forced_tokens(bytes: &[u8], tokenize: &dyn Fn(&[u8]) -> Vec<i32>, n_max: usize) -> Vec<i32> {
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

/// Splits forced bytes into text runs and special tokens (`\xFF[id]`).
pub fn split_forced(bytes: &[u8]) -> Vec<Forced<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == 0xFF {
            if let Some((n, id)) =
                bytes.get(i + 1..).filter(|r| r.first() == Some(&b'[')).and_then(llguidance::toktrie::parse_numeric_token)
            {
                if i > start {
                    out.push(Forced::Text(&bytes[start..i]));
                }
                out.push(Forced::Token(id));
                i += 1 + n;
                start = i;
                continue;
            }
        }
        i += 1;
    }
    if start < bytes.len() {
        out.push(Forced::Text(&bytes[start..]));
    }
    out
}

/// A piece of forced output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced<'a> {
    Text(&'a [u8]),
    Token(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_tokens_in_forced_bytes() {
        assert_eq!(split_forced(b"ab\xFF[12]c\xFF[7]"), vec![Forced::Text(b"ab"), Forced::Token(12), Forced::Text(b"c"), Forced::Token(7)]);
        assert_eq!(split_forced(b"\xFFx"), vec![Forced::Text(b"\xFFx")]);
        assert_eq!(split_forced(b""), Vec::<Forced>::new());
    }

    /// A tokenizer that makes one token per byte (ids = byte values).
    fn bytes(b: &[u8]) -> Vec<i32> {
        b.iter().map(|&x| x as i32).collect()
    }

    #[test]
    fn forced_text_drops_its_last_token() {
        assert_eq!(forced_tokens(b"{\"a", &bytes, 16), vec![b'{' as i32, b'"' as i32]);
        assert_eq!(forced_tokens(b"x", &bytes, 16), Vec::<i32>::new());
        assert_eq!(forced_tokens(b"abcdef", &bytes, 3), vec![97, 98, 99]);
    }

    #[test]
    fn special_tokens_stand_and_text_before_them_is_kept_whole() {
        // "ab" then a special token then "cd": the text before a special
        // token cannot merge with it, so all of it stays.
        assert_eq!(forced_tokens(b"ab\xFF[300]cd", &bytes, 16), vec![97, 98, 300, 99]);
        assert_eq!(forced_tokens(b"\xFF[7]", &bytes, 16), vec![7]);
    }

    #[test]
    fn a_cut_character_ends_the_draft() {
        // "é" is two bytes; only its first is forced.
        assert_eq!(forced_tokens(b"ab\xC3", &bytes, 16), vec![97]);
        assert_eq!(forced_tokens(b"ab\xC3\xFF[5]", &bytes, 16), vec![97, 98]);
    }
}
