//! The call grammar llama.cpp's chat code writes for a model family (GBNF,
//! read by `crate::gbnf::syntax`), turned into a Lark grammar for
//! llguidance, so that a required or named call is forced in the family's
//! own syntax — and drafted from the grammar — as our Hermes-style calls
//! are.
//!
//! llama.cpp's grammars are written for its character-by-character GBNF
//! sampler. Three things differ under llguidance, which lexes:
//! - they begin with the generation prompt, which the prompt has already
//!   written: the constraint is compiled as having read it
//!   ([`Grammar::LarkAfter`](crate::sampling::constraint::Grammar));
//! - free text ("until" one of some delimiters) is spelled as a
//!   character automaton, one rule per state, which a lexing Earley parser
//!   pays for at every character. Each automaton is read back into its
//!   delimiters: text up to a delimiter becomes one lazy lexeme ending with
//!   it (or free text before a special token, which no text can contain);
//!   free text that nothing delimits — the words before a required call —
//!   is dropped, which only tightens the constraint (llama.cpp allows
//!   words before a required call; a small model takes that way and
//!   talks until its budget ends);
//! - special tokens (`<|channel|>`) are written as text: each is written
//!   as the token where the model has it as one.
//!
//! What cannot be read this way is refused with the reason; the caller
//! then leaves the answer unconstrained (it is still read).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::closing::ValueCloser;
use super::format::lark_str;
use crate::gbnf::syntax::{self, Atom, Item};

/// Rules a grammar may have (llama.cpp's have a few hundred at most).
const MAX_RULES: usize = 20_000;
/// Longest special token looked for inside a literal, in bytes.
const MAX_SPECIAL_LEN: usize = 64;

/// A grammar's item as converted: what Lark can say, and what the
/// conversion writes in place of automata.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Lit(String),
    /// A character class: negated, and its ranges (inclusive).
    Class(bool, Vec<(char, char)>),
    Ref(String),
    /// Alternatives, each a sequence.
    Group(Vec<Vec<Node>>),
    /// `node{min,max}`; `max` None is unbounded.
    Rep(Box<Node>, u64, Option<u64>),
    /// Text up to a delimiter, then the delimiter (a lazy lexeme).
    TextThen(String),
    /// Free text (before a special token, which it cannot contain).
    Text,
}

type Rules = BTreeMap<String, Vec<Vec<Node>>>;

/// A grammar's rules by name, read by [`syntax::parse`]; what the
/// conversion has no use for (tokens, `.`, a rule defined twice) is
/// refused.
fn rules_of(gbnf: &str) -> Result<Rules, String> {
    let mut rules = Rules::new();
    for rule in syntax::parse(gbnf)?.rules {
        let alternatives = rule.alternatives.iter().map(|s| nodes(s)).collect::<Result<_, _>>()?;
        if rules.insert(rule.name.clone(), alternatives).is_some() {
            return Err(format!("rule {} defined twice", rule.name));
        }
        if rules.len() > MAX_RULES {
            return Err("too many rules".into());
        }
    }
    Ok(rules)
}

fn nodes(sequence: &[Item]) -> Result<Vec<Node>, String> {
    sequence.iter().map(node).collect()
}

fn node(item: &Item) -> Result<Node, String> {
    let char_of = |c: u32| char::from_u32(c).ok_or_else(|| format!("U+{c:X} is not a character"));
    Ok(match &item.atom {
        Atom::Literal(chars) => Node::Lit(chars.iter().map(|&c| char_of(c)).collect::<Result<_, _>>()?),
        Atom::Class { negated, members } => {
            // A reversed range (`z-a`) matches nothing, in llama.cpp too.
            let ranges: Vec<(char, char)> = members
                .iter()
                .filter(|&&(lo, hi)| hi.unwrap_or(lo) >= lo)
                .map(|&(lo, hi)| Ok((char_of(lo)?, char_of(hi.unwrap_or(lo))?)))
                .collect::<Result<_, String>>()?;
            if ranges.is_empty() && !negated {
                return Err("a character class that matches nothing".into());
            }
            Node::Class(*negated, ranges)
        }
        Atom::Rule(name) => Node::Ref(name.clone()),
        Atom::Group(alternatives) => Node::Group(alternatives.iter().map(|s| nodes(s)).collect::<Result<_, _>>()?),
        Atom::Repeat(repeated, repetition) => {
            let (min, max) = repetition.bounds();
            Node::Rep(Box::new(node(repeated)?), min, max)
        }
        Atom::AnyChar | Atom::Token { .. } => return Err("tokens and `.` are not converted".into()),
    })
}

/// What a character automaton (rules of the form `[c] next | [c] | empty`)
/// stands for: text without any of `delimiters` (`until`), or text up to
/// and including the first of them (`through`).
#[derive(Debug, Clone, PartialEq)]
enum Automaton {
    Until(Vec<String>),
    Through(Vec<String>),
}

fn class_has(negated: bool, ranges: &[(char, char)], c: char) -> bool {
    ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != negated
}

/// The automaton that starts at rule `start`, read back into its delimiters.
fn automaton(rules: &Rules, start: &str) -> Option<Automaton> {
    // Every state: alternatives that are empty, a class, or a class then a state.
    let mut strings: HashMap<&str, String> = HashMap::from([(start, String::new())]);
    let mut queue = VecDeque::from([start]);
    let mut order = Vec::new();
    while let Some(state) = queue.pop_front() {
        order.push(state);
        for alt in rules.get(state)? {
            match alt.as_slice() {
                [] | [Node::Class(..)] => {}
                [Node::Class(negated, ranges), Node::Ref(next)] => {
                    if !rules.contains_key(next.as_str()) {
                        return None;
                    }
                    if !strings.contains_key(next.as_str()) {
                        // A trie edge is one character; the first path found
                        // (breadth first) spells the state's prefix.
                        let text = match (negated, ranges.as_slice()) {
                            (false, [(lo, hi)]) if lo == hi => format!("{}{lo}", strings[state]),
                            _ => String::new(),
                        };
                        strings.insert(next.as_str(), text);
                        queue.push_back(next.as_str());
                    }
                }
                _ => return None,
            }
        }
        if order.len() > 4096 {
            return None;
        }
    }
    let empties = order.iter().all(|s| rules[*s].iter().any(Vec::is_empty));
    let (mut until, mut through) = (BTreeSet::new(), BTreeSet::new());
    for state in &order {
        let alts = &rules[*state];
        // Characters this state mentions: the candidates for a delimiter's end.
        let mut mentioned = BTreeSet::new();
        for alt in alts {
            if let Some(Node::Class(_, ranges)) = alt.first() {
                for &(lo, hi) in ranges {
                    if (hi as u32) - (lo as u32) < 256 {
                        mentioned.extend((lo as u32..=hi as u32).filter_map(char::from_u32));
                    }
                }
            }
        }
        for c in mentioned {
            let mut covered = false;
            for alt in alts {
                match alt.as_slice() {
                    [Node::Class(negated, ranges)] if class_has(*negated, ranges, c) => {
                        // Ends here: the delimiter is complete.
                        if *negated {
                            return None;
                        }
                        through.insert(format!("{}{c}", strings[state]));
                        covered = true;
                    }
                    [Node::Class(negated, ranges), _] if class_has(*negated, ranges, c) => covered = true,
                    _ => {}
                }
            }
            if !covered {
                until.insert(format!("{}{c}", strings[state]));
            }
        }
        // Every class of a state must be one character or a negation (the
        // rest of the characters): anything else is not an automaton of
        // delimiters.
        for alt in alts {
            if let Some(Node::Class(false, ranges)) = alt.first() {
                if ranges.len() != 1 || ranges[0].0 != ranges[0].1 {
                    return None;
                }
            }
        }
    }
    match (empties, until.is_empty(), through.is_empty()) {
        (true, false, true) => Some(Automaton::Until(until.into_iter().collect())),
        (false, true, false) => Some(Automaton::Through(through.into_iter().collect())),
        _ => None,
    }
}

struct Converter<'a> {
    rules: Rules,
    automata: HashMap<String, Automaton>,
    special: &'a dyn Fn(&str) -> Option<u32>,
}

impl Converter<'_> {
    /// The automaton a node stands for, through rules that are only a reference.
    fn automaton_of(&self, node: &Node) -> Option<Automaton> {
        let mut name = match node {
            Node::Ref(n) => n.clone(),
            Node::Rep(inner, 0, Some(1)) => return self.automaton_of(inner),
            _ => return None,
        };
        for _ in 0..16 {
            if let Some(a) = self.automata.get(&name) {
                return Some(a.clone());
            }
            match self.rules.get(&name).map(Vec::as_slice) {
                Some([alt]) if alt.len() == 1 => match &alt[0] {
                    Node::Ref(next) => name = next.clone(),
                    _ => return None,
                },
                _ => return None,
            }
        }
        None
    }

    /// `node` without `delimiter` at its front, if every way it can start
    /// starts with it (alternatives that are empty are given up).
    fn strip(&self, node: &Node, delimiters: &[String], depth: usize) -> Option<(String, Vec<Node>)> {
        if depth > 32 {
            return None;
        }
        match node {
            Node::Lit(s) => {
                let d = delimiters.iter().filter(|d| s.starts_with(d.as_str())).max_by_key(|d| d.len())?;
                Some((d.clone(), vec![Node::Lit(s[d.len()..].to_string())]))
            }
            Node::Ref(name) => self.strip(&Node::Group(self.rules.get(name)?.clone()), delimiters, depth + 1),
            Node::Group(alts) => {
                let mut found: Option<String> = None;
                let mut rests = Vec::new();
                for alt in alts.iter().filter(|a| !a.is_empty()) {
                    let (d, mut rest) = self.strip(&alt[0], delimiters, depth + 1)?;
                    if found.as_ref().is_some_and(|f| *f != d) {
                        return None;
                    }
                    found = Some(d);
                    rest.extend(alt[1..].iter().cloned());
                    rests.push(rest);
                }
                Some((found?, vec![Node::Group(rests)]))
            }
            // Repeated no times: nothing to strip.
            Node::Rep(_, _, Some(0)) => None,
            Node::Rep(inner, min, max) => {
                let (d, mut rest) = self.strip(inner, delimiters, depth + 1)?;
                match max {
                    Some(1) => {}
                    _ => rest.push(Node::Rep(inner.clone(), min.saturating_sub(1), max.map(|m| m - 1))),
                }
                Some((d, rest))
            }
            _ => None,
        }
    }

    /// Whether `rest` (what follows free text) is the calls: llama.cpp names
    /// their rules `tool-call…`, `tools` or `<family>-tool-call`.
    fn before_call(&self, rest: &[Node]) -> bool {
        let next = rest.iter().find(|n| !matches!(n, Node::Ref(name) if name == "space"));
        matches!(next, Some(Node::Ref(name)) if name == "tools" || name.starts_with("tool-call") || name.ends_with("-tool-call"))
    }

    /// Whether `text` begins with a special token of the model.
    fn starts_special(&self, text: &str) -> bool {
        (1..=text.len().min(MAX_SPECIAL_LEN)).any(|n| text.is_char_boundary(n) && (self.special)(&text[..n]).is_some())
    }

    /// Rewrites a sequence: free text joined to the delimiter that follows it.
    fn sequence(&self, seq: &[Node]) -> Result<Vec<Node>, String> {
        let mut out: Vec<Node> = Vec::new();
        let mut i = 0;
        while i < seq.len() {
            let node = &seq[i];
            match self.automaton_of(node) {
                Some(Automaton::Through(ds)) => {
                    if ds.iter().any(|d| self.starts_special(d)) {
                        if let [d] = ds.as_slice() {
                            out.push(Node::Rep(Box::new(Node::Text), 0, Some(1)));
                            out.push(Node::Lit(d.clone()));
                        } else {
                            return Err("text ends at one of several special tokens".into());
                        }
                    } else {
                        out.push(Node::Group(ds.iter().map(|d| through(d)).collect()));
                    }
                }
                Some(Automaton::Until(_)) if self.before_call(&seq[i + 1..]) => {
                    // Words before a required call: none (the call is what
                    // was asked for; a small model would talk instead).
                }
                Some(Automaton::Until(ds)) => {
                    // What follows, past optional parts that do not start
                    // with a delimiter (they are left out: a tightening).
                    let mut j = i + 1;
                    let mut next = None;
                    while let Some(n) = seq.get(j) {
                        next = self.strip(n, &ds, 0);
                        let optional = matches!(n, Node::Rep(_, 0, _)) || matches!(n, Node::Ref(name) if name == "space");
                        if next.is_some() || !optional {
                            break;
                        }
                        j += 1;
                    }
                    match next {
                        Some((d, _)) if self.starts_special(&d) => {
                            // No text holds a special token: free text, then the token.
                            out.push(Node::Rep(Box::new(Node::Text), 0, Some(1)));
                            out.push(self.node(&seq[j])?);
                            i = j;
                        }
                        Some((d, rest)) => {
                            out.push(Node::TextThen(d));
                            for n in &rest {
                                out.push(self.node(n)?);
                            }
                            i = j;
                        }
                        // Words that no delimiter closes (before a required call): none.
                        None => {}
                    }
                }
                None => out.push(self.node(node)?),
            }
            i += 1;
        }
        Ok(out)
    }

    fn node(&self, node: &Node) -> Result<Node, String> {
        Ok(match node {
            Node::Group(alts) => Node::Group(alts.iter().map(|a| self.sequence(a)).collect::<Result<_, _>>()?),
            Node::Rep(inner, min, max) => {
                if self.automaton_of(inner).is_some() {
                    let mut seq = self.sequence(std::slice::from_ref(node))?;
                    return Ok(if seq.len() == 1 { seq.remove(0) } else { Node::Group(vec![seq]) });
                }
                Node::Rep(Box::new(self.node(inner)?), *min, *max)
            }
            n => n.clone(),
        })
    }
}

/// Text through `delimiter`. A closing tag with white space around it
/// (`"\n</parameter>\n"`) ends the text at the tag, wherever the white
/// space before it went (the text keeps it), then has what follows it:
/// a value ends at its first closing tag, as the family's reader reads it
/// ([`super::closing`]).
fn through(delimiter: &str) -> Vec<Node> {
    match ValueCloser::of(delimiter) {
        Some(c) if c.after.is_empty() => vec![Node::TextThen(c.tag)],
        Some(c) => vec![Node::TextThen(c.tag), Node::Lit(c.after)],
        None => vec![Node::TextThen(delimiter.to_string())],
    }
}

/// The closing tags of argument values in `gbnf` (llama.cpp's call grammar
/// for a family) with the white space its delimiters put around them: what
/// [`super::closing::close_values`] supplies before llama.cpp's parser
/// reads an answer. Empty when the grammar has none or cannot be read.
pub fn value_closers(gbnf: &str) -> Vec<ValueCloser> {
    let Ok(rules) = rules_of(gbnf) else { return Vec::new() };
    let automata: HashMap<&str, Automaton> = rules.keys().filter_map(|n| automaton(&rules, n).map(|a| (n.as_str(), a))).collect();
    // The automata other rules use (not the states inside one).
    fn refs<'r>(node: &'r Node, out: &mut BTreeSet<&'r str>) {
        match node {
            Node::Ref(n) => {
                out.insert(n);
            }
            Node::Group(alts) => alts.iter().flatten().for_each(|n| refs(n, out)),
            Node::Rep(inner, ..) => refs(inner, out),
            _ => {}
        }
    }
    let mut used = BTreeSet::new();
    for (_, alts) in rules.iter().filter(|(n, _)| !automata.contains_key(n.as_str())) {
        alts.iter().flatten().for_each(|n| refs(n, &mut used));
    }
    let mut out: Vec<ValueCloser> = Vec::new();
    for name in used {
        if let Some(Automaton::Through(ds)) = automata.get(name) {
            for c in ds.iter().filter_map(|d| ValueCloser::of(d)) {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
    }
    out
}

/// The closing tags (`</name>`) in `text`.
fn closing_tags(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("</") {
        let tail = &rest[i..];
        match tail[2..].find(|c: char| c == '>' || c == '<' || c.is_whitespace()) {
            Some(j) if j > 0 && tail.as_bytes()[2 + j] == b'>' => {
                out.push(tail[..3 + j].to_string());
                rest = &tail[3 + j..];
            }
            _ => rest = &tail[2..],
        }
    }
    out
}

fn lark_name(name: &str) -> String {
    format!("g_{}", name.to_ascii_lowercase().replace('-', "_"))
}

fn regex_char(c: char) -> String {
    if c.is_ascii_alphanumeric() || (c as u32 > 0x7f && !c.is_whitespace()) {
        c.to_string()
    } else {
        format!("\\x{{{:x}}}", c as u32)
    }
}

struct Emitter<'a> {
    special: &'a dyn Fn(&str) -> Option<u32>,
    lazies: BTreeMap<String, String>,
    /// Every text a literal holds (between its special tokens).
    texts: BTreeSet<String>,
    /// The closing tags those texts hold (`</function>`, `</tool_call>`):
    /// free text never holds one but the delimiter it ends with, so a value
    /// the model leaves unclosed cannot swallow the end of its call and the
    /// calls after it.
    closers: BTreeSet<String>,
}

impl Emitter<'_> {
    /// A literal's parts: special tokens (`Err`) and the text between them.
    fn parts(&self, s: &str) -> Vec<Result<String, u32>> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut i = 0;
        while i < s.len() {
            let found = if matches!(s.as_bytes()[i], b'<' | b'[') {
                (i + 2..=s.len().min(i + MAX_SPECIAL_LEN))
                    .rev()
                    .filter(|&j| s.is_char_boundary(j) && matches!(s.as_bytes()[j - 1], b'>' | b']'))
                    .find_map(|j| (self.special)(&s[i..j]).map(|id| (j, id)))
            } else {
                None
            };
            match found {
                Some((j, id)) => {
                    if !text.is_empty() {
                        parts.push(Ok(std::mem::take(&mut text)));
                    }
                    parts.push(Err(id));
                    i = j;
                }
                None => {
                    let c = s[i..].chars().next().unwrap_or('\0');
                    text.push(c);
                    i += c.len_utf8();
                }
            }
        }
        if !text.is_empty() {
            parts.push(Ok(text));
        }
        parts
    }

    /// A literal, with the special tokens inside it written as tokens, and
    /// its text cut after any other literal's text it begins with: a lexer
    /// takes the longest match, and would otherwise never see the shorter
    /// literal's way on (`"<|channel|>commentary"` beside `"<|channel|>"`
    /// then `"commentary to=…"`).
    fn literal(&self, s: &str) -> String {
        let mut parts = Vec::new();
        for part in self.parts(s) {
            match part {
                Err(id) => parts.push(format!("<[{id}]>")),
                Ok(mut text) => {
                    while let Some(prefix) =
                        self.texts.iter().filter(|t| t.len() < text.len() && text.starts_with(t.as_str())).min_by_key(|t| t.len())
                    {
                        parts.push(lark_str(prefix));
                        text = text[prefix.len()..].to_string();
                    }
                    parts.push(lark_str(&text));
                }
            }
        }
        match parts.len() {
            0 => "\"\"".into(),
            1 => parts.remove(0),
            _ => format!("({})", parts.join(" ")),
        }
    }

    fn node(&mut self, node: &Node) -> String {
        match node {
            Node::Lit(s) => self.literal(s),
            Node::Class(negated, ranges) => {
                let mut out = String::from("/[");
                if *negated {
                    out.push('^');
                }
                for &(lo, hi) in ranges {
                    out.push_str(&regex_char(lo));
                    if hi != lo {
                        out.push('-');
                        out.push_str(&regex_char(hi));
                    }
                }
                out.push_str("]/");
                out
            }
            Node::Ref(name) => lark_name(name),
            Node::Group(alts) => {
                let alts: Vec<String> = alts.iter().map(|a| self.sequence(a)).collect();
                format!("({})", alts.join(" | "))
            }
            Node::Rep(inner, min, max) => {
                let inner = self.node(inner);
                match (min, max) {
                    (_, Some(0)) => "\"\"".into(),
                    (0, Some(1)) => format!("{inner}?"),
                    (0, None) => format!("{inner}*"),
                    (1, None) => format!("{inner}+"),
                    (m, None) => format!("{inner}{{{m},}}"),
                    (m, Some(n)) => format!("{inner}{{{m},{n}}}"),
                }
            }
            Node::TextThen(d) => {
                let name = format!("text_then_{}", self.lazies.len());
                let regex = |s: &str| s.chars().map(regex_char).collect::<String>();
                let mut body = format!("/(?s:.*){}/", regex(d));
                let others: Vec<String> = self.closers.iter().filter(|c| !d.contains(c.as_str())).map(|c| regex(c)).collect();
                if !others.is_empty() {
                    body.push_str(&format!(" & ~/(?s:.*)({})(?s:.*)/", others.join("|")));
                }
                self.lazies.entry(body).or_insert(name).clone()
            }
            Node::Text => "CALL_FREE_TEXT".into(),
        }
    }

    fn sequence(&mut self, seq: &[Node]) -> String {
        if seq.is_empty() {
            return "\"\"".into();
        }
        seq.iter().map(|n| self.node(n)).collect::<Vec<_>>().join(" ")
    }
}

/// The Lark grammar for llguidance that forces what `gbnf` (llama.cpp's
/// grammar for a family's calls, from the generation prompt on) allows,
/// with `special` telling which texts are special tokens of the model.
pub fn call_grammar(gbnf: &str, special: &dyn Fn(&str) -> Option<u32>) -> Result<String, String> {
    let rules = rules_of(gbnf)?;
    if !rules.contains_key("root") {
        return Err("no root rule".into());
    }
    let automata: HashMap<String, Automaton> = rules.keys().filter_map(|name| automaton(&rules, name).map(|a| (name.clone(), a))).collect();
    let converter = Converter { rules, automata, special };
    // The rules still reachable from the root, rewritten.
    let mut converted: BTreeMap<String, Vec<Vec<Node>>> = BTreeMap::new();
    let mut todo = vec!["root".to_string()];
    while let Some(name) = todo.pop() {
        if converted.contains_key(&name) {
            continue;
        }
        let alts = converter.rules.get(&name).ok_or_else(|| format!("rule {name} is not defined"))?;
        let alts: Vec<Vec<Node>> = alts.iter().map(|a| converter.sequence(a)).collect::<Result<_, _>>()?;
        fn refs(node: &Node, out: &mut Vec<String>) {
            match node {
                Node::Ref(n) => out.push(n.clone()),
                Node::Group(alts) => alts.iter().flatten().for_each(|n| refs(n, out)),
                Node::Rep(inner, ..) => refs(inner, out),
                _ => {}
            }
        }
        for n in alts.iter().flatten() {
            refs(n, &mut todo);
        }
        converted.insert(name, alts);
    }
    let mut emitter = Emitter { special, lazies: BTreeMap::new(), texts: BTreeSet::new(), closers: BTreeSet::new() };
    fn literals<'n>(node: &'n Node, out: &mut Vec<&'n str>) {
        match node {
            Node::Lit(s) => out.push(s),
            Node::Group(alts) => alts.iter().flatten().for_each(|n| literals(n, out)),
            Node::Rep(inner, ..) => literals(inner, out),
            _ => {}
        }
    }
    let mut all = Vec::new();
    converted.values().flatten().flatten().for_each(|n| literals(n, &mut all));
    let texts: BTreeSet<String> = all.iter().flat_map(|l| emitter.parts(l)).filter_map(|p| p.ok()).filter(|t| !t.is_empty()).collect();
    emitter.closers = texts.iter().flat_map(|t| closing_tags(t)).collect();
    emitter.texts = texts;
    let mut out = String::from("start: g_root\n");
    for (name, alts) in &converted {
        let body: Vec<String> = alts.iter().map(|a| emitter.sequence(a)).collect();
        out.push_str(&format!("{}: {}\n", lark_name(name), body.join(" | ")));
    }
    for (body, name) in &emitter.lazies {
        out.push_str(&format!("{name}[lazy]: {body}\n"));
    }
    if out.contains("CALL_FREE_TEXT") {
        out.push_str("CALL_FREE_TEXT: /(?s:.+)/\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::constraint::fixtures::env;
    use crate::sampling::constraint::{Compiler, Grammar};

    fn fixture(name: &str) -> (String, String) {
        let path = format!("{}/src/chat/testdata/calls/{name}.gbnf", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        let first = text.lines().next().unwrap();
        let prompt: String = serde_json::from_str(first.strip_prefix("# generation prompt: ").unwrap()).unwrap();
        (text, prompt)
    }

    /// Whether `text` can be generated token by token under the grammar
    /// after `prompt`, and ended there.
    fn accepts(grammar: &str, prompt: &str, text: &str) -> bool {
        let (env, _) = env();
        let g = Grammar::LarkAfter(grammar.into(), prompt.into());
        let mut c = Compiler::new(&env).unwrap().compile(&g).unwrap_or_else(|e| panic!("{e}\n{grammar}"));
        for t in env.tok_trie().tokenize_with_special(text, |t| env.tokenize(t)) {
            let Ok(mask) = c.allowed() else { return false };
            if !c.is_allowed(&mask, t as i32) || c.consume(t as i32).is_err() {
                return false;
            }
        }
        let mask = c.allowed().unwrap();
        let eos = env.tok_trie().eos_token() as i32;
        c.is_allowed(&mask, eos)
    }

    const NONE: &dyn Fn(&str) -> Option<u32> = &|_| None;

    /// The toy vocabulary's special tokens.
    fn toy_special(text: &str) -> Option<u32> {
        env().0.tok_trie().get_special_token(text)
    }

    #[test]
    fn reads_automata_back_into_delimiters() {
        let rules = rules_of(&fixture("Qwen3-Coder").0).unwrap();
        assert_eq!(automaton(&rules, "until-64"), Some(Automaton::Until(vec!["<function=get_weather>".into(), "<tool_call>".into()])));
        assert_eq!(automaton(&rules, "ac-8"), Some(Automaton::Through(vec!["\n</parameter>\n".into()])));
        assert_eq!(automaton(&rules, "space"), None);
        let rules = rules_of(&fixture("GLM-4.6").0).unwrap();
        assert_eq!(automaton(&rules, "until-7"), Some(Automaton::Until(vec!["</think>".into()])));
        assert_eq!(automaton(&rules, "ac-25"), Some(Automaton::Through(vec!["</arg_value>\n".into()])));
    }

    #[test]
    fn value_closers_of_each_family() {
        let closer = |d: &str| ValueCloser::of(d).unwrap();
        assert_eq!(value_closers(&fixture("Qwen3-Coder").0), vec![closer("\n</parameter>\n")]);
        assert_eq!(value_closers(&fixture("GLM-4.6").0), vec![closer("</arg_value>\n")]);
        // JSON arguments: none.
        assert_eq!(value_closers(&fixture("deepseek-ai-DeepSeek-V3.1").0), vec![]);
        assert_eq!(value_closers("root ::= ("), vec![]);
    }

    #[test]
    fn a_value_ends_at_its_first_closing_tag() {
        // The model left out the line break before the tag: the value ends
        // there, and what must follow the tag is forced (not the system
        // prompt's text until the budget ends).
        let (gbnf, prompt) = fixture("Qwen3-Coder");
        let lark = call_grammar(&gbnf, &toy_special).unwrap();
        let bare = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</parameter>\n</function>\n</tool_call>";
        assert!(accepts(&lark, &prompt, bare), "{lark}");
        let run_on = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</parameter>\n</function>\n</tool_call>\n\nIMPORTANT\n</parameter>\n</function>\n</tool_call>";
        assert!(!accepts(&lark, &prompt, run_on), "{lark}");
        let (gbnf, prompt) = fixture("GLM-4.6");
        let lark = call_grammar(&gbnf, &toy_special).unwrap();
        let run_on = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value></tool_call>x</arg_value>\n</tool_call>";
        assert!(!accepts(&lark, &prompt, run_on), "{lark}");
    }

    #[test]
    fn an_unclosed_value_cannot_swallow_the_end_of_its_call() {
        // Qwen3-Coder on SmolLM2, forced: "Lyon</function></tool_call>" and
        // two more calls became one string value, ended by a </parameter>
        // much later. A value holds no closing tag of the call's.
        assert_eq!(closing_tags("a</x> </y>\n<z></ bad></w"), vec!["</x>", "</y>"]);
        let (gbnf, prompt) = fixture("Qwen3-Coder");
        let lark = call_grammar(&gbnf, &toy_special).unwrap();
        let swallowed = "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
        assert!(!accepts(&lark, &prompt, swallowed), "{lark}");
        let closed = "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>";
        assert!(accepts(&lark, &prompt, closed), "{lark}");
    }

    #[test]
    fn every_fixture_converts_and_compiles() {
        let dir = format!("{}/src/chat/testdata/calls", env!("CARGO_MANIFEST_DIR"));
        let (env, _) = env();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            let (gbnf, prompt) = fixture(&name);
            let lark = call_grammar(&gbnf, &toy_special).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!lark.contains("until_") && !lark.contains("g_ac_"), "{name}: an automaton is left\n{lark}");
            // It compiles, and reads the generation prompt.
            Compiler::new(&env)
                .unwrap()
                .compile(&Grammar::LarkAfter(lark.clone(), prompt))
                .unwrap_or_else(|e| panic!("{name}: {e}\n{lark}"));
        }
    }

    #[test]
    fn calls_in_each_syntax_are_accepted_and_others_refused() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "Qwen3-Coder",
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis </b> <x\n</parameter>\n</function>\n</tool_call>",
                "<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
            ),
            (
                "GLM-4.6",
                "<think>a </th <b> c</think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
                "<tool_call>get_weather\n<arg_key>town</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
            ),
            (
                "deepseek-ai-DeepSeek-V3.1",
                // The generation prompt opened the thinking: it is closed first.
                "Paris, then.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ),
            (
                "openai-gpt-oss-120b",
                // (`<|end|>` ends generation in the toy vocabulary: no analysis message here.)
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
                "<|channel|>final<|message|>Hi<|end|>",
            ),
            ("LFM2-8B-A1B", "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>", "Sure.<|tool_call_start|>[get_time()]<|tool_call_end|>"),
        ];
        for (name, good, bad) in cases {
            let (gbnf, prompt) = fixture(name);
            let lark = call_grammar(&gbnf, &toy_special).unwrap();
            assert!(accepts(&lark, &prompt, good), "{name} refused {good:?}\n{lark}");
            assert!(!accepts(&lark, &prompt, bad), "{name} accepted {bad:?}\n{lark}");
        }
    }

    #[test]
    fn special_tokens_are_written_as_tokens() {
        let (gbnf, _) = fixture("openai-gpt-oss-120b");
        let special = |t: &str| match t {
            "<|end|>" => Some(7),
            "<|start|>" => Some(8),
            _ => None,
        };
        let lark = call_grammar(&gbnf, &special).unwrap();
        assert!(lark.contains("<[7]>") && lark.contains("<[8]>"), "{lark}");
        assert!(lark.contains("CALL_FREE_TEXT"), "{lark}");
    }

    #[test]
    fn hostile_grammars_are_refused_not_crashed() {
        for g in ["", "root ::= (", "root ::= \"a", "root ::= [a", "x ::= y", "root ::= a\nroot ::= b", "root ::= b"] {
            assert!(call_grammar(g, NONE).is_err(), "{g:?}");
        }
        // Shapes that once overflowed in the automaton reader and the
        // delimiter stripping: converted or refused, never a panic.
        for g in [
            "root ::= [z-a]",
            "root ::= [^z-a] root | [^z-a]",
            "root ::= \"<a>\"{0} [x]",
            "root ::= (\"<a>\" [b]){0,0} \"c\"",
            "root ::= a\na ::= [z-a] a | [z-a] |",
        ] {
            let _ = call_grammar(g, NONE);
            let _ = value_closers(g);
        }
        // A grammar that does not begin with the prompt's text is refused when compiled.
        let (env, _) = env();
        let lark = call_grammar("root ::= \"x\" \"y\"", NONE).unwrap();
        assert!(Compiler::new(&env).unwrap().compile(&Grammar::LarkAfter(lark, "z".into())).is_err());
    }
}
