//! What a chat request asks of the answer: the tools the model may call
//! (`tools`, `tool_choice`, `parallel_tool_calls`), the shape of its content
//! (`response_format`), its reasoning (`reasoning_format`) and extra template
//! variables (`chat_template_kwargs`), all in OpenAI's (and llama.cpp
//! server's) shapes, checked here. The schemas are compiled later, against
//! the model's vocabulary; here they are bounded.

use serde_json::{json, Map, Value};

use crate::error::{EngineError, Result};
use crate::json::describe::{truncate, type_name};
use crate::json::schema::check_schema;
#[cfg(test)]
use crate::json::schema::MAX_PROPERTIES;

/// Most tools in one request.
pub const MAX_TOOLS: usize = 128;
/// Longest tool name (OpenAI's limit).
pub const MAX_TOOL_NAME: usize = 64;
/// Most bytes of `chat_template_kwargs` as JSON.
const MAX_KWARGS_BYTES: usize = 64 * 1024;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// Its `parameters` JSON schema (an empty object schema when none was given).
    pub parameters: Value,
    /// The tool as the request gave it, for the chat template.
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides; a call it starts is constrained from its opener.
    #[default]
    Auto,
    /// No calls: the tools are shown to the model, its output is text.
    None,
    /// At least one call, constrained from the first token.
    Required,
    /// This function, constrained from the first token.
    Function(String),
}

impl ToolChoice {
    /// The wire value.
    pub fn to_json(&self) -> Value {
        match self {
            ToolChoice::Auto => "auto".into(),
            ToolChoice::None => "none".into(),
            ToolChoice::Required => "required".into(),
            ToolChoice::Function(name) => json!({ "type": "function", "function": { "name": name } }),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    /// Any JSON object, or one matching this schema.
    Json(Value),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// Reasoning (`<think>…</think>`) goes to `reasoning_content`.
    #[default]
    Auto,
    /// Reasoning stays in `content`, as the model wrote it.
    None,
}

impl ReasoningFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningFormat::Auto => "auto",
            ReasoningFormat::None => "none",
        }
    }
}

/// The chat-only fields of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOptions {
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    pub response_format: Option<ResponseFormat>,
    pub template_kwargs: Map<String, Value>,
    pub reasoning_format: ReasoningFormat,
    /// Most tokens of thinking per block; `None`: no limit.
    pub reasoning_budget: Option<u32>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            response_format: None,
            template_kwargs: Map::new(),
            reasoning_format: ReasoningFormat::Auto,
            reasoning_budget: None,
        }
    }
}

impl ChatOptions {
    /// Whether tool calls may end up in the output (and are parsed).
    pub fn calls_tools(&self) -> bool {
        !self.tools.is_empty() && self.tool_choice != ToolChoice::None
    }

    /// The tools a call may name: all of them, or the one `tool_choice` names.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.tool_choice {
            ToolChoice::Function(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::None => Vec::new(),
            _ => self.tools.iter().collect(),
        }
    }
}

fn invalid(field: &str, why: impl std::fmt::Display) -> EngineError {
    EngineError::invalid(field, why)
}

/// Reads the chat fields of a request object (`tools`, `tool_choice`,
/// `parallel_tool_calls`, `response_format`, `chat_template_kwargs`,
/// `reasoning_format`, `reasoning_effort`, `reasoning_budget`). `get`
/// returns a field, `None`
/// for absent or null.
pub fn parse_chat_options<'a>(get: impl Fn(&str) -> Option<&'a Value>) -> Result<ChatOptions> {
    let tools = match get("tools") {
        None => Vec::new(),
        Some(v) => parse_tools(v)?,
    };
    let tool_choice = match get("tool_choice") {
        None => ToolChoice::Auto,
        Some(v) => parse_tool_choice(v, &tools)?,
    };
    let parallel_tool_calls = match get("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid("parallel_tool_calls", format!("expected a boolean, got {}", type_name(v)))),
    };
    let response_format = get("response_format").map(parse_response_format).transpose()?;
    let mut template_kwargs = match get("chat_template_kwargs") {
        None => Map::new(),
        Some(v) => parse_kwargs(v)?,
    };
    match get("reasoning_effort") {
        None => {}
        // A variable of the template (gpt-oss reads it); chat_template_kwargs wins.
        Some(Value::String(s)) if ["low", "medium", "high"].contains(&s.as_str()) => {
            template_kwargs.entry("reasoning_effort").or_insert(Value::String(s.clone()));
        }
        Some(v) => return Err(invalid("reasoning_effort", format!("expected \"low\", \"medium\" or \"high\", got {v}"))),
    }
    let reasoning_format = match get("reasoning_format") {
        None => ReasoningFormat::Auto,
        Some(Value::String(s)) if s == "auto" => ReasoningFormat::Auto,
        Some(Value::String(s)) if s == "none" => ReasoningFormat::None,
        Some(v) => return Err(invalid("reasoning_format", format!("expected \"auto\" or \"none\", got {v}"))),
    };
    let reasoning_budget = match get("reasoning_budget") {
        None => None,
        Some(v) => match v.as_i64() {
            Some(-1) => None,
            Some(n) if (0..=i64::from(i32::MAX)).contains(&n) => Some(n as u32),
            _ => return Err(invalid("reasoning_budget", format!("expected an integer from -1 (no limit) up, got {v}"))),
        },
    };
    Ok(ChatOptions { tools, tool_choice, parallel_tool_calls, response_format, template_kwargs, reasoning_format, reasoning_budget })
}

fn parse_tools(v: &Value) -> Result<Vec<Tool>> {
    let items = v.as_array().ok_or_else(|| invalid("tools", format!("expected an array of tools, got {}", type_name(v))))?;
    if items.len() > MAX_TOOLS {
        return Err(invalid("tools", format!("at most {MAX_TOOLS} tools are allowed, got {}", items.len())));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("tools[{i}]");
        let obj = item.as_object().ok_or_else(|| {
            invalid(&at, format!("expected {{ type: \"function\", function: {{ name, parameters }} }}, got {}", type_name(item)))
        })?;
        match obj.get("type") {
            Some(Value::String(t)) if t == "function" => {}
            Some(other) => return Err(invalid(&format!("{at}.type"), format!("only \"function\" tools are supported, got {other}"))),
            None => return Err(invalid(&format!("{at}.type"), "required: \"function\"")),
        }
        let f = obj
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(&format!("{at}.function"), "required: an object with name and parameters"))?;
        let name = match f.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(invalid(&format!("{at}.function.name"), "required: a string")),
        };
        if name.is_empty()
            || name.len() > MAX_TOOL_NAME
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            return Err(invalid(
                &format!("{at}.function.name"),
                format!("expected 1 to {MAX_TOOL_NAME} letters, digits, '_', '-' or '.', got {:?}", truncate(&name, 80)),
            ));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(invalid(&format!("{at}.function.name"), format!("{name:?} is given twice")));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(other) => {
                return Err(invalid(&format!("{at}.function.description"), format!("expected a string, got {}", type_name(other))))
            }
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
            Some(p @ Value::Object(_)) => {
                check_schema(p, &format!("{at}.function.parameters"))?;
                p.clone()
            }
            Some(other) => {
                return Err(invalid(
                    &format!("{at}.function.parameters"),
                    format!("expected a JSON schema object, got {}", type_name(other)),
                ))
            }
        };
        tools.push(Tool { name, description, parameters, raw: item.clone() });
    }
    Ok(tools)
}

fn parse_tool_choice(v: &Value, tools: &[Tool]) -> Result<ToolChoice> {
    let choice = match v {
        Value::String(s) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => {
                return Err(invalid(
                    "tool_choice",
                    format!("expected \"auto\", \"none\", \"required\" or {{ type: \"function\", function: {{ name }} }}, got {v}"),
                ))
            }
        },
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid("tool_choice.type", "expected \"function\""));
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.function.name", "required: the name of one of the tools"))?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(invalid("tool_choice.function.name", format!("{name:?} is not one of the tools")));
            }
            ToolChoice::Function(name.to_string())
        }
        other => return Err(invalid("tool_choice", format!("expected a string or an object, got {}", type_name(other)))),
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(invalid("tool_choice", "needs tools"));
    }
    Ok(choice)
}

fn parse_response_format(v: &Value) -> Result<ResponseFormat> {
    let obj = v.as_object().ok_or_else(|| invalid("response_format", format!("expected an object with a type, got {}", type_name(v))))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => {
            // llama.cpp's server also takes a `schema` here.
            let schema = match obj.get("schema") {
                None | Some(Value::Null) => json!({ "type": "object" }),
                Some(s) => {
                    check_schema(s, "response_format.schema")?;
                    s.clone()
                }
            };
            Ok(ResponseFormat::Json(schema))
        }
        Some("json_schema") => {
            let js = obj
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid("response_format.json_schema", "required: { name, schema, strict? }"))?;
            match js.get("name") {
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(other) => {
                    return Err(invalid("response_format.json_schema.name", format!("expected a string, got {}", type_name(other))))
                }
            }
            match js.get("strict") {
                None | Some(Value::Null) | Some(Value::Bool(_)) => {}
                Some(other) => {
                    return Err(invalid("response_format.json_schema.strict", format!("expected a boolean, got {}", type_name(other))))
                }
            }
            let schema = match js.get("schema") {
                None | Some(Value::Null) => json!({ "type": "object" }),
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    check_schema(s, "response_format.json_schema.schema")?;
                    s.clone()
                }
                Some(other) => {
                    return Err(invalid("response_format.json_schema.schema", format!("expected a JSON schema, got {}", type_name(other))))
                }
            };
            Ok(ResponseFormat::Json(schema))
        }
        Some(other) => {
            Err(invalid("response_format.type", format!("expected \"text\", \"json_object\" or \"json_schema\", got {other:?}")))
        }
        None => Err(invalid("response_format.type", "required: \"text\", \"json_object\" or \"json_schema\"")),
    }
}

/// Template variables the request may not set: the engine's own.
const RESERVED_KWARGS: [&str; 4] = ["messages", "tools", "add_generation_prompt", "raise_exception"];

fn parse_kwargs(v: &Value) -> Result<Map<String, Value>> {
    let obj = v.as_object().ok_or_else(|| invalid("chat_template_kwargs", format!("expected an object, got {}", type_name(v))))?;
    if v.to_string().len() > MAX_KWARGS_BYTES {
        return Err(invalid("chat_template_kwargs", format!("at most {MAX_KWARGS_BYTES} bytes are allowed")));
    }
    if let Some(k) = obj.keys().find(|k| RESERVED_KWARGS.contains(&k.as_str())) {
        return Err(invalid(&format!("chat_template_kwargs.{k}"), "is set by the engine"));
    }
    if let Some(v) = obj.get("enable_thinking").filter(|v| !v.is_boolean()) {
        return Err(invalid("chat_template_kwargs.enable_thinking", format!("expected a boolean, got {}", type_name(v))));
    }
    Ok(obj.clone())
}

/// The schema of one call in JSON: `{ name_key: <name>, args_key: <parameters> }`
/// (keys in that order), with `id_key` a 9-character id when the format has
/// one (Mistral's).
pub fn call_schema(tool: &Tool, name_key: &str, args_key: &str, id_key: Option<&str>) -> Value {
    let mut properties = Map::new();
    properties.insert(name_key.into(), json!({ "const": tool.name }));
    properties.insert(args_key.into(), tool.parameters.clone());
    let mut required = vec![json!(name_key), json!(args_key)];
    if let Some(id) = id_key {
        properties.insert(id.into(), json!({ "type": "string", "pattern": "^[a-zA-Z0-9]{9}$" }));
        required.push(json!(id));
    }
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

/// OpenAPI's `"nullable": true` (which zod's OpenAI helpers write) as JSON
/// schema: `anyOf` with `null`. Applied to schemas before they are compiled.
pub fn nullable_to_any_of(schema: &mut Value) {
    let mut stack = vec![schema];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if o.get("nullable") == Some(&Value::Bool(true)) {
                    o.remove("nullable");
                    let inner = Value::Object(std::mem::take(o));
                    o.insert("anyOf".into(), json!([inner, { "type": "null" }]));
                }
                stack.extend(o.values_mut());
            }
            Value::Array(a) => stack.extend(a.iter_mut()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatOptions> {
        let m = v.as_object().unwrap().clone();
        parse_chat_options(|k| m.get(k).filter(|v| !v.is_null()))
    }

    fn tool(name: &str) -> Value {
        json!({ "type": "function", "function": { "name": name, "description": "d", "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } })
    }

    #[test]
    fn defaults_and_shapes() {
        let o = parse(json!({})).unwrap();
        assert_eq!(o, ChatOptions::default());
        let o = parse(json!({ "tools": [tool("get_weather"), tool("add")], "tool_choice": { "type": "function", "function": { "name": "add" } }, "parallel_tool_calls": false, "reasoning_format": "none", "chat_template_kwargs": { "enable_thinking": false } })).unwrap();
        assert_eq!(o.tools.len(), 2);
        assert_eq!(o.tool_choice, ToolChoice::Function("add".into()));
        assert_eq!(o.callable().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["add"]);
        assert!(!o.parallel_tool_calls);
        assert_eq!(o.reasoning_format, ReasoningFormat::None);
        assert_eq!(o.template_kwargs["enable_thinking"], json!(false));
        let o = parse(json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "w", "schema": { "type": "object" }, "strict": true } } })).unwrap();
        assert_eq!(o.response_format, Some(ResponseFormat::Json(json!({ "type": "object" }))));
        let o = parse(json!({ "response_format": { "type": "json_object" } })).unwrap();
        assert_eq!(o.response_format, Some(ResponseFormat::Json(json!({ "type": "object" }))));
        assert_eq!(parse(json!({ "tools": [tool("a")] })).unwrap().tools[0].parameters["required"], json!(["city"]));
        let no_params = json!([{ "type": "function", "function": { "name": "now" } }]);
        assert_eq!(parse(json!({ "tools": no_params })).unwrap().tools[0].parameters, json!({ "type": "object", "properties": {} }));
    }

    #[test]
    fn bad_values_name_the_field() {
        for (v, field) in [
            (json!({ "tools": {} }), "tools:"),
            (json!({ "tools": [1] }), "tools[0]:"),
            (json!({ "tools": [{ "type": "retrieval" }] }), "tools[0].type:"),
            (json!({ "tools": [{ "type": "function" }] }), "tools[0].function:"),
            (json!({ "tools": [{ "type": "function", "function": { "name": "a b" } }] }), "tools[0].function.name:"),
            (json!({ "tools": [tool("a"), tool("a")] }), "tools[1].function.name:"),
            (json!({ "tools": [{ "type": "function", "function": { "name": "a", "parameters": "x" } }] }), "tools[0].function.parameters:"),
            (json!({ "tool_choice": "sometimes", "tools": [tool("a")] }), "tool_choice:"),
            (json!({ "tool_choice": "required" }), "tool_choice:"),
            (
                json!({ "tool_choice": { "type": "function", "function": { "name": "b" } }, "tools": [tool("a")] }),
                "tool_choice.function.name:",
            ),
            (json!({ "tool_choice": { "type": "x" }, "tools": [tool("a")] }), "tool_choice.type:"),
            (json!({ "parallel_tool_calls": "yes" }), "parallel_tool_calls:"),
            (json!({ "response_format": { "type": "xml" } }), "response_format.type:"),
            (json!({ "response_format": { "type": "json_schema" } }), "response_format.json_schema:"),
            (
                json!({ "response_format": { "type": "json_schema", "json_schema": { "schema": 3 } } }),
                "response_format.json_schema.schema:",
            ),
            (json!({ "chat_template_kwargs": [] }), "chat_template_kwargs:"),
            (json!({ "chat_template_kwargs": { "messages": [] } }), "chat_template_kwargs.messages:"),
            (json!({ "chat_template_kwargs": { "enable_thinking": "no" } }), "chat_template_kwargs.enable_thinking:"),
            (json!({ "reasoning_format": "deepseek-legacy" }), "reasoning_format:"),
        ] {
            let e = parse(v.clone()).unwrap_err();
            assert!(e.message.starts_with(field), "{v}: {}", e.message);
        }
        let many: Vec<Value> = (0..=MAX_TOOLS).map(|i| tool(&format!("t{i}"))).collect();
        assert!(parse(json!({ "tools": many })).unwrap_err().message.starts_with("tools:"));
        let props: Map<String, Value> = (0..=MAX_PROPERTIES).map(|i| (format!("p{i}"), json!({ "type": "string" }))).collect();
        let big = json!([{ "type": "function", "function": { "name": "a", "parameters": { "type": "object", "properties": { "inner": { "type": "object", "properties": props } } } } }]);
        let e = parse(json!({ "tools": big })).unwrap_err();
        assert!(e.message.starts_with("tools[0].function.parameters.properties.inner.properties:"), "{}", e.message);
    }

    #[test]
    fn call_schemas_and_nullable() {
        let t = parse(json!({ "tools": [tool("get")] })).unwrap().tools.remove(0);
        let s = call_schema(&t, "name", "parameters", Some("id"));
        assert_eq!(s["properties"]["name"], json!({ "const": "get" }));
        assert_eq!(s["required"], json!(["name", "parameters", "id"]));
        let mut z = json!({ "type": "object", "properties": { "note": { "type": "string", "nullable": true } } });
        nullable_to_any_of(&mut z);
        assert_eq!(z["properties"]["note"], json!({ "anyOf": [{ "type": "string" }, { "type": "null" }] }));
    }
}
