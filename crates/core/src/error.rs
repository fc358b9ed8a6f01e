//! The one error type of llama-engine. Every failure that reaches JavaScript
//! is an `EngineError`; its `code` is stable and part of the public contract.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    ModelLoadFailed,
    IncompatibleDraft,
    Disposed,
    InvalidSession,
    /// A prompt longer than the context, with `context_shift: false`
    /// (`prompt_tokens`, `context_size` say by how much).
    ContextExceeded,
    /// The engine's process (`isolation: 'process'`) died; the request did not finish.
    EngineCrashed,
    /// The isolated engine's process is restarting after a crash and the
    /// next one starts later than a caller should wait (`retryAfterMs`).
    EngineRestarting,
    Internal,
}

impl ErrorCode {
    /// Every code, in documentation order: the one list the binding exports
    /// (`errorCodes()`) and `index.d.ts` and the README are checked against.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::InvalidRequest,
        ErrorCode::ModelLoadFailed,
        ErrorCode::IncompatibleDraft,
        ErrorCode::Disposed,
        ErrorCode::InvalidSession,
        ErrorCode::ContextExceeded,
        ErrorCode::EngineCrashed,
        ErrorCode::EngineRestarting,
        ErrorCode::Internal,
    ];

    /// The wire name, set as `code` on the JavaScript `Error`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::ModelLoadFailed => "MODEL_LOAD_FAILED",
            ErrorCode::IncompatibleDraft => "INCOMPATIBLE_DRAFT",
            ErrorCode::Disposed => "DISPOSED",
            ErrorCode::InvalidSession => "INVALID_SESSION",
            ErrorCode::ContextExceeded => "CONTEXT_EXCEEDED",
            ErrorCode::EngineCrashed => "ENGINE_CRASHED",
            ErrorCode::EngineRestarting => "ENGINE_RESTARTING",
            ErrorCode::Internal => "INTERNAL",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    pub code: ErrorCode,
    pub message: String,
    /// The request field at fault (`response_format.json_schema.schema`,
    /// `tools[0].function.parameters.properties.a`), for an
    /// `INVALID_REQUEST`: set on the JavaScript error as `field`, so that
    /// callers (the server's `param`) never parse the message.
    pub field: Option<String>,
    /// For `CONTEXT_EXCEEDED`: the prompt's tokens and the context's cells
    /// (set on the JavaScript error as `promptTokens`, `contextSize`).
    pub context: Option<(usize, usize)>,
}

impl EngineError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        EngineError { code, message: message.into(), field: None, context: None }
    }

    /// A request field of the wrong type or out of range. The message starts
    /// with the field's wire name too, for people reading it.
    pub fn invalid(field: &str, why: impl fmt::Display) -> Self {
        EngineError { code: ErrorCode::InvalidRequest, message: format!("{field}: {why}"), field: Some(field.to_string()), context: None }
    }

    /// A prompt of `prompt_tokens` that a context of `context_size` cells
    /// cannot hold (`context_shift: false`). The message is llama-server's.
    pub fn context_exceeded(prompt_tokens: usize, context_size: usize) -> Self {
        EngineError {
            code: ErrorCode::ContextExceeded,
            message: format!(
                "the request exceeds the available context size: the prompt takes {prompt_tokens} tokens, the context holds {context_size} (context_shift: false)"
            ),
            field: None,
            context: Some((prompt_tokens, context_size)),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn disposed() -> Self {
        Self::new(ErrorCode::Disposed, "the engine has been disposed")
    }

    /// The error a panic caught on an engine thread becomes.
    pub fn from_panic(panic: &(dyn std::any::Any + Send)) -> Self {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Self::internal(format!("the engine recovered from a panic: {why}"))
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for EngineError {}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_upper_snake_case() {
        let names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        for (i, n) in names.iter().enumerate() {
            assert!(n.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{n}");
            assert!(!names[..i].contains(n), "{n} twice");
        }
    }
}
