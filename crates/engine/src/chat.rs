//! Chat requests made ready for the engine thread, on the caller's thread so
//! that errors reject before anything is queued: the messages prepared for
//! the model's template and rendered (with the tools, or the generic
//! preamble), and the plan of the generation — how its output is read
//! (reasoning, tool calls) and what constrains it.

use std::sync::{Arc, Mutex};

use rand::Rng;

use llama_cpp_2::model::LlamaModel;
use serde_json::{json, Value};

use super::chat_native::{self, NativeParser};
use llama_engine_core::chat::call_grammar::{call_grammar, value_closers};
use llama_engine_core::chat::closing::close_values;
use llama_engine_core::chat::format::SharedParser;
use llama_engine_core::chat::output::{OutputParser, ToolCall};
use llama_engine_core::chat::reparse::ReparseReader;
use llama_engine_core::chat::tools::ToolChoice;
use llama_engine_core::sampling::noise;

use super::model::special_token;
use llama_engine_core::chat::format::OutputFormat;
use llama_engine_core::chat::format::{
    constraint_grammar, json_answer, prepare_messages, reasoning_start, ChatFormat, ChatPlan, Family, ReasoningMarkers, ReasoningStart,
};
use llama_engine_core::chat::template::Render;
use llama_engine_core::chat::tools::{ChatOptions, ReasoningFormat, ResponseFormat};
use llama_engine_core::chat::{ChatMessage, ChatTemplate};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::request::{CompletionRequest, PromptPart};
use llama_engine_core::sampling::budget::BudgetPlan;
use llama_engine_core::sampling::constraint::Grammar;

/// A model's chat template and what it tells of its output formats.
pub struct Chat {
    pub template: ChatTemplate,
    pub format: ChatFormat,
    /// When the model writes its calls (or reasoning) in a syntax that is
    /// none of ours: the family whose answers llama.cpp's chat code reads.
    pub native: Option<Native>,
    /// The template refuses a system message (gemma 2): it is put at the
    /// start of the first user message, as llama.cpp does.
    pub fold_system: bool,
    /// The template's Jinja source (`status().chatTemplate`).
    pub source: String,
}

/// Whether a template writes the tools it is given into the prompt.
fn shows_tools(template: &ChatTemplate) -> bool {
    const NAME: &str = "zq_probe_tool_7";
    let tool = json!({ "type": "function", "function": { "name": NAME, "description": "A probe.", "parameters": { "type": "object", "properties": {} } } });
    let render = Render { add_generation_prompt: true, tools: Some(vec![tool]), kwargs: Default::default() };
    template.render_json(&[json!({ "role": "user", "content": "Hi" })], &render, "messages").is_ok_and(|text| text.contains(NAME))
}

/// Whether a template reads call arguments as objects (most) or only as
/// JSON text (functionary v3.2 concatenates them to strings).
fn reads_object_arguments(template: &ChatTemplate) -> bool {
    let tool = json!({ "type": "function", "function": { "name": "probe", "parameters": { "type": "object", "properties": { "x": { "type": "string" } } } } });
    let conversation = |args: Value| {
        vec![
            json!({ "role": "user", "content": "Hi" }),
            json!({ "role": "assistant", "content": "", "tool_calls": [{ "id": "call_1", "type": "function", "function": { "name": "probe", "arguments": args } }] }),
        ]
    };
    let render = Render { add_generation_prompt: false, tools: Some(vec![tool]), kwargs: Default::default() };
    let object = template.render_json(&conversation(json!({ "x": "1" })), &render, "messages");
    let text = template.render_json(&conversation(json!("{\"x\": \"1\"}")), &render, "messages");
    object.is_ok() || text.is_err()
}

/// Whether a template refuses a system message that it would render as a user's.
fn folds_system(template: &ChatTemplate) -> bool {
    let render = Render { add_generation_prompt: true, ..Default::default() };
    let system = template.render_json(
        &[json!({ "role": "system", "content": "S" }), json!({ "role": "user", "content": "U" })],
        &render,
        "messages",
    );
    system.is_err() && template.render_json(&[json!({ "role": "user", "content": "S\nU" })], &render, "messages").is_ok()
}

impl Chat {
    pub fn new(template: ChatTemplate, source: &str, forced: Option<Family>, bos: &str, eos: &str) -> Chat {
        let mut format = ChatFormat::detect(&template, source, forced);
        // llama.cpp's reading wins over ours where ours is only the
        // preamble or a syntax our probes learnt: it knows the family's
        // reasoning and response markers too.
        let ours = matches!(format.tools.family, Family::Generic | Family::Learned);
        // Only for templates that show tools: one that ignores them gets our
        // preamble, and then our syntax is the one to read.
        let native = if forced.is_none() && ours && shows_tools(&template) { Native::detect(source, bos, eos) } else { None };
        if native.is_some() {
            // The template shows the tools in the model's own syntax: no
            // preamble; calls in history reach it as it reads them.
            format.tools.template_shows_tools = true;
            format.tools.object_arguments = reads_object_arguments(&template);
        }
        let fold_system = folds_system(&template);
        Chat { template, format, native, fold_system, source: source.to_string() }
    }

    /// The name of the family its answers are read as (`status().toolCallFormat`).
    pub fn family(&self) -> &'static str {
        match &self.native {
            Some(n) => n.name,
            None => self.format.tools.family.as_str(),
        }
    }
}

/// The text `messages` render to with `options`: prepared for the model's
/// format (calls written as it writes them; with the generic format, tool
/// results as user turns and the tools in a system preamble) and rendered
/// with the tools and the template's extra variables.
///
/// With the generation prompt, a last assistant message without calls is
/// continued, as llama-server continues it ("prefill"): the conversation
/// before it with the generation prompt, then its text (after its
/// `reasoning_content` and the end of thinking, where the generation
/// prompt opens a thinking block).
pub fn render(chat: &Chat, messages: &[ChatMessage], options: &ChatOptions, add_generation_prompt: bool) -> Result<String> {
    if let (true, Some((last, before))) = (add_generation_prompt, messages.split_last()) {
        if last.role == "assistant" && !last.extra.contains_key("tool_calls") && !before.is_empty() {
            if before.last().is_some_and(|m| m.role == "assistant") {
                return Err(EngineError::invalid("messages", "cannot continue two or more assistant messages at the end of the list"));
            }
            let mut text = render_turns(chat, before, options, true)?;
            if let Some(m) = chat.format.reasoning.as_ref() {
                if reasoning_start(&text, Some(m)) == ReasoningStart::Open {
                    text.push_str(last.extra.get("reasoning_content").and_then(Value::as_str).unwrap_or(""));
                    text.push_str(&m.end);
                }
            }
            // Given in text parts: joined with a blank line, as llama-server continues it.
            let continued = if last.media.is_empty() { last.continued.as_deref() } else { None };
            text.push_str(continued.or(last.content.as_deref()).unwrap_or(""));
            return Ok(text);
        }
    }
    render_turns(chat, messages, options, add_generation_prompt)
}

fn render_turns(chat: &Chat, messages: &[ChatMessage], options: &ChatOptions, add_generation_prompt: bool) -> Result<String> {
    let syntax = &chat.format.tools;
    let messages: Vec<Value> = messages.iter().map(ChatMessage::to_json).collect();
    let mut prepared = prepare_messages(&messages, syntax, if options.calls_tools() { &options.tools } else { &[] });
    if chat.fold_system && prepared.len() > 1 && prepared[0].get("role").and_then(Value::as_str) == Some("system") {
        // As llama.cpp: the system text, a newline, then the next message's.
        let system = prepared.remove(0);
        let text = |m: &Value| m.get("content").and_then(Value::as_str).unwrap_or("").to_string();
        let joined = format!("{}\n{}", text(&system), text(&prepared[0]));
        if let Some(first) = prepared[0].as_object_mut() {
            first.insert("content".into(), Value::String(joined));
        }
    }
    let render = Render {
        add_generation_prompt,
        tools: (syntax.template_shows_tools && !options.tools.is_empty()).then(|| options.tools.iter().map(|t| t.raw.clone()).collect()),
        kwargs: with_thinking_default(&options.template_kwargs),
    };
    chat.template.render_json(&prepared, &render, "messages")
}

/// The template's variables: `enable_thinking` is true unless the request
/// says otherwise, as llama.cpp renders (templates that close the thinking
/// of their generation prompt when it is not set would otherwise think
/// nothing by default).
fn with_thinking_default(kwargs: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let mut kwargs = kwargs.clone();
    kwargs.entry("enable_thinking").or_insert(Value::Bool(true));
    kwargs
}

/// Prepares `req`: renders its messages into its prompt and returns the
/// plan of its output (how it is read, what constrains it), which travels
/// beside the request in its `Job`. Requests without messages get a plan for
/// their JSON answer (`json_schema`, `response_format`), if any.
pub fn prepare(req: &mut CompletionRequest, chat: std::result::Result<&Chat, EngineError>, model: &LlamaModel) -> Result<ChatPlan> {
    let Some(messages) = &req.messages else {
        let grammar = match (&req.json_schema, &req.chat.response_format) {
            (Some(text), _) => Some((json_answer(&serde_json::from_str::<Value>(text).unwrap_or(Value::Bool(true))), "json_schema")),
            (None, Some(ResponseFormat::Json(schema))) => Some((json_answer(schema), "response_format")),
            _ => None,
        };
        return Ok(ChatPlan { grammar, ..ChatPlan::default() });
    };
    let chat = chat?;
    let options = &mut req.chat;
    // A JSON schema on a chat request is its answer's format.
    if let Some(text) = &req.json_schema {
        options.response_format = Some(ResponseFormat::Json(serde_json::from_str(text).unwrap_or(Value::Bool(true))));
    }
    let format = &chat.format;
    let syntax = &format.tools;
    let calls = options.calls_tools();
    let prompt = render(chat, messages, options, true)?;
    let start = reasoning_start(&prompt, format.reasoning.as_ref());
    let special = |text: &str| special_token(model, text);
    let separate = options.reasoning_format == ReasoningFormat::Auto;
    let output = OutputFormat {
        calls: calls.then(|| syntax.clone()),
        reasoning: if separate { format.reasoning.clone() } else { None },
        reasoning_start: start,
    };
    let mut markers: Vec<i32> = Vec::new();
    if calls {
        markers.extend([&syntax.open, &syntax.close].into_iter().chain(&syntax.alt_open).filter_map(|m| special(m)).map(|t| t as i32));
    }
    if let Some(m) = &format.reasoning {
        markers.extend([&m.start, &m.end].iter().filter_map(|m| special(m)).map(|t| t as i32));
    }
    let field = if calls {
        "tools"
    } else if req.json_schema.is_some() {
        "json_schema"
    } else {
        "response_format"
    };
    if let Some(native) = &chat.native {
        // llama.cpp reads this family's answers; what constrains them is
        // only a JSON answer's schema (tool calls are not constrained yet).
        let made = native.for_request(options)?;
        markers.extend(made.markers.iter().filter_map(|m| special(m)).map(|t| t as i32));
        for stop in &made.stops {
            if !req.stop.contains(stop) {
                req.stop.push(stop.clone());
            }
        }
        // A required or named call is forced in the family's own syntax:
        // llama.cpp's grammar for it, made fit for llguidance (`call_grammar`),
        // compiled as having read the generation prompt. Where that cannot
        // be done the call is only read. A JSON answer's schema constrains
        // as with every family.
        let grammar = if calls {
            native_call_grammar(&made, &prompt, &special).map(|g| (g, field))
        } else {
            constraint_grammar(format, options, start, &special).map(|g| (Grammar::Lark(g), field))
        };
        if req.grammar.is_some() && grammar.is_some() {
            return Err(EngineError::invalid(
                "grammar",
                "cannot be combined with a required tool call or a JSON response_format (they bring their own constraint)",
            ));
        }
        let budget = made.thinking.as_ref().and_then(|(start, end)| {
            let markers = ReasoningMarkers { start: start.clone(), end: end.clone() };
            budget_plan(options, &prompt, &markers)
        });
        req.prompt = vec![PromptPart::Chat(prompt)];
        return Ok(ChatPlan { output: None, reader: Some(made.parser.clone()), grammar, marker_tokens: markers, reasoning_budget: budget });
    }
    let grammar = constraint_grammar(format, options, start, &special).map(|g| (Grammar::Lark(g), field));
    if req.grammar.is_some() && grammar.is_some() {
        return Err(EngineError::invalid(
            "grammar",
            "cannot be combined with tools or a JSON response_format (they bring their own constraint)",
        ));
    }
    let plan = ChatPlan {
        output: (output.calls.is_some() || output.reasoning.is_some()).then_some(output),
        reader: None,
        grammar,
        marker_tokens: markers,
        reasoning_budget: format.reasoning.as_ref().and_then(|m| budget_plan(options, &prompt, m)),
    };
    req.prompt = vec![PromptPart::Chat(prompt)];
    Ok(plan)
}

/// The request's `reasoning_budget` with the family's thinking markers, and
/// whether `prompt` has opened the thinking already.
fn budget_plan(options: &ChatOptions, prompt: &str, markers: &ReasoningMarkers) -> Option<BudgetPlan> {
    let budget = options.reasoning_budget?;
    let open = reasoning_start(prompt, Some(markers)) == ReasoningStart::Open;
    Some(BudgetPlan { budget, start: markers.start.clone(), end: markers.end.clone(), open })
}

/// The constraint of a required call in a family llama.cpp reads, if its
/// grammar can be made fit for llguidance and starts where `prompt` ends.
fn native_call_grammar(made: &NativeMade, prompt: &str, special: &dyn Fn(&str) -> Option<u32>) -> Option<Grammar> {
    if made.call_gbnf.is_empty() || !prompt.ends_with(&made.generation_prompt) {
        return None;
    }
    let lark = call_grammar(&made.call_gbnf, special).ok()?;
    Some(Grammar::LarkAfter(lark, made.generation_prompt.clone()))
}

/// Parsers made for recent sets of tools and settings: agents send the same
/// tools every turn.
const NATIVE_KEPT: usize = 16;

/// A family llama.cpp's chat code reads (a parser per family in its
/// `common/chat.cpp`, or one its auto-parser derives from the template's
/// renders). Which family is read from what the template writes.
pub struct Native {
    pub name: &'static str,
    source: String,
    bos: String,
    eos: String,
    made: Mutex<Vec<(String, Arc<NativeMade>)>>,
}

/// What reading one request's answer needs.
pub struct NativeMade {
    pub parser: SharedParser,
    /// Texts of special tokens the parser reads (kept in the answer's text).
    pub markers: Vec<String>,
    /// Texts that end the answer (gpt-oss's `<|call|>`), as llama.cpp's server stops at them.
    pub stops: Vec<String>,
    /// llama.cpp's grammar for a required call (GBNF, from the generation
    /// prompt on), and that generation prompt; empty when it has none.
    pub call_gbnf: String,
    pub generation_prompt: String,
    /// The family's thinking markers (start, end), where it has them.
    pub thinking: Option<(String, String)>,
}

/// Families by a marker their templates write (for names; the parsing is
/// llama.cpp's whatever the name).
const FAMILIES: [(&str, &[&str]); 17] = [
    ("gpt-oss", &["<|channel|>"]),
    ("deepseek-v3.2", &["DSML"]),
    ("deepseek", &["tool▁calls▁begin"]),
    ("kimi-k2", &["<|tool_calls_section_begin|>"]),
    ("minimax-m2", &["<minimax:tool_call>"]),
    ("seed-oss", &["<seed:tool_call>"]),
    ("glm", &["<arg_key>"]),
    ("functionary-v3.1", &["Use the function '"]),
    ("qwen3-coder", &["<function=", "<parameter="]),
    ("command-r7b", &["<|START_ACTION|>"]),
    ("granite", &["<|tool_call|>"]),
    ("functionary", &[">>>all"]),
    ("firefunction", &["functools["]),
    ("apertus", &["<|tools_prefix|>"]),
    ("lfm2", &["<|tool_call_start|>"]),
    ("nemotron", &["<TOOLCALL>"]),
    ("gemma4", &["<|tool_call>"]),
];

impl Native {
    /// Whether llama.cpp reads more from this template's answers than
    /// plain text (a probe with one tool): then it reads them.
    fn detect(source: &str, bos: &str, eos: &str) -> Option<Native> {
        let probe = json!({
            "messages": [{ "role": "user", "content": "Hello" }],
            "tools": [{ "type": "function", "function": { "name": "probe", "description": "A probe.",
                "parameters": { "type": "object", "properties": { "x": { "type": "string" } } } } }],
        });
        let derived = chat_native::derive(source, bos, eos, &probe).ok()?;
        if derived.format == 0 || derived.parser.is_empty() {
            return None;
        }
        let name = FAMILIES.iter().find(|(_, markers)| markers.iter().any(|m| source.contains(m))).map(|(name, _)| *name).unwrap_or("auto");
        Some(Native { name, source: source.to_string(), bos: bos.to_string(), eos: eos.to_string(), made: Mutex::new(Vec::new()) })
    }

    /// The parser for a request with these options (made once per set of
    /// tools and settings).
    pub fn for_request(&self, options: &ChatOptions) -> Result<Arc<NativeMade>> {
        let thinking = options.template_kwargs.get("enable_thinking").and_then(Value::as_bool).unwrap_or(true);
        // A named call is a required call with only that tool to call.
        let choice = match options.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
            ToolChoice::Required | ToolChoice::Function(_) => "required",
        };
        let tools: Vec<Value> = match options.tool_choice {
            ToolChoice::Function(_) => options.callable().iter().map(|t| t.raw.clone()).collect(),
            _ => options.tools.iter().map(|t| t.raw.clone()).collect(),
        };
        let inputs = json!({
            "messages": [{ "role": "user", "content": "Hello" }],
            "tools": tools,
            "tool_choice": choice,
            "parallel_tool_calls": options.parallel_tool_calls,
            "enable_thinking": thinking,
            "chat_template_kwargs": options.template_kwargs,
            "reasoning_format": if options.reasoning_format == ReasoningFormat::Auto { "auto" } else { "none" },
        });
        let key = inputs.to_string();
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = made.iter().position(|(k, _)| *k == key) {
            let kept = made.remove(i);
            let m = kept.1.clone();
            made.push(kept);
            return Ok(m);
        }
        drop(made);
        let fail = |why: String| EngineError::invalid("messages", format!("llama.cpp cannot read this template's answers: {why}"));
        let derived = chat_native::derive(&self.source, &self.bos, &self.eos, &inputs).map_err(fail)?;
        let parser = Arc::new(NativeParser::new(&derived, options.reasoning_format == ReasoningFormat::Auto).map_err(fail)?);
        let mut markers = derived.preserved_tokens.clone();
        markers.push(derived.thinking_start_tag.clone());
        markers.extend(derived.thinking_end_tags.iter().cloned());
        markers.extend(derived.grammar_triggers.iter().map(|t| t.value.clone()));
        markers.retain(|m| !m.is_empty());
        let stops = derived.additional_stops.clone();
        // The call grammar is how the answer is written, whatever reading
        // of reasoning is asked for: derived with reasoning read apart.
        // (Derived for `reasoning_format: none`, llama.cpp's grammar has no
        // thinking block, though the generation prompt may have opened and
        // closed one; forced from that prompt, it could not be followed and
        // the call was not forced at all.)
        let for_grammar = if choice == "required" && options.reasoning_format != ReasoningFormat::Auto {
            let mut auto = inputs.clone();
            auto["reasoning_format"] = json!("auto");
            chat_native::derive(&self.source, &self.bos, &self.eos, &auto).map_err(fail)?
        } else {
            derived.clone()
        };
        // A lazy grammar waits for a trigger (tool_choice auto): not forced.
        let call_gbnf = if choice == "required" && !for_grammar.grammar_lazy { for_grammar.grammar.clone() } else { String::new() };
        // A tag-delimited value ends at its first closing tag, as the call
        // grammar ends it (core::chat::closing).
        let closers = value_closers(&derived.grammar);
        let m = Arc::new(NativeMade {
            parser: SharedParser(Arc::new(move |text: &str, partial| parser.parse(&close_values(text, &closers), partial))),
            markers,
            stops,
            call_gbnf,
            generation_prompt: for_grammar.generation_prompt.clone(),
            thinking: match (derived.thinking_start_tag.as_str(), derived.thinking_end_tags.first()) {
                (start, Some(end)) if !start.is_empty() && !end.is_empty() => Some((start.to_string(), end.clone())),
                _ => None,
            },
        });
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        made.push((key, m.clone()));
        if made.len() > NATIVE_KEPT {
            made.remove(0);
        }
        Ok(m)
    }
}

/// An answer a model wrote (here or elsewhere) read as the engine reads its
/// own: content, reasoning, tool calls (`parseChatOutput`). `options` are
/// the request's tools and settings; the prompt it answered is taken to be
/// a user's message rendered with them (which says whether its thinking
/// was already open).
pub fn read_answer(chat: &Chat, options: &ChatOptions, text: &str) -> Result<(String, Option<String>, Vec<ToolCall>)> {
    let separate = options.reasoning_format == ReasoningFormat::Auto;
    if let Some(native) = &chat.native {
        let made = native.for_request(options)?;
        let mut r = ReparseReader::new(made.parser.clone(), noise::from_os().random::<u64>());
        r.append(text);
        r.finish();
        let reasoning = (!r.reasoning().is_empty()).then(|| r.reasoning().to_string());
        return Ok((r.content().to_string(), reasoning, r.calls().to_vec()));
    }
    let user = vec![ChatMessage::new("user", "Hello")];
    let prompt = render(chat, &user, options, true)?;
    let format = &chat.format;
    let output = OutputFormat {
        calls: options.calls_tools().then(|| format.tools.clone()),
        reasoning: if separate { format.reasoning.clone() } else { None },
        reasoning_start: reasoning_start(&prompt, format.reasoning.as_ref()),
    };
    let mut p = OutputParser::new(output, noise::from_os().random::<u64>());
    p.push(text);
    p.finish();
    let reasoning = (!p.reasoning().is_empty()).then(|| p.reasoning().to_string());
    Ok((p.content().to_string(), reasoning, p.calls().to_vec()))
}
