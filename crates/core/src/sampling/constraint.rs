//! Constraints computed by llguidance: which tokens may come next under a
//! JSON schema or a Lark grammar (structured output, tool calls), and which
//! bytes the grammar forces from here (what the grammar drafter proposes).
//!
//! A `Constraint` is one request's matcher: the sampler masks the logits
//! with `allowed()` before it chooses, then `consume`s the chosen token.
//! Drafted tokens are never consumed, only chosen ones, so verification
//! needs no rollback. llguidance poisons a matcher on any error; this
//! wrapper reports that once, as an error, and never hands back a mask that
//! would let generation go on unconstrained.
//!
//! Compiling is bounded by llguidance's `ParserLimits` (lexer fuel, items,
//! grammar size) and, before that, by the request's own limits (schema size
//! and nesting, checked when it is parsed).

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{InferenceCapabilities, SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use super::forced::{forced_tokens, Tokenize};

/// What a constraint is made from.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON schema (its JSON text is the cache key).
    JsonSchema(Value),
    /// A Lark grammar (llguidance's dialect, with `%json` schemas inside).
    Lark(String),
    /// A Lark grammar whose first text (`<special>` tokens and text) the
    /// prompt has already written: the constraint starts after it.
    LarkAfter(String, String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            Grammar::Lark(lark) | Grammar::LarkAfter(lark, _) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// How JSON is laid out under a constraint: Python's `json.dumps` style
/// (`", "` and `": "`, no other whitespace). llguidance's default allows any
/// whitespace anywhere, without bound: a small model can then loop on
/// newlines forever. This is also how chat templates print JSON.
pub fn json_layout() -> Value {
    serde_json::json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " })
}

/// llguidance's limits, ours where its defaults allow too much. Each is
/// named in docs/guarantees.md.
pub fn limits() -> ParserLimits {
    ParserLimits {
        // Lexer work to build a grammar's lexemes (~50k a millisecond):
        // about 20 ms.
        initial_lexer_fuel: 1_000_000,
        // Lexer work and parser items for one token's mask (~14k and ~20k a
        // millisecond): at most ~15 ms and ~2.5 ms a token. Past them the
        // request ends with INVALID_REQUEST rather than hold the batch.
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_items_in_row: 2_000,
        // Lexer states are built as tokens are matched and kept with the
        // compiled grammar (1–2 kB each): at most ~100 MB, not llguidance's
        // 250,000 (~500 MB).
        max_lexer_states: 50_000,
        // Symbols in the grammar's productions.
        max_grammar_size: 200_000,
        precompute_large_lexemes: true,
        // Errors without the generated text in them.
        verbose_errors: false,
    }
}

/// Compiles grammars for one vocabulary. Built once per model (it walks the
/// vocabulary); cheap to share.
#[derive(Clone)]
pub struct Compiler {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
}

impl Compiler {
    pub fn new(env: &TokEnv) -> Result<Compiler, String> {
        let mut factory = ParserFactory::new(env, InferenceCapabilities::default(), &SlicedBiasComputer::general_slices())
            .map_err(|e| format!("llguidance: {e}"))?;
        // Nothing on stderr; errors without the generated text in them.
        factory.quiet();
        *factory.limits_mut() = limits();
        let n_vocab = env.tok_trie().vocab_size();
        Ok(Compiler { factory: Arc::new(factory), n_vocab })
    }

    /// Compiles `grammar`. The error is llguidance's reason, first line only.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, String> {
        let parser = self.factory.create_parser(grammar.top_level()).map_err(|e| first_line(&format!("{e:#}")))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(first_line(&e));
        }
        if let Grammar::LarkAfter(_, written) = grammar {
            let env = self.factory.tok_env();
            let tokens = env.tok_trie().tokenize_with_special(written, |text| env.tokenize(text));
            matcher
                .consume_tokens(&tokens)
                .map_err(|e| format!("the grammar does not begin with {written:?}: {}", first_line(&format!("{e:#}"))))?;
        }
        Ok(Constraint { matcher, n_vocab: self.n_vocab, failure: None, tokenize: None })
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Where in `schema` (which does not compile) the problem is: the path
    /// of the deepest part that fails to compile on its own (`.properties.a`),
    /// empty when only the whole fails. llguidance's messages do not say.
    pub fn locate(&self, schema: &Value) -> String {
        let mut path = String::new();
        let mut at = schema;
        let mut budget = 64;
        'descend: loop {
            for (step, child) in children(at) {
                if budget == 0 {
                    break 'descend;
                }
                budget -= 1;
                let mut alone = child.clone();
                if let Some(o) = alone.as_object_mut() {
                    o.insert("x-guidance".into(), json_layout());
                }
                if let Err(e) = self.compile(&Grammar::JsonSchema(alone)) {
                    // A reference into the whole does not resolve alone.
                    if e.contains("Pointer") || e.contains("$ref") || e.contains("registry") {
                        continue;
                    }
                    path.push_str(&step);
                    at = child;
                    continue 'descend;
                }
            }
            break;
        }
        path
    }
}

/// The sub-schemas of a schema, each with the path step to it.
fn children(schema: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    let Some(o) = schema.as_object() else { return out };
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(m)) = o.get(key) {
            out.extend(m.iter().map(|(k, v)| (format!(".{key}.{k}"), v)));
        }
    }
    for key in ["items", "additionalProperties", "not", "if", "then", "else", "contains"] {
        if let Some(v @ Value::Object(_)) = o.get(key) {
            out.push((format!(".{key}"), v));
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(a)) = o.get(key) {
            out.extend(a.iter().enumerate().map(|(i, v)| (format!(".{key}[{i}]"), v)));
        }
    }
    out
}

/// Whether a constraint failed on one of [`limits`] (llguidance says so only
/// in words: "Too many items (limit …)", "… max is …", lexer fuel or
/// states) rather than on a bug: the request's field is then at fault.
pub fn is_limit(why: &str) -> bool {
    ["limit", "max is", "fuel", "states"].iter().any(|w| why.contains(w))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).trim().to_string()
}

/// One request's constraint.
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
    failure: Option<String>,
    /// The model's tokenizer, for the canonical tokens of forced text.
    tokenize: Option<Tokenize>,
}

/// What may come next.
pub enum Next {
    /// Forced text goes on past the next token: only its canonical first token.
    Forced(i32),
    /// Any token the mask allows.
    Mask(SimpleVob),
}

impl Constraint {
    /// Forced text is written in the model's canonical tokens (see
    /// [`super::forced`]): from here on [`next_token`](Self::next_token) allows only
    /// their first where the grammar forces text beyond one token.
    pub fn with_tokenizer(mut self, tokenize: Tokenize) -> Self {
        self.tokenize = Some(tokenize);
        self
    }

    /// What the next token may be: the canonical token of forced text (when
    /// a tokenizer is set and the grammar accepts that token), else the mask.
    /// The same function of the constraint's state whether a token is
    /// decoded plainly or verified in a draft.
    pub fn next_token(&mut self) -> Result<Next, String> {
        if let Some(t) = self.forced_next() {
            return Ok(Next::Forced(t));
        }
        self.allowed().map(Next::Mask)
    }

    fn forced_next(&mut self) -> Option<i32> {
        let tokenize = self.tokenize.clone()?;
        let bytes = self.forced_bytes();
        if bytes.is_empty() {
            return None;
        }
        let &first = forced_tokens(&bytes, &*tokenize, 1).first()?;
        let id = u32::try_from(first).ok().filter(|&i| (i as usize) < self.n_vocab)?;
        (self.matcher.validate_tokens(&[id]).ok()? == 1).then_some(first)
    }

    /// The canonical tokens of the forced text from here (at most `n_max`).
    pub fn forced(&mut self, n_max: usize) -> Vec<i32> {
        let Some(tokenize) = self.tokenize.clone() else { return Vec::new() };
        let bytes = self.forced_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        forced_tokens(&bytes, &*tokenize, n_max)
    }

    /// The tokens allowed next: a bit per token id (end-of-generation tokens
    /// only where the grammar may end; only those once it has ended).
    pub fn allowed(&mut self) -> Result<SimpleVob, String> {
        if let Some(f) = &self.failure {
            return Err(f.clone());
        }
        self.matcher.compute_mask_or_eos().map_err(|e| self.fail(format!("the constraint failed: {}", first_line(&e.to_string()))))
    }

    /// Whether token `id` is allowed by `mask` (ids past the vocabulary are not).
    pub fn is_allowed(&self, mask: &SimpleVob, id: i32) -> bool {
        usize::try_from(id).is_ok_and(|i| i < self.n_vocab && mask.is_allowed(i as u32))
    }

    /// Records `token` as generated. A token chosen under the mask always
    /// fits; once the grammar has ended, only an end-of-generation token can
    /// be chosen, and it is not fed to the finished matcher.
    pub fn consume(&mut self, token: i32) -> Result<(), String> {
        if let Some(f) = &self.failure {
            return Err(f.clone());
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        let Ok(t) = u32::try_from(token) else { return Err(self.fail(format!("token {token} is not a token id"))) };
        self.matcher.consume_token(t).map_err(|e| self.fail(format!("the constraint failed: {}", first_line(&e.to_string()))))
    }

    /// The bytes the grammar forces from here on (special tokens as
    /// `\xFF[id]`); empty when nothing is forced.
    pub fn forced_bytes(&mut self) -> Vec<u8> {
        if self.failure.is_some() || self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.compute_ff_bytes()
    }

    /// Why the constraint stopped working, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// An independent copy (for a compiled grammar reused by later requests).
    pub fn deep_clone(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            n_vocab: self.n_vocab,
            failure: self.failure.clone(),
            tokenize: self.tokenize.clone(),
        }
    }

    fn fail(&mut self, why: String) -> String {
        self.failure = Some(why.clone());
        why
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    use std::sync::Arc;

    use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

    /// A toy vocabulary: every byte, some words, and three special tokens;
    /// `<|end|>` is the end of generation.
    pub fn env() -> (TokEnv, Vec<Vec<u8>>) {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for w in ["{\"", "\":", "\", \"", "name", "arguments", "city", "Paris", "true", "false", " ", "\n", "<tool_call>", "</tool_call>"] {
            words.push(w.as_bytes().to_vec());
        }
        words.push(b"\xFF<|im_start|>".to_vec());
        words.push(b"\xFF<|im_end|>".to_vec());
        words.push(b"\xFF<|end|>".to_vec());
        let eos = words.len() as u32 - 1;
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&[eos, eos - 1]);
        (Arc::new(ApproximateTokEnv::new(trie)), words)
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::env;
    use super::*;
    use serde_json::json;

    fn id(words: &[Vec<u8>], w: &[u8]) -> i32 {
        words.iter().position(|x| x == w).unwrap() as i32
    }

    fn schema() -> Value {
        let mut s = json!({ "type": "object", "properties": { "city": { "type": "string" }, "ok": { "type": "boolean" } }, "required": ["city", "ok"], "additionalProperties": false });
        s["x-guidance"] = json_layout();
        s
    }

    #[test]
    fn a_schema_masks_forces_and_ends() {
        let (env, words) = env();
        let compiler = Compiler::new(&env).unwrap();
        let mut c = compiler.compile(&Grammar::JsonSchema(schema())).unwrap();
        // Nothing but `{` can start the object.
        let mask = c.allowed().unwrap();
        assert!(c.is_allowed(&mask, id(&words, b"{")));
        assert!(!c.is_allowed(&mask, id(&words, b"x")));
        assert!(!c.is_allowed(&mask, id(&words, b"\xFF<|end|>")));
        assert_eq!(c.forced_bytes(), b"{\"city\": \"");
        for t in [b"{\"".as_slice(), b"city", b"\":", b" ", b"\"", b"Paris", b"\"", b",", b" ", b"\"", b"o", b"k", b"\":", b" ", b"true"] {
            let token = id(&words, t);
            let mask = c.allowed().unwrap();
            assert!(c.is_allowed(&mask, token), "{}", String::from_utf8_lossy(t));
            c.consume(token).unwrap();
        }
        assert_eq!(c.forced_bytes(), b"}");
        c.consume(id(&words, b"}")).unwrap();
        // Ended: only end-of-generation tokens, and consuming one is fine.
        let mask = c.allowed().unwrap();
        assert!(c.is_allowed(&mask, id(&words, b"\xFF<|end|>")) && c.is_allowed(&mask, id(&words, b"\xFF<|im_end|>")));
        assert!(!c.is_allowed(&mask, id(&words, b" ")));
        c.consume(id(&words, b"\xFF<|end|>")).unwrap();
        assert!(c.forced_bytes().is_empty());
    }

    /// Longest match over the fixture's words (special tokens excluded).
    fn longest_match(words: Vec<Vec<u8>>) -> Tokenize {
        std::sync::Arc::new(move |mut bytes: &[u8]| {
            let mut out = Vec::new();
            while !bytes.is_empty() {
                let (id, w) = words
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| w.first() != Some(&0xFF) || w.len() == 1)
                    .filter(|(_, w)| bytes.starts_with(w))
                    .max_by_key(|(i, w)| (w.len(), std::cmp::Reverse(*i)))
                    .unwrap();
                out.push(id as i32);
                bytes = &bytes[w.len()..];
            }
            out
        })
    }

    #[test]
    fn forced_text_is_written_in_canonical_tokens() {
        let (env, words) = env();
        let compiler = Compiler::new(&env).unwrap();
        let mut c = compiler.compile(&Grammar::JsonSchema(schema())).unwrap().with_tokenizer(longest_match(words.clone()));
        // `{"city": "` is forced: `{"`, `city`, `":`, ` ` then `"` (the last
        // may merge with the free text after it, so it is not forced).
        assert_eq!(c.forced(16), [b"{\"".as_slice(), b"city", b"\":", b" "].map(|w| id(&words, w)));
        for w in [b"{\"".as_slice(), b"city", b"\":", b" "] {
            match c.next_token().unwrap() {
                Next::Forced(t) => assert_eq!(t, id(&words, w), "{}", String::from_utf8_lossy(w)),
                Next::Mask(_) => panic!("{} is forced", String::from_utf8_lossy(w)),
            }
            c.consume(id(&words, w)).unwrap();
        }
        // The quote before free text: the mask, where `"` and `"Paris`-like merges are open.
        assert!(matches!(c.next_token().unwrap(), Next::Mask(m) if m.is_allowed(id(&words, b"\"") as u32)));
        // Without a tokenizer nothing is forced token by token.
        let mut plain = compiler.compile(&Grammar::JsonSchema(schema())).unwrap();
        assert!(matches!(plain.next_token().unwrap(), Next::Mask(_)) && plain.forced(16).is_empty());
    }

    #[test]
    fn a_token_outside_the_grammar_fails_the_constraint_for_good() {
        let (env, words) = env();
        let mut c = Compiler::new(&env).unwrap().compile(&Grammar::JsonSchema(schema())).unwrap();
        let e = c.consume(id(&words, b"x")).unwrap_err();
        assert!(e.starts_with("the constraint failed"), "{e}");
        assert!(c.allowed().is_err());
        assert_eq!(c.failure(), Some(e.as_str()));
    }

    #[test]
    fn compile_errors_are_one_line() {
        let (env, _) = env();
        let compiler = Compiler::new(&env).unwrap();
        for (g, want) in [
            (Grammar::JsonSchema(json!({ "type": "strin" })), "strin"),
            (Grammar::JsonSchema(json!({ "type": "object", "if": {} })), "Unimplemented keys"),
            (Grammar::Lark("start: foo bar".into()), "unknown name"),
        ] {
            let e = compiler.compile(&g).err().expect("an error");
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_failing_schema_is_located() {
        let (env, _) = env();
        let compiler = Compiler::new(&env).unwrap();
        let schema = json!({ "type": "object", "properties": { "a": { "type": "string" }, "b": { "type": "array", "items": { "type": "object", "properties": { "c": { "type": "strin" } } } } } });
        assert_eq!(compiler.locate(&schema), ".properties.b.items.properties.c");
        assert_eq!(compiler.locate(&json!({ "type": "strin" })), "");
    }

    #[test]
    fn a_lazy_tool_call_grammar_leaves_text_free_until_the_opener() {
        let (env, words) = env();
        let compiler = Compiler::new(&env).unwrap();
        let lark = r#"start: tool_call* TEXT
TEXT: /(.|\n)*/
tool_call: tool_hd "\n" call "\n</tool_call>"
tool_hd[lazy]: TEXT "<tool_call>"
call: %json {"type": "object", "properties": {"name": {"const": "get"}}, "required": ["name"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}}
"#;
        let mut c = compiler.compile(&Grammar::Lark(lark.into())).unwrap();
        for t in [b"x".as_slice(), b" ", b"<tool_call>", b"\n"] {
            let token = id(&words, t);
            let mask = c.allowed().unwrap();
            assert!(c.is_allowed(&mask, token));
            c.consume(token).unwrap();
        }
        assert_eq!(c.forced_bytes(), b"{\"name\": \"get\"}\n</tool_call>");
    }
}
