//! GBNF grammars, checked before llama.cpp sees them.
//!
//! llama.cpp's grammar parser prints its errors (and the whole grammar) to
//! the process's stderr, and some grammars it accepts cost unbounded memory,
//! stack or time: a repetition `x{2,1}` expands without end, `x{0,9999999}`
//! builds millions of rules, deep parentheses recurse off the stack, a long
//! literal repeated a thousand times allocates gigabytes, and its
//! left-recursion check walks every path of the grammar. So a grammar is
//! parsed here first, by a port of llama.cpp's parser (`llama-grammar.cpp`:
//! the same syntax, escapes, rule numbering and expansion of repetitions)
//! that accepts exactly what it accepts, within bounds, and says what is
//! wrong with line and column. The rules it builds are llama.cpp's, so the
//! checks llama.cpp makes after parsing (undefined rules, a `root` rule,
//! left recursion) are made here on the same structure.
//!
//! Named tokens (`<|im_end|>`) need the vocabulary: they are returned for
//! the engine to check (each must be exactly one token).

use std::collections::HashMap;

/// Longest grammar accepted, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;
/// Largest bound of one repetition `{m,n}`.
pub const MAX_REPEAT: u64 = 1000;
/// Sum over all repetitions of their largest bound (each costs a rule copy).
pub const MAX_REPEAT_TOTAL: u64 = 20_000;
/// Deepest nesting of parentheses.
pub const MAX_NESTING: usize = 64;
/// Most elements in all rules after repetitions are expanded (llama.cpp
/// keeps 8 bytes per element, and walks them while matching).
pub const MAX_ELEMENTS: usize = 2_000_000;
/// Most paths llama.cpp's left-recursion check may walk (it does not
/// remember rules it has checked, so shared left prefixes multiply).
pub const MAX_LEFT_PATHS: u64 = 1_000_000;

/// llama.cpp's `MAX_REPETITION_THRESHOLD`.
const LLAMA_REPETITION_THRESHOLD: u64 = 2000;

/// A grammar element, as llama.cpp's `llama_grammar_element` (type, value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elem {
    End,
    Alt,
    RuleRef(u32),
    Char(u32),
    CharNot(u32),
    CharRngUpper(u32),
    CharAlt(u32),
    CharAny,
    Token(u32),
    TokenNot(u32),
    /// A named token (`<|im_end|>`), resolved by the vocabulary: index into
    /// `Parsed::named_tokens`.
    NamedToken(u32),
    NamedTokenNot(u32),
}

impl Elem {
    fn is_end_of_sequence(self) -> bool {
        matches!(self, Elem::End | Elem::Alt)
    }
}

/// A grammar that llama.cpp will accept, given that each of its
/// `named_tokens` is one token of the model's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedGrammar {
    /// Texts of the named tokens it uses (`<|im_end|>`), each once.
    pub named_tokens: Vec<String>,
    /// Token ids it uses (`<[42]>`).
    pub token_ids: Vec<u32>,
}

/// Checks a grammar whose start rule is `root`. The error says what is
/// wrong and where (line and column, 1-based).
pub fn check_gbnf(grammar: &str) -> Result<CheckedGrammar, String> {
    check_limits(grammar)?;
    let parsed = Parser::new(grammar).parse()?;
    parsed.check_rules()?;
    if !parsed.symbols.contains_key("root") {
        return Err("the grammar has no rule named root".into());
    }
    parsed.check_left_recursion()?;
    let mut token_ids: Vec<u32> = parsed
        .rules
        .iter()
        .flatten()
        .filter_map(|e| match e {
            Elem::Token(t) | Elem::TokenNot(t) => Some(*t),
            _ => None,
        })
        .collect();
    token_ids.sort_unstable();
    token_ids.dedup();
    Ok(CheckedGrammar { named_tokens: parsed.named_tokens, token_ids })
}

/// Bounds that do not need a parse: size, repetition bounds, nesting.
fn check_limits(grammar: &str) -> Result<(), String> {
    if grammar.len() > MAX_GRAMMAR_BYTES {
        return Err(format!("at most {MAX_GRAMMAR_BYTES} bytes are allowed, got {}", grammar.len()));
    }
    if let Some(at) = grammar.find('\0') {
        return Err(format!("{}: NUL characters are not allowed", position(grammar, at)));
    }
    let b = grammar.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    let mut total = 0u64;
    while i < b.len() {
        match b[i] {
            b'"' => i = skip_quoted(b, i + 1, b'"'),
            b'[' => i = skip_quoted(b, i + 1, b']'),
            b'#' => {
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            b'(' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(format!("{}: parentheses nested deeper than {MAX_NESTING}", position(grammar, i)));
                }
                i += 1;
            }
            b')' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'{' => {
                let at = i;
                let (next, bounds) = repetition(b, i + 1);
                i = next;
                let Some((min, max)) = bounds else { continue };
                let here = position(grammar, at);
                if let Some(max) = max {
                    if max < min {
                        return Err(format!("{here}: repetition {{{min},{max}}}: the maximum is below the minimum"));
                    }
                }
                let largest = max.unwrap_or(min);
                if largest > MAX_REPEAT {
                    return Err(format!("{here}: repetition bounds above {MAX_REPEAT} are not allowed, got {largest}"));
                }
                total += largest + 1;
                if total > MAX_REPEAT_TOTAL {
                    return Err(format!("{here}: repetitions expand to more than {MAX_REPEAT_TOTAL} copies in all"));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Index after the closing `end` of a literal or class opened before `i`.
fn skip_quoted(b: &[u8], mut i: usize, end: u8) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            c if c == end => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn number(b: &[u8], mut i: usize) -> (usize, Option<u64>) {
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    let start = i;
    let mut n: u64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        n = n.saturating_mul(10).saturating_add(u64::from(b[i] - b'0'));
        i += 1;
    }
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    (i, (i > start && b[start].is_ascii_digit()).then_some(n))
}

/// Parses `m}`, `m,}` or `m,n}` after a `{`: the index after it and
/// `(min, max)`; `None` bounds when it is not that shape (the parser then
/// reports it).
fn repetition(b: &[u8], i: usize) -> (usize, Option<(u64, Option<u64>)>) {
    let (i, min) = number(b, i);
    let Some(min) = min else { return (i, None) };
    match b.get(i) {
        Some(b'}') => (i + 1, Some((min, Some(min)))),
        Some(b',') => {
            let (j, max) = number(b, i + 1);
            match b.get(j) {
                Some(b'}') => (j + 1, Some((min, max))),
                _ => (j, None),
            }
        }
        _ => (i, None),
    }
}

/// "line L, column C" of byte offset `at` (columns count characters).
fn position(text: &str, at: usize) -> String {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {col}")
}

struct Parsed {
    symbols: HashMap<String, u32>,
    rules: Vec<Vec<Elem>>,
    named_tokens: Vec<String>,
}

/// The port of `llama_grammar_parser`. Positions are byte offsets into
/// `src`; the end of the text stands for C's terminating NUL.
struct Parser<'a> {
    src: &'a str,
    b: &'a [u8],
    symbols: HashMap<String, u32>,
    rules: Vec<Vec<Elem>>,
    named_tokens: Vec<String>,
    elements: usize,
}

type P<T> = Result<T, String>;

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Parser { src, b: src.as_bytes(), symbols: HashMap::new(), rules: Vec::new(), named_tokens: Vec::new(), elements: 0 }
    }

    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    fn err<T>(&self, i: usize, what: &str) -> P<T> {
        Err(format!("{}: {what}", position(self.src, i)))
    }

    fn parse(mut self) -> P<Parsed> {
        let mut pos = self.space(0, true);
        while self.at(pos) != 0 {
            pos = self.rule(pos)?;
        }
        if self.rules.is_empty() {
            return self.err(pos, "the grammar has no rules");
        }
        Ok(Parsed { symbols: self.symbols, rules: self.rules, named_tokens: self.named_tokens })
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

    fn int(&self, i: usize) -> P<(usize, u64)> {
        let mut j = i;
        while self.at(j).is_ascii_digit() {
            j += 1;
        }
        if j == i {
            return self.err(i, "expecting an integer");
        }
        let n = self.src[i..j].parse::<u64>().or_else(|_| self.err(i, "number too large"))?;
        Ok((j, n))
    }

    fn symbol(&mut self, name: &str) -> u32 {
        let next = self.symbols.len() as u32;
        *self.symbols.entry(name.to_string()).or_insert(next)
    }

    fn generate_symbol(&mut self, base: &str) -> u32 {
        let next = self.symbols.len() as u32;
        self.symbols.insert(format!("{base}_{next}"), next);
        next
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Elem>) -> P<()> {
        self.elements += rule.len();
        if self.elements > MAX_ELEMENTS {
            return Err(format!("the grammar expands to more than {MAX_ELEMENTS} elements (repeated long literals?)"));
        }
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
        Ok(())
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
    fn token(&mut self, i: usize) -> P<(Elem, usize)> {
        if self.at(i) != b'<' {
            return self.err(i, "expecting '<'");
        }
        let mut j = i + 1;
        if self.at(j) == b'[' {
            j += 1;
            let (end, id) = self.int(j)?;
            let id = u32::try_from(id).or_else(|_| self.err(j, "token id too large"))?;
            if self.at(end) != b']' {
                return self.err(end, "expecting ']'");
            }
            if self.at(end + 1) != b'>' {
                return self.err(end + 1, "expecting '>'");
            }
            return Ok((Elem::Token(id), end + 2));
        }
        while !matches!(self.at(j), 0 | b'>') {
            j += 1;
        }
        if self.at(j) != b'>' {
            return self.err(j, "expecting '>'");
        }
        let text = &self.src[i..=j];
        let index = match self.named_tokens.iter().position(|t| t == text) {
            Some(k) => k,
            None => {
                self.named_tokens.push(text.to_string());
                self.named_tokens.len() - 1
            }
        };
        Ok((Elem::NamedToken(index as u32), j + 1))
    }

    fn rule(&mut self, i: usize) -> P<usize> {
        let name_end = self.name(i)?;
        let pos = self.space(name_end, false);
        let name = self.src[i..name_end].to_string();
        let id = self.symbol(&name);
        if !self.src[pos..].starts_with("::=") {
            return self.err(pos, "expecting '::='");
        }
        let pos = self.space(pos + 3, true);
        let mut pos = self.alternates(pos, &name, id, false, 0)?;
        match self.at(pos) {
            b'\r' => pos += if self.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => return self.err(pos, "expecting a newline or the end"),
        }
        Ok(self.space(pos, true))
    }

    fn alternates(&mut self, i: usize, name: &str, id: u32, nested: bool, depth: usize) -> P<usize> {
        let mut rule = Vec::new();
        let mut pos = self.sequence(i, name, &mut rule, nested, depth)?;
        while self.at(pos) == b'|' {
            rule.push(Elem::Alt);
            pos = self.space(pos + 1, true);
            pos = self.sequence(pos, name, &mut rule, nested, depth)?;
        }
        rule.push(Elem::End);
        self.add_rule(id, rule)?;
        Ok(pos)
    }

    fn sequence(&mut self, i: usize, name: &str, rule: &mut Vec<Elem>, nested: bool, depth: usize) -> P<usize> {
        let mut last_sym_start = rule.len();
        let mut pos = i;
        let mut n_prev_rules: u64 = 1;
        loop {
            let c = self.at(pos);
            match c {
                b'"' => {
                    pos += 1;
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    while self.at(pos) != b'"' {
                        if self.at(pos) == 0 {
                            return self.err(pos, "unexpected end of input (an unterminated string)");
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        rule.push(Elem::Char(ch));
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'[' => {
                    pos += 1;
                    let negated = self.at(pos) == b'^';
                    if negated {
                        pos += 1;
                    }
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    while self.at(pos) != b']' {
                        if self.at(pos) == 0 {
                            return self.err(pos, "unexpected end of input (an unterminated character class)");
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        let first = last_sym_start >= rule.len();
                        rule.push(match (first, negated) {
                            (false, _) => Elem::CharAlt(ch),
                            (true, false) => Elem::Char(ch),
                            (true, true) => Elem::CharNot(ch),
                        });
                        if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                            if self.at(pos + 1) == 0 {
                                return self.err(pos + 1, "unexpected end of input (an unterminated character class)");
                            }
                            let (end, next) = self.char(pos + 1)?;
                            pos = next;
                            rule.push(Elem::CharRngUpper(end));
                        }
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'<' | b'!' => {
                    let not = c == b'!';
                    let (elem, end) = self.token(if not { pos + 1 } else { pos })?;
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(match (elem, not) {
                        (Elem::Token(t), true) => Elem::TokenNot(t),
                        (Elem::NamedToken(t), true) => Elem::NamedTokenNot(t),
                        (e, _) => e,
                    });
                    pos = self.space(end, nested);
                }
                c if is_word_char(c) => {
                    let end = self.name(pos)?;
                    let src = self.src;
                    let id = self.symbol(&src[pos..end]);
                    pos = self.space(end, nested);
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::RuleRef(id));
                }
                b'(' => {
                    if depth >= MAX_NESTING {
                        return self.err(pos, &format!("parentheses nested deeper than {MAX_NESTING}"));
                    }
                    let open = pos;
                    pos = self.space(pos + 1, true);
                    let before = self.symbols.len() as u64;
                    let sub = self.generate_symbol(name);
                    pos = self.alternates(pos, name, sub, true, depth + 1)?;
                    n_prev_rules = (self.symbols.len() as u64).saturating_sub(before).max(1);
                    last_sym_start = rule.len();
                    rule.push(Elem::RuleRef(sub));
                    if self.at(pos) != b')' {
                        return self.err(pos, &format!("expecting ')' (to close the '(' at {})", position(self.src, open)));
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'.' => {
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::CharAny);
                    pos = self.space(pos + 1, nested);
                }
                b'*' | b'+' | b'?' => {
                    let at = pos;
                    pos = self.space(pos + 1, nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(at, name, rule, last_sym_start, &mut n_prev_rules, min, max)?;
                }
                b'{' => {
                    let at = pos;
                    pos = self.space(pos + 1, nested);
                    if !self.at(pos).is_ascii_digit() {
                        return self.err(pos, "expecting an integer");
                    }
                    let (end, min) = self.int(pos)?;
                    pos = self.space(end, nested);
                    let mut max = Some(min);
                    if self.at(pos) == b'}' {
                        pos = self.space(pos + 1, nested);
                    } else if self.at(pos) == b',' {
                        pos = self.space(pos + 1, nested);
                        max = None;
                        if self.at(pos).is_ascii_digit() {
                            let (end, m) = self.int(pos)?;
                            max = Some(m);
                            pos = self.space(end, nested);
                        }
                        if self.at(pos) != b'}' {
                            return self.err(pos, "expecting '}'");
                        }
                        pos = self.space(pos + 1, nested);
                    } else {
                        return self.err(pos, "expecting ','");
                    }
                    if min > LLAMA_REPETITION_THRESHOLD {
                        return self.err(at, "too many repetitions");
                    }
                    // llama.cpp reads a maximum above its threshold as "no maximum".
                    let max = max.filter(|&m| m <= LLAMA_REPETITION_THRESHOLD);
                    self.repeat(at, name, rule, last_sym_start, &mut n_prev_rules, min, max)?;
                }
                _ => return Ok(pos),
            }
        }
    }

    /// llama.cpp's `handle_repetitions`: S{m,n} becomes S repeated m times
    /// and n-m optional copies in generated rules (one recursive rule
    /// without a maximum).
    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        at: usize,
        name: &str,
        rule: &mut Vec<Elem>,
        last_sym_start: usize,
        n_prev_rules: &mut u64,
        min: u64,
        max: Option<u64>,
    ) -> P<()> {
        if last_sym_start == rule.len() {
            return self.err(at, "a repetition needs an item before it");
        }
        let prev: Vec<Elem> = rule[last_sym_start..].to_vec();
        let total = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total) > LLAMA_REPETITION_THRESHOLD {
            return self.err(at, "repetitions of repetitions expand to too many rules");
        }
        let n_opt = match max {
            None => 1,
            Some(m) => m.checked_sub(min).ok_or_else(|| format!("{}: the maximum is below the minimum", position(self.src, at)))?,
        };
        let growth = (prev.len() as u64).saturating_mul(min.saturating_sub(1) + n_opt);
        if growth > MAX_ELEMENTS as u64 || self.elements + rule.len() + growth as usize > MAX_ELEMENTS {
            return Err(format!("{}: the grammar expands to more than {MAX_ELEMENTS} elements", position(self.src, at)));
        }
        if min == 0 {
            rule.truncate(last_sym_start);
        } else {
            for _ in 1..min {
                rule.extend_from_slice(&prev);
            }
        }
        let mut last_rec = 0;
        for i in 0..n_opt {
            let mut rec = prev.clone();
            let id = self.generate_symbol(name);
            if i > 0 || max.is_none() {
                rec.push(Elem::RuleRef(if max.is_none() { id } else { last_rec }));
            }
            rec.push(Elem::Alt);
            rec.push(Elem::End);
            self.add_rule(id, rec)?;
            last_rec = id;
        }
        if n_opt > 0 {
            rule.push(Elem::RuleRef(last_rec));
        }
        *n_prev_rules = n_prev_rules.saturating_mul(total);
        Ok(())
    }
}

impl Parsed {
    fn name_of(&self, id: u32) -> String {
        self.symbols.iter().find(|(_, &v)| v == id).map_or_else(|| format!("#{id}"), |(k, _)| k.clone())
    }

    /// llama.cpp's check after parsing: every rule defined, every reference
    /// to a defined rule.
    fn check_rules(&self) -> Result<(), String> {
        let n = self.rules.len() as u32;
        // A symbol that was referenced but never defined has no rule.
        for (name, &id) in &self.symbols {
            if id >= n || self.rules[id as usize].is_empty() {
                return Err(format!("undefined rule: {name}"));
            }
        }
        for rule in &self.rules {
            for e in rule {
                if let Elem::RuleRef(r) = *e {
                    if r >= n || self.rules[r as usize].is_empty() {
                        return Err(format!("undefined rule: {}", self.name_of(r)));
                    }
                }
            }
        }
        Ok(())
    }

    /// Left recursion, as a graph: rule A leads to B when B stands first in
    /// an alternative of A, or after rule references that can match nothing.
    /// Left recursion is a cycle. llama.cpp's own check
    /// (`llama_grammar_detect_left_recursion`) counts as "can match nothing"
    /// only rules with a literally empty alternative, and so misses cycles
    /// through rules like `x ::= "a"?`, on which its matcher recurses without
    /// end; here nullability is computed properly, which finds every cycle
    /// llama.cpp finds and those too. llama.cpp's check also walks every path
    /// of its graph from each rule it has not finished yet (it does not
    /// remember finished ones); a grammar with too many is refused.
    fn check_left_recursion(&self) -> Result<(), String> {
        let n = self.rules.len();
        let mut may_be_empty = vec![false; n];
        loop {
            let mut changed = false;
            for (i, rule) in self.rules.iter().enumerate() {
                if may_be_empty[i] {
                    continue;
                }
                let mut all_empty = true;
                for e in rule {
                    match *e {
                        e if e.is_end_of_sequence() => {
                            if all_empty {
                                may_be_empty[i] = true;
                                changed = true;
                                break;
                            }
                            all_empty = true;
                        }
                        Elem::RuleRef(r) if may_be_empty[r as usize] => {}
                        _ => all_empty = false,
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let edges: Vec<Vec<usize>> = self
            .rules
            .iter()
            .map(|rule| {
                let mut out = Vec::new();
                let mut open = true;
                for e in rule {
                    match *e {
                        Elem::RuleRef(r) if open => {
                            out.push(r as usize);
                            if !may_be_empty[r as usize] {
                                open = false;
                            }
                        }
                        e if e.is_end_of_sequence() => open = true,
                        _ => open = false,
                    }
                }
                out
            })
            .collect();
        // Depth-first, iteratively: 0 = new, 1 = on the stack, 2 = done.
        let mut state = vec![0u8; n];
        let mut order = Vec::with_capacity(n);
        for start in 0..n {
            if state[start] != 0 {
                continue;
            }
            let mut stack = vec![(start, 0usize)];
            state[start] = 1;
            while let Some(top) = stack.last_mut() {
                let v = top.0;
                if let Some(&w) = edges[v].get(top.1) {
                    top.1 += 1;
                    match state[w] {
                        0 => {
                            state[w] = 1;
                            stack.push((w, 0));
                        }
                        1 => return Err(format!("left recursion in rule {} (llama.cpp does not support it)", self.name_of(w as u32))),
                        _ => {}
                    }
                } else {
                    state[v] = 2;
                    order.push(v);
                    stack.pop();
                }
            }
        }
        // Paths from each rule, children first (`order` is a post-order).
        let mut paths = vec![0u64; n];
        for &v in &order {
            paths[v] = edges[v].iter().fold(1u64, |acc, &w| acc.saturating_add(paths[w]));
        }
        let total = paths.iter().fold(0u64, |a, &p| a.saturating_add(p));
        if total > MAX_LEFT_PATHS {
            return Err(format!(
                "the grammar is too complex to check (more than {MAX_LEFT_PATHS} paths through the first items of its rules)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(g: &str) -> CheckedGrammar {
        check_gbnf(g).unwrap_or_else(|e| panic!("{g:?}: {e}"))
    }

    #[test]
    fn ordinary_grammars_pass() {
        for g in [
            r#"root ::= "yes" | "no""#,
            r#"root ::= [a-z]{2,5} ("-" [0-9]{3})?"#,
            r#"root ::= "{" [^}]* "}"  # braces inside literals and classes are not repetitions"#,
            r#"root ::= "a{99999,1}" [{}] "\"{5,1}""#,
            "root ::= x{0,} x{3} x{1000}\nx ::= \"x\"",
            "root ::= item+\nitem ::= [a-z] | \"\\u00e9\" | \"\\x41\" | \"\\U0001F600\" | [\\]\\-]",
            "root ::= (\n  \"a\" |\n  \"b\"\n)*",
            "root ::= \"é\" [à-ü] . \"\\t\"\r\n",
            "# a comment\n\nroot ::= \"x\" # trailing\n",
            "root ::= <[42]> !<[7]> <|im_end|>",
            "root ::= \"a\"{2,}",
            "root ::= [] \"x\"",
        ] {
            ok(g);
        }
    }

    #[test]
    fn the_grammars_of_llama_cpp_parse() {
        let json = r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;
        ok(json);
    }

    #[test]
    fn tokens_are_collected() {
        let g = ok("root ::= <|im_end|> <[42]> !<[7]> <|im_end|> <think>");
        assert_eq!(g.named_tokens, vec!["<|im_end|>".to_string(), "<think>".to_string()]);
        assert_eq!(g.token_ids, vec![7, 42]);
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
            ("root ::= \"a\"{x}", "expecting an integer"),
            ("root ::= \"a\"{1;2}", "expecting ','"),
            ("root ::= \"a\"{1,2", "expecting '}'"),
            ("root ::= <foo", "expecting '>'"),
            ("root ::= !x", "expecting '<'"),
            ("root ::= <[99999999999]>", "token id too large"),
            ("x ::= \"a\"", "no rule named root"),
            ("root ::= missing", "undefined rule: missing"),
            ("root ::= root \"a\"", "left recursion in rule root"),
            ("root ::= x \"a\"\nx ::= | root", "left recursion"),
            // Through a rule that can match nothing (llama.cpp's check misses
            // it, and its matcher then recurses without end).
            ("root ::= x y \"a\"\nx ::= \"b\"{0,3}\ny ::= root", "left recursion"),
            // llama.cpp's check sees `S**` as left-recursive too.
            ("root ::= \"a\"**", "left recursion"),
            ("root ::= \"a\"\0", "NUL"),
            ("", "no rules"),
            ("  # only a comment\n", "no rules"),
            ("::= \"a\"", "expecting a rule name"),
        ] {
            let e = check_gbnf(g).unwrap_err();
            assert!(e.contains(want), "{g:?}: {e}");
        }
    }

    #[test]
    fn unbounded_expansions_are_rejected() {
        for (g, why) in [
            ("root ::= [a-z]{2,1}", "below the minimum"),
            ("root ::= \"a\"{0,9999999}", "above 1000"),
            ("root ::= \"a\"{18446744073709551617}", "above 1000"),
            ("root ::= \"a\"{1001,}", "above 1000"),
            (&format!("root ::= {}", "\"a\"{1000} ".repeat(30)), "copies in all"),
            (&format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100)), "nested deeper"),
            (&"a".repeat(MAX_GRAMMAR_BYTES + 1), "bytes"),
            (&format!("root ::= \"{}\"{{1000}}", "x".repeat(10_000)), "elements"),
            ("root ::= (\"a\"{0,50}){0,50}", "too many rules"),
        ] {
            let err = check_gbnf(g).unwrap_err();
            assert!(err.contains(why), "{g:.60}: {err}");
        }
    }

    #[test]
    fn a_left_prefix_walked_exponentially_is_refused() {
        // r0 ::= r1 | r1, r1 ::= r2 | r2, …: 2^40 paths for llama.cpp's check.
        let mut g = String::from("root ::= r0\n");
        for i in 0..40 {
            g.push_str(&format!("r{i} ::= r{} \"a\" | r{} \"b\"\n", i + 1, i + 1));
        }
        g.push_str("r40 ::= \"z\"\n");
        assert!(check_gbnf(&g).unwrap_err().contains("too complex"));
        // The same depth without sharing is fine.
        let mut g = String::from("root ::= r0\n");
        for i in 0..40 {
            g.push_str(&format!("r{i} ::= r{} \"a\"\n", i + 1));
        }
        g.push_str("r40 ::= \"z\"\n");
        ok(&g);
    }

    #[test]
    fn never_panics_on_junk() {
        let pieces = [
            "root", " ::= ", "\"", "[", "]", "(", ")", "{", "}", "1", ",", "*", "|", "\\", "<", ">", "!", "\n", "é", "#", "x", "-", "^",
            ".",
        ];
        let mut seed = 17u64;
        for _ in 0..20_000 {
            let mut g = String::new();
            for _ in 0..(seed % 24) {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                g.push_str(pieces[(seed >> 33) as usize % pieces.len()]);
            }
            let _ = check_gbnf(&g);
        }
    }
}
