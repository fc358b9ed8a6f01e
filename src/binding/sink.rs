//! The one wrapper around `ThreadsafeFunction` used to stream a request's
//! events into JavaScript. Every event of a request, including the final
//! `done` (or `error`), goes through the same function, so they reach JS in
//! order and the JS side can settle the promise on the last one.

use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use serde::Serialize;

use crate::core::error::EngineError;
use crate::core::events::{CompletionResult, EventSink, TokenEvent};

/// Strong (not weak): a pending request keeps the process alive, as a
/// pending timer would. It is released when the request finishes, so an idle
/// engine holds nothing open.
pub type EventFn = ThreadsafeFunction<String, (), String, Status, false, false, 0>;

pub struct JsEventSink {
    tsfn: EventFn,
    /// Whether the final `done` or `error` was sent.
    finished: bool,
}

impl JsEventSink {
    pub fn new(tsfn: EventFn) -> Self {
        JsEventSink { tsfn, finished: false }
    }

    fn send(&self, json: String) -> bool {
        self.tsfn.call(json, ThreadsafeFunctionCallMode::NonBlocking) == Status::Ok
    }
}

#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    r#type: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

#[derive(Serialize)]
struct WireError<'a> {
    code: &'a str,
    message: &'a str,
}

pub fn to_json<T: Serialize>(kind: &'static str, body: &T) -> String {
    serde_json::to_string(&Tagged { r#type: kind, body })
        .unwrap_or_else(|e| format!(r#"{{"type":"error","code":"INTERNAL","message":"cannot serialise an event: {e}"}}"#))
}

pub fn error_json(e: &EngineError) -> String {
    to_json("error", &WireError { code: e.code.as_str(), message: &e.message })
}

impl EventSink for JsEventSink {
    fn token(&mut self, event: &TokenEvent) -> bool {
        self.send(to_json("token", event))
    }

    fn finish(mut self: Box<Self>, outcome: Result<CompletionResult, EngineError>) {
        let json = match outcome {
            Ok(result) => to_json("done", &result),
            Err(e) => error_json(&e),
        };
        self.finished = true;
        self.send(json);
    }
}

/// Every request's promise settles: one dropped without an answer (the
/// engine lost it, in a panic say) rejects with INTERNAL.
impl Drop for JsEventSink {
    fn drop(&mut self) {
        if !self.finished {
            self.send(error_json(&EngineError::internal("the engine lost this request (see the other rejections for why)")));
        }
    }
}
