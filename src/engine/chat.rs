//! Chat requests made ready for the engine thread, on the caller's thread so
//! that errors reject before anything is queued: the messages prepared for
//! the model's template and rendered (with the tools, or the generic
//! preamble), and the plan of the generation — how its output is read
//! (reasoning, tool calls) and what constrains it.

use llama_cpp_2::model::LlamaModel;
use serde_json::Value;

use super::model::special_token;
use crate::core::chat::format::OutputFormat;
use crate::core::chat::format::{constraint_grammar, json_answer, prepare_messages, reasoning_start, ChatFormat, ChatPlan, Family};
use crate::core::chat::template::Render;
use crate::core::chat::tools::{ChatOptions, ReasoningFormat, ResponseFormat};
use crate::core::chat::{ChatMessage, ChatTemplate};
use crate::core::error::{EngineError, Result};
use crate::core::request::{CompletionRequest, PromptPart};
use crate::core::sampling::constraint::Grammar;

/// A model's chat template and what it tells of its output formats.
pub struct Chat {
    pub template: ChatTemplate,
    pub format: ChatFormat,
}

impl Chat {
    pub fn new(template: ChatTemplate, source: &str, forced: Option<Family>) -> Chat {
        let format = ChatFormat::detect(&template, source, forced);
        Chat { template, format }
    }
}

/// The text `messages` render to with `options`: prepared for the model's
/// format (calls written as it writes them; with the generic format, tool
/// results as user turns and the tools in a system preamble) and rendered
/// with the tools and the template's extra variables.
pub fn render(chat: &Chat, messages: &[ChatMessage], options: &ChatOptions, add_generation_prompt: bool) -> Result<String> {
    let syntax = &chat.format.tools;
    let messages: Vec<Value> = messages.iter().map(ChatMessage::to_json).collect();
    let prepared = prepare_messages(&messages, syntax, if options.calls_tools() { &options.tools } else { &[] });
    let render = Render {
        add_generation_prompt,
        tools: (syntax.template_shows_tools && !options.tools.is_empty()).then(|| options.tools.iter().map(|t| t.raw.clone()).collect()),
        kwargs: options.template_kwargs.clone(),
    };
    chat.template.render_json(&prepared, &render, "messages")
}

/// Prepares `req`: renders its messages into its prompt and plans its
/// output. Requests without messages get a plan for their JSON answer
/// (`json_schema`, `response_format`), if any.
pub fn prepare(req: &mut CompletionRequest, chat: std::result::Result<&Chat, EngineError>, model: &LlamaModel) -> Result<()> {
    let Some(messages) = &req.messages else {
        req.plan.grammar = match (&req.json_schema, &req.chat.response_format) {
            (Some(text), _) => Some((json_answer(&serde_json::from_str::<Value>(text).unwrap_or(Value::Bool(true))), "json_schema")),
            (None, Some(ResponseFormat::Json(schema))) => Some((json_answer(schema), "response_format")),
            _ => None,
        };
        return Ok(());
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
    let grammar = constraint_grammar(format, options, start, &special).map(|g| (Grammar::Lark(g), field));
    req.plan =
        ChatPlan { output: (output.calls.is_some() || output.reasoning.is_some()).then_some(output), grammar, marker_tokens: markers };
    req.prompt = vec![PromptPart::Chat(prompt)];
    Ok(())
}
