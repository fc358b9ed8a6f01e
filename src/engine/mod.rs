//! The engine: one background thread per `LlamaEngine` that owns the models
//! and contexts, takes completion jobs from a FIFO queue and decodes up to
//! `parallel` of them together (`worker`). Nothing here knows about N-API.
//!
//! - `mod.rs`: the handle the binding holds, the job queue, shutdown;
//! - `worker.rs`: the engine thread's loop and the phases of one step;
//! - `slot.rs`: a slot's KV stream and the request generating in it;
//! - `calibrate.rs`: batch costs and the batch-invariance self-check;
//! - `draft_model.rs`: the draft model as a drafter, per slot;
//! - `sampler.rs`: a request's sampler chain;
//! - `model.rs`, `ggml_setup.rs`: loading models, llama.cpp's settings.

mod calibrate;
pub mod draft_model;
pub mod ggml_setup;
pub mod model;
pub mod sampler;
pub mod slot;
pub mod worker;

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use crate::core::chat::{ChatMessage, ChatTemplate};
use crate::core::error::{EngineError, Result};
use crate::core::events::EventSink;
use crate::core::request::{CompletionRequest, PromptPart};

pub use model::{EngineOptions, ModelInfo};

type Costs = (Vec<Option<f64>>, Option<f64>);

pub struct Job {
    pub id: u64,
    pub request: CompletionRequest,
    pub sink: Box<dyn EventSink>,
    pub cancel: Arc<AtomicBool>,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// Requests in a slot, with their cancel flags.
    running: HashMap<u64, Arc<AtomicBool>>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<QueueState>,
    wake: Condvar,
    /// Set (and `done` notified) when the engine thread has ended and freed
    /// its models.
    finished: Mutex<bool>,
    done: Condvar,
}

impl Shared {
    /// Closes the queue: the running request is cancelled (it ends within
    /// one step); returns the queued jobs, for the caller to settle.
    fn shut(&self) -> Vec<Job> {
        let queued = {
            let mut st = self.lock();
            st.closed = true;
            for cancel in st.running.values() {
                cancel.store(true, Ordering::SeqCst);
            }
            st.jobs.drain(..).collect()
        };
        self.wake.notify_all();
        queued
    }

    /// Waits until the engine thread has ended, at most `timeout`.
    fn wait_finished(&self, timeout: std::time::Duration) {
        let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.done.wait_timeout_while(finished, timeout, |f| !*f);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding the lock is caught on the engine thread; the
        // queue itself stays consistent, so poisoning is not a reason to fail.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next queued job, now marked running; with `wait`, blocks until
    /// one is queued. `None` when the engine is closed (or, without `wait`,
    /// when the queue is empty).
    fn next_job(&self, wait: bool) -> Option<Job> {
        let mut st = self.lock();
        loop {
            if st.closed {
                return None;
            }
            if let Some(job) = st.jobs.pop_front() {
                st.running.insert(job.id, job.cancel.clone());
                return Some(job);
            }
            if !wait {
                return None;
            }
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

impl worker::Finished for Shared {
    fn finished(&self, id: u64) {
        self.lock().running.remove(&id);
    }
}

#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Measured cost (ms) of a target batch of n tokens, index n; and of a draft step.
    pub batch_cost_ms: Vec<Option<f64>>,
    pub draft_step_ms: Option<f64>,
    pub queued: usize,
    /// Requests decoding now (each in a slot).
    pub active: usize,
    pub disposed: bool,
    pub tokens_cached: usize,
}

/// The handle the binding holds. Cheap to share; every method is callable
/// from the JS thread and never blocks on llama.cpp (except `join`, which the
/// binding runs off the JS thread).
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The target model, for tokenize/detokenize on the calling thread.
    model: RwLock<Option<Arc<LlamaModel>>>,
    info: ModelInfo,
    next_id: AtomicU64,
    tokens_cached: Arc<AtomicU64>,
    costs: Arc<Mutex<Costs>>,
    ngram: worker::NgramStore,
    ngram_path: Option<String>,
    /// Why a configured n-gram cache file could not be used (the engine works without it).
    ngram_errors: Vec<String>,
    /// What `messages` are rendered with (see `model::chat_template`).
    chat: Option<std::result::Result<ChatTemplate, String>>,
}

impl Engine {
    /// Starts the engine thread and waits (blocking the caller, which is a
    /// worker thread of the binding) until the models are loaded.
    pub fn load(opts: EngineOptions, progress: Option<Box<dyn FnMut(f32) + Send>>) -> Result<Engine> {
        let shared = Arc::new(Shared::default());
        let tokens_cached = Arc::new(AtomicU64::new(0));
        let (ngram, ngram_errors) = load_ngram_caches(&opts);
        let costs: Arc<Mutex<Costs>> = Arc::default();
        let ngram_path = opts.ngram_cache_path.clone();
        let chat_override = opts.chat_template.clone();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(Arc<LlamaModel>, ModelInfo)>>();
        let thread = {
            let shared = shared.clone();
            let tokens_cached = tokens_cached.clone();
            let ngram = ngram.clone();
            let costs = costs.clone();
            std::thread::Builder::new()
                .name("llama-engine".into())
                // llama.cpp's grammar code recurses once per nested rule.
                .stack_size(64 << 20)
                .spawn(move || engine_thread(opts, progress, shared, ready_tx, tokens_cached, costs, ngram))
                .map_err(|e| EngineError::internal(format!("cannot start the engine thread: {e}")))?
        };
        match ready_rx.recv() {
            Ok(Ok((model, info))) => {
                register_for_exit(&shared);
                let chat = model::chat_template(&model, chat_override.as_deref());
                let mut engine = Engine {
                    shared,
                    thread: Mutex::new(Some(thread)),
                    model: RwLock::new(Some(model)),
                    info,
                    next_id: AtomicU64::new(1),
                    tokens_cached,
                    costs,
                    ngram,
                    ngram_path,
                    ngram_errors,
                    chat: None,
                };
                match chat {
                    Ok(chat) => {
                        engine.chat = chat;
                        Ok(engine)
                    }
                    Err(e) => {
                        if let Some(t) = engine.close() {
                            let _ = t.join();
                        }
                        Err(e)
                    }
                }
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

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Renders chat messages with the engine's chat template.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        match &self.chat {
            Some(Ok(template)) => template.render(messages, add_generation_prompt, "messages"),
            Some(Err(why)) => Err(EngineError::invalid(
                "messages",
                format!("the model's chat template (tokenizer.chat_template) cannot be used ({why}); load the engine with the chatTemplate option"),
            )),
            None => Err(EngineError::invalid(
                "messages",
                "this model has no chat template (no tokenizer.chat_template in its GGUF); load the engine with the chatTemplate option to use messages",
            )),
        }
    }

    /// Turns a chat request's `messages` into its prompt, rendered here (on
    /// the caller's thread) so that a template error rejects the request
    /// before it is queued.
    pub fn render_messages(&self, request: &mut CompletionRequest) -> Result<()> {
        if let Some(messages) = &request.messages {
            request.prompt = vec![PromptPart::Chat(self.apply_chat_template(messages, true)?)];
        }
        Ok(())
    }

    fn model(&self) -> Result<Arc<LlamaModel>> {
        self.model.read().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(EngineError::disposed)
    }

    pub fn tokenize(&self, text: &str, add_bos: bool, special: bool) -> Result<Vec<i32>> {
        let model = self.model()?;
        Ok(model.vocab().tokenize(text.as_bytes(), add_bos, special).into_iter().map(|t| t.0).collect())
    }

    pub fn detokenize(&self, tokens: &[i32]) -> Result<String> {
        let model = self.model()?;
        if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0 || t >= self.info.n_vocab) {
            return Err(EngineError::invalid(&format!("tokens[{i}]"), format!("{t} is not a token id (0..{})", self.info.n_vocab)));
        }
        if tokens.is_empty() {
            return Ok(String::new());
        }
        let ids: Vec<LlamaToken> = tokens.iter().map(|&t| LlamaToken(t)).collect();
        let bytes = model.vocab().detokenize(&ids, false, false);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub fn next_job_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a job. On a disposed engine the sink is finished with DISPOSED.
    pub fn submit(&self, job: Job) {
        let mut st = self.shared.lock();
        if st.closed {
            drop(st);
            job.sink.finish(Err(EngineError::disposed()));
            return;
        }
        st.jobs.push_back(job);
        drop(st);
        self.shared.wake.notify_one();
    }

    /// Aborts one job: a queued one leaves the queue and resolves at once
    /// with an empty, aborted result; a running one stops within one step.
    pub fn abort(&self, id: u64) {
        let mut st = self.shared.lock();
        if let Some(cancel) = st.running.get(&id) {
            cancel.store(true, Ordering::SeqCst);
            return;
        }
        if let Some(pos) = st.jobs.iter().position(|j| j.id == id) {
            let job = st.jobs.remove(pos).expect("position is in range");
            drop(st);
            let result = worker::aborted_before_start(&job.request, &self.info, self.info.batch_invariant);
            job.sink.finish(Ok(result));
        }
    }

    /// Stops every request that is running now; queued ones are untouched.
    pub fn cancel_running(&self) {
        for cancel in self.shared.lock().running.values() {
            cancel.store(true, Ordering::SeqCst);
        }
    }

    pub fn status(&self) -> Status {
        let st = self.shared.lock();
        Status {
            queued: st.jobs.len(),
            active: st.running.len(),
            disposed: st.closed,
            tokens_cached: self.tokens_cached.load(Ordering::Relaxed) as usize,
            batch_cost_ms: self.costs.lock().map(|c| c.0.clone()).unwrap_or_default(),
            draft_step_ms: self.costs.lock().ok().and_then(|c| c.1),
        }
    }

    /// Stops the engine: the running request ends as aborted, queued ones
    /// reject with DISPOSED, and the models are freed when the thread exits.
    /// Returns the thread to join (off the JS thread).
    pub fn close(&self) -> Option<JoinHandle<()>> {
        for job in self.shared.shut() {
            job.sink.finish(Err(EngineError::disposed()));
        }
        self.model.write().unwrap_or_else(|p| p.into_inner()).take();
        self.thread.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Writes the dynamic n-gram cache (to `path`, or to `ngramCachePath`).
    pub fn save_ngram_cache(&self, path: Option<&str>) -> Result<usize> {
        let path = path
            .or(self.ngram_path.as_deref())
            .ok_or_else(|| EngineError::invalid("path", "no path given and the engine was loaded without ngramCachePath"))?;
        let cache = self.ngram.dynamic.lock().unwrap_or_else(|p| p.into_inner()).clone();
        cache.save(std::path::Path::new(path))?;
        Ok(cache.len())
    }

    pub fn ngram_status(&self) -> (usize, usize, &[String]) {
        let dynamic = self.ngram.dynamic.lock().map(|c| c.len()).unwrap_or(0);
        let fixed = self.ngram.fixed.as_ref().map_or(0, |c| c.len());
        (dynamic, fixed, &self.ngram_errors)
    }

    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Garbage-collected without dispose(): let the thread finish on its own.
        let _ = self.close();
    }
}

/// Engines whose threads may be running, so that the process can stop them
/// before it exits (see `stop_engines_at_exit`).
static LIVE: Mutex<Vec<std::sync::Weak<Shared>>> = Mutex::new(Vec::new());

/// Called by the C runtime when the process exits (`atexit`): stops every
/// engine thread and waits for it to end. Without it, a thread still
/// decoding when Node exits (a worker terminated mid-generation, or
/// `process.exit()` during a request) would run llama.cpp while the C++
/// runtime destroys ggml's static objects, and crash the process.
extern "C" fn stop_engines_at_exit() {
    let live: Vec<Arc<Shared>> = LIVE.lock().unwrap_or_else(|p| p.into_inner()).drain(..).filter_map(|w| w.upgrade()).collect();
    for shared in &live {
        drop(shared.shut()); // queued jobs: nobody is left to answer
    }
    for shared in &live {
        shared.wait_finished(std::time::Duration::from_secs(30));
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

/// Marks the engine thread finished when dropped: declared first in the
/// thread, it is dropped last, after the models and contexts are freed.
struct Finished(Arc<Shared>);

impl Drop for Finished {
    fn drop(&mut self) {
        *self.0.finished.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0.done.notify_all();
    }
}

fn engine_thread(
    opts: EngineOptions,
    progress: Option<Box<dyn FnMut(f32) + Send>>,
    shared: Arc<Shared>,
    ready: mpsc::Sender<Result<(Arc<LlamaModel>, ModelInfo)>>,
    tokens_cached: Arc<AtomicU64>,
    costs: Arc<Mutex<Costs>>,
    ngram: worker::NgramStore,
) {
    let _finished = Finished(shared.clone());
    let loaded = catch_unwind(AssertUnwindSafe(|| worker::Models::load(&opts, progress)))
        .unwrap_or_else(|_| Err(EngineError::internal("panic while loading the model")));
    let models = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut worker = match catch_unwind(AssertUnwindSafe(|| worker::Worker::new(&models, &opts, ngram)))
        .unwrap_or_else(|_| Err(EngineError::internal("panic while creating the context")))
    {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let publish = |worker: &worker::Worker| {
        if let Ok(mut c) = costs.lock() {
            *c = worker.costs();
        }
        tokens_cached.store(worker.tokens_cached() as u64, Ordering::Relaxed);
    };
    publish(&worker);
    let mut info = models.info.clone();
    info.batch_invariant = worker.invariance().holds();
    info.batch_invariance = worker.invariance().to_string();
    if ready.send(Ok((models.target.clone(), info))).is_err() {
        return;
    }
    let done: &Shared = &shared;
    loop {
        // Requests join between steps, while there are free slots; with
        // nothing to decode, wait for one.
        while worker.has_free_slot() {
            let Some(job) = shared.next_job(worker.active() == 0) else { break };
            let id = job.id;
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| worker.admit(job, done))) {
                // The job went with the panic; its sink settles its promise
                // as it is dropped.
                worker::Finished::finished(done, id);
                recover(&mut worker, &*panic, done);
            }
        }
        if worker.active() == 0 {
            if shared.is_closed() {
                break;
            }
            continue;
        }
        let stepped = catch_unwind(AssertUnwindSafe(|| worker.step(done)));
        match stepped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                worker.fail_all(&e, done);
                worker.reset();
            }
            Err(panic) => recover(&mut worker, &*panic, done),
        }
        publish(&worker);
    }
}

/// After a panic on the engine thread: every active request ends with
/// INTERNAL, and the caches are forgotten (their state is unknown).
fn recover(worker: &mut worker::Worker, panic: &(dyn std::any::Any + Send), done: &Shared) {
    worker.fail_all(&worker::panic_error(panic), done);
    worker.reset();
}

/// Loads the dynamic and static n-gram caches named in the options. A file
/// that cannot be read is reported and skipped: speculation works without it.
fn load_ngram_caches(opts: &EngineOptions) -> (worker::NgramStore, Vec<String>) {
    use crate::core::ngram::NgramCache;
    let mut errors = Vec::new();
    let mut store = worker::NgramStore::default();
    if let Some(path) = &opts.ngram_cache_path {
        if std::path::Path::new(path).exists() {
            match NgramCache::load(std::path::Path::new(path)) {
                Ok(c) => store.dynamic = Arc::new(std::sync::Mutex::new(c)),
                Err(e) => errors.push(format!("ngramCachePath: {}", e.message)),
            }
        }
    }
    if let Some(path) = &opts.static_ngram_cache_path {
        match NgramCache::load(std::path::Path::new(path)) {
            Ok(c) => store.fixed = Some(Arc::new(c)),
            Err(e) => errors.push(format!("staticNgramCachePath: {}", e.message)),
        }
    }
    (store, errors)
}
