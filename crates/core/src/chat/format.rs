//! How a model writes tool calls and reasoning, learned from its chat
//! template, and what follows from it: the messages as the template wants
//! them, the generic preamble for templates that ignore tools, and the
//! constraint (a Lark grammar for llguidance) that makes every call the
//! model starts a valid call.
//!
//! Detection renders the template with probe conversations that differ in
//! one thing and reads the difference, as llama.cpp's autoparser does: a
//! conversation whose assistant turn is empty against the same turn with a
//! call of a probe function shows how a call is written (the marker before
//! it, the JSON object with the name and argument keys, the marker after
//! it); one call against two shows whether each call has its own markers or
//! the calls form one JSON array; a call with object arguments against one
//! with a JSON string shows which form the template reads. A template that
//! does not show the tools at all gets the generic format: a system
//! preamble that lists them and asks for `<tool_call>{...}</tool_call>`.

use serde_json::{json, Map, Value};

use super::template::{ChatTemplate, Render};
use super::tools::{call_schema, nullable_to_any_of, ChatOptions, ResponseFormat, Tool, ToolChoice};
use crate::sampling::budget::BudgetPlan;
use crate::sampling::constraint::{json_layout, Grammar};

/// What the output parser (`output.rs`) looks for.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputFormat {
    /// The call syntax, when calls are parsed.
    pub calls: Option<ToolSyntax>,
    /// The reasoning markers, when reasoning is separated.
    pub reasoning: Option<ReasoningMarkers>,
    pub reasoning_start: ReasoningStart,
}

/// An answer as a parser read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning: String,
    /// (id, name, arguments as JSON text)
    pub calls: Vec<(String, String, String)>,
}

/// Reads an answer: `partial` when more text may follow.
pub type ParseFn = dyn Fn(&str, bool) -> Result<ParsedMessage, String> + Send + Sync;

/// A parser shared by the requests of one chat format.
#[derive(Clone)]
pub struct SharedParser(pub std::sync::Arc<ParseFn>);

impl std::fmt::Debug for SharedParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedParser")
    }
}

impl PartialEq for SharedParser {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What preparing a request decided for its generation: how its output is
/// read, what constrains it (and which request field that comes from, for
/// errors), and which special tokens are markers to keep in the text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatPlan {
    pub output: Option<OutputFormat>,
    /// A parser that reads the whole answer (llama.cpp's, for the families
    /// whose syntax is not one of ours): used instead of `output`.
    pub reader: Option<SharedParser>,
    pub grammar: Option<(Grammar, &'static str)>,
    pub marker_tokens: Vec<i32>,
    /// `reasoning_budget` with the markers of the family's thinking.
    pub reasoning_budget: Option<BudgetPlan>,
}

/// The constraint of a JSON answer: `schema` with the engine's layout.
pub fn json_answer(schema: &Value) -> Grammar {
    let mut schema = schema.clone();
    nullable_to_any_of(&mut schema);
    match schema.as_object_mut() {
        Some(o) => {
            o.insert("x-guidance".into(), json_layout());
        }
        // `true`/`false` schemas: any JSON value, or nothing.
        None => schema = json!({ "x-guidance": json_layout(), "anyOf": [schema] }),
    }
    Grammar::JsonSchema(schema)
}

const PROBE_FN: &str = "FFF_FIRST_FUN_F";
const PROBE_FN2: &str = "SSS_SECOND_FUN_S";
const PROBE_ARG: &str = "AA_ARG_FST_AA";
const PROBE_VALUE: &str = "XXXX";
const PROBE_ID: &str = "call00001";
const PROBE_ID2: &str = "call00002";

/// The families the engine knows by name (the syntax itself is learned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `<tool_call>{"name", "arguments"}</tool_call>` per call: Hermes 2/3,
    /// Qwen 2.5, Qwen 3, QwQ.
    Hermes,
    /// A bare `{"name", "parameters"}` object: Llama 3.1–3.3.
    Llama3,
    /// `[TOOL_CALLS][{"name", "arguments", "id"}, …]`: Mistral Nemo, Mistral Small 3.1.
    Mistral,
    /// The template shows no tools: the preamble, and the Hermes syntax.
    Generic,
    /// Learned from the template, none of the above.
    Learned,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Hermes => "hermes",
            Family::Llama3 => "llama3",
            Family::Mistral => "mistral",
            Family::Generic => "generic",
            Family::Learned => "learned",
        }
    }

    /// The names the `toolCallFormat` load option takes, besides "auto".
    pub const FORCED: [Family; 4] = [Family::Hermes, Family::Llama3, Family::Mistral, Family::Generic];

    pub fn parse(name: &str) -> Option<Family> {
        Self::FORCED.into_iter().find(|f| f.as_str() == name)
    }
}

/// How one model writes tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSyntax {
    pub family: Family,
    /// Whether the template shows the request's `tools` to the model.
    pub template_shows_tools: bool,
    /// The marker before a call (per call) or before the array of calls;
    /// empty for a bare JSON object.
    pub open: String,
    /// Between `open` and the JSON, and between the JSON and `close`.
    pub gap_before: String,
    pub gap_after: String,
    /// The marker after a call (or the array).
    pub close: String,
    /// Another marker a bare call may start with (Llama 3's `<|python_tag|>`).
    pub alt_open: Option<String>,
    /// Between two calls that each have their markers.
    pub between: String,
    pub name_key: String,
    pub args_key: String,
    /// A key for a call id the model writes (Mistral: 9 characters).
    pub id_key: Option<String>,
    /// The calls are one JSON array after `open`.
    pub array: bool,
    /// Most calls in one turn the template can show (1 for Llama 3).
    pub max_calls: usize,
    /// The template reads arguments as an object (else as a JSON string).
    pub object_arguments: bool,
}

impl ToolSyntax {
    fn hermes(family: Family) -> ToolSyntax {
        ToolSyntax {
            family,
            template_shows_tools: family != Family::Generic,
            open: "<tool_call>".into(),
            gap_before: "\n".into(),
            gap_after: "\n".into(),
            close: "</tool_call>".into(),
            alt_open: None,
            between: "\n".into(),
            name_key: "name".into(),
            args_key: "arguments".into(),
            id_key: None,
            array: false,
            max_calls: usize::MAX,
            object_arguments: true,
        }
    }

    /// The syntax of a named family, for templates detection cannot read.
    pub fn of_family(family: Family) -> ToolSyntax {
        match family {
            Family::Llama3 => ToolSyntax {
                open: String::new(),
                gap_before: String::new(),
                gap_after: String::new(),
                close: String::new(),
                alt_open: Some("<|python_tag|>".into()),
                between: String::new(),
                args_key: "parameters".into(),
                max_calls: 1,
                ..ToolSyntax::hermes(Family::Llama3)
            },
            Family::Mistral => ToolSyntax {
                open: "[TOOL_CALLS]".into(),
                gap_before: String::new(),
                gap_after: String::new(),
                close: String::new(),
                between: String::new(),
                id_key: Some("id".into()),
                array: true,
                ..ToolSyntax::hermes(Family::Mistral)
            },
            f => ToolSyntax::hermes(f),
        }
    }

    /// Whether the engine adds the generic preamble (the template does not
    /// show the tools itself).
    pub fn needs_preamble(&self) -> bool {
        !self.template_shows_tools
    }

    /// One call as the model writes it (for the preamble's example and for
    /// earlier turns in the generic format).
    pub fn write_call(&self, name: &str, arguments: &Value, id: Option<&str>) -> String {
        let mut call = Map::new();
        call.insert(self.name_key.clone(), Value::String(name.into()));
        call.insert(self.args_key.clone(), arguments.clone());
        if let (Some(k), Some(id)) = (&self.id_key, id) {
            call.insert(k.clone(), Value::String(id.into()));
        }
        let body = python_json(&Value::Object(call));
        let body = if self.array { format!("[{body}]") } else { body };
        format!("{}{}{}{}{}", self.open, self.gap_before, body, self.gap_after, self.close)
    }
}

/// How a model's reasoning is marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningMarkers {
    pub start: String,
    pub end: String,
}

/// What the engine knows of a template's output formats.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatFormat {
    pub tools: ToolSyntax,
    /// `<think>`/`</think>` when the template knows them.
    pub reasoning: Option<ReasoningMarkers>,
}

impl ChatFormat {
    /// Detects the formats of `template` (see the module comment); `forced`
    /// replaces the detected tool syntax with a named family's.
    pub fn detect(template: &ChatTemplate, source: &str, forced: Option<Family>) -> ChatFormat {
        let shows_tools = shows_tools(template);
        let learned = if shows_tools { learn_syntax(template) } else { None };
        let mut tools = match (forced, learned) {
            (Some(f), _) => ToolSyntax::of_family(f),
            (None, Some(s)) => s,
            (None, None) => ToolSyntax::of_family(Family::Generic),
        };
        tools.template_shows_tools = shows_tools && tools.family != Family::Generic;
        let reasoning = (source.contains("<think>") || source.contains("</think>"))
            .then(|| ReasoningMarkers { start: "<think>".into(), end: "</think>".into() });
        ChatFormat { tools, reasoning }
    }
}

fn probe_tool(name: &str) -> Value {
    json!({ "type": "function", "function": { "name": name, "description": "A probe.", "parameters": {
        "type": "object", "properties": { PROBE_ARG: { "type": "string" } }, "required": [] } } })
}

fn probe_call(name: &str, id: &str, object: bool) -> Value {
    let args = json!({ PROBE_ARG: PROBE_VALUE });
    let args = if object { args } else { Value::String(python_json(&args)) };
    json!({ "id": id, "type": "function", "function": { "name": name, "arguments": args } })
}

fn user() -> Value {
    json!({ "role": "user", "content": "U_USER_MSG Hello END_U" })
}

fn render(template: &ChatTemplate, messages: &[Value], tools: bool, agp: bool) -> Option<String> {
    let r =
        Render { add_generation_prompt: agp, tools: tools.then(|| vec![probe_tool(PROBE_FN), probe_tool(PROBE_FN2)]), ..Render::default() };
    template.render_json(messages, &r, "probe").ok()
}

fn shows_tools(template: &ChatTemplate) -> bool {
    render(template, &[user()], true, true).is_some_and(|s| s.contains(PROBE_FN))
}

/// What differs between `a` and `b`: `b` without their common prefix and
/// suffix, widened so that it never cuts a `<…>` or `[…]` marker in half
/// (`<|im_end|>` and `<tool_call>` share their first byte).
fn difference<'b>(a: &str, b: &'b str) -> &'b str {
    let prefix = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let (a_rest, b_rest) = (&a.as_bytes()[prefix..], &b.as_bytes()[prefix..]);
    let suffix = a_rest.iter().rev().zip(b_rest.iter().rev()).take_while(|(x, y)| x == y).count();
    let (mut start, mut end) = (prefix, b.len() - suffix);
    while !b.is_char_boundary(start) {
        start -= 1;
    }
    while end < b.len() && !b.is_char_boundary(end) {
        end += 1;
    }
    for (open, close) in [('<', '>'), ('[', ']')] {
        if let Some(i) = b[..start].rfind(open) {
            if !b[i..start].contains(close) {
                start = i;
            }
        }
    }
    for (open, close) in [('<', '>'), ('[', ']')] {
        if let Some(i) = b[start..end].rfind(open) {
            if !b[start + i..end].contains(close) {
                end = start + i;
            }
        }
    }
    &b[start..end.max(start)]
}

/// The first JSON value in `text` (starting at a `{` or `[`) that holds the
/// probe function's name: its start, its end and the value.
fn find_json(text: &str) -> Option<(usize, usize, Value)> {
    for (i, c) in text.char_indices() {
        if c != '{' && c != '[' {
            continue;
        }
        let mut stream = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
        if let Some(Ok(v)) = stream.next() {
            if v.to_string().contains(PROBE_FN) {
                return Some((i, i + stream.byte_offset(), v));
            }
        }
    }
    None
}

/// Learns the call syntax from renders of probe calls (see the module comment).
fn learn_syntax(template: &ChatTemplate) -> Option<ToolSyntax> {
    let empty = json!({ "role": "assistant", "content": "" });
    let with = |calls: Vec<Value>| json!({ "role": "assistant", "content": "", "tool_calls": calls });
    let base = render(template, &[user(), empty], true, false)?;
    let (one, object_arguments) = match render(template, &[user(), with(vec![probe_call(PROBE_FN, PROBE_ID, true)])], true, false) {
        Some(r) if r.contains(&format!("\"{PROBE_ARG}\"")) => (r, true),
        _ => (render(template, &[user(), with(vec![probe_call(PROBE_FN, PROBE_ID, false)])], true, false)?, false),
    };
    let call_text = difference(&base, &one);
    let (start, end, value) = find_json(call_text)?;
    let array = value.is_array();
    let call = if array { value.as_array()?.first()?.clone() } else { value };
    let obj = call.as_object()?;
    let name_key = obj.iter().find(|(_, v)| v.as_str() == Some(PROBE_FN))?.0.clone();
    let args_key = obj.iter().find(|(k, v)| *k != &name_key && v.to_string().contains(PROBE_ARG))?.0.clone();
    let id_key = obj.iter().find(|(_, v)| v.as_str() == Some(PROBE_ID)).map(|(k, _)| k.clone());
    let before = &call_text[..start];
    let after = &call_text[end..];
    let open = before.trim().to_string();
    let gap_before = before.trim_start().strip_prefix(open.as_str()).unwrap_or("").to_string();
    let close = after.trim().to_string();
    let gap_after = after.strip_suffix(after.trim_start()).unwrap_or("").to_string();
    // Two calls: each with its own markers, or one array.
    let two = render(
        template,
        &[user(), with(vec![probe_call(PROBE_FN, PROBE_ID, object_arguments), probe_call(PROBE_FN2, PROBE_ID2, object_arguments)])],
        true,
        false,
    );
    let (max_calls, between) = match two.as_deref().map(|t| difference(&base, t)) {
        Some(t) if t.contains(PROBE_FN2) => {
            let between = if !open.is_empty() && t.matches(open.as_str()).count() >= 2 {
                let second = t.match_indices(open.as_str()).nth(1).map_or(0, |(i, _)| i);
                let first_close = if close.is_empty() { None } else { t[..second].rfind(close.as_str()).map(|i| i + close.len()) };
                first_close.map_or(String::new(), |c| t[c..second].to_string())
            } else {
                String::new()
            };
            (usize::MAX, between)
        }
        _ => (1, String::new()),
    };
    let family = if open.contains("<tool_call>") && !array {
        Family::Hermes
    } else if open.contains("[TOOL_CALLS]") && array {
        Family::Mistral
    } else if (open.is_empty() || open == "<|python_tag|>") && args_key == "parameters" {
        Family::Llama3
    } else {
        Family::Learned
    };
    Some(ToolSyntax {
        family,
        template_shows_tools: true,
        alt_open: (family == Family::Llama3).then(|| "<|python_tag|>".to_string()),
        open,
        gap_before,
        gap_after,
        close,
        between,
        name_key,
        args_key,
        id_key,
        array,
        max_calls,
        object_arguments,
    })
}

/// Python's `json.dumps`: what templates print, and how the model is asked
/// to write calls.
pub fn python_json(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{}]", items.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter().map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v))).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// A 9-character alphanumeric id for `id` (Mistral's templates refuse others),
/// the same for the same id.
pub fn nine_char_id(id: &str) -> String {
    if id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return id.to_string();
    }
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut h: u64 = 0xcbf29ce484222325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    (0..9)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize] as char;
            h = (h / ALPHABET.len() as u64) ^ h.rotate_left(17);
            c
        })
        .collect()
}

/// The generic preamble: the tools and how to call them.
pub fn preamble(syntax: &ToolSyntax, tools: &[Tool]) -> String {
    let mut s = String::from("You can call the following tools. Each is described by a JSON schema of its arguments:\n<tools>\n");
    for t in tools {
        let mut entry = Map::new();
        entry.insert("name".into(), Value::String(t.name.clone()));
        if let Some(d) = &t.description {
            entry.insert("description".into(), Value::String(d.clone()));
        }
        entry.insert("parameters".into(), t.parameters.clone());
        s.push_str(&python_json(&Value::Object(entry)));
        s.push('\n');
    }
    s.push_str("</tools>\nTo call a tool, answer with one block per call, and nothing else:\n");
    s.push_str(&syntax.write_call("<tool name>", &json!("<the arguments as a JSON object>"), Some("<9 letters or digits>")));
    s.push_str("\nThe results come back in the next message. If no tool helps, answer normally.");
    s
}

/// The messages as the template wants them (JSON, its shape): `null` keys
/// dropped (as transformers does), tool calls' arguments as objects or
/// strings as the template reads them, empty content for a turn that only
/// calls tools, 9-character ids for Mistral's templates; and for the
/// generic format, the preamble in the system message, earlier calls
/// written out in the assistant's text and tool results as user turns.
pub fn prepare_messages(messages: &[Value], syntax: &ToolSyntax, tools: &[Tool]) -> Vec<Value> {
    let generic = syntax.needs_preamble();
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        let Some(obj) = m.as_object() else { continue };
        let mut obj: Map<String, Value> = obj.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("").to_string();
        if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
            for call in calls.iter_mut() {
                if syntax.id_key.is_some() {
                    if let Some(Value::String(id)) = call.get_mut("id") {
                        *id = nine_char_id(id);
                    }
                }
                if let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                    *args = arguments_as(args, syntax.object_arguments);
                }
            }
            obj.entry("content").or_insert_with(|| Value::String(String::new()));
        }
        if syntax.id_key.is_some() {
            if let Some(Value::String(id)) = obj.get_mut("tool_call_id") {
                *id = nine_char_id(id);
            }
        }
        if generic {
            if role == "assistant" {
                if let Some(Value::Array(calls)) = obj.remove("tool_calls") {
                    let mut text = obj.get("content").and_then(Value::as_str).unwrap_or("").to_string();
                    for call in &calls {
                        let f = call.get("function").cloned().unwrap_or(Value::Null);
                        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
                        let args = arguments_as(f.get("arguments").unwrap_or(&Value::Null), true);
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&syntax.write_call(name, &args, call.get("id").and_then(Value::as_str)));
                    }
                    obj.insert("content".into(), Value::String(text));
                }
            } else if role == "tool" {
                let content = obj.get("content").cloned().unwrap_or(Value::String(String::new()));
                let content = content.as_str().map(str::to_string).unwrap_or_else(|| content.to_string());
                obj = Map::new();
                obj.insert("role".into(), "user".into());
                obj.insert("content".into(), Value::String(format!("<tool_response>\n{content}\n</tool_response>")));
            }
        }
        out.push(Value::Object(obj));
    }
    if generic && !tools.is_empty() {
        let text = preamble(syntax, tools);
        match out.first_mut().and_then(Value::as_object_mut) {
            Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
                let old = first.get("content").and_then(Value::as_str).unwrap_or("").to_string();
                first.insert("content".into(), Value::String(if old.is_empty() { text } else { format!("{old}\n\n{text}") }));
            }
            _ => out.insert(0, json!({ "role": "system", "content": text })),
        }
    }
    out
}

fn arguments_as(args: &Value, object: bool) -> Value {
    match (args, object) {
        (Value::String(s), true) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object).unwrap_or_else(|| args.clone()),
        (Value::Object(_), false) => Value::String(python_json(args)),
        _ => args.clone(),
    }
}

/// Where the model's output starts relative to its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningStart {
    /// The prompt opened the reasoning (`…<think>\n`): output starts inside it.
    Open,
    /// The model may open it itself.
    Optional,
    /// The prompt closed it (thinking turned off) or there is none.
    None,
}

/// Where the output starts, from the rendered prompt.
pub fn reasoning_start(prompt: &str, markers: Option<&ReasoningMarkers>) -> ReasoningStart {
    let Some(m) = markers else { return ReasoningStart::None };
    let tail = prompt.trim_end();
    if tail.ends_with(m.start.as_str()) {
        ReasoningStart::Open
    } else if tail.ends_with(m.end.as_str()) {
        ReasoningStart::None
    } else {
        ReasoningStart::Optional
    }
}

/// A Lark string literal of `s`.
pub(crate) fn lark_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A marker in Lark: the special token when the vocabulary has it as one
/// (`<[id]>`), else the literal text.
fn lark_marker(text: &str, special: &dyn Fn(&str) -> Option<u32>) -> String {
    match special(text) {
        Some(id) => format!("<[{id}]>"),
        None => lark_str(text),
    }
}

/// The constraint of a chat request, as a Lark grammar for llguidance, or
/// `None` when its output is free: tool calls (lazy with `tool_choice`
/// auto: free text and reasoning until a call's opener; from the first
/// token with `required` or a named function) and a JSON `response_format`,
/// after any reasoning. `special` gives a marker's token id when it is a
/// special token.
pub fn constraint_grammar(
    format: &ChatFormat,
    options: &ChatOptions,
    start: ReasoningStart,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Option<String> {
    let syntax = &format.tools;
    let calls = options.calls_tools();
    let json_content = match &options.response_format {
        Some(ResponseFormat::Json(schema)) => Some(schema.clone()),
        _ => None,
    };
    if !calls && json_content.is_none() {
        return None;
    }
    let mut rules: Vec<String> = Vec::new();
    // Reasoning before anything else.
    let think = match (&format.reasoning, start) {
        (Some(m), ReasoningStart::Open | ReasoningStart::Optional) => {
            let end = match special(&m.end) {
                Some(id) => {
                    rules.push("THINK_TEXT: /(.|\\n)+/".into());
                    format!("think_body: THINK_TEXT? <[{id}]>")
                }
                None => format!("think_body[lazy]: /(.|\\n)*{}/", regex_escape(&m.end)),
            };
            rules.push(end);
            rules.push("think_gap: /[ \\t\\r\\n]{1,4}/".into());
            if start == ReasoningStart::Open {
                "think_body think_gap?".to_string()
            } else {
                rules.push(format!("think: {} think_body think_gap?", lark_marker(&m.start, special)));
                "think?".to_string()
            }
        }
        _ => String::new(),
    };
    let required = matches!(options.tool_choice, ToolChoice::Required | ToolChoice::Function(_));
    let many = options.parallel_tool_calls && !matches!(options.tool_choice, ToolChoice::Function(_)) && syntax.max_calls > 1;
    if calls {
        let tools = options.callable();
        let mut one: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut s = call_schema(t, &syntax.name_key, &syntax.args_key, syntax.id_key.as_deref());
                nullable_to_any_of(&mut s);
                s
            })
            .collect();
        let mut schema = if one.len() == 1 { one.remove(0) } else { json!({ "anyOf": one }) };
        if syntax.array {
            schema = json!({ "type": "array", "items": schema, "minItems": 1 });
            if !many {
                schema["maxItems"] = json!(1);
            }
        }
        schema["x-guidance"] = json_layout();
        rules.push(format!("call_body: %json {}", schema));
        let gap = |g: &str| if g.is_empty() { String::new() } else { format!(" {}", lark_str(g)) };
        let close = if syntax.close.is_empty() { String::new() } else { format!(" {}", lark_marker(&syntax.close, special)) };
        let open = if syntax.open.is_empty() { String::new() } else { lark_marker(&syntax.open, special) };
        let open_special = special(&syntax.open).is_some();
        // One call (or one array of calls) after its opener.
        rules.push(format!("call_rest:{} call_body{}{}", gap(&syntax.gap_before), gap(&syntax.gap_after), close));
        let per_call = !syntax.array && !syntax.open.is_empty();
        let between = if syntax.between.is_empty() { String::new() } else { format!("{} ", lark_str(&syntax.between)) };
        let top = if let Some(schema) = &json_content {
            let mut schema = schema.clone();
            nullable_to_any_of(&mut schema);
            if let Some(o) = schema.as_object_mut() {
                o.insert("x-guidance".into(), json_layout());
            }
            rules.push(format!("content_json: %json {schema}"));
            // Tools and a JSON answer: a call, or the JSON.
            rules.push(if syntax.open.is_empty() { "call: call_rest".to_string() } else { format!("call: {open} call_rest") });
            if required {
                format!("call ({between}call)*")
            } else if many && per_call {
                format!("content_json | call ({between}call)*")
            } else {
                "content_json | call".into()
            }
        } else if syntax.open.is_empty() {
            // A bare JSON call (after Llama's `<|python_tag|>`, when the
            // model has it), or text that does not start like one.
            rules.push("FREE: /([^{ \\t\\r\\n](.|\\n)*)?/".into());
            let tag = syntax.alt_open.as_deref().and_then(special).map_or(String::new(), |id| format!("<[{id}]>? "));
            if required {
                format!("{tag}call_body")
            } else {
                format!("{tag}call_body | FREE")
            }
        } else if required {
            rules.push(format!("call: {open} call_rest"));
            if many && per_call {
                format!("call ({between}call)*")
            } else {
                "call".into()
            }
        } else if open_special {
            rules.push("TEXT: /(.|\\n)+/".into());
            rules.push(format!("call: {open} call_rest"));
            if many && per_call {
                "TEXT? (call TEXT?)*".into()
            } else {
                "TEXT? (call TEXT?)?".into()
            }
        } else {
            // Free text until the opener, then a call.
            rules.push("TEXT: /(.|\\n)*/".into());
            rules.push(format!("call_hd[lazy]: TEXT {open}"));
            rules.push("call: call_hd call_rest".into());
            if many && per_call {
                "call* TEXT".into()
            } else {
                // Nothing after the one call (free text after it could
                // hold a second opener).
                "call | TEXT".into()
            }
        };
        rules.insert(0, format!("start: {think} {top}").replace("start:  ", "start: "));
    } else if let Some(schema) = json_content {
        let mut schema = schema;
        nullable_to_any_of(&mut schema);
        if let Some(o) = schema.as_object_mut() {
            o.insert("x-guidance".into(), json_layout());
        }
        rules.push(format!("content_json: %json {schema}"));
        rules.insert(0, format!("start: {think} content_json").replace("start:  ", "start: "));
    }
    Some(rules.join("\n") + "\n")
}

/// `s` as a literal inside a Lark regex (`/…/`).
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.^$|?*+()[]{}/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN25: &str = r#"{%- if tools %}{{- '<|im_start|>system\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}{{- "\n\n# Tools\n\n<tools>" }}{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- endif %}{%- endif %}{%- for message in messages %}{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- elif message.role == "assistant" %}{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\n' + message.content }}{%- endif %}{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\n' }}{%- elif message.role == "tool" %}{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

    const LLAMA31: &str = r#"{{- bos_token }}{%- if tools is not none %}{{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' }}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}{%- elif 'tool_calls' in message %}{%- if not message.tool_calls|length == 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}{%- set tool_call = message.tool_calls[0].function %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}{%- elif message.role == "tool" or message.role == "ipython" %}{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}{{- message.content }}{{- "<|eot_id|>" }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"#;

    const NEMO: &str = r#"{%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}{%- if not tools is defined %}{%- set tools = none %}{%- endif %}{{- bos_token }}{%- for message in loop_messages %}{%- if message["role"] == "user" %}{%- if tools is not none and loop.last %}{{- "[AVAILABLE_TOOLS][" }}{%- for tool in tools %}{{- tool|tojson }}{%- endfor %}{{- "][/AVAILABLE_TOOLS]" }}{%- endif %}{{- "[INST]" + message["content"] + "[/INST]" }}{%- elif message.tool_calls is defined and message.tool_calls is not none %}{{- "[TOOL_CALLS][" }}{%- for tool_call in message.tool_calls %}{%- set out = tool_call.function|tojson %}{{- out[:-1] }}{%- if not tool_call.id is defined or tool_call.id|length != 9 %}{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{%- endif %}{{- ', "id": "' + tool_call.id + '"}' }}{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}{%- endfor %}{%- elif message["role"] == "assistant" %}{{- message["content"] + eos_token}}{%- elif message["role"] == "tool_results" or message["role"] == "tool" %}{{- '[TOOL_RESULTS]{"content": ' + message.content|string + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}{%- endif %}{%- endfor %}"#;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn detect(source: &str) -> ChatFormat {
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        ChatFormat::detect(&t, source, None)
    }

    #[test]
    fn hermes_style_qwen() {
        let f = detect(QWEN25);
        let s = &f.tools;
        assert_eq!(s.family, Family::Hermes, "{s:?}");
        assert!(s.template_shows_tools && !s.array && s.object_arguments);
        assert_eq!(
            (s.open.as_str(), s.gap_before.as_str(), s.gap_after.as_str(), s.close.as_str()),
            ("<tool_call>", "\n", "\n", "</tool_call>")
        );
        assert_eq!((s.name_key.as_str(), s.args_key.as_str(), s.id_key.as_deref()), ("name", "arguments", None));
        assert_eq!(s.between, "\n");
        assert_eq!(s.max_calls, usize::MAX);
        assert_eq!(f.reasoning, None);
    }

    #[test]
    fn llama_3_1() {
        let s = detect(LLAMA31).tools;
        assert_eq!(s.family, Family::Llama3);
        assert_eq!((s.open.as_str(), s.close.as_str(), s.args_key.as_str()), ("", "", "parameters"));
        assert_eq!(s.max_calls, 1);
    }

    #[test]
    fn mistral_nemo() {
        let s = detect(NEMO).tools;
        assert_eq!(s.family, Family::Mistral);
        assert!(s.array);
        assert_eq!((s.open.as_str(), s.id_key.as_deref()), ("[TOOL_CALLS]", Some("id")));
    }

    #[test]
    fn a_template_without_tools_is_generic_with_a_preamble() {
        let f = detect(SMOLLM2);
        assert_eq!(f.tools.family, Family::Generic);
        assert!(f.tools.needs_preamble());
        let tools = crate::chat::tools::parse_chat_options(|k| {
            (k == "tools").then_some(&*Box::leak(Box::new(json!([{ "type": "function", "function": { "name": "get_weather", "parameters": { "type": "object", "properties": { "city": { "type": "string" } } } } }]))))
        })
        .unwrap()
        .tools;
        let msgs = prepare_messages(
            &[
                json!({ "role": "user", "content": "Weather in Paris?" }),
                json!({ "role": "assistant", "content": null, "tool_calls": [{ "id": "c1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\"}" } }] }),
                json!({ "role": "tool", "tool_call_id": "c1", "content": "22 C" }),
            ],
            &f.tools,
            &tools,
        );
        assert_eq!(msgs[0]["role"], "system");
        assert!(msgs[0]["content"].as_str().unwrap().contains("\"name\": \"get_weather\""));
        assert_eq!(msgs[2]["content"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
        assert_eq!(msgs[3], json!({ "role": "user", "content": "<tool_response>\n22 C\n</tool_response>" }));
    }

    #[test]
    fn forced_families() {
        let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        let f = ChatFormat::detect(&t, SMOLLM2, Some(Family::Llama3));
        assert_eq!(f.tools.args_key, "parameters");
        assert!(f.tools.needs_preamble());
    }

    #[test]
    fn python_json_and_ids() {
        assert_eq!(python_json(&json!({ "a": [1, { "b": "é" }], "c": null })), "{\"a\": [1, {\"b\": \"é\"}], \"c\": null}");
        let id = nine_char_id("call_abcdefghijklmnop");
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(nine_char_id("call_abcdefghijklmnop"), id);
        assert_eq!(nine_char_id("a1B2c3D4e"), "a1B2c3D4e");
    }

    #[test]
    fn reasoning_starts() {
        let m = ReasoningMarkers { start: "<think>".into(), end: "</think>".into() };
        assert_eq!(reasoning_start("<|im_start|>assistant\n<think>\n", Some(&m)), ReasoningStart::Open);
        assert_eq!(reasoning_start("assistant\n<think>\n\n</think>\n\n", Some(&m)), ReasoningStart::None);
        assert_eq!(reasoning_start("assistant\n", Some(&m)), ReasoningStart::Optional);
        assert_eq!(reasoning_start("assistant\n<think>\n", None), ReasoningStart::None);
    }
}

#[cfg(test)]
mod grammar_tests {
    use super::*;
    use crate::chat::tools::parse_chat_options;
    use crate::sampling::constraint::fixtures::env;
    use crate::sampling::constraint::{Compiler, Grammar};

    fn options(extra: Value) -> ChatOptions {
        let mut m = json!({ "tools": [
            { "type": "function", "function": { "name": "get_weather", "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } },
            { "type": "function", "function": { "name": "add", "parameters": { "type": "object", "properties": { "x": { "type": "integer" } }, "required": ["x"] } } }
        ] });
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        let m = m.as_object().unwrap().clone();
        parse_chat_options(|k| m.get(k).filter(|v| !v.is_null())).unwrap()
    }

    /// Whether `text` can be generated token by token under the grammar
    /// (greedy tokens of the toy vocabulary), and ended there.
    fn accepts(grammar: &str, text: &str) -> bool {
        let (env, _) = env();
        let mut c = Compiler::new(&env).unwrap().compile(&Grammar::Lark(grammar.into())).unwrap_or_else(|e| panic!("{e}\n{grammar}"));
        for t in env.tokenize_bytes(text.as_bytes()) {
            let Ok(mask) = c.allowed() else { return false };
            if !c.is_allowed(&mask, t as i32) || c.consume(t as i32).is_err() {
                return false;
            }
        }
        let mask = c.allowed().unwrap();
        let eos = env.tok_trie().eos_token() as i32;
        c.is_allowed(&mask, eos)
    }

    fn format(family: Family, reasoning: bool) -> ChatFormat {
        ChatFormat {
            tools: ToolSyntax::of_family(family),
            reasoning: reasoning.then(|| ReasoningMarkers { start: "<think>".into(), end: "</think>".into() }),
        }
    }

    const NO_SPECIAL: &dyn Fn(&str) -> Option<u32> = &|_| None;

    #[test]
    fn hermes_auto_is_lazy_and_calls_are_valid() {
        let g = constraint_grammar(&format(Family::Hermes, false), &options(json!({})), ReasoningStart::None, NO_SPECIAL).unwrap();
        assert!(accepts(&g, "Just text, no call."));
        assert!(accepts(&g, "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
        assert!(accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 2}}\n</tool_call><tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 3}}\n</tool_call>"));
        assert!(!accepts(&g, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
        assert!(!accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": \"two\"}}\n</tool_call>"));
        // One call only.
        let g = constraint_grammar(
            &format(Family::Hermes, false),
            &options(json!({ "parallel_tool_calls": false })),
            ReasoningStart::None,
            NO_SPECIAL,
        )
        .unwrap();
        assert!(!accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 2}}\n</tool_call><tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 3}}\n</tool_call>"));
    }

    #[test]
    fn required_and_named_calls_start_at_once() {
        let g = constraint_grammar(
            &format(Family::Hermes, false),
            &options(json!({ "tool_choice": "required" })),
            ReasoningStart::None,
            NO_SPECIAL,
        )
        .unwrap();
        assert!(!accepts(&g, "Hello"));
        assert!(accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
        let named = options(json!({ "tool_choice": { "type": "function", "function": { "name": "get_weather" } } }));
        let g = constraint_grammar(&format(Family::Hermes, false), &named, ReasoningStart::None, NO_SPECIAL).unwrap();
        assert!(!accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
        assert!(accepts(&g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
    }

    #[test]
    fn reasoning_comes_first_and_stays_free() {
        let f = format(Family::Hermes, true);
        let g = constraint_grammar(&f, &options(json!({ "tool_choice": "required" })), ReasoningStart::Optional, NO_SPECIAL).unwrap();
        assert!(accepts(
            &g,
            "<think>I should call add {not json}.</think>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>"
        ));
        let g = constraint_grammar(&f, &options(json!({ "tool_choice": "required" })), ReasoningStart::Open, NO_SPECIAL).unwrap();
        assert!(accepts(&g, "Thinking...</think><tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
        assert!(!accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
    }

    #[test]
    fn other_families_and_json_content() {
        let g = constraint_grammar(&format(Family::Llama3, false), &options(json!({})), ReasoningStart::None, NO_SPECIAL).unwrap();
        assert!(accepts(&g, "{\"name\": \"add\", \"parameters\": {\"x\": 1}}"));
        assert!(accepts(&g, "Sure, here you go."));
        assert!(!accepts(&g, "{\"name\": \"nope\", \"parameters\": {}}"));
        let g = constraint_grammar(
            &format(Family::Mistral, false),
            &options(json!({ "tool_choice": "required" })),
            ReasoningStart::None,
            NO_SPECIAL,
        )
        .unwrap();
        assert!(accepts(&g, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"x\": 1}, \"id\": \"a1B2c3D4e\"}]"));
        assert!(!accepts(&g, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"x\": 1}, \"id\": \"short\"}]"));
        let json_only = options(
            json!({ "tools": null, "response_format": { "type": "json_schema", "json_schema": { "name": "x", "schema": { "type": "object", "properties": { "n": { "type": "integer", "nullable": true } }, "required": ["n"] } } } }),
        );
        let g = constraint_grammar(&format(Family::Hermes, false), &json_only, ReasoningStart::None, NO_SPECIAL).unwrap();
        assert!(accepts(&g, "{\"n\": 3}"));
        assert!(accepts(&g, "{\"n\": null}"));
        assert!(!accepts(&g, "{\"n\": \"3\"}"));
        let both = options(json!({ "response_format": { "type": "json_object" } }));
        let g = constraint_grammar(&format(Family::Hermes, false), &both, ReasoningStart::None, NO_SPECIAL).unwrap();
        assert!(accepts(&g, "{\"any\": true}"));
        assert!(accepts(&g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
        assert!(constraint_grammar(
            &format(Family::Hermes, false),
            &options(json!({ "tool_choice": "none" })),
            ReasoningStart::None,
            NO_SPECIAL
        )
        .is_none());
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;

    /// The formats detected for the real templates in
    /// `__test__/fixtures/chat-templates`.
    #[test]
    fn formats_of_real_templates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/chat-templates");
        for (file, family, open, reasoning) in [
            ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", Family::Hermes, "<tool_call>", false),
            ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", Family::Hermes, "<tool_call>", false),
            ("Qwen-Qwen2.5-7B-Instruct.jinja", Family::Hermes, "<tool_call>", false),
            ("Qwen-Qwen3-0.6B.jinja", Family::Hermes, "<tool_call>", true),
            ("Qwen-QwQ-32B.jinja", Family::Hermes, "<tool_call>", true),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", Family::Llama3, "", false),
            ("meta-llama-Llama-3.2-3B-Instruct.jinja", Family::Llama3, "", false),
            ("meta-llama-Llama-3.3-70B-Instruct.jinja", Family::Llama3, "", false),
            ("mistralai-Mistral-Nemo-Instruct-2407.jinja", Family::Mistral, "[TOOL_CALLS]", false),
            ("mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja", Family::Mistral, "[TOOL_CALLS]", false),
            // Calls with the name outside the JSON: not learned; the generic format.
            ("Mistral-Small-3.2-24B-Instruct-2506.jinja", Family::Generic, "<tool_call>", false),
            ("Qwen3-Coder.jinja", Family::Generic, "<tool_call>", false),
            ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", Family::Generic, "<tool_call>", true),
        ] {
            let source = std::fs::read_to_string(dir.join(file)).unwrap();
            let t = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
            let f = ChatFormat::detect(&t, &source, None);
            assert_eq!((f.tools.family, f.tools.open.as_str(), f.reasoning.is_some()), (family, open, reasoning), "{file}: {:?}", f.tools);
        }
    }
}
