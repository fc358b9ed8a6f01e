//! llama.cpp's own reading of chat output (its `common/chat.cpp`: a parser
//! per model family, or one its auto-parser derives from the template's
//! renders), through the small C wrapper of patch 0005. Our Jinja renders
//! the prompt; this only says how the model's answer is written and reads
//! it back: content, reasoning, tool calls — also part-way, as it streams.

use std::ffi::{c_char, CStr, CString};

use serde::Deserialize;
use serde_json::Value;

use llama_engine_core::chat::format::ParsedMessage;

/// What llama.cpp derived from a template for one set of inputs (tools,
/// thinking): its output format and the parser for it.
#[derive(Debug, Clone, Deserialize)]
pub struct Derived {
    pub format: i32,
    pub format_name: String,
    pub generation_prompt: String,
    pub grammar: String,
    pub grammar_lazy: bool,
    pub grammar_triggers: Vec<Trigger>,
    pub preserved_tokens: Vec<String>,
    pub additional_stops: Vec<String>,
    pub parser: String,
    pub supports_thinking: bool,
    pub thinking_start_tag: String,
    pub thinking_end_tags: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Trigger {
    #[serde(rename = "type")]
    pub kind: i32,
    pub value: String,
}

fn take(ptr: *mut c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string the wrapper allocated with malloc.
    let s = unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned();
    unsafe { llama_cpp_sys_2::llama_rs_string_free(ptr) };
    Some(s)
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| "contains a NUL byte".to_string())
}

/// Derives the output format of `template` for `inputs` (`messages`,
/// `tools`, `tool_choice`, `parallel_tool_calls`, `enable_thinking`,
/// `chat_template_kwargs`, `reasoning_format`).
pub fn derive(template: &str, bos: &str, eos: &str, inputs: &Value) -> Result<Derived, String> {
    let (t, b, e, i) = (cstring(template)?, cstring(bos)?, cstring(eos)?, cstring(&inputs.to_string())?);
    let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid C strings in; the wrapper catches every exception.
    let status = unsafe { llama_cpp_sys_2::llama_rs_chat_derive(t.as_ptr(), b.as_ptr(), e.as_ptr(), i.as_ptr(), &mut out, &mut err) };
    let (out, err) = (take(out), take(err));
    if status != llama_cpp_sys_2::LLAMA_RS_STATUS_OK {
        return Err(err.unwrap_or_else(|| format!("llama.cpp's chat code failed ({status})")));
    }
    serde_json::from_str(&out.unwrap_or_default()).map_err(|e| e.to_string())
}

/// Deepest bracket nesting given to llama.cpp's parsers, which recurse
/// once per level (JSON arguments); real answers nest a few levels.
pub const MAX_NESTING: usize = 256;

/// The deepest nesting of `{` and `[` in `text` (counted everywhere,
/// strings too: an over-estimate only).
fn nesting(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// A parser made from `Derived`: reads an answer, whole or part-way.
pub struct NativeParser(*mut llama_cpp_sys_2::llama_rs_chat_parser);

// SAFETY: parsing only reads the parser (a const method in llama.cpp).
unsafe impl Send for NativeParser {}
unsafe impl Sync for NativeParser {}

impl Drop for NativeParser {
    fn drop(&mut self) {
        // SAFETY: made by llama_rs_chat_parser_new, freed once.
        unsafe { llama_cpp_sys_2::llama_rs_chat_parser_free(self.0) }
    }
}

#[derive(Debug, Deserialize)]
struct Msg {
    content: String,
    reasoning_content: String,
    tool_calls: Vec<Call>,
}

#[derive(Debug, Deserialize)]
struct Call {
    name: String,
    arguments: String,
    id: String,
}

impl NativeParser {
    pub fn new(derived: &Derived, reasoning: bool) -> Result<NativeParser, String> {
        let params = serde_json::json!({
            "format": derived.format,
            "generation_prompt": derived.generation_prompt,
            "parser": derived.parser,
            "reasoning_format": if reasoning { "auto" } else { "none" },
        });
        let p = cstring(&params.to_string())?;
        let mut err = std::ptr::null_mut();
        // SAFETY: a valid C string in; exceptions caught by the wrapper.
        let parser = unsafe { llama_cpp_sys_2::llama_rs_chat_parser_new(p.as_ptr(), &mut err) };
        let err = take(err);
        if parser.is_null() {
            return Err(err.unwrap_or_else(|| "llama.cpp could not load the parser".into()));
        }
        Ok(NativeParser(parser))
    }

    /// Reads `text` (`partial`: more may follow). Text nested deeper than
    /// llama.cpp's recursive parsers can safely follow is not given to them.
    pub fn parse(&self, text: &str, partial: bool) -> Result<ParsedMessage, String> {
        if nesting(text) > MAX_NESTING {
            return Err(format!("the answer nests brackets deeper than {MAX_NESTING}"));
        }
        let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the bytes of `text` with their length; the parser lives.
        let status =
            unsafe { llama_cpp_sys_2::llama_rs_chat_parser_parse(self.0, text.as_ptr().cast(), text.len(), partial, &mut out, &mut err) };
        let (out, err) = (take(out), take(err));
        if status != llama_cpp_sys_2::LLAMA_RS_STATUS_OK {
            return Err(err.unwrap_or_else(|| format!("llama.cpp could not read the answer ({status})")));
        }
        let msg: Msg = serde_json::from_str(&out.unwrap_or_default()).map_err(|e| e.to_string())?;
        // As llama.cpp's server answers: reasoning and content without the
        // white space around them (the line breaks about their markers).
        Ok(ParsedMessage {
            content: msg.content.trim().to_string(),
            reasoning: msg.reasoning_content.trim().to_string(),
            calls: msg.tool_calls.into_iter().map(|c| (c.id, c.name, c.arguments)).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints what llama.cpp derives for a template (`TEMPLATE=path`): its
    /// format, stops, markers and call grammar: `cargo test --release --lib derive_prints -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn derive_prints() {
        let path = std::env::var("TEMPLATE").unwrap();
        let source = std::fs::read_to_string(path).unwrap();
        let inputs = serde_json::json!({
            "messages": [{ "role": "user", "content": "Hello" }],
            "tools": [{ "type": "function", "function": { "name": "get_weather", "description": "d",
                "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } }],
            "tool_choice": "required",
        });
        let d = derive(&source, "<s>", "</s>", &inputs).unwrap();
        println!(
            "format {} {} lazy {} stops {:?} preserved {:?}",
            d.format, d.format_name, d.grammar_lazy, d.additional_stops, d.preserved_tokens
        );
        println!("GBNF:\n{}", d.grammar);
        if let Ok(out) = std::env::var("OUT") {
            // A fixture for `core::chat::call_grammar`'s tests.
            let prompt = serde_json::to_string(&d.generation_prompt).unwrap();
            std::fs::write(out, format!("# generation prompt: {prompt}\n{}", d.grammar)).unwrap();
        }
    }
}
