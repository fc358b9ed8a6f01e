//! JSON values as callers send them, below both `request` and `chat`: how an
//! error message names a value (`describe`) and the JSON schemas of
//! `json_schema`, `response_format` and tools, checked and bounded before
//! llguidance compiles one (`schema`).

pub(crate) mod describe;
pub mod schema;
