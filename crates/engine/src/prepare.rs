//! Work whose cost grows with what the caller sent — parsing a request,
//! rendering its chat template, tokenizing its prompt, an `embed()` call's
//! inputs, a conversation to save — done on a thread of its own, in the
//! order it was handed over: never on the JS thread (a 16 MiB body would
//! hold every other client of the event loop) and never on the engine
//! thread (it would hold every running stream between two steps).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, Weak};

use super::Engine;
use llama_engine_core::error::EngineError;

/// One piece of work: it answers its caller itself (through the sink it
/// carries), also when it fails. Given `None` when the engine is gone.
pub type Work = Box<dyn FnOnce(Option<&Engine>) + Send>;

pub struct Preparer {
    tx: Mutex<Option<Sender<Work>>>,
}

impl Preparer {
    /// Starts the thread. It holds the engine weakly, so the engine is
    /// dropped when its last handle is; `stop` (or that drop) ends it.
    pub fn start(engine: Weak<Engine>) -> Result<Preparer, EngineError> {
        let (tx, rx) = mpsc::channel::<Work>();
        std::thread::Builder::new()
            .name("llama-engine-prepare".into())
            // Templates recurse (bounded by their fuel), as does JSON parsing.
            .stack_size(32 << 20)
            .spawn(move || {
                // Below the engine thread: preparing a huge request must
                // not slow the steps of those already streaming.
                super::background::lower_this_thread();
                while let Ok(work) = rx.recv() {
                    let engine = engine.upgrade();
                    // A panic is the work's own: its sink, dropped with it,
                    // rejects its promise; the next work goes on.
                    let _ = catch_unwind(AssertUnwindSafe(|| work(engine.as_deref())));
                }
            })
            .map_err(|e| EngineError::internal(format!("cannot start the preparing thread: {e}")))?;
        Ok(Preparer { tx: Mutex::new(Some(tx)) })
    }

    /// Hands `work` over; gives it back when the preparer has stopped.
    pub fn run(&self, work: Work) -> Result<(), Work> {
        match self.tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(tx) => tx.send(work).map_err(|e| e.0),
            None => Err(work),
        }
    }

    /// No more work is taken; what was handed over still runs (and finds
    /// the engine closed).
    pub fn stop(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}
