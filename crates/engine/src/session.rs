//! `saveSession` and `loadSession` on the handle's side: the conversation
//! checked and rendered, the file read and checked off the JS thread, then
//! a session job for the engine thread (`worker/session.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::chat;
use super::shared::{Job, SessionJob};
use super::Engine;
use crate::kv::kv_settings;
use llama_engine_core::cache::session::{Expect, ModelId, Session};
use llama_engine_core::chat::format::ChatPlan;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::request::{parse_request, CompletionRequest, PromptPart, RequestLimits};
use llama_engine_core::text::events::EventSink;

/// Fields a conversation to save may have: a chat (`messages` and what
/// else reaches its template) or a `prompt`.
const CONVERSATION_FIELDS: [&str; 6] = ["messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "prompt"];

fn check_path(path: &str) -> Result<PathBuf> {
    if path.is_empty() || path.contains('\0') {
        return Err(EngineError::invalid("path", "expected a file path"));
    }
    Ok(PathBuf::from(path))
}

impl Engine {
    /// Queues a session save: `conversation` (`{ messages, tools? … }` or
    /// `{ prompt }`) is rendered as its next request will start (chat
    /// messages without the assistant's opening), evaluated into a slot
    /// (reusing whatever prefix is cached) and written to `path`.
    /// The conversation arrives as JSON and is parsed, rendered and
    /// tokenized on the preparing thread.
    pub fn save_session(&self, path: String, conversation_json: String, sink: Box<dyn EventSink>) {
        self.prepare_then(sink, move |engine, sink| {
            let job = serde_json::from_str::<Value>(&conversation_json)
                .map_err(|e| EngineError::invalid("conversation", format!("not valid JSON ({e})")))
                .and_then(|conversation| engine.save_job(&path, conversation))
                .and_then(|(request, session)| Ok((engine.tokenize_request(&request)?, request, session)));
            super::memory::release_after(conversation_json.len());
            match job {
                Ok((tokens, request, session)) => {
                    let id = engine.next_job_id();
                    let cancel = Arc::new(AtomicBool::new(false));
                    engine.submit(Job {
                        id,
                        request,
                        plan: ChatPlan::default(),
                        sink,
                        cancel,
                        session: Some(session),
                        compiled: None,
                        tokens: Some(tokens.tokens),
                        media: tokens.media,
                        encode_ms: tokens.encode_ms,
                    });
                }
                Err(e) => sink.reply(Err(e)),
            }
        });
    }

    fn save_job(&self, path: &str, conversation: Value) -> Result<(CompletionRequest, SessionJob)> {
        if self.is_closed() {
            return Err(EngineError::disposed());
        }
        let path = check_path(path)?;
        let Value::Object(conv) = &conversation else {
            return Err(EngineError::invalid("conversation", "expected { messages } or { prompt }"));
        };
        if let Some(k) = conv.keys().find(|k| !CONVERSATION_FIELDS.contains(&k.as_str())) {
            return Err(EngineError::invalid(
                &format!("conversation.{k}"),
                "not part of a conversation (messages, tools, tool_choice, parallel_tool_calls, chat_template_kwargs; or prompt)",
            ));
        }
        if !conv.contains_key("messages") && !conv.contains_key("prompt") {
            return Err(EngineError::invalid("conversation", "expected { messages } or { prompt }"));
        }
        let mut fields: Map<String, Value> = conv.clone();
        fields.insert("n_predict".into(), json!(0));
        fields.insert("temperature".into(), json!(0));
        fields.insert("speculative".into(), json!({ "mode": "off" }));
        let limits = RequestLimits { n_vocab: self.info.n_vocab, n_ctx: self.info.n_ctx };
        let mut request = parse_request(&Value::Object(fields), &limits)?;
        // (The messages stay: their images and audio are tokenized with the text.)
        if let Some(messages) = &request.messages {
            let text = chat::render(self.vocab().chat()?, messages, &request.chat, false)?;
            request.prompt = vec![PromptPart::Chat(text)];
            request.chat = Default::default();
        }
        Ok((request, SessionJob::Save { path, conversation }))
    }

    /// Queues a job with no request of its own (a slot's save or erase).
    fn submit_slot_job(&self, session: SessionJob, sink: Box<dyn EventSink>) {
        if self.is_closed() {
            return sink.reply(Err(EngineError::disposed()));
        }
        let job = Job {
            id: self.next_job_id(),
            request: CompletionRequest::default(),
            plan: ChatPlan::default(),
            sink,
            cancel: Arc::new(AtomicBool::new(false)),
            session: Some(session),
            compiled: None,
            tokens: None,
            media: Vec::new(),
            encode_ms: 0.0,
        };
        if let Err(job) = self.shared.submit(job) {
            job.sink.reply(Err(EngineError::disposed()));
        }
    }

    /// Writes what idle slot `slot` holds (its cells and their tokens) to
    /// `path`, as a session file `load_session` reads; `sink` gets the
    /// answer (`{ tokens, exact, bytes }`).
    pub fn save_slot(&self, slot: usize, path: &str, sink: Box<dyn EventSink>) {
        match check_path(path) {
            Ok(path) => self.submit_slot_job(SessionJob::SaveSlot { slot, path }, sink),
            Err(e) => sink.reply(Err(e)),
        }
    }

    /// Drops the cells idle slot `slot` holds; `sink` gets `{ tokens }`, the
    /// tokens it held.
    pub fn erase_slot(&self, slot: usize, sink: Box<dyn EventSink>) {
        self.submit_slot_job(SessionJob::EraseSlot { slot }, sink)
    }

    /// Reads and checks the session file at `path` on a thread of its own,
    /// then queues it for a free slot (or for idle slot `slot`); `sink`
    /// gets the answer.
    pub fn load_session(&self, path: &str, slot: Option<usize>, sink: Box<dyn EventSink>) {
        let path = match check_path(path) {
            Ok(p) if !self.is_closed() => p,
            Ok(_) => return sink.reply(Err(EngineError::disposed())),
            Err(e) => return sink.reply(Err(e)),
        };
        let info = &self.info;
        let model = ModelId { file: info.name.clone(), fingerprint: info.fingerprint.clone(), n_vocab: info.n_vocab };
        let (n_ctx, max_bytes) = (info.n_ctx as usize, info.session_bytes_max);
        let kv = kv_settings(info.portable);
        let shared = self.shared.clone();
        let id = self.next_job_id();
        let spawned = std::thread::Builder::new().name("llama-engine-load".into()).spawn(move || {
            let expect = Expect { model: &model, kv, n_ctx };
            match read_session(&path, &expect, max_bytes) {
                Err(e) => sink.reply(Err(e)),
                Ok(session) => {
                    let job = Job {
                        id,
                        request: CompletionRequest::default(),
                        plan: ChatPlan::default(),
                        sink,
                        cancel: Arc::new(AtomicBool::new(false)),
                        session: Some(SessionJob::Load(Box::new(session), slot)),
                        compiled: None,
                        tokens: None,
                        media: Vec::new(),
                        encode_ms: 0.0,
                    };
                    if let Err(job) = shared.submit(job) {
                        job.sink.reply(Err(EngineError::disposed()));
                    }
                }
            }
        });
        if spawned.is_err() {
            // The sink went with the closure; dropping it rejected the promise.
        }
    }
}

/// A session file read and checked (`core::cache::session`). A file that
/// cannot be read is the path's error; one that is not a valid session for
/// this engine is `INVALID_SESSION`, saying why.
fn read_session(path: &Path, expect: &Expect<'_>, max_bytes: u64) -> Result<Session> {
    let shown = path.display();
    let invalid = |why: String| EngineError::new(ErrorCode::InvalidSession, format!("{shown}: {why}"));
    let meta = std::fs::metadata(path).map_err(|e| EngineError::invalid("path", format!("cannot read {shown}: {e}")))?;
    if !meta.is_file() {
        return Err(EngineError::invalid("path", format!("{shown} is not a file")));
    }
    if meta.len() > max_bytes {
        return Err(invalid(format!("{} bytes: larger than any session of this model and context could be", meta.len())));
    }
    let bytes = std::fs::read(path).map_err(|e| EngineError::invalid("path", format!("cannot read {shown}: {e}")))?;
    Session::decode(&bytes, expect).map_err(invalid)
}
