//! The engine thread: loads the models, then takes jobs from the queue into
//! free slots and steps the worker until the engine is closed. Every panic
//! on it is caught (the requests it hit end with `INTERNAL`); it marks
//! itself exited after its models are freed, and the process waits for it
//! before exiting.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use llama_cpp_2::model::LlamaModel;

use super::media::Projector;
use super::model::{EngineOptions, ModelInfo, Progress};
use super::shared::Shared;
use super::worker::{Models, Worker};
use llama_engine_core::error::{EngineError, Result};

/// What the engine thread hands the handle once its models are loaded.
pub struct Ready {
    pub thread: JoinHandle<()>,
    pub model: Arc<LlamaModel>,
    pub info: ModelInfo,
    pub projector: Option<Arc<Projector>>,
}

type Loaded = (Arc<LlamaModel>, ModelInfo, Option<Arc<Projector>>);

/// Starts the engine thread and waits (blocking the caller, a worker thread
/// of the binding) until the models are loaded or failed to load.
pub fn start(opts: EngineOptions, progress: Option<Progress>, shared: Arc<Shared>) -> Result<Ready> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Loaded>>();
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("llama-engine".into())
            // llama.cpp's grammar code recurses once per nested rule.
            .stack_size(64 << 20)
            .spawn(move || run(opts, progress, shared, ready_tx))
            .map_err(|e| EngineError::internal(format!("cannot start the engine thread: {e}")))?
    };
    match ready_rx.recv() {
        Ok(Ok((model, info, projector))) => {
            register_for_exit(&shared);
            Ok(Ready { thread, model, info, projector })
        }
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(EngineError::internal("the engine thread stopped while loading"))
        }
    }
}

/// Marks the engine thread exited when dropped: made first in the thread,
/// it is dropped last, after the models and contexts are freed.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.0.mark_exited();
    }
}

fn run(opts: EngineOptions, progress: Option<Progress>, shared: Arc<Shared>, ready: mpsc::Sender<Result<Loaded>>) {
    let _exit = ExitGuard(shared.clone());
    let loaded = catch_unwind(AssertUnwindSafe(|| Models::load(&opts, progress)))
        .unwrap_or_else(|_| Err(EngineError::internal("panic while loading the model")));
    let models = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let created = catch_unwind(AssertUnwindSafe(|| Worker::new(&models, &opts, shared.clone())))
        .unwrap_or_else(|_| Err(EngineError::internal("panic while creating the context")));
    let mut worker = match created {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    worker.publish();
    let mut info = models.info.clone();
    info.batch_invariant = worker.invariance().holds();
    info.batch_invariance = worker.invariance().to_string();
    info.media = worker.projector.as_ref().map(|p| p.reads());
    if ready.send(Ok((models.target.clone(), info, worker.projector.clone()))).is_err() {
        return;
    }
    loop {
        // Requests join between steps, while there are free slots; with
        // nothing to decode, wait for one.
        while worker.has_free_slot() {
            let Some(job) = shared.next_job(worker.active() == 0) else { break };
            let id = job.id;
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| worker.admit(job))) {
                // The job went with the panic; its sink settles its promise
                // as it is dropped.
                shared.request_ended(id);
                worker.recover(&EngineError::from_panic(&*panic));
            }
        }
        // One chunk of the front embed() call per step, beside the slots.
        if let Some(mut job) = shared.next_embed() {
            match catch_unwind(AssertUnwindSafe(|| worker.embed_step(&mut job))) {
                Ok(Ok(true)) => {
                    // Its passes counted in status() before its answer goes.
                    worker.publish();
                    job.answer()
                }
                Ok(Ok(false)) => {
                    if let Err(job) = shared.resubmit_embed(job) {
                        job.fail(EngineError::disposed());
                    }
                }
                Ok(Err(e)) => job.fail(e),
                Err(panic) => {
                    worker.drop_embedder();
                    job.fail(EngineError::from_panic(&*panic));
                }
            }
        }
        if worker.active() == 0 {
            if shared.is_closed() {
                break;
            }
            continue;
        }
        match catch_unwind(AssertUnwindSafe(|| worker.step())) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => worker.recover(&e),
            Err(panic) => worker.recover(&EngineError::from_panic(&*panic)),
        }
        worker.publish();
    }
}

/// Engines whose threads may be running, so that the process can stop them
/// before it exits (see `stop_engines_at_exit`).
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Called by the C runtime when the process exits (`atexit`): stops every
/// engine thread and waits for it to end. Without it, a thread still
/// decoding when Node exits (a worker terminated mid-generation, or
/// `process.exit()` during a request) would run llama.cpp while the C++
/// runtime destroys ggml's static objects, and crash the process.
extern "C" fn stop_engines_at_exit() {
    let live: Vec<Arc<Shared>> = LIVE.lock().unwrap_or_else(|p| p.into_inner()).drain(..).filter_map(|w| w.upgrade()).collect();
    for shared in &live {
        drop(shared.close()); // queued jobs and embed calls: nobody is left to answer
    }
    for shared in &live {
        shared.wait_exited(Duration::from_secs(30));
    }
}

/// Registers an engine for `stop_engines_at_exit`, and the handler itself.
/// The handler is registered again at each load, after llama.cpp's statics
/// exist, so it runs before their destructors (atexit handlers and static
/// destructors run in reverse order of registration); it is idempotent.
fn register_for_exit(shared: &Arc<Shared>) {
    extern "C" {
        fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
    }
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(shared));
    drop(live);
    // SAFETY: registers a plain `extern "C" fn()` with the C runtime.
    unsafe {
        atexit(stop_engines_at_exit);
    }
}
