//! The one error type of llama-engine. Every failure that reaches JavaScript
//! is an `EngineError`; its `code` is stable and part of the public contract.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    ModelLoadFailed,
    IncompatibleDraft,
    Disposed,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::ModelLoadFailed => "MODEL_LOAD_FAILED",
            ErrorCode::IncompatibleDraft => "INCOMPATIBLE_DRAFT",
            ErrorCode::Disposed => "DISPOSED",
            ErrorCode::Internal => "INTERNAL",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    pub code: ErrorCode,
    pub message: String,
}

impl EngineError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        EngineError { code, message: message.into() }
    }

    /// A request field of the wrong type or out of range. The message starts
    /// with the field's wire name so callers can tell which one.
    pub fn invalid(field: &str, why: impl fmt::Display) -> Self {
        Self::new(ErrorCode::InvalidRequest, format!("{field}: {why}"))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn disposed() -> Self {
        Self::new(ErrorCode::Disposed, "the engine has been disposed")
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for EngineError {}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
