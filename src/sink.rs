//! The one wrapper around `ThreadsafeFunction` used to stream a request's
//! events into JavaScript. Every event of a request, including the final
//! `done` (or its error), goes through the same function, so they reach JS
//! in order and the JS side can settle the promise on the last one.

use napi::bindgen_prelude::{Function, JsValuesTupleIntoVec, ToNapiValue};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{sys, Status};
use std::cell::RefCell;

use serde::Serialize;

use crate::error::JsEngineError;
use llama_engine_core::error::EngineError;
use llama_engine_core::text::events::{CompletionResult, EventSink, PromptProgress, TokenEvent};

/// What a request's callback receives: an event as JSON, or its error as a
/// JavaScript `Error` with its `code`.
pub enum Outgoing {
    Event(String),
    Error(EngineError),
}

impl ToNapiValue for Outgoing {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        match val {
            Outgoing::Event(json) => unsafe { String::to_napi_value(env, json) },
            Outgoing::Error(e) => unsafe { JsEngineError::to_napi_value(env, JsEngineError(e)) },
        }
    }
}

/// Strong (not weak): a pending request keeps the process alive, as a
/// pending timer would. It is released when the request finishes, so an idle
/// engine holds nothing open.
pub type EventFn = ThreadsafeFunction<Outgoing, (), Outgoing, Status, false, false, 0>;

pub struct JsEventSink {
    tsfn: EventFn,
    /// Whether the final `done` or `error` was sent.
    answered: bool,
}

impl JsEventSink {
    pub fn new(tsfn: EventFn) -> Self {
        JsEventSink { tsfn, answered: false }
    }

    /// The threadsafe function a request's events go through.
    pub fn function<A: JsValuesTupleIntoVec + 'static>(on_event: &Function<'_, A, ()>) -> napi::Result<EventFn> {
        on_event.build_threadsafe_function::<Outgoing>().callee_handled::<false>().weak::<false>().build_callback(|ctx| Ok(ctx.value))
    }

    fn send(&self, out: Outgoing) -> bool {
        self.tsfn.call(out, ThreadsafeFunctionCallMode::NonBlocking) == Status::Ok
    }
}

#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    r#type: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

fn to_json<T: Serialize>(kind: &'static str, body: &T) -> Outgoing {
    match serde_json::to_string(&Tagged { r#type: kind, body }) {
        Ok(json) => Outgoing::Event(json),
        Err(e) => Outgoing::Error(EngineError::internal(format!("cannot serialise an event: {e}"))),
    }
}

impl EventSink for JsEventSink {
    fn token(&mut self, event: &TokenEvent) -> bool {
        self.send(to_json("token", event))
    }

    fn progress(&mut self, progress: &PromptProgress) -> bool {
        self.send(to_json("progress", progress))
    }

    fn finish(mut self: Box<Self>, outcome: Result<CompletionResult, EngineError>) {
        let out = match outcome {
            Ok(result) => to_json("done", &result),
            Err(e) => Outgoing::Error(e),
        };
        self.answered = true;
        self.send(out);
    }

    fn reply(mut self: Box<Self>, outcome: Result<serde_json::Value, EngineError>) {
        let out = match outcome {
            Ok(value) => to_json("done", &value),
            Err(e) => Outgoing::Error(e),
        };
        self.answered = true;
        self.send(out);
    }
}

thread_local! {
    /// The last panic on this thread (where and why), noted by the addon's
    /// panic hook before the stack unwinds.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Called by the panic hook: what a sink dropped while this panic unwinds
/// says its request failed of. (The hook is not installed in unit tests.)
#[cfg_attr(test, allow(dead_code))]
pub fn note_panic(info: &std::panic::PanicHookInfo<'_>) {
    let why = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    let at = info.location().map(|l| format!(" (at {}:{})", l.file(), l.line())).unwrap_or_default();
    LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{why}{at}")));
}

/// Every request's promise settles: one dropped without an answer rejects
/// with INTERNAL, naming the cause — the panic it was dropped in (the
/// engine thread goes on with its other requests), or, dropped otherwise,
/// that it is a bug of the engine's.
impl Drop for JsEventSink {
    fn drop(&mut self) {
        if !self.answered {
            let panic = if std::thread::panicking() { LAST_PANIC.with(|p| p.borrow().clone()) } else { None };
            let message = match panic {
                Some(why) => format!("the engine recovered from a panic while handling this request: {why}"),
                None => "the engine dropped this request without an answer (a bug in llama-engine: please report it)".to_string(),
            };
            self.send(Outgoing::Error(EngineError::internal(message)));
        }
    }
}
