//! Bounds on a JSON schema before llguidance compiles it. llguidance turns
//! every count in a schema into copies of a grammar rule when it compiles:
//! `minItems: 100000000` is a hundred million array items built in memory
//! before any of its own limits looks (59 s and 4 GB, measured). So every
//! count a schema can hold — array and object sizes, string lengths, the
//! `{m,n}` of a pattern — is checked here first, alone and multiplied by the
//! counts it sits inside, with the same bounds as a GBNF grammar's
//! repetitions (`core::gbnf`). What passes compiles in
//! milliseconds; llguidance's own `ParserLimits` then bound the rest
//! (`core::sampling::constraint`).

use serde_json::Value;

use crate::error::{EngineError, Result};

/// Most bytes of one schema (tool parameters or a response format) as JSON.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Most properties one object of a schema may list (llguidance's compile
/// time grows with the square of optional properties).
pub const MAX_PROPERTIES: usize = 512;
/// Largest count in a schema: `minItems`, `maxItems`, `minProperties`,
/// `maxProperties`, `minContains`, `maxContains`, and a pattern's `{m,n}`.
pub const MAX_COUNT: u64 = 1_000;
/// Largest `minLength` / `maxLength` of a string (a string is one lexeme:
/// its length bounds a counter in the lexer, not copies of a rule).
pub const MAX_STRING_LENGTH: u64 = 10_000;
/// Most copies in all: each count times the counts of the arrays, objects
/// and pattern groups it sits inside, summed over the schema.
pub const MAX_COPIES: u64 = 20_000;

const COUNT_KEYS: [&str; 6] = ["minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"];
const LENGTH_KEYS: [&str; 2] = ["minLength", "maxLength"];

fn invalid(field: &str, why: impl std::fmt::Display) -> EngineError {
    EngineError::invalid(field, why)
}

/// Bounds `schema` (the request's `field`): its size, the properties of each
/// of its objects, and every count in it, alone and multiplied. The error
/// names the place (`field.properties.a.maxItems`) and the limit.
pub fn check_schema(schema: &Value, field: &str) -> Result<()> {
    let bytes = schema.to_string().len();
    if bytes > MAX_SCHEMA_BYTES {
        return Err(invalid(field, format!("at most {MAX_SCHEMA_BYTES} bytes are allowed, got {bytes}")));
    }
    let mut copies: u64 = 0;
    // (value, path, product of the counts it sits inside)
    let mut stack = vec![(schema, String::new(), 1u64)];
    while let Some((v, path, outer)) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(Value::Object(props)) = o.get("properties") {
                    if props.len() > MAX_PROPERTIES {
                        return Err(invalid(
                            &format!("{field}{path}.properties"),
                            format!("at most {MAX_PROPERTIES} properties are allowed, got {}", props.len()),
                        ));
                    }
                }
                // The counts of this (sub)schema; its children are repeated
                // by the largest of them.
                let mut here = 1u64;
                for key in COUNT_KEYS {
                    if let Some(n) = o.get(key) {
                        let n = count(n, &format!("{field}{path}.{key}"), MAX_COUNT)?;
                        copies = add_copies(copies, outer.saturating_mul(n), field, &path, key)?;
                        here = here.max(n);
                    }
                }
                for key in LENGTH_KEYS {
                    if let Some(n) = o.get(key) {
                        count(n, &format!("{field}{path}.{key}"), MAX_STRING_LENGTH)?;
                    }
                }
                // A pattern is one lexeme, compiled once however many
                // items repeat it: its groups multiply, the schema's counts
                // around it do not.
                if let Some(Value::String(p)) = o.get("pattern") {
                    copies = check_pattern(p, &format!("{field}{path}.pattern"), copies)?;
                }
                if let Some(Value::Object(pp)) = o.get("patternProperties") {
                    for p in pp.keys() {
                        copies = check_pattern(p, &format!("{field}{path}.patternProperties"), copies)?;
                    }
                }
                let inner = outer.saturating_mul(here);
                for (k, child) in o {
                    stack.push((child, format!("{path}.{k}"), inner));
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    stack.push((child, format!("{path}[{i}]"), outer));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A count keyword's value: a non-negative integer at most `max`. Values
/// that are not counts are left to llguidance to refuse.
fn count(v: &Value, at: &str, max: u64) -> Result<u64> {
    let n = match v {
        Value::Number(n) => {
            n.as_u64().or_else(|| n.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f.min(u64::MAX as f64) as u64))
        }
        _ => None,
    };
    match n {
        Some(n) if n > max => Err(invalid(at, format!("at most {max} is allowed here, got {n}"))),
        Some(n) => Ok(n),
        None => Ok(0),
    }
}

fn add_copies(copies: u64, more: u64, field: &str, path: &str, key: &str) -> Result<u64> {
    let total = copies.saturating_add(more);
    if total > MAX_COPIES {
        return Err(invalid(
            &format!("{field}{path}.{key}"),
            format!("the schema's counts multiply to more than {MAX_COPIES} copies in all (counts inside arrays and objects multiply)"),
        ));
    }
    Ok(total)
}

/// The `{m}`, `{m,}` and `{m,n}` of a regular expression, each at most
/// [`MAX_COUNT`], and multiplied by the quantified groups around it into
/// `copies`.
fn check_pattern(pattern: &str, at: &str, copies: u64) -> Result<u64> {
    let quantifiers = quantifiers(pattern);
    let mut copies = copies;
    for q in &quantifiers {
        if q.bound > MAX_COUNT {
            return Err(invalid(at, format!("a repetition {{m,n}} may count at most {MAX_COUNT}, got {}", q.bound)));
        }
        // The groups that enclose this quantifier's operand, quantified.
        let around = quantifiers
            .iter()
            .filter(|g| g.group.is_some_and(|(s, e)| s < q.at && q.at < e))
            .fold(1u64, |acc, g| acc.saturating_mul(g.bound));
        copies = copies.saturating_add(around.saturating_mul(q.bound));
        if copies > MAX_COPIES {
            return Err(invalid(at, format!("repetitions multiply to more than {MAX_COPIES} copies in all")));
        }
    }
    Ok(copies)
}

/// One `{m,n}` in a regular expression.
#[derive(Debug, PartialEq)]
struct Quantifier {
    /// Byte offset of the `{`.
    at: usize,
    /// The larger of m and n (m for `{m,}`).
    bound: u64,
    /// When it quantifies a group: the group's `(` and `)` offsets.
    group: Option<(usize, usize)>,
}

/// The counted repetitions of `pattern`, skipping escapes and character
/// classes. A `{` that does not start a well-formed quantifier is a literal.
fn quantifiers(pattern: &str) -> Vec<Quantifier> {
    let b = pattern.as_bytes();
    let mut out = Vec::new();
    let mut opens = Vec::new();
    let mut last_group: Option<(usize, usize)> = None;
    let mut i = 0;
    let mut in_class = false;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' {
            i += 2;
            last_group = None;
            continue;
        }
        if in_class {
            in_class = c != b']';
            i += 1;
            continue;
        }
        match c {
            b'[' => in_class = true,
            b'(' => opens.push(i),
            b')' => {
                last_group = opens.pop().map(|s| (s, i));
                i += 1;
                continue;
            }
            b'{' => {
                if let Some((bound, len)) = braces(&b[i..]) {
                    out.push(Quantifier { at: i, bound, group: last_group });
                    i += len;
                    last_group = None;
                    continue;
                }
            }
            _ => {}
        }
        last_group = None;
        i += 1;
    }
    out
}

/// `{m}`, `{m,}` or `{m,n}` at the start of `b`: the larger bound and the
/// length of the braces.
fn braces(b: &[u8]) -> Option<(u64, usize)> {
    let end = b.iter().position(|&c| c == b'}')?;
    let inner = std::str::from_utf8(&b[1..end]).ok()?;
    let (m, n) = match inner.split_once(',') {
        Some((m, n)) => (m.trim(), n.trim()),
        None => (inner.trim(), ""),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    if !digits(m) || !(n.is_empty() || digits(n)) {
        return None;
    }
    // Saturate: a count too long for u64 is over every limit anyway.
    let parse = |s: &str| s.parse::<u64>().unwrap_or(u64::MAX);
    let bound = if n.is_empty() { parse(m) } else { parse(m).max(parse(n)) };
    Some((bound, end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(schema: Value) -> String {
        check_schema(&schema, "response_format.json_schema.schema").unwrap_err().message
    }

    #[test]
    fn counts_in_every_position_are_bounded() {
        for (schema, at) in [
            (json!({ "type": "array", "items": { "type": "integer" }, "minItems": 100_000_000u64 }), ".minItems"),
            (json!({ "type": "array", "maxItems": 5_000_000 }), ".maxItems"),
            (json!({ "type": "string", "minLength": 1_000_000 }), ".minLength"),
            (json!({ "type": "string", "maxLength": 1e7 }), ".maxLength"),
            (json!({ "type": "object", "minProperties": 2_000_000 }), ".minProperties"),
            (json!({ "type": "object", "maxProperties": 2_000_000 }), ".maxProperties"),
            (json!({ "type": "array", "contains": { "type": "integer" }, "minContains": 3_000_000 }), ".minContains"),
            (json!({ "type": "object", "properties": { "a": { "type": "string", "pattern": "^a{1000000}$" } } }), ".properties.a.pattern"),
            (json!({ "type": "string", "pattern": "^(ab){2,18446744073709551616}$" }), ".pattern"),
            (json!({ "type": "object", "patternProperties": { "^x{0,99999}$": { "type": "string" } } }), ".patternProperties"),
        ] {
            let e = err(schema.clone());
            assert!(e.starts_with(&format!("response_format.json_schema.schema{at}:")), "{schema}: {e}");
            assert!(e.contains("at most"), "{e}");
        }
    }

    #[test]
    fn nested_counts_multiply() {
        // 1,000 arrays of 1,000: each count is allowed, their product is not.
        let nested =
            json!({ "type": "array", "minItems": 1000, "items": { "type": "array", "minItems": 1000, "items": { "type": "integer" } } });
        let e = err(nested);
        assert!(e.starts_with("response_format.json_schema.schema.items.minItems:") && e.contains("20000 copies"), "{e}");
        // A pattern's groups multiply too, and with the arrays around them.
        assert!(err(json!({ "type": "string", "pattern": "((a{100}){100}){100}" })).contains("copies"));
        assert!(err(json!({ "type": "array", "items": { "pattern": "(a{20}){1000}" } })).contains("copies"));
        // What real schemas hold passes.
        let fine = json!({ "type": "object", "properties": {
            "tags": { "type": "array", "items": { "type": "string", "maxLength": 64, "pattern": "^[a-z]{1,32}(-[a-z]{1,32}){0,3}$" }, "maxItems": 20 },
            "matrix": { "type": "array", "minItems": 3, "maxItems": 3, "items": { "type": "array", "minItems": 3, "maxItems": 3, "items": { "type": "number" } } },
            "summary": { "type": "string", "maxLength": 10000 },
            "zip": { "type": "string", "pattern": "^\\d{5}(-\\d{4})?$" },
            "codes": { "type": "array", "maxItems": 500, "items": { "type": "string", "pattern": "^[A-Z]{100}$" } }
        } });
        check_schema(&fine, "f").unwrap();
    }

    #[test]
    fn quantifiers_skip_escapes_classes_and_literal_braces() {
        assert_eq!(quantifiers(r"\{5000\}[{9999}]x{3}"), vec![Quantifier { at: 17, bound: 3, group: None }]);
        assert_eq!(quantifiers("a{,5}b{x}"), vec![]);
        let q = quantifiers("(ab){2,7}c{4,}");
        assert_eq!(q, vec![Quantifier { at: 4, bound: 7, group: Some((0, 3)) }, Quantifier { at: 10, bound: 4, group: None }]);
    }

    #[test]
    fn size_and_properties_are_bounded() {
        let props: serde_json::Map<String, Value> = (0..=MAX_PROPERTIES).map(|i| (format!("p{i}"), json!({ "type": "string" }))).collect();
        assert!(err(json!({ "type": "object", "properties": props })).contains("properties are allowed"));
        let big = json!({ "enum": (0..60_000).map(|i| format!("v{i}")).collect::<Vec<_>>() });
        assert!(err(big).contains("bytes are allowed"));
    }
}
