//! Chat requests' `messages` (OpenAI's shape), checked before anything is
//! rendered: roles, contents (a string or text parts), and the fields a
//! template may read besides.

use serde_json::{Map, Value as Json};

use crate::error::{EngineError, Result};
use crate::json::describe::{truncate, type_name};
use crate::request::media::{is_media_part, parse_media_part, MediaInput, MAX_MEDIA_PARTS, MEDIA_MARKER};

/// Most messages in one request.
pub const MAX_MESSAGES: usize = 100_000;
/// The roles a message may have.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];
/// Text of all messages together (the prompt size limit).
const MAX_MESSAGES_BYTES: usize = 8 * 1024 * 1024;

/// One message. `content` is the text (text parts joined); the fields a
/// template may use besides (`name`, `tool_calls`, `tool_call_id`) pass
/// through as they were given.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    /// `None` only for an assistant message that carries `tool_calls`.
    pub content: Option<String>,
    pub extra: Map<String, Json>,
    /// Its images and audio, in order: each stands in `content` as
    /// `MEDIA_MARKER`.
    pub media: Vec<MediaInput>,
    /// Given as text parts: those joined with a blank line, the text a last
    /// assistant message is continued with (as llama-server continues one).
    pub continued: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: Some(content.into()), extra: Map::new(), media: Vec::new(), continued: None }
    }

    pub fn to_json(&self) -> Json {
        let mut m = self.extra.clone();
        m.insert("role".into(), Json::String(self.role.clone()));
        m.insert("content".into(), self.content.clone().map_or(Json::Null, Json::String));
        Json::Object(m)
    }
}

/// Parses and checks `messages` (the wire name is `field`, used in errors:
/// `messages[2].content` …).
pub fn parse_messages(value: &Json, field: &str) -> Result<Vec<ChatMessage>> {
    let items =
        value.as_array().ok_or_else(|| EngineError::invalid(field, format!("expected an array of messages, got {}", type_name(value))))?;
    if items.is_empty() {
        return Err(EngineError::invalid(field, "must contain at least one message"));
    }
    if items.len() > MAX_MESSAGES {
        return Err(EngineError::invalid(field, format!("at most {MAX_MESSAGES} messages are allowed, got {}", items.len())));
    }
    let mut bytes = 0usize;
    let mut n_media = 0usize;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let map = item
            .as_object()
            .ok_or_else(|| EngineError::invalid(&at, format!("expected an object with role and content, got {}", type_name(item))))?;
        let role = match map.get("role") {
            Some(Json::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
            Some(Json::String(r)) => {
                return Err(EngineError::invalid(
                    &format!("{at}.role"),
                    format!("expected \"system\", \"user\", \"assistant\" or \"tool\", got {:?}", truncate(r, 40)),
                ))
            }
            None => return Err(EngineError::invalid(&format!("{at}.role"), "required (\"system\", \"user\", \"assistant\" or \"tool\")")),
            Some(other) => return Err(EngineError::invalid(&format!("{at}.role"), format!("expected a string, got {}", type_name(other)))),
        };
        if let Some(calls) = map.get("tool_calls").filter(|v| !v.is_null()) {
            if role != "assistant" {
                return Err(EngineError::invalid(&format!("{at}.tool_calls"), "only assistant messages call tools"));
            }
            check_tool_calls(calls, &format!("{at}.tool_calls"))?;
        }
        for key in ["name", "tool_call_id", "reasoning_content"] {
            if let Some(v) = map.get(key).filter(|v| !v.is_null() && !v.is_string()) {
                return Err(EngineError::invalid(&format!("{at}.{key}"), format!("expected a string, got {}", type_name(v))));
            }
        }
        let mut extra = Map::new();
        for key in ["name", "tool_call_id", "tool_calls", "reasoning_content"] {
            if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
                bytes += v.to_string().len();
                extra.insert(key.into(), v.clone());
            }
        }
        let mut media = Vec::new();
        let continued = match map.get("content") {
            Some(Json::Array(parts)) => {
                let texts: Vec<&str> = parts.iter().filter_map(|p| p.get("text").and_then(Json::as_str)).collect();
                Some(texts.join("\n\n"))
            }
            _ => None,
        };
        let content = match map.get("content") {
            Some(Json::String(text)) => Some(no_marker(text, &format!("{at}.content"))?.clone()),
            Some(Json::Array(parts)) => Some(text_parts(parts, &format!("{at}.content"), &mut media, &mut n_media)?),
            None | Some(Json::Null) if role == "assistant" && extra.contains_key("tool_calls") => None,
            None => {
                return Err(EngineError::invalid(
                    &format!("{at}.content"),
                    "required: a string or an array of { type: \"text\", text } parts",
                ))
            }
            Some(other) => {
                return Err(EngineError::invalid(
                    &format!("{at}.content"),
                    format!("expected a string or an array of {{ type: \"text\", text }} parts, got {}", type_name(other)),
                ))
            }
        };
        bytes += content.as_ref().map_or(0, String::len) + role.len();
        if bytes > MAX_MESSAGES_BYTES {
            return Err(EngineError::invalid(field, format!("at most {MAX_MESSAGES_BYTES} bytes of text are allowed")));
        }
        out.push(ChatMessage { role, content, extra, media, continued });
    }
    Ok(out)
}

/// An assistant message's `tool_calls`: OpenAI's shape, `arguments` a JSON
/// text (or, as Hugging Face has it, an object).
fn check_tool_calls(calls: &Json, at: &str) -> Result<()> {
    let items = calls.as_array().ok_or_else(|| EngineError::invalid(at, format!("expected an array, got {}", type_name(calls))))?;
    for (j, call) in items.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let f = call
            .get("function")
            .and_then(Json::as_object)
            .ok_or_else(|| EngineError::invalid(&format!("{here}.function"), "required: { name, arguments }"))?;
        if !f.get("name").is_some_and(Json::is_string) {
            return Err(EngineError::invalid(&format!("{here}.function.name"), "required: a string"));
        }
        match f.get("arguments") {
            None | Some(Json::Null) | Some(Json::Object(_)) => {}
            Some(Json::String(text)) => {
                if serde_json::from_str::<Json>(text).is_err() {
                    return Err(EngineError::invalid(&format!("{here}.function.arguments"), "not valid JSON"));
                }
            }
            Some(other) => {
                return Err(EngineError::invalid(
                    &format!("{here}.function.arguments"),
                    format!("expected a JSON string, got {}", type_name(other)),
                ))
            }
        }
        if let Some(id) = call.get("id").filter(|v| !v.is_null() && !v.is_string()) {
            return Err(EngineError::invalid(&format!("{here}.id"), format!("expected a string, got {}", type_name(id))));
        }
    }
    Ok(())
}

/// Text that does not hold the media marker (it would take a media's place).
fn no_marker<'a>(text: &'a String, at: &str) -> Result<&'a String> {
    if text.contains(MEDIA_MARKER) {
        return Err(EngineError::invalid(at, format!("text must not contain {MEDIA_MARKER}")));
    }
    Ok(text)
}

/// The text of an OpenAI content-parts array: its text parts, joined, with
/// each media part (image, audio) as the media marker and its bytes in `media`.
pub fn text_parts(parts: &[Json], at: &str, media: &mut Vec<MediaInput>, n_media: &mut usize) -> Result<String> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let map = part
            .as_object()
            .ok_or_else(|| EngineError::invalid(&here, format!("expected a {{ type, text }} object, got {}", type_name(part))))?;
        match map.get("type").and_then(Json::as_str) {
            Some("text" | "input_text") => {}
            Some(ty) if is_media_part(ty) => {
                *n_media += 1;
                if *n_media > MAX_MEDIA_PARTS {
                    return Err(EngineError::invalid(&here, format!("at most {MAX_MEDIA_PARTS} images and audio files per request")));
                }
                media.push(parse_media_part(map, ty, &here)?);
                text.push_str(MEDIA_MARKER);
                continue;
            }
            Some(other) => {
                return Err(EngineError::invalid(
                    &format!("{here}.type"),
                    format!("expected \"text\", \"image\", \"image_url\", \"audio\" or \"input_audio\", got {:?}", truncate(other, 40)),
                ))
            }
            None => return Err(EngineError::invalid(&format!("{here}.type"), "required: \"text\"")),
        }
        match map.get("text") {
            Some(Json::String(t)) => text.push_str(no_marker(t, &format!("{here}.text"))?),
            _ => return Err(EngineError::invalid(&format!("{here}.text"), "expected a string")),
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: Json) -> Vec<ChatMessage> {
        parse_messages(&v, "messages").unwrap()
    }

    #[test]
    fn text_parts_are_joined() {
        let m = msgs(json!([{ "role": "user", "content": [{ "type": "text", "text": "Hello, " }, { "type": "text", "text": "world" }] }]));
        assert_eq!(m[0].content.as_deref(), Some("Hello, world"));
        // Continued (a last assistant message), llama-server joins them with a blank line.
        assert_eq!(m[0].continued.as_deref(), Some("Hello, \n\nworld"));
        assert_eq!(msgs(json!([{ "role": "user", "content": "Hi" }]))[0].continued, None);
    }

    #[test]
    fn bad_messages_name_the_field() {
        for (v, field) in [
            (json!("hi"), "messages:"),
            (json!([]), "messages:"),
            (json!([1]), "messages[0]:"),
            (json!([{ "content": "x" }]), "messages[0].role:"),
            (json!([{ "role": 3, "content": "x" }]), "messages[0].role:"),
            (json!([{ "role": "", "content": "x" }]), "messages[0].role:"),
            (json!([{ "role": "robot", "content": "x" }]), "messages[0].role:"),
            (json!([{ "role": "user", "content": "x", "tool_calls": [] }]), "messages[0].tool_calls:"),
            (
                json!([{ "role": "assistant", "content": null, "tool_calls": [{ "function": { "name": "f", "arguments": "{" } }] }]),
                "messages[0].tool_calls[0].function.arguments:",
            ),
            (
                json!([{ "role": "assistant", "content": null, "tool_calls": [{ "function": { "arguments": "{}" } }] }]),
                "messages[0].tool_calls[0].function.name:",
            ),
            (json!([{ "role": "tool", "content": "x", "tool_call_id": 5 }]), "messages[0].tool_call_id:"),
            (json!([{ "role": "user" }]), "messages[0].content:"),
            (json!([{ "role": "user", "content": 5 }]), "messages[0].content:"),
            (json!([{ "role": "user", "content": null }]), "messages[0].content:"),
            (json!([{ "role": "user", "content": [{ "type": "image_url", "image_url": {} }] }]), "messages[0].content[0].image_url.url:"),
            (json!([{ "role": "user", "content": [{ "type": "video" }] }]), "messages[0].content[0].type:"),
            (json!([{ "role": "user", "content": [{ "type": "text" }] }]), "messages[0].content[0].text:"),
            (json!([{ "role": "user", "content": "ok" }, { "role": "user", "content": ["x"] }]), "messages[1].content[0]:"),
        ] {
            let e = parse_messages(&v, "messages").unwrap_err();
            assert!(e.message.starts_with(field), "{v}: {}", e.message);
        }
        // An assistant turn that only calls tools may have no content.
        let m = msgs(
            json!([{ "role": "assistant", "content": null, "tool_calls": [{ "id": "1", "type": "function", "function": { "name": "f", "arguments": "{}" } }] }]),
        );
        assert_eq!(m[0].content, None);
    }
}
