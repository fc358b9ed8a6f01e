//! How error messages name what the user sent: a JSON value's type, and a
//! bounded excerpt of user text. A leaf, so the request parser and the chat
//! parsers (messages, tools) both use it without importing each other.

use std::borrow::Cow;

use serde_json::Value;

/// A JSON value's type, as JSON Schema names it.
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// At most `max_chars` characters of user text, for error messages.
pub(crate) fn truncate(text: &str, max_chars: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => Cow::Owned(format!("{}…", &text[..end])),
        None => Cow::Borrowed(text),
    }
}
