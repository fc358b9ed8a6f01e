//! Rendering chat messages into a prompt with the model's own Jinja chat
//! template (the GGUF's `tokenizer.chat_template`, or `chatTemplate` given
//! at load).
//!
//! Rendering follows Hugging Face transformers, which is what template
//! authors test against: `trim_blocks` and `lstrip_blocks` on, loop controls,
//! Python's string and dict methods (minijinja-contrib's pycompat), and in the
//! context `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and
//! the functions `raise_exception` and `strftime_now`.
//!
//! A template is code that comes with a model file; it is bounded like any
//! other input: its source size, an instruction budget (fuel) per render,
//! minijinja's recursion and range limits, and the size of what it writes.

use std::fmt;
use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde_json::{Map, Value as Json};

use super::messages::ChatMessage;
use crate::error::{EngineError, Result};

/// Largest template source accepted (real ones are under 20 KB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// Instructions one render may execute. A typical template spends a few
/// hundred per message; this allows conversations of thousands of messages
/// and stops a runaway loop within about a tenth of a second.
pub const TEMPLATE_FUEL: u64 = 2_000_000;
/// Most bytes a render may write: the prompt size limit of a request.
pub const MAX_RENDERED_BYTES: usize = 8 * 1024 * 1024;

const TEMPLATE_NAME: &str = "chat_template";
/// A compiled chat template with the model's special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish_non_exhaustive()
    }
}

/// Why a template cannot be used at all (it does not compile, or is too large).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The error `raise_exception(message)` raises; recognised to report the
/// template's own message.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source`. Fails when it is too large or is not valid Jinja.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> std::result::Result<Self, TemplateError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(TemplateError(format!("is {} bytes; at most {MAX_TEMPLATE_BYTES} are allowed", source.len())));
        }
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
        });
        env.add_function("strftime_now", |format: String| -> std::result::Result<Value, JinjaError> {
            let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            #[cfg(test)]
            let secs = tests::FROZEN_NOW.with(|f| f.get()).unwrap_or(secs);
            Ok(Value::from(strftime(&format, secs)))
        });
        env.add_filter("tojson", tojson);
        // `string` as Python's str(): a dict or list as its repr.
        env.add_filter("string", |value: Value| -> Value {
            use minijinja::value::ValueKind;
            match value.kind() {
                ValueKind::Map | ValueKind::Seq | ValueKind::Bool | ValueKind::None => match serde_json::to_value(&value) {
                    Ok(json) => {
                        let mut text = String::new();
                        python_repr(&json, &mut text);
                        Value::from(text)
                    }
                    Err(_) => Value::from(value.to_string()),
                },
                ValueKind::String => value,
                _ => Value::from(value.to_string()),
            }
        });
        // Values print as Python prints them: a dict or list as its repr
        // (`{'type': 'function'}`), booleans as True / False, none as None.
        env.set_formatter(|out, state, value| {
            use minijinja::value::ValueKind;
            match value.kind() {
                ValueKind::Map | ValueKind::Seq | ValueKind::Bool | ValueKind::None => match serde_json::to_value(value) {
                    Ok(json) => {
                        let mut text = String::new();
                        python_repr(&json, &mut text);
                        out.write_str(&text).map_err(|_| JinjaError::new(ErrorKind::WriteFailure, "write failed"))
                    }
                    Err(_) => minijinja::escape_formatter(out, state, value),
                },
                _ => minijinja::escape_formatter(out, state, value),
            }
        });
        // JSON text to a value (DeepSeek V3.2 / V4 read string arguments so).
        env.add_filter("from_json", |text: String| -> std::result::Result<Value, JinjaError> {
            serde_json::from_str::<Json>(&text)
                .map(|v| Value::from_serialize(&v))
                .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("from_json: {e}")))
        });
        // As in Python: none is not iterable (minijinja would iterate it as
        // empty, and templates test `tools is iterable` before `tools | length`).
        env.add_test("iterable", |v: Value| {
            use minijinja::value::ValueKind;
            matches!(v.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::String | ValueKind::Iterable | ValueKind::Plain)
                && v.try_iter().is_ok()
        });
        env.add_template_owned(TEMPLATE_NAME, generation_blocks(&python_line_continuations(source)))
            .map_err(|e| TemplateError(describe(&e)))?;
        Ok(ChatTemplate { env, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    /// Renders `messages`. Errors are `INVALID_REQUEST` naming `field`: the
    /// template's own message when it raises, or what went wrong.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool, field: &str) -> Result<String> {
        let messages: Vec<Json> = messages.iter().map(ChatMessage::to_json).collect();
        self.render_json(&messages, &Render { add_generation_prompt, ..Render::default() }, field)
    }

    /// Renders messages already in the template's JSON shape, with the
    /// tools and extra variables of `r`, as Hugging Face transformers passes
    /// them: `tools` is the request's list as given (none without tools),
    /// `chat_template_kwargs` are set last, so they may override the special
    /// tokens (as in transformers) but not what the engine sets.
    pub fn render_json(&self, messages: &[Json], r: &Render, field: &str) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| EngineError::internal(describe(&e)))?;
        let mut ctx = Map::new();
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        for (k, v) in &r.kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        // llama.cpp's extra variable `datetime`, and firefunction-v2's
        // `functions` (its tools' function objects; empty text without
        // tools, as llama.cpp passes it), unless the request set them.
        if !ctx.contains_key("datetime") {
            let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            #[cfg(test)]
            let secs = tests::FROZEN_NOW.with(|f| f.get()).unwrap_or(secs);
            ctx.insert("datetime".into(), Json::String(strftime("%b %d %Y", secs)));
        }
        if !ctx.contains_key("functions") {
            let mut text = String::new();
            if let Some(tools) = &r.tools {
                let functions = Json::Array(tools.iter().map(|t| t.get("function").unwrap_or(t).clone()).collect());
                python_json(&functions, Some(2), false, 0, &mut text);
            }
            ctx.insert("functions".into(), Json::String(text));
        }
        ctx.insert("messages".into(), Json::Array(messages.to_vec()));
        ctx.insert("add_generation_prompt".into(), Json::Bool(r.add_generation_prompt));
        ctx.insert("tools".into(), r.tools.clone().map_or(Json::Null, Json::Array));
        let mut out = Limited { buf: Vec::new(), limit: MAX_RENDERED_BYTES, exceeded: false };
        match template.render_captured_to(Value::from_serialize(&ctx), &mut out) {
            Ok(_) => String::from_utf8(out.buf).map_err(|_| EngineError::invalid(field, "the chat template wrote invalid UTF-8")),
            Err(_) if out.exceeded => {
                Err(EngineError::invalid(field, format!("the chat template wrote more than {MAX_RENDERED_BYTES} bytes; it was stopped")))
            }
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(EngineError::invalid(
                field,
                format!("the chat template ran for more than {TEMPLATE_FUEL} steps (an endless loop?); it was stopped"),
            )),
            Err(e) => match raised(&e) {
                Some(message) => Err(EngineError::invalid(field, format!("the chat template rejected them: {message}"))),
                None => Err(EngineError::invalid(field, format!("the chat template failed: {}", describe(&e)))),
            },
        }
    }
}

/// What a render adds to the messages.
#[derive(Debug, Clone, Default)]
pub struct Render {
    pub add_generation_prompt: bool,
    /// The tools, as the request gave them.
    pub tools: Option<Vec<Json>>,
    /// `chat_template_kwargs`.
    pub kwargs: Map<String, Json>,
}

/// Python's `json.dumps(value, ensure_ascii=False)`, which is what
/// transformers' `tojson` filter is: `", "` and `": "` between items,
/// `indent=N` for one item per line, keys in their order, no HTML escaping
/// (minijinja's own `tojson` is compact and escapes `<>&'`, so prompts would
/// differ from what the model was trained on).
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    python_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn python_json(v: &Json, indent: Option<usize>, sort_keys: bool, level: usize, out: &mut String) {
    let (item_sep, newline) = match indent {
        Some(n) => (",", Some(n)),
        None => (", ", None),
    };
    let open_line = |out: &mut String, level: usize| {
        if let Some(n) = newline {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                open_line(out, level + 1);
                python_json(item, indent, sort_keys, level + 1, out);
            }
            open_line(out, level);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                open_line(out, level + 1);
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(": ");
                python_json(item, indent, sort_keys, level + 1, out);
            }
            open_line(out, level);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Python's `repr` of a JSON value (`str()` of a dict or list).
fn python_repr(v: &Json, out: &mut String) {
    match v {
        Json::Null => out.push_str("None"),
        Json::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 1e16 => out.push_str(&format!("{f:.1}")),
            (_, _, Some(f)) => out.push_str(&f.to_string()),
            _ => out.push_str(&n.to_string()),
        },
        Json::String(s) => {
            // Single quotes unless the text has one and no double quote.
            let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
            out.push(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push(quote);
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(item, out);
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&Json::String(k.clone()), out);
                out.push_str(": ");
                python_repr(item, out);
            }
            out.push('}');
        }
    }
}

/// `{% generation %}…{% endgeneration %}` (transformers' tag marking the
/// assistant's own text for training masks; LFM2.5 and poolside's Laguna
/// templates use it) renders its body: the tag becomes an `if true` block,
/// whitespace control kept.
fn generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let body = inner.trim_start_matches(['-', '+']).trim_end_matches(['-', '+']).trim();
        let replacement = match body {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(word) => {
                let lead = &inner[..inner.len() - inner.trim_start_matches(['-', '+']).len()];
                let trail = &inner[inner.trim_end_matches(['-', '+']).len()..];
                out.push_str(&format!("{{%{lead} {word} {trail}%}}"));
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Removes backslash-newline pairs inside the string literals of Jinja tags,
/// as Python's Jinja does (a line continuation) and minijinja does not (it
/// keeps both characters). Mistral's templates write their long default
/// system prompts that way. Text outside tags is left as it is.
fn python_line_continuations(source: &str) -> String {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Text,
        Tag,
        Comment,
        Str(u8),
    }
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut state = State::Text;
    let mut i = 0;
    while i < b.len() {
        let next = b.get(i + 1).copied();
        match state {
            State::Text if b[i] == b'{' && matches!(next, Some(b'{') | Some(b'%')) => state = State::Tag,
            State::Text if b[i] == b'{' && next == Some(b'#') => state = State::Comment,
            State::Comment if b[i] == b'#' && next == Some(b'}') => state = State::Text,
            State::Tag if matches!(b[i], b'}' | b'%') && next == Some(b'}') => state = State::Text,
            State::Tag if matches!(b[i], b'"' | b'\'') => state = State::Str(b[i]),
            State::Str(q) if b[i] == q => state = State::Tag,
            State::Str(_) if b[i] == b'\\' => {
                let skip = match (next, b.get(i + 2)) {
                    (Some(b'\n'), _) => 2,
                    (Some(b'\r'), Some(b'\n')) => 3,
                    _ => 0,
                };
                if skip > 0 {
                    i += skip;
                    continue;
                }
                // Another escape: copy both characters, so an escaped quote
                // does not end the string.
                out.push(b[i]);
                if let Some(n) = next {
                    out.push(n);
                }
                i += 2;
                continue;
            }
            _ => {}
        }
        out.push(b[i]);
        i += 1;
    }
    // Only ASCII bytes were removed, so the rest is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| source.to_owned())
}

/// The message of a `raise_exception` anywhere in the error's chain.
fn raised(e: &JinjaError) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        source = s.source();
    }
    None
}

/// One line: what went wrong and where in the template.
fn describe(e: &JinjaError) -> String {
    let mut text = e.kind().to_string();
    if let Some(detail) = e.detail() {
        text.push_str(": ");
        text.push_str(detail);
    }
    if let Some(line) = e.line() {
        text.push_str(&format!(" (line {line})"));
    }
    text
}

/// A writer that refuses to grow past `limit` bytes.
struct Limited {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl Write for Limited {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Python's `strftime` for the directives chat templates use (dates in the
/// system prompt, as Llama 3's `strftime_now("%d %b %Y")`), in UTC.
/// Unknown directives are copied as they are.
fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01
/// (Howard Hinnant's days-to-civil algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::chat::messages::parse_messages;
    use serde_json::json;

    thread_local! {
        /// `strftime_now`'s clock in tests that compare with golden renders.
        pub(in crate::chat) static FROZEN_NOW: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    }

    /// The agent conversation (system, tools, reasoning in history, calls
    /// with object and with string arguments, tool results, the generation
    /// prompt) over every template of llama.cpp's set
    /// (`goldens/AGENT.json`, made by `scripts/render-goldens.py`): the
    /// same text as Python's Jinja2, or an error where it raised.
    #[test]
    fn renders_agent_conversations() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/chat-templates");
        let index: Json = serde_json::from_str(&std::fs::read_to_string(dir.join("goldens/AGENT.json")).unwrap()).unwrap();
        FROZEN_NOW.with(|f| f.set(Some(1_736_942_400)));
        let tools = index["tools"].as_array().unwrap().clone();
        let with_args = |kind: &str| -> Vec<Json> {
            let mut messages = index["messages"].as_array().unwrap().clone();
            for m in &mut messages {
                if let Some(calls) = m.get_mut("tool_calls").and_then(Json::as_array_mut) {
                    for c in calls {
                        let a = c["function"]["arguments"].clone();
                        let a = match a {
                            Json::String(t) => serde_json::from_str(&t).unwrap(),
                            v => v,
                        };
                        c["function"]["arguments"] = if kind == "object" { a } else { Json::String(crate::chat::format::python_json(&a)) };
                    }
                }
            }
            messages
        };
        let (mut same, mut raised, mut wrong) = (0, 0, Vec::new());
        let results = index["results"].as_object().unwrap();
        for (name, r) in results {
            let source = std::fs::read_to_string(dir.join(name)).unwrap();
            let t = ChatTemplate::new(&source, "<s>", "</s>").unwrap_or_else(|e| panic!("{name}: {e:?}"));
            for kind in ["object", "string"] {
                let mut kwargs = Map::new();
                kwargs.insert("enable_thinking".into(), Json::Bool(true));
                let render = Render { add_generation_prompt: true, tools: Some(tools.clone()), kwargs };
                let out = t.render_json(&with_args(kind), &render, "messages");
                let golden = &r[kind];
                if golden["ok"] == true {
                    match out {
                        Ok(text) if text == golden["text"].as_str().unwrap() => same += 1,
                        Ok(text) => {
                            let g = golden["text"].as_str().unwrap();
                            let at = text.bytes().zip(g.bytes()).take_while(|(a, b)| a == b).count();
                            wrong.push(format!(
                                "{name}/{kind}: differs at byte {at}: ours {:?} / jinja2 {:?}",
                                &text[at.saturating_sub(20).min(text.len())..(at + 40).min(text.len())],
                                &g[at.saturating_sub(20).min(g.len())..(at + 40).min(g.len())]
                            ));
                        }
                        Err(e) => wrong.push(format!("{name}/{kind}: we fail: {}", e.message)),
                    }
                } else if out.is_err() {
                    raised += 1;
                } else {
                    wrong.push(format!("{name}/{kind}: renders, but Jinja2 raised {}", golden["error"]));
                }
            }
        }
        FROZEN_NOW.with(|f| f.set(None));
        eprintln!("agent conversations: {same} identical, {raised} refused by both, {} differ", wrong.len());
        // Known, with their reasons (docs/tools.md): Kimi K2's templates
        // append to lists (`list.append`; values are immutable here, and
        // transformers' own sandbox refuses it too); functionary v3.1
        // concatenates `tojson` text to a `|safe` string, which Python's
        // Markup HTML-escapes (`&#34;`: not what the model was trained on);
        // llama.cpp's own R1 template passes a generator to `tojson`, which
        // only Python cannot print.
        let known = [
            "Kimi-K2-Instruct.jinja/",
            "Kimi-K2-Thinking.jinja/",
            "meetkai-functionary-medium-v3.1.jinja/",
            "llama-cpp-deepseek-r1.jinja/",
        ];
        let unknown: Vec<&String> = wrong.iter().filter(|w| !known.iter().any(|k| w.starts_with(k))).collect();
        assert!(unknown.is_empty(), "{}", unknown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"));
        assert!(same >= 111, "{same} identical");
    }

    /// Every template and case rendered by Python's Jinja2 as transformers
    /// 5.23 configures it (`__test__/fixtures/chat-templates/goldens`):
    /// the same text, or an error where Jinja2 raised. Tools as given,
    /// `tojson` as Python's `json.dumps`, `null` message keys dropped.
    #[test]
    fn renders_as_transformers_does() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/chat-templates");
        let index: Json = serde_json::from_str(&std::fs::read_to_string(dir.join("goldens/INDEX.json")).unwrap()).unwrap();
        // 2025-01-15 12:00 UTC, as the goldens were rendered.
        FROZEN_NOW.with(|f| f.set(Some(1_736_942_400)));
        let (mut same, mut raised) = (0, 0);
        for r in index["results"].as_array().unwrap() {
            let name = r["template"].as_str().unwrap();
            // Python-Jinja2-only failure (a generator passed to tojson).
            if name == "llama-cpp-deepseek-r1.jinja" && r["ok"] == false {
                continue;
            }
            let source = std::fs::read_to_string(dir.join(name)).unwrap();
            let bos_eos = &index["bos_eos"][name];
            let t = ChatTemplate::new(&source, bos_eos[0].as_str().unwrap(), bos_eos[1].as_str().unwrap()).unwrap();
            let case = &index["cases"][r["case"].as_str().unwrap()];
            let keep_null = case["extra_kwargs"].get("_keep_null") == Some(&json!(true));
            let messages: Vec<Json> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    let m = m.as_object().unwrap();
                    Json::Object(m.iter().filter(|(_, v)| keep_null || !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect())
                })
                .collect();
            let mut kwargs = case["extra_kwargs"].as_object().unwrap().clone();
            kwargs.remove("_keep_null");
            let render = Render {
                add_generation_prompt: true,
                tools: (case["tools"] == true).then(|| index["tools"].as_array().unwrap().clone()),
                kwargs,
            };
            let out = t.render_json(&messages, &render, "messages");
            if r["ok"] == true {
                let golden = std::fs::read_to_string(dir.join("goldens").join(r["file"].as_str().unwrap())).unwrap();
                assert_eq!(out.as_deref().map_err(|e| e.message.clone()), Ok(golden.as_str()), "{name} / {}", r["case"]);
                same += 1;
            } else if r["error"].as_str().unwrap_or("").starts_with("TemplateError") {
                // The template's own raise_exception: the same refusal.
                assert!(out.is_err(), "{name} / {} renders, but the template raised: {}", r["case"], r["error"]);
                raised += 1;
            }
            // (Where Python's Jinja2 fails on a type — iterating none, a key
            // missing from a message — minijinja may render; the engine
            // prepares messages so that templates get what they read.)
        }
        FROZEN_NOW.with(|f| f.set(None));
        assert!(same >= 90 && raised >= 3, "{same} same, {raised} raised");
    }

    /// SmolLM2-135M-Instruct's template, as its GGUF stores it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn msgs(v: Json) -> Vec<ChatMessage> {
        parse_messages(&v, "messages").unwrap()
    }

    fn smol() -> ChatTemplate {
        ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap()
    }

    #[test]
    fn smollm2_inserts_its_default_system_turn_only_without_a_system_message() {
        let t = smol();
        let out = t.render(&msgs(json!([{ "role": "user", "content": "Hi" }])), true, "messages").unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t
            .render(&msgs(json!([{ "role": "system", "content": "Be brief." }, { "role": "user", "content": "Hi" }])), false, "messages")
            .unwrap();
        assert_eq!(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn templates_that_raise_loop_or_flood_are_errors() {
        let raise = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('roles must start with user') }}{% endif %}ok",
            "",
            "",
        )
        .unwrap();
        let e = raise.render(&msgs(json!([{ "role": "system", "content": "x" }])), true, "messages").unwrap_err();
        assert_eq!(e.message, "messages: the chat template rejected them: roles must start with user");
        assert_eq!(raise.render(&msgs(json!([{ "role": "user", "content": "x" }])), true, "messages").unwrap(), "ok");

        let endless =
            ChatTemplate::new("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "", "").unwrap();
        let e = endless.render(&msgs(json!([{ "role": "user", "content": "x" }])), true, "messages").unwrap_err();
        assert!(e.message.contains("ran for more than"), "{}", e.message);

        let flood = ChatTemplate::new("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}", "", "").unwrap();
        let e = flood.render(&msgs(json!([{ "role": "user", "content": "x" }])), true, "messages").unwrap_err();
        assert!(e.message.contains("wrote more than"), "{}", e.message);

        let broken = ChatTemplate::new("{{ messages[0].content | no_such_filter }}", "", "");
        assert!(broken.is_err() || broken.unwrap().render(&msgs(json!([{ "role": "user", "content": "x" }])), true, "m").is_err());
        let e = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(e.0.contains("syntax error"), "{e}");
        assert!(ChatTemplate::new(&"x".repeat(MAX_TEMPLATE_BYTES + 1), "", "").is_err());
    }

    #[test]
    fn python_methods_loop_controls_and_the_context() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}[{{ m['role'].upper() }}:{{ m.content.strip() }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let m = msgs(
            json!([{ "role": "user", "content": "  hi  " }, { "role": "tool", "content": "no" }, { "role": "assistant", "content": "yo" }]),
        );
        assert_eq!(t.render(&m, true, "messages").unwrap(), "<s>[USER:hi][ASSISTANT:yo]></s>");
        assert_eq!(t.render(&m, false, "messages").unwrap(), "<s>[USER:hi][ASSISTANT:yo]</s>");
        // trim_blocks / lstrip_blocks, as transformers renders.
        let t = ChatTemplate::new("{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}", "", "")
            .unwrap();
        assert_eq!(t.render(&msgs(json!([{ "role": "user", "content": "a" }])), true, "messages").unwrap(), "a\n");
    }

    #[test]
    fn backslash_newline_in_a_string_is_a_line_continuation() {
        let t = ChatTemplate::new("{% set s = \"one \\\ntwo \\\\ \\\"q\\\" \\n\" %}{{ s }}|a\\\nb", "", "").unwrap();
        assert_eq!(t.render(&msgs(json!([{ "role": "user", "content": "x" }])), true, "m").unwrap(), "one two \\ \"q\" \n|a\\\nb");
        assert_eq!(python_line_continuations("{{ 'a\\\r\nb' }}"), "{{ 'ab' }}");
        assert_eq!(python_line_continuations("{# 'x\\\n #}{{ \"é\\\n\" }}"), "{# 'x\\\n #}{{ \"é\" }}");
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-07-26 12:34:56 UTC, a Friday.
        let t = 1_721_997_296;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(strftime("%A %B %e, %y %H:%M:%S %% %Q", t), "Friday July 26, 24 12:34:56 % %Q");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn firefunction_renders_without_tools_and_with_them() {
        // Its template adds `functions` and `datetime` to its system prompt,
        // both llama.cpp's variables: empty text without tools.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/chat-templates");
        let source = std::fs::read_to_string(dir.join("fireworks-ai-llama-3-firefunction-v2.jinja")).unwrap();
        let t = ChatTemplate::new(&source, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        FROZEN_NOW.with(|f| f.set(Some(1_721_997_296)));
        let messages = [json!({ "role": "user", "content": "What is today?" })];
        let plain = t.render_json(&messages, &Render { add_generation_prompt: true, ..Render::default() }, "messages").unwrap();
        assert!(plain.contains("Available functions as JSON spec:\n\nToday is Jul 26 2024."), "{plain}");
        let tool = json!({ "type": "function", "function": { "name": "f", "parameters": { "type": "object" } } });
        let render = Render { add_generation_prompt: true, tools: Some(vec![tool]), ..Render::default() };
        let with = t.render_json(&messages, &render, "messages").unwrap();
        FROZEN_NOW.with(|f| f.set(None));
        assert!(with.contains("\"name\": \"f\"") && with.contains("Today is Jul 26 2024."), "{with}");
    }
}
