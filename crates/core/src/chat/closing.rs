//! Where a tag-delimited argument value ends. Families whose arguments are
//! XML-ish (`<parameter=city>\nParis\n</parameter>\n` in Qwen3-Coder,
//! `<arg_value>Paris</arg_value>\n` in GLM, MiniMax's and Seed-OSS's
//! `<parameter …>`) close a value with a tag, and llama.cpp's call grammar
//! and parser spell the delimiter with the white space its template writes
//! around the tag (`"\n</parameter>\n"`). A model that writes
//! `Paris</parameter>` without the line break has closed the value for its
//! family's own reader (the reference parsers end a value at the first
//! closing tag), but not for that grammar, which lets the value run on
//! through `</function>` and `</tool_call>` to the token limit.
//!
//! So a value ends at the first closing tag, in both directions: the call
//! grammar ends the value's text there (and then forces the white space
//! after the tag, [`super::call_grammar`]), and before llama.cpp's parser
//! reads an answer, the white space it expects around such a tag is
//! supplied where the model left it out ([`close_values`]).

use std::borrow::Cow;

/// A closing tag with the white space llama.cpp's delimiter puts around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueCloser {
    pub before: String,
    pub tag: String,
    pub after: String,
}

impl ValueCloser {
    /// `delimiter` read as white space, one closing tag (`</name>`), white
    /// space; `None` for anything else.
    pub fn of(delimiter: &str) -> Option<ValueCloser> {
        let rest = delimiter.trim_start();
        let before = &delimiter[..delimiter.len() - rest.len()];
        let tag_len = rest.find('>')? + 1;
        let (tag, after) = rest.split_at(tag_len);
        let name = tag.strip_prefix("</")?.strip_suffix('>')?;
        let name_ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == ':');
        (name_ok && after.chars().all(char::is_whitespace)).then(|| ValueCloser {
            before: before.into(),
            tag: tag.into(),
            after: after.into(),
        })
    }
}

/// `text` with the white space of each closer supplied around its tag
/// where the model left it out, so that a parser looking for the whole
/// delimiter ends the value at the first closing tag. The text may be a
/// part still arriving: a tag cut at its end (`</param`) is treated as the
/// tag it may become, and nothing is added after a tag that ends it.
pub fn close_values<'t>(text: &'t str, closers: &[ValueCloser]) -> Cow<'t, str> {
    let mut out: Cow<'t, str> = Cow::Borrowed(text);
    for closer in closers.iter().filter(|c| !c.before.is_empty() || !c.after.is_empty()) {
        if let Cow::Owned(s) = close_one(&out, closer) {
            out = Cow::Owned(s);
        }
    }
    out
}

fn close_one<'t>(text: &'t str, c: &ValueCloser) -> Cow<'t, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut from = 0;
    // Whole tags.
    while let Some(i) = text[from..].find(&c.tag).map(|i| from + i) {
        let end = i + c.tag.len();
        if !text[..i].ends_with(&c.before) {
            out.push_str(&text[copied..i]);
            out.push_str(&c.before);
            copied = i;
        }
        let next = &text[end..];
        if !next.is_empty() && !next.starts_with(&c.after) && !c.after.starts_with(next) {
            out.push_str(&text[copied..end]);
            out.push_str(&c.after);
            copied = end;
        }
        from = end;
    }
    // A tag cut at the end of text that is still arriving (at least `</`).
    let tail = &text[from..];
    let cut = (2..c.tag.len())
        .rev()
        .find(|&n| tail.len() >= n && tail.is_char_boundary(tail.len() - n) && c.tag.starts_with(&tail[tail.len() - n..]));
    if let Some(n) = cut {
        let i = text.len() - n;
        if !text[..i].ends_with(&c.before) {
            out.push_str(&text[copied..i]);
            out.push_str(&c.before);
            copied = i;
        }
    }
    if copied == 0 && out.is_empty() {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> ValueCloser {
        ValueCloser::of("\n</parameter>\n").unwrap()
    }

    #[test]
    fn reads_delimiters() {
        assert_eq!(qwen(), ValueCloser { before: "\n".into(), tag: "</parameter>".into(), after: "\n".into() });
        assert_eq!(
            ValueCloser::of("</arg_value>\n"),
            Some(ValueCloser { before: "".into(), tag: "</arg_value>".into(), after: "\n".into() })
        );
        for not in ["\n</parameter>x", "<parameter>", "</>", "</a b>", "\"", "</tool_call>\n<tool_call>"] {
            assert_eq!(ValueCloser::of(not), None, "{not:?}");
        }
    }

    #[test]
    fn supplies_the_white_space_around_a_bare_tag() {
        let c = [qwen()];
        let whole = "<parameter=city>\nParis\n</parameter>\n</function>";
        assert!(matches!(close_values(whole, &c), Cow::Borrowed(_)));
        assert_eq!(close_values("<parameter=city>\nParis</parameter>\n</function>", &c), whole);
        assert_eq!(close_values("<parameter=city>\nParis</parameter></function>", &c), whole);
        // Two values, the second already whole.
        assert_eq!(
            close_values("a</parameter>\n<parameter=b>\nb\n</parameter>\n", &c),
            "a\n</parameter>\n<parameter=b>\nb\n</parameter>\n"
        );
        // Nothing after a tag that ends the text so far, or after a part of what follows it.
        assert_eq!(close_values("Paris</parameter>", &c), "Paris\n</parameter>");
        assert_eq!(close_values("Paris\n</parameter>\n", &c), "Paris\n</parameter>\n");
    }

    #[test]
    fn a_tag_cut_at_the_end_is_treated_as_the_tag() {
        let c = [qwen()];
        assert_eq!(close_values("Paris</param", &c), "Paris\n</param");
        assert_eq!(close_values("Paris</", &c), "Paris\n</");
        assert_eq!(close_values("Paris<", &c), "Paris<");
        assert_eq!(close_values("Paris\n</param", &c), "Paris\n</param");
        assert_eq!(close_values("x < y</p", &c), "x < y\n</p");
    }

    #[test]
    fn unicode_and_other_text_are_left_alone() {
        let c = [qwen()];
        for t in ["", "héllo wörld", "</paramete", "a</b>", "日本</parameter"] {
            let out = close_values(t, &c);
            assert!(out.len() >= t.len());
        }
        assert_eq!(close_values("日本</parameter>", &c), "日本\n</parameter>");
    }
}
