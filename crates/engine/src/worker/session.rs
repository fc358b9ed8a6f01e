//! Session jobs on the engine thread: a saved prompt's cells leave its slot
//! for a file (written off this thread, atomically); a checked session's
//! cells go into a free slot.

use std::path::PathBuf;

use llama_cpp_2::token::LlamaToken;
use serde_json::{json, Map, Value};

use super::prefix::Start;
use super::Worker;
use crate::kv;
use crate::shared::Job;
use crate::slot::{Request, Stop};
use llama_engine_core::cache::session::{Header, ModelId, Session};
use llama_engine_core::error::{EngineError, ErrorCode};
use llama_engine_core::files::{write_atomically, WriteError};
use llama_engine_core::text::events::EventSink;

/// "llama-engine <version>": sessions from another version load, but are
/// not promised bit-identical cells (its llama.cpp may differ).
pub fn engine_id() -> String {
    format!("llama-engine {}", env!("CARGO_PKG_VERSION"))
}

/// The answer's fields: the tokens, whether the cells are exact, and the
/// conversation (`messages` and its tools, or `prompt`).
fn answer(tokens: usize, exact: bool, conversation: &Value) -> Value {
    let mut out = Map::new();
    out.insert("tokens".into(), json!(tokens));
    out.insert("exact".into(), json!(exact));
    if let Value::Object(c) = conversation {
        out.extend(c.clone());
    }
    Value::Object(out)
}

impl Worker<'_> {
    pub(super) fn model_id(&self) -> ModelId {
        let info = &self.models.info;
        ModelId { file: info.name.clone(), fingerprint: info.fingerprint.clone(), n_vocab: info.n_vocab }
    }

    /// A save's prompt has been evaluated into slot `i` (or it ended early):
    /// its cells, read now (right after a decode), are written to its file
    /// by another thread, which answers.
    pub(super) fn finish_save(&mut self, i: usize, r: Request<'_>, stop: Stop) {
        let Some((path, conversation)) = r.save_target().cloned() else { return };
        let n = self.slots[i].cached.len();
        if stop != Stop::Limit || n != r.prompt().len() {
            let e = match stop {
                Stop::Abort => EngineError::disposed(),
                _ => EngineError::internal("the session's prompt was not evaluated"),
            };
            return r.reply(Err(e));
        }
        self.write_cells(i, path, conversation, r.into_sink());
    }

    /// Writes slot `i`'s cells (the tokens it holds) to `path` with
    /// `conversation`: read now, encoded and written by another thread,
    /// which answers `sink`.
    fn write_cells(&self, i: usize, path: PathBuf, conversation: Value, sink: Box<dyn EventSink>) {
        let slot = &self.slots[i];
        let n = slot.cached.len();
        let cells = match kv::save(&self.ctx, slot.seq) {
            Ok(c) => c,
            Err(e) => return sink.reply(Err(e)),
        };
        let positions = slot.positions.prefix(n);
        let windowed = match cells.check(n, &positions) {
            Ok(layout) => layout.windowed,
            Err(e) => return sink.reply(Err(EngineError::internal(format!("the slot's state does not read back: {e}")))),
        };
        let exact = true;
        let header = Header {
            engine: engine_id(),
            model: self.model_id(),
            kv: kv::kv_settings(self.opts.portable).into(),
            backend: self.models.info.compute_id.clone(),
            exact,
            windowed,
            media_positions: positions.spans().to_vec(),
            conversation: conversation.clone(),
        };
        let session = Session { header, tokens: slot.cached.iter().map(|t| t.0).collect(), cells };
        let reply = answer(n, exact, &Value::Null);
        // Encoding and writing take a while for a long prompt: off the engine
        // thread. (Should the thread not start, the sink is dropped, which
        // rejects the promise.)
        let _ = std::thread::Builder::new().name("llama-engine-save".into()).spawn(move || {
            let bytes = session.encode();
            let outcome = write_atomically(&path, |w| w.write_all(&bytes))
                .map(|_| {
                    let mut reply = reply;
                    reply["bytes"] = json!(bytes.len());
                    reply
                })
                .map_err(|e| match e {
                    WriteError::Create(e) => EngineError::invalid("path", format!("cannot write {}: {e}", path.display())),
                    WriteError::Write(e) => EngineError::internal(format!("saving the session to {} failed: {e}", path.display())),
                });
            sink.reply(outcome);
        });
    }

    /// Slot `slot` as a session job may take it: one of the engine's, and
    /// not running a request.
    fn idle_slot(&self, slot: usize) -> std::result::Result<usize, EngineError> {
        if slot >= self.slots.len() {
            return Err(EngineError::invalid(
                "slot",
                format!("no slot {slot}: this engine has {} (0 to {})", self.slots.len(), self.slots.len() - 1),
            ));
        }
        if !self.slots[slot].is_free() {
            return Err(EngineError::invalid("slot", format!("slot {slot} is running a request: try again once it is idle")));
        }
        Ok(slot)
    }

    /// Writes what idle slot `slot` holds to `path` and answers (its
    /// tokens are the session's prompt).
    pub(super) fn save_slot(&mut self, job: Job, slot: usize, path: PathBuf) {
        self.shared.request_ended(job.id);
        let i = match self.idle_slot(slot) {
            Ok(i) => i,
            Err(e) => return job.sink.reply(Err(e)),
        };
        if self.slots[i].reusable().len() != self.slots[i].cached.len() {
            return job.sink.reply(Err(EngineError::invalid(
                "slot",
                format!("slot {slot}'s context was shifted: its cells are not what its tokens compute"),
            )));
        }
        let conversation = json!({ "prompt": self.slots[i].cached.iter().map(|t| t.0).collect::<Vec<_>>() });
        self.write_cells(i, path, conversation, job.sink);
    }

    /// Empties idle slot `slot` (its cells are not kept in the prompt
    /// cache) and answers with the tokens it held.
    pub(super) fn erase_slot(&mut self, job: Job, slot: usize) {
        self.shared.request_ended(job.id);
        let outcome = self.idle_slot(slot).and_then(|i| {
            let n = self.slots[i].cached.len();
            kv::clear(&mut self.ctx, self.slots[i].seq)?;
            self.slots[i].keep(0);
            Ok(json!({ "tokens": n }))
        });
        // status() says so by the time the promise resolves.
        self.publish();
        job.sink.reply(outcome);
    }

    /// Restores a checked session into a free slot, or into idle slot
    /// `slot` (what that slot held goes to the prompt cache first), and
    /// answers.
    pub(super) fn load_session(&mut self, job: Job, session: Session, slot: Option<usize>) {
        let tokens: Vec<LlamaToken> = session.tokens.iter().map(|&t| LlamaToken(t)).collect();
        let positions = session.positions();
        if let Some(Err(e)) = slot.map(|s| self.idle_slot(s)) {
            self.shared.request_ended(job.id);
            return job.sink.reply(Err(e));
        }
        let Some((i, Start::Ready(_))) = self.place(&tokens, &positions, false, 0, slot) else {
            self.shared.request_ended(job.id);
            return job.sink.reply(Err(EngineError::internal("no free slot for the session")));
        };
        let seq = self.slots[i].seq;
        let n_seq = self.slots.len() as i32;
        let outcome = match kv::restore(&mut self.ctx, seq, n_seq, &session.cells, tokens.len(), &positions) {
            Ok(()) => {
                self.slots[i].hold(&tokens, if session.header.windowed { tokens.len() } else { 0 });
                let h = &session.header;
                let exact = h.exact && h.backend == self.models.info.compute_id && h.engine == engine_id();
                let mut out = answer(tokens.len(), exact, &h.conversation);
                out["slot"] = json!(i);
                Ok(out)
            }
            Err(why) => {
                self.slots[i].keep(0);
                Err(EngineError::new(ErrorCode::InvalidSession, format!("this session's cells do not fit this engine: {why}")))
            }
        };
        self.shared.request_ended(job.id);
        self.publish();
        job.sink.reply(outcome);
    }
}
