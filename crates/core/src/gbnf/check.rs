//! A grammar checked as llama.cpp would take it, within bounds. The tree
//! `super::syntax` reads is lowered to llama.cpp's rule elements as
//! `llama_grammar_parser` builds them (the same rule numbering and
//! expansion of repetitions), so the checks llama.cpp makes after parsing
//! (undefined rules, a `root` rule, left recursion) are made here on the
//! same structure, and so are the bounds on what it costs: a repetition
//! `x{2,1}` expands without end, `x{0,9999999}` builds millions of rules, a
//! long literal repeated a thousand times allocates gigabytes, and its
//! left-recursion check walks every path of the grammar.
//!
//! Named tokens (`<|im_end|>`) need the vocabulary: they are returned for
//! the engine to check (each must be exactly one token).

use std::collections::HashMap;

use super::syntax::{self, position, Atom, Grammar, Item, Repetition, Sequence, Token};

/// Longest grammar accepted, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;
/// Largest bound of one repetition `{m,n}`.
pub const MAX_REPEAT: u64 = 1000;
/// Sum over all repetitions in braces of their largest bound (each costs
/// a rule copy).
pub const MAX_REPEAT_TOTAL: u64 = 20_000;
/// Most elements in all rules after repetitions are expanded (llama.cpp
/// keeps 8 bytes per element, and walks them while matching).
pub const MAX_ELEMENTS: usize = 2_000_000;
/// Most paths llama.cpp's left-recursion check may walk (it does not
/// remember rules it has checked, so shared left prefixes multiply).
pub const MAX_LEFT_PATHS: u64 = 1_000_000;

/// llama.cpp's `MAX_REPETITION_THRESHOLD`.
const LLAMA_REPETITION_THRESHOLD: u64 = 2000;
// So llama.cpp's reading of larger bounds (a minimum refused, a maximum
// taken as none) never applies.
const _: () = assert!(MAX_REPEAT <= LLAMA_REPETITION_THRESHOLD);

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
    /// `Lowered::named_tokens`.
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
/// wrong and, for what is written wrong, where (line and column, 1-based).
pub fn check_gbnf(grammar: &str) -> Result<CheckedGrammar, String> {
    if grammar.len() > MAX_GRAMMAR_BYTES {
        return Err(format!("at most {MAX_GRAMMAR_BYTES} bytes are allowed, got {}", grammar.len()));
    }
    let tree = syntax::parse(grammar)?;
    if tree.rules.is_empty() {
        return Err(format!("{}: the grammar has no rules", position(grammar, grammar.len())));
    }
    let lowered = Lowering::new(grammar).lower(&tree)?;
    lowered.check_rules()?;
    if !lowered.symbols.contains_key("root") {
        return Err("the grammar has no rule named root".into());
    }
    lowered.check_left_recursion()?;
    let mut token_ids: Vec<u32> = lowered
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
    Ok(CheckedGrammar { named_tokens: lowered.named_tokens, token_ids })
}

/// llama.cpp's rules: symbol ids by name, and each id's elements.
struct Lowered {
    symbols: HashMap<String, u32>,
    rules: Vec<Vec<Elem>>,
    named_tokens: Vec<String>,
}

/// What `llama_grammar_parser` does as it reads, done on the tree in the
/// order it was written: symbols are numbered as llama.cpp numbers them.
/// Positions (for errors) are byte offsets into `src`.
struct Lowering<'a> {
    src: &'a str,
    symbols: HashMap<String, u32>,
    rules: Vec<Vec<Elem>>,
    named_tokens: Vec<String>,
    elements: usize,
    /// What repetitions in braces have cost so far (`MAX_REPEAT_TOTAL`).
    copies: u64,
}

type P<T> = Result<T, String>;

impl<'a> Lowering<'a> {
    fn new(src: &'a str) -> Self {
        Lowering { src, symbols: HashMap::new(), rules: Vec::new(), named_tokens: Vec::new(), elements: 0, copies: 0 }
    }

    fn err<T>(&self, i: usize, what: &str) -> P<T> {
        Err(format!("{}: {what}", position(self.src, i)))
    }

    fn lower(mut self, tree: &Grammar) -> P<Lowered> {
        for rule in &tree.rules {
            let id = self.symbol(&rule.name);
            self.alternates(&rule.alternatives, &rule.name, id)?;
        }
        Ok(Lowered { symbols: self.symbols, rules: self.rules, named_tokens: self.named_tokens })
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

    fn alternates(&mut self, alternatives: &[Sequence], name: &str, id: u32) -> P<()> {
        let mut rule = Vec::new();
        for (k, sequence) in alternatives.iter().enumerate() {
            if k > 0 {
                rule.push(Elem::Alt);
            }
            for item in sequence {
                self.item(item, name, &mut rule)?;
            }
        }
        rule.push(Elem::End);
        self.add_rule(id, rule)
    }

    /// Appends `item`'s elements to `rule`, and returns how many rules a
    /// repetition of it copies (llama.cpp's `n_prev_rules`).
    fn item(&mut self, item: &Item, name: &str, rule: &mut Vec<Elem>) -> P<u64> {
        match &item.atom {
            Atom::Literal(chars) => rule.extend(chars.iter().map(|&c| Elem::Char(c))),
            Atom::Class { negated, members } => {
                for (k, &(c, upper)) in members.iter().enumerate() {
                    rule.push(match (k, negated) {
                        (0, false) => Elem::Char(c),
                        (0, true) => Elem::CharNot(c),
                        _ => Elem::CharAlt(c),
                    });
                    if let Some(upper) = upper {
                        rule.push(Elem::CharRngUpper(upper));
                    }
                }
            }
            Atom::AnyChar => rule.push(Elem::CharAny),
            Atom::Rule(reference) => {
                let id = self.symbol(reference);
                rule.push(Elem::RuleRef(id));
            }
            Atom::Token { negated, token } => rule.push(match (token, negated) {
                (Token::Id(t), false) => Elem::Token(*t),
                (Token::Id(t), true) => Elem::TokenNot(*t),
                (Token::Named(text), negated) => {
                    let index = match self.named_tokens.iter().position(|t| t == text) {
                        Some(k) => k,
                        None => {
                            self.named_tokens.push(text.clone());
                            self.named_tokens.len() - 1
                        }
                    } as u32;
                    if *negated {
                        Elem::NamedTokenNot(index)
                    } else {
                        Elem::NamedToken(index)
                    }
                }
            }),
            Atom::Group(alternatives) => {
                let before = self.symbols.len() as u64;
                let sub = self.generate_symbol(name);
                self.alternates(alternatives, name, sub)?;
                rule.push(Elem::RuleRef(sub));
                return Ok((self.symbols.len() as u64).saturating_sub(before).max(1));
            }
            Atom::Repeat(repeated, repetition) => {
                let start = rule.len();
                let n_prev_rules = self.item(repeated, name, rule)?;
                return self.repeat(item.at, *repetition, name, rule, start, n_prev_rules);
            }
        }
        Ok(1)
    }

    /// A repetition's bounds, at `at`: what llama.cpp would expand without
    /// end or into too many rules is refused.
    fn bound(&mut self, at: usize, min: u64, max: Option<u64>) -> P<()> {
        let here = position(self.src, at);
        if let Some(max) = max {
            if max < min {
                return Err(format!("{here}: repetition {{{min},{max}}}: the maximum is below the minimum"));
            }
        }
        let largest = max.unwrap_or(min);
        if largest > MAX_REPEAT {
            return Err(format!("{here}: repetition bounds above {MAX_REPEAT} are not allowed, got {largest}"));
        }
        self.copies += largest + 1;
        if self.copies > MAX_REPEAT_TOTAL {
            return Err(format!("{here}: repetitions expand to more than {MAX_REPEAT_TOTAL} copies in all"));
        }
        Ok(())
    }

    /// llama.cpp's `handle_repetitions`: the elements of `rule` from
    /// `start` on (S), repeated: S{m,n} becomes S repeated m times and n-m
    /// optional copies in generated rules (one recursive rule without a
    /// maximum).
    fn repeat(&mut self, at: usize, repetition: Repetition, name: &str, rule: &mut Vec<Elem>, start: usize, n_prev_rules: u64) -> P<u64> {
        let (min, max) = repetition.bounds();
        if let Repetition::Braces { .. } = repetition {
            self.bound(at, min, max)?;
        }
        let prev: Vec<Elem> = rule[start..].to_vec();
        let total = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total) > LLAMA_REPETITION_THRESHOLD {
            return self.err(at, "repetitions of repetitions expand to too many rules");
        }
        // The bounds are checked: `max` is not below `min`.
        let n_opt = max.map_or(1, |m| m.saturating_sub(min));
        let growth = (prev.len() as u64).saturating_mul(min.saturating_sub(1) + n_opt);
        if growth > MAX_ELEMENTS as u64 || self.elements + rule.len() + growth as usize > MAX_ELEMENTS {
            return self.err(at, &format!("the grammar expands to more than {MAX_ELEMENTS} elements"));
        }
        if min == 0 {
            rule.truncate(start);
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
        Ok(n_prev_rules.saturating_mul(total))
    }
}

impl Lowered {
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
    fn errors_say_what() {
        for (g, want) in [
            ("x ::= \"a\"", "no rule named root"),
            ("root ::= missing", "undefined rule: missing"),
            ("root ::= root \"a\"", "left recursion in rule root"),
            ("root ::= x \"a\"\nx ::= | root", "left recursion"),
            // Through a rule that can match nothing (llama.cpp's check misses
            // it, and its matcher then recurses without end).
            ("root ::= x y \"a\"\nx ::= \"b\"{0,3}\ny ::= root", "left recursion"),
            // llama.cpp's check sees `S**` as left-recursive too.
            ("root ::= \"a\"**", "left recursion"),
            // A later definition replaces an earlier one, as in llama.cpp.
            ("root ::= x\nroot ::= \"a\"", "undefined rule: x"),
            ("", "line 1, column 1: the grammar has no rules"),
            ("  # only a comment\n", "line 2, column 1: the grammar has no rules"),
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
            ("root ::= (\"a\"{\n5000})", "line 1, column 14: repetition bounds above 1000"),
            (&format!("root ::= {}", "\"a\"{1000} ".repeat(30)), "copies in all"),
            (&format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100)), "nested deeper"),
            (&"a".repeat(MAX_GRAMMAR_BYTES + 1), "bytes"),
            (&format!("root ::= \"{}\"{{1000}}", "x".repeat(10_000)), "elements"),
            ("root ::= (\"a\"{0,50}){0,50}", "too many rules"),
        ] {
            let err = check_gbnf(g).unwrap_err();
            assert!(err.contains(why), "{g:.60}: {err}");
        }
        // Operators are not counted among the copies.
        ok(&format!("root ::= {}", "\"a\"* ".repeat(MAX_REPEAT_TOTAL as usize + 1)));
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
