//! A pre-check of GBNF grammars before llama.cpp parses them.
//!
//! llama.cpp's grammar parser reports syntax errors, but some grammars it
//! accepts cost unbounded memory or stack: a repetition `x{2,1}` (max below
//! min) expands without end (measured: 24 GB and the OOM killer), `x{0,9999999}`
//! builds millions of rules, and very deep parentheses recurse the parser
//! off the stack. This scanner walks the grammar once, skipping string
//! literals, character classes and comments, and bounds exactly those.
//! Everything else is left to llama.cpp's parser, whose errors are caught.

/// Longest grammar accepted, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;
/// Largest bound of one repetition `{m,n}`.
pub const MAX_REPEAT: u64 = 1000;
/// Sum over all repetitions of their largest bound (each costs a rule copy).
pub const MAX_REPEAT_TOTAL: u64 = 20_000;
/// Deepest nesting of parentheses.
pub const MAX_NESTING: usize = 64;

/// `Ok` when the grammar is safe to hand to llama.cpp's parser (which may
/// still reject it); `Err` with the reason otherwise.
pub fn check_gbnf(grammar: &str) -> Result<(), String> {
    if grammar.len() > MAX_GRAMMAR_BYTES {
        return Err(format!("at most {MAX_GRAMMAR_BYTES} bytes are allowed, got {}", grammar.len()));
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
                    return Err(format!("parentheses nested deeper than {MAX_NESTING}"));
                }
                i += 1;
            }
            b')' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'{' => {
                let (next, bounds) = repetition(b, i + 1);
                i = next;
                let Some((min, max)) = bounds else { continue };
                if let Some(max) = max {
                    if max < min {
                        return Err(format!("repetition {{{min},{max}}}: the maximum is below the minimum"));
                    }
                }
                let largest = max.unwrap_or(min);
                if largest > MAX_REPEAT {
                    return Err(format!("repetition bounds above {MAX_REPEAT} are not allowed, got {largest}"));
                }
                total += largest + 1;
                if total > MAX_REPEAT_TOTAL {
                    return Err(format!("repetitions expand to more than {MAX_REPEAT_TOTAL} copies in all"));
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

/// Parses `m}`, `m,}` or `m,n}` after a `{`. Returns the index after it and
/// `(min, max)`; `None` bounds when it is not that shape (llama.cpp's parser
/// will report it).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_grammars_pass() {
        for g in [
            r#"root ::= "yes" | "no""#,
            r#"root ::= [a-z]{2,5} ("-" [0-9]{3})?"#,
            r#"root ::= "{" [^}]* "}"  # braces inside literals and classes are not repetitions"#,
            r#"root ::= "a{99999,1}" [{}] "\"{5,1}""#,
            r#"root ::= x{0,} x{3} x{1000}
x ::= "x""#,
        ] {
            assert_eq!(check_gbnf(g), Ok(()), "{g}");
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
        ] {
            let err = check_gbnf(g).unwrap_err();
            assert!(err.contains(why), "{g:.60}: {err}");
        }
    }

    #[test]
    fn malformed_repetitions_are_left_to_the_parser() {
        for g in ["root ::= \"a\"{", "root ::= \"a\"{,3}", "root ::= \"a\"{x}", "root ::= \"a\"{3", "root ::= \"unterminated"] {
            assert_eq!(check_gbnf(g), Ok(()), "{g}");
        }
    }
}
