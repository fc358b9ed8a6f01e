//! GBNF read into a syntax tree, as llama.cpp's parser
//! (`llama-grammar.cpp`) reads it: the same syntax, white space, comments
//! and escapes, so what it refuses llama.cpp refuses too, and where; what
//! llama.cpp's parser does besides reading (numbering rules, expanding
//! repetitions) is `super::check`'s. Errors say where, with line and
//! column (1-based). Positions in the tree are byte offsets into the text.

/// Deepest nesting of parentheses (the parser recurses into each).
pub const MAX_NESTING: usize = 64;

/// A grammar as written: its rules in order. A name may be defined more
/// than once (llama.cpp keeps the last definition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grammar {
    pub rules: Vec<Rule>,
}

/// `name ::= alternatives`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub alternatives: Vec<Sequence>,
}

pub type Sequence = Vec<Item>;

/// An atom and where it is written (for a repetition, where its operator is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub at: usize,
    pub atom: Atom,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Atom {
    /// `"…"`: code points, which escapes may make of any 32-bit value.
    Literal(Vec<u32>),
    /// `[…]` or `[^…]`: each member a character, and the upper end when it
    /// is a range `a-z`.
    Class {
        negated: bool,
        members: Vec<(u32, Option<u32>)>,
    },
    /// `.`
    AnyChar,
    /// A rule, by name.
    Rule(String),
    /// `(… | …)`
    Group(Vec<Sequence>),
    /// `<[42]>` or `<|im_end|>`, or either negated (`!<[42]>`).
    Token {
        negated: bool,
        token: Token,
    },
    Repeat(Box<Item>, Repetition),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    Id(u32),
    /// Its text with the angle brackets (`<|im_end|>`): the vocabulary
    /// says which token it is.
    Named(String),
}

/// A repetition as written: an operator or bounds in braces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repetition {
    /// `?`
    Optional,
    /// `*`
    Star,
    /// `+`
    Plus,
    /// `{m}`, `{m,}` or `{m,n}` (`max` None); numbers too large for 64
    /// bits read as `u64::MAX`.
    Braces { min: u64, max: Option<u64> },
}

impl Repetition {
    /// `(min, max)`; `max` None is unbounded.
    pub fn bounds(self) -> (u64, Option<u64>) {
        match self {
            Repetition::Optional => (0, Some(1)),
            Repetition::Star => (0, None),
            Repetition::Plus => (1, None),
            Repetition::Braces { min, max } => (min, max),
        }
    }
}

impl Atom {
    /// Whether llama.cpp writes no rule element for it (`""`, `[]`,
    /// `x{0}`): it refuses a repetition of that.
    fn writes_nothing(&self) -> bool {
        match self {
            Atom::Literal(chars) => chars.is_empty(),
            Atom::Class { members, .. } => members.is_empty(),
            Atom::Repeat(_, Repetition::Braces { min: 0, max: Some(0) }) => true,
            _ => false,
        }
    }
}

/// Reads a grammar. The error says what is wrong and where.
pub fn parse(src: &str) -> Result<Grammar, String> {
    // The parser stops at NUL as llama.cpp's (a C string) would: refused.
    if let Some(at) = src.find('\0') {
        return Err(format!("{}: NUL characters are not allowed", position(src, at)));
    }
    let p = Parser { src, b: src.as_bytes() };
    let mut rules = Vec::new();
    let mut pos = p.space(0, true);
    while p.at(pos) != 0 {
        let (rule, next) = p.rule(pos)?;
        rules.push(rule);
        pos = next;
    }
    Ok(Grammar { rules })
}

/// "line L, column C" of byte offset `at` (columns count characters).
pub fn position(text: &str, at: usize) -> String {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {col}")
}

/// The port of `llama_grammar_parser`'s reading. Positions are byte
/// offsets into `src`; the end of the text stands for C's terminating NUL.
struct Parser<'a> {
    src: &'a str,
    b: &'a [u8],
}

type P<T> = Result<T, String>;

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl Parser<'_> {
    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    fn err<T>(&self, i: usize, what: &str) -> P<T> {
        Err(format!("{}: {what}", position(self.src, i)))
    }

    fn space(&self, mut i: usize, newline_ok: bool) -> usize {
        loop {
            match self.at(i) {
                b' ' | b'\t' => i += 1,
                b'\r' | b'\n' if newline_ok => i += 1,
                b'#' => {
                    while !matches!(self.at(i), 0 | b'\r' | b'\n') {
                        i += 1;
                    }
                }
                _ => return i,
            }
        }
    }

    fn name(&self, i: usize) -> P<usize> {
        let mut j = i;
        while is_word_char(self.at(j)) {
            j += 1;
        }
        if j == i {
            return self.err(i, "expecting a rule name");
        }
        Ok(j)
    }

    /// Digits at `i`: the index after them and their value, None when it
    /// does not fit in 64 bits.
    fn int(&self, i: usize) -> P<(usize, Option<u64>)> {
        let mut j = i;
        while self.at(j).is_ascii_digit() {
            j += 1;
        }
        if j == i {
            return self.err(i, "expecting an integer");
        }
        Ok((j, self.src[i..j].parse::<u64>().ok()))
    }

    fn hex(&self, i: usize, size: usize) -> P<(u32, usize)> {
        let mut v: u32 = 0;
        let mut j = i;
        while j < i + size {
            let c = self.at(j);
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => break,
            };
            v = (v << 4) + u32::from(d);
            j += 1;
        }
        if j != i + size {
            return self.err(i, &format!("expecting {size} hex digits"));
        }
        Ok((v, j))
    }

    /// One character of a literal or class: an escape or a UTF-8 character.
    fn char(&self, i: usize) -> P<(u32, usize)> {
        match self.at(i) {
            b'\\' => match self.at(i + 1) {
                b'x' => self.hex(i + 2, 2),
                b'u' => self.hex(i + 2, 4),
                b'U' => self.hex(i + 2, 8),
                b't' => Ok((u32::from(b'\t'), i + 2)),
                b'r' => Ok((u32::from(b'\r'), i + 2)),
                b'n' => Ok((u32::from(b'\n'), i + 2)),
                c @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok((u32::from(c), i + 2)),
                _ => self.err(i, "unknown escape"),
            },
            0 => self.err(i, "unexpected end of input"),
            _ => {
                let c = self.src[i..].chars().next().unwrap_or('\0');
                Ok((u32::from(c), i + c.len_utf8()))
            }
        }
    }

    /// `<[id]>` or a named token `<...>`, at `i` (after any `!`).
    fn token(&self, i: usize) -> P<(Token, usize)> {
        if self.at(i) != b'<' {
            return self.err(i, "expecting '<'");
        }
        let mut j = i + 1;
        if self.at(j) == b'[' {
            j += 1;
            let (end, id) = self.int(j)?;
            let id = id.ok_or_else(|| format!("{}: number too large", position(self.src, j)))?;
            let id = u32::try_from(id).or_else(|_| self.err(j, "token id too large"))?;
            if self.at(end) != b']' {
                return self.err(end, "expecting ']'");
            }
            if self.at(end + 1) != b'>' {
                return self.err(end + 1, "expecting '>'");
            }
            return Ok((Token::Id(id), end + 2));
        }
        while !matches!(self.at(j), 0 | b'>') {
            j += 1;
        }
        if self.at(j) != b'>' {
            return self.err(j, "expecting '>'");
        }
        Ok((Token::Named(self.src[i..=j].to_string()), j + 1))
    }

    fn rule(&self, i: usize) -> P<(Rule, usize)> {
        let name_end = self.name(i)?;
        let pos = self.space(name_end, false);
        let name = self.src[i..name_end].to_string();
        if !self.src[pos..].starts_with("::=") {
            return self.err(pos, "expecting '::='");
        }
        let pos = self.space(pos + 3, true);
        let (alternatives, mut pos) = self.alternates(pos, false, 0)?;
        match self.at(pos) {
            b'\r' => pos += if self.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return self.err(pos, "expecting a newline or the end"),
        }
        Ok((Rule { name, alternatives }, self.space(pos, true)))
    }

    fn alternates(&self, i: usize, nested: bool, depth: usize) -> P<(Vec<Sequence>, usize)> {
        let (first, mut pos) = self.sequence(i, nested, depth)?;
        let mut alternatives = vec![first];
        while self.at(pos) == b'|' {
            let (next, end) = self.sequence(self.space(pos + 1, true), nested, depth)?;
            alternatives.push(next);
            pos = end;
        }
        Ok((alternatives, pos))
    }

    fn sequence(&self, i: usize, nested: bool, depth: usize) -> P<(Sequence, usize)> {
        let mut items: Sequence = Vec::new();
        let mut pos = i;
        loop {
            let at = pos;
            let atom = match self.at(pos) {
                b'"' => {
                    pos += 1;
                    let mut chars = Vec::new();
                    while self.at(pos) != b'"' {
                        if self.at(pos) == 0 {
                            return self.err(pos, "unexpected end of input (an unterminated string)");
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        chars.push(ch);
                    }
                    pos += 1;
                    Atom::Literal(chars)
                }
                b'[' => {
                    pos += 1;
                    let negated = self.at(pos) == b'^';
                    if negated {
                        pos += 1;
                    }
                    let mut members = Vec::new();
                    while self.at(pos) != b']' {
                        if self.at(pos) == 0 {
                            return self.err(pos, "unexpected end of input (an unterminated character class)");
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        let mut upper = None;
                        if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                            if self.at(pos + 1) == 0 {
                                return self.err(pos + 1, "unexpected end of input (an unterminated character class)");
                            }
                            let (end, next) = self.char(pos + 1)?;
                            pos = next;
                            upper = Some(end);
                        }
                        members.push((ch, upper));
                    }
                    pos += 1;
                    Atom::Class { negated, members }
                }
                c @ (b'<' | b'!') => {
                    let negated = c == b'!';
                    let (token, end) = self.token(if negated { pos + 1 } else { pos })?;
                    pos = end;
                    Atom::Token { negated, token }
                }
                c if is_word_char(c) => {
                    let end = self.name(pos)?;
                    let name = self.src[pos..end].to_string();
                    pos = end;
                    Atom::Rule(name)
                }
                b'(' => {
                    if depth >= MAX_NESTING {
                        return self.err(pos, &format!("parentheses nested deeper than {MAX_NESTING}"));
                    }
                    let (alternatives, end) = self.alternates(self.space(pos + 1, true), true, depth + 1)?;
                    if self.at(end) != b')' {
                        return self.err(end, &format!("expecting ')' (to close the '(' at {})", position(self.src, pos)));
                    }
                    pos = end + 1;
                    Atom::Group(alternatives)
                }
                b'.' => {
                    pos += 1;
                    Atom::AnyChar
                }
                c @ (b'*' | b'+' | b'?') => {
                    pos += 1;
                    let repetition = match c {
                        b'*' => Repetition::Star,
                        b'+' => Repetition::Plus,
                        _ => Repetition::Optional,
                    };
                    self.repeat(&mut items, at, repetition)?
                }
                b'{' => {
                    let (repetition, end) = self.braces(pos + 1, nested)?;
                    pos = end;
                    self.repeat(&mut items, at, repetition)?
                }
                _ => return Ok((items, pos)),
            };
            items.push(Item { at, atom });
            pos = self.space(pos, nested);
        }
    }

    /// `m}`, `m,}` or `m,n}` after a `{` (white space around the numbers),
    /// and the index after it.
    fn braces(&self, i: usize, nested: bool) -> P<(Repetition, usize)> {
        // Too large for 64 bits: llama.cpp refuses it, and so does the
        // checker's bound, in its own words.
        let (end, min) = self.int(self.space(i, nested))?;
        let min = min.unwrap_or(u64::MAX);
        let pos = self.space(end, nested);
        match self.at(pos) {
            b'}' => Ok((Repetition::Braces { min, max: Some(min) }, pos + 1)),
            b',' => {
                let mut pos = self.space(pos + 1, nested);
                let mut max = None;
                if self.at(pos).is_ascii_digit() {
                    let (end, m) = self.int(pos)?;
                    max = Some(m.unwrap_or(u64::MAX));
                    pos = self.space(end, nested);
                }
                if self.at(pos) != b'}' {
                    return self.err(pos, "expecting '}'");
                }
                Ok((Repetition::Braces { min, max }, pos + 1))
            }
            _ => self.err(pos, "expecting ','"),
        }
    }

    /// The last item of `items`, repeated: the operator at `at` needs one
    /// that llama.cpp writes as something.
    fn repeat(&self, items: &mut Sequence, at: usize, repetition: Repetition) -> P<Atom> {
        match items.pop() {
            Some(item) if !item.atom.writes_nothing() => Ok(Atom::Repeat(Box::new(item), repetition)),
            _ => self.err(at, "a repetition needs an item before it"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn atoms(g: &str) -> Vec<Atom> {
        let grammar = parse(g).unwrap_or_else(|e| panic!("{g:?}: {e}"));
        grammar.rules[0].alternatives[0].iter().map(|item| item.atom.clone()).collect()
    }

    #[test]
    fn reads_each_kind_of_item() {
        let lit = |s: &str| Atom::Literal(s.chars().map(u32::from).collect());
        let a = Box::new(Item { at: 9, atom: lit("a") });
        assert_eq!(
            atoms(r#"root ::= "a"? "a"* "a"+ "a"{2} "a"{ 2 , } "a"{1,3}"#)[..4],
            [
                Atom::Repeat(a.clone(), Repetition::Optional),
                Atom::Repeat(Box::new(Item { at: 14, atom: lit("a") }), Repetition::Star),
                Atom::Repeat(Box::new(Item { at: 19, atom: lit("a") }), Repetition::Plus),
                Atom::Repeat(Box::new(Item { at: 24, atom: lit("a") }), Repetition::Braces { min: 2, max: Some(2) }),
            ]
        );
        let bounds: Vec<_> = atoms(r#"root ::= "a"{ 2 , } "a"{1,3} "a"{18446744073709551617}"#)
            .into_iter()
            .map(|a| match a {
                Atom::Repeat(_, r) => r.bounds(),
                _ => panic!("{a:?}"),
            })
            .collect();
        assert_eq!(bounds, [(2, None), (1, Some(3)), (u64::MAX, Some(u64::MAX))]);
        assert_eq!(
            atoms(r#"root ::= [^a-z\]-] . x-1 <[42]> !<|im_end|> ("b" | c)"#),
            [
                Atom::Class { negated: true, members: vec![('a' as u32, Some('z' as u32)), (']' as u32, None), ('-' as u32, None)] },
                Atom::AnyChar,
                Atom::Rule("x-1".into()),
                Atom::Token { negated: false, token: Token::Id(42) },
                Atom::Token { negated: true, token: Token::Named("<|im_end|>".into()) },
                Atom::Group(vec![vec![Item { at: 45, atom: lit("b") }], vec![Item { at: 51, atom: Atom::Rule("c".into()) }]]),
            ]
        );
    }

    #[test]
    fn escapes_are_llama_cpps() {
        assert_eq!(
            atoms(r#"root ::= "\x41\u00e9\U0001F600\t\r\n\\\"\[\]\-é" "\uD800""#),
            [Atom::Literal("Aé😀\t\r\n\\\"[]-é".chars().map(u32::from).collect()), Atom::Literal(vec![0xD800])]
        );
    }

    #[test]
    fn rules_end_at_a_line_break_and_go_on_after_an_operator() {
        let g = parse("root ::=\n  \"a\" |\n  x # note\r\nx ::= (\n\"b\"\n)\n").unwrap();
        let names: Vec<&str> = g.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["root", "x"]);
        assert_eq!(g.rules[0].alternatives.len(), 2);
        // A name may be defined again.
        assert_eq!(parse("x ::= \"a\"\nx ::= \"b\"").unwrap().rules.len(), 2);
        assert_eq!(parse("  # only a comment\n").unwrap().rules, []);
    }

    #[test]
    fn errors_say_where() {
        for (g, want) in [
            ("root ::= \"abc", "line 1, column 14: unexpected end of input"),
            ("root ::= x\nx ::= [a-", "line 2, column 10: unexpected end of input"),
            ("root := \"a\"", "line 1, column 6: expecting '::='"),
            ("root ::= \"a\" )", "line 1, column 14: expecting a newline or the end"),
            ("root ::= (\"a\"", "line 1, column 14: expecting ')'"),
            ("root ::= \"\\q\"", "line 1, column 11: unknown escape"),
            ("root ::= \"\\x4\"", "expecting 2 hex digits"),
            ("root ::= * \"a\"", "line 1, column 10: a repetition needs an item before it"),
            ("root ::= \"a\" \"\"*", "line 1, column 16: a repetition needs an item before it"),
            ("root ::= [] \"a\"{0}+", "line 1, column 19: a repetition needs an item before it"),
            ("root ::= \"a\"{x}", "expecting an integer"),
            ("root ::= \"a\"{1;2}", "expecting ','"),
            ("root ::= \"a\"{1,2", "expecting '}'"),
            ("root ::= <foo", "expecting '>'"),
            ("root ::= !x", "expecting '<'"),
            ("root ::= <[99999999999]>", "token id too large"),
            ("root ::= <[99999999999999999999999]>", "line 1, column 12: number too large"),
            ("root ::= \"a\"\0", "NUL"),
            ("::= \"a\"", "expecting a rule name"),
            ("root_1 ::= \"a\"", "line 1, column 5: expecting '::='"),
            (&format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100)), "line 1, column 74: parentheses nested deeper than 64"),
        ] {
            let e = parse(g).unwrap_err();
            assert!(e.contains(want), "{g:?}: {e}");
        }
    }
}
