//! The engine: one background thread per `LlamaEngine` that owns the models
//! and contexts, takes completion jobs from a FIFO queue and decodes up to
//! `parallel` of them together. Nothing here knows about N-API.
//!
//! - `mod.rs`: `Engine`, the handle the binding holds;
//! - `shared.rs`: what the handle and the engine thread share (the queue,
//!   the n-gram caches, published status);
//! - `thread.rs`: the engine thread's life: load, admit, step, exit;
//! - `chat.rs`: chat requests rendered and their output planned;
//! - `chat_native.rs`: llama.cpp's reading of the answers of the families
//!   whose syntax is not ours (patch 0005);
//! - `compile.rs`: constraints compiled on a thread of their own;
//! - `prepare.rs`: what callers send parsed, rendered and tokenized on a
//!   thread of its own, in order;
//! - `embed.rs`: `embed()` in a context of its own, between steps;
//! - `session.rs`: `saveSession`/`loadSession` before the engine thread;
//! - `kv.rs`: a slot's cells copied, saved and restored;
//! - `worker/`: the engine thread's state and the phases of one step;
//! - `slot.rs`: a slot's KV stream and the request generating in it;
//! - `sampler.rs`: a request's sampler chain;
//! - `draft_model.rs`: the draft model as a drafter, per slot;
//! - `media.rs`: images and audio through the projector (llama.cpp's mtmd);
//! - `calibrate.rs`: batch costs and the batch-invariance self-check;
//!   `attention_check.rs` and `matmul_check.rs` its kernel-level parts;
//! - `vocab.rs`: tokenizing and chat rendering, on any thread (also
//!   without weights, for an isolated engine's parent);
//! - `model.rs`, `ggml_setup.rs`: loading models, llama.cpp's settings;
//! - `llama_log.rs`: llama.cpp's log, silent, kept while a model loads;
//! - `memory.rs`: freed memory given back after large inputs;
//! - `background.rs`: low-priority threads for huge text work;
//! - `gpu.rs`: the GPU back end, its probe, and why none computes.

mod attention_check;
pub mod background;
mod calibrate;
pub mod chat;
pub mod chat_native;
mod compile;
pub mod draft_model;
pub mod embed;
pub mod ggml_setup;
pub mod gpu;
pub mod inspect;
pub mod kv;
pub mod llama_log;
mod lora;
mod matmul_check;
pub mod media;
pub mod memory;
pub mod model;
pub mod portable;
mod prepare;
pub mod rpc;
pub mod sampler;
mod session;
pub mod shared;
pub mod slot;
mod thread;
pub mod vocab;
pub mod worker;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use llama_engine_core::cache::prompt_cache::CacheStats;
use llama_engine_core::chat::format::{ChatFormat, ChatPlan};
use llama_engine_core::embed::{parse_embed_request, EmbedInput};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::request::{parse_request_json, CompletionRequest, RequestLimits};
use llama_engine_core::speculation::ngram::NgramCache;
use llama_engine_core::speculation::suffix::{SuffixStore, VocabId};
use llama_engine_core::text::events::EventSink;
pub use model::{EngineOptions, ModelInfo, Progress};
use prepare::{Preparer, Work};
pub use shared::Job;
use shared::{NgramStore, Shared};
use vocab::Vocab;

/// A request's prompt, tokenized on the preparing thread.
pub(crate) struct PreparedPrompt {
    pub(crate) tokens: Vec<LlamaToken>,
    /// Its images and audio, encoded, and where they stand in `tokens`.
    pub(crate) media: Vec<media::MediaSpan>,
    pub(crate) encode_ms: f64,
}

/// What `status()` reports.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub queued: usize,
    /// Requests decoding now (each in a slot).
    pub active: usize,
    pub disposed: bool,
    /// Measured cost (ms) of a target batch of n tokens, index n; and of a
    /// draft step.
    pub batch_cost_ms: Vec<Option<f64>>,
    pub draft_step_ms: Option<f64>,
    pub tokens_cached: usize,
    pub prompt_cache: CacheStats,
    pub threads_in_use: usize,
    /// The target's decoding steps so far, and the slots they served (summed).
    pub decodes: u64,
    pub decoded_slots: u64,
    pub slots: Vec<shared::SlotStatus>,
}

/// The handle the binding holds. Cheap to share; every method is callable
/// from the JS thread and never blocks on llama.cpp (except `join`, which the
/// binding runs off the JS thread).
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The target's vocabulary and chat template, for text work on any thread.
    vocab: Arc<Vocab>,
    info: ModelInfo,
    next_id: AtomicU64,
    ngram_path: Option<String>,
    /// Why a configured n-gram cache file could not be used (the engine works without it).
    ngram_errors: Vec<String>,
    suffix_path: Option<String>,
    /// Why `suffixCachePath` could not be read (the engine starts empty).
    suffix_errors: Vec<String>,
    /// The thread that parses, renders and tokenizes what callers send
    /// (`prepare`), started by `start_preparing` once the engine is shared.
    preparer: OnceLock<Preparer>,
    /// The multimodal projector (`mmprojPath`): media are tokenized and
    /// encoded with it on the preparing thread.
    projector: Option<Arc<media::Projector>>,
}

impl Engine {
    /// Starts the engine thread and waits (blocking the caller, which is a
    /// worker thread of the binding) until the models are loaded.
    pub fn load(opts: EngineOptions, progress: Option<Progress>) -> Result<Engine> {
        let (ngram, ngram_errors) = load_ngram_caches(&opts);
        let shared = Arc::new(Shared::new(ngram));
        let ngram_path = opts.ngram_cache_path.clone();
        let vocab_opts = opts.clone();
        let ready = thread::start(opts, progress, shared.clone())?;
        let limits = RequestLimits { n_vocab: ready.info.n_vocab, n_ctx: ready.info.n_ctx };
        let vocab = match Vocab::new(ready.model, &vocab_opts, limits) {
            Ok(v) => v,
            Err(e) => {
                shared.close();
                let _ = ready.thread.join();
                return Err(e);
            }
        };
        let suffix_errors = load_suffix_cache(&vocab_opts, &shared, ready.info.vocab_id);
        Ok(Engine {
            shared,
            thread: Mutex::new(Some(ready.thread)),
            vocab: Arc::new(vocab),
            info: ready.info,
            next_id: AtomicU64::new(1),
            ngram_path,
            ngram_errors,
            suffix_path: vocab_opts.suffix_cache_path.clone(),
            suffix_errors,
            preparer: OnceLock::new(),
            projector: ready.projector,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Starts the preparing thread, which holds the engine weakly.
    pub fn start_preparing(self: &Arc<Self>) -> Result<()> {
        let preparer = Preparer::start(Arc::downgrade(self))?;
        let _ = self.preparer.set(preparer);
        Ok(())
    }

    /// Hands work to the preparing thread; `Err` gives it back when the
    /// engine is closed or has none.
    fn hand_over(&self, work: Work) -> std::result::Result<(), Work> {
        match self.preparer.get() {
            Some(p) if !self.is_closed() => p.run(work),
            _ => Err(work),
        }
    }

    fn limits(&self) -> RequestLimits {
        RequestLimits { n_vocab: self.info.n_vocab, n_ctx: self.info.n_ctx }
    }

    /// Queues a request (its JSON) as job `id`: it is parsed, its chat
    /// rendered and its prompt tokenized on the preparing thread, then it
    /// waits for a slot. Its events, or its error, go to `sink`; `abort(id)`
    /// works from now on.
    pub fn submit_json(&self, id: u64, json: String, sink: Box<dyn EventSink>) {
        let cancel = Arc::new(AtomicBool::new(false));
        if !self.shared.begin_preparing(id, cancel.clone()) {
            return sink.finish(Err(EngineError::disposed()));
        }
        let work: Work = Box::new(move |engine| match engine {
            Some(engine) => engine.prepare_job(id, &json, sink, cancel),
            None => sink.finish(Err(EngineError::disposed())),
        });
        if let Err(work) = self.hand_over(work) {
            self.shared.end_preparing(id);
            work(None);
        }
    }

    fn prepare_job(&self, id: u64, json: &str, sink: Box<dyn EventSink>, cancel: Arc<AtomicBool>) {
        let prepared =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(CompletionRequest, ChatPlan, PreparedPrompt)> {
                let mut request = parse_request_json(json, &self.limits())?;
                if let Some(slot) = request.id_slot.filter(|&s| s >= self.info.parallel) {
                    return Err(EngineError::invalid(
                        "id_slot",
                        format!("no slot {slot}: this engine has {} (0 to {}), or -1", self.info.parallel, self.info.parallel - 1),
                    ));
                }
                let plan = self.prepare(&mut request)?;
                let tokens = self.tokenize_request(&request)?;
                Ok((request, plan, tokens))
            }))
            .unwrap_or_else(|panic| Err(EngineError::from_panic(&*panic)));
        memory::release_after(json.len());
        let (request, plan, tokens) = match prepared {
            Ok(p) => p,
            Err(e) => {
                self.shared.end_preparing(id);
                return sink.finish(Err(e));
            }
        };
        let job = Job {
            id,
            request,
            plan,
            sink,
            cancel,
            session: None,
            compiled: None,
            tokens: Some(tokens.tokens),
            media: tokens.media,
            encode_ms: tokens.encode_ms,
        };
        match self.shared.submit_prepared(job) {
            Ok(()) => {}
            Err(shared::NotQueued::Closed(job)) => job.sink.finish(Err(EngineError::disposed())),
            Err(shared::NotQueued::Aborted(job)) => {
                let result = worker::aborted_before_start(&job.request, &self.info, self.info.batch_invariant);
                job.sink.finish(Ok(result));
            }
        }
    }

    /// Runs `f` on the preparing thread and answers `sink` with its result
    /// (an `embed()` call's or a session's preparation, say).
    pub fn prepare_then(&self, sink: Box<dyn EventSink>, f: impl FnOnce(&Engine, Box<dyn EventSink>) + Send + 'static) {
        let work: Work = Box::new(move |engine| match engine {
            Some(engine) if !engine.is_closed() => f(engine, sink),
            _ => sink.reply(Err(EngineError::disposed())),
        });
        if let Err(work) = self.hand_over(work) {
            work(None);
        }
    }

    /// The target's vocabulary and chat template.
    pub fn vocab(&self) -> &Arc<Vocab> {
        &self.vocab
    }

    /// What the engine learnt of its chat template (for `status()`).
    pub fn chat_format(&self) -> Option<&ChatFormat> {
        self.vocab.chat_format()
    }

    /// Makes a request ready (on the preparing thread): a chat request's
    /// messages rendered into its prompt; returns the plan of its output.
    pub fn prepare(&self, request: &mut CompletionRequest) -> Result<ChatPlan> {
        let model = self.model()?;
        chat::prepare(request, self.vocab.chat(), &model)
    }

    /// A prepared request's prompt as tokens; with images or audio, their
    /// chunks encoded (`media`).
    pub(crate) fn tokenize_request(&self, request: &CompletionRequest) -> Result<PreparedPrompt> {
        let model = self.model()?;
        let media = request.media();
        if media.is_empty() {
            let tokens = model::tokenize_prompt(&model, request, &self.info)?;
            return Ok(PreparedPrompt { tokens, media: Vec::new(), encode_ms: 0.0 });
        }
        let Some(projector) = &self.projector else {
            return Err(EngineError::invalid(
                &media[0].at,
                format!(
                    "{} reads text only: load the engine with mmprojPath (the model's projector) to send images or audio",
                    self.info.name
                ),
            ));
        };
        let text = match request.prompt.as_slice() {
            [llama_engine_core::request::PromptPart::Chat(text)] => text,
            _ => return Err(EngineError::invalid(&media[0].at, "images and audio are read in chat messages only")),
        };
        let vocab = model.vocab();
        let bos = vocab.token_to_piece(vocab.bos(), true, None);
        let add_bos = vocab.should_add_bos() && !text.as_bytes().starts_with(&bos);
        let prompt = projector.prepare(text, &media, add_bos)?;
        Ok(PreparedPrompt { tokens: prompt.tokens, media: prompt.spans, encode_ms: prompt.encode_ms })
    }

    fn model(&self) -> Result<Arc<LlamaModel>> {
        self.vocab.model()
    }

    /// Checks an `embed()` call (`{ input, normalize?, truncate? }`) and
    /// tokenizes its inputs (on the preparing thread), images and audio
    /// encoded by the projector: a bad one is refused before anything is
    /// queued.
    pub fn prepare_embed(&self, request: &serde_json::Value) -> Result<embed::PreparedEmbed> {
        let reranking = self.info.pooling == llama_engine_core::embed::Pooling::Rank;
        if request.get("rerank").is_some() {
            return self.prepare_rerank(request);
        }
        if reranking {
            return Err(EngineError::invalid(
                "input",
                format!(
                    "{} is a reranker (its pooling is rank): it scores documents against a query (rerank()), it gives no embeddings",
                    self.info.name
                ),
            ));
        }
        let request = parse_embed_request(request, self.info.n_vocab)?;
        let model = self.model()?;
        let mut media = Vec::with_capacity(request.inputs.len());
        let mut tokens: Vec<Vec<i32>> = Vec::with_capacity(request.inputs.len());
        for (i, input) in request.inputs.iter().enumerate() {
            let (t, m) = match input {
                // BOS (and EOS) as the model adds them; text is not parsed for special tokens.
                EmbedInput::Text(s) => (model.vocab().tokenize(s.as_bytes(), true, false).into_iter().map(|t| t.0).collect(), Vec::new()),
                EmbedInput::Tokens(t) => (t.clone(), Vec::new()),
                EmbedInput::Parts(text, parts) => {
                    let at = request.field(i);
                    let Some(projector) = &self.projector else {
                        return Err(EngineError::invalid(
                            &at,
                            format!(
                                "{} reads text only: load the engine with mmprojPath (the model's projector) to embed images or audio",
                                self.info.name
                            ),
                        ));
                    };
                    if !self.info.causal {
                        return Err(EngineError::invalid(&at, "images and audio are embedded by decoder models only"));
                    }
                    let refs: Vec<&llama_engine_core::request::media::MediaInput> = parts.iter().collect();
                    let prompt = projector.prepare(text, &refs, model.vocab().should_add_bos())?;
                    // Its vector pools text rows: without any, there is nothing to pool.
                    if prompt.tokens.iter().all(|&t| media::is_media_token(t)) {
                        return Err(EngineError::invalid(&at, "has no text besides its media: add a text part after them"));
                    }
                    // An input with media is never cut (that could cut through one).
                    if prompt.tokens.len() > self.info.n_ctx as usize {
                        return Err(EngineError::invalid(
                            &at,
                            format!(
                                "too large: {} tokens with its media; the engine embeds at most {} per input (its contextSize)",
                                prompt.tokens.len(),
                                self.info.n_ctx
                            ),
                        ));
                    }
                    (prompt.tokens.iter().map(|t| t.0).collect(), prompt.spans)
                }
            };
            tokens.push(t);
            media.push(m);
        }
        request.fit(&mut tokens, self.info.n_ctx as usize)?;
        let inputs = tokens.into_iter().map(|t| t.into_iter().map(LlamaToken).collect()).collect();
        Ok(embed::EmbedJob::new(inputs, media, request.normalize))
    }

    /// Checks a `rerank()` call (`{ rerank: { query, documents } }`) and
    /// makes each document's input as llama.cpp's server does: the model's
    /// `rerank` template (`{query}`, `{document}` in
    /// `tokenizer.chat_template.rerank`, special tokens read), else BOS (if
    /// the model adds it), the query, EOS (if it adds it, else SEP), SEP
    /// (if it adds it), the document, EOS. Each pair is scored alone (its
    /// score the same whatever else is in the call); a pair longer than the
    /// context is refused, naming its document.
    fn prepare_rerank(&self, request: &serde_json::Value) -> Result<embed::PreparedEmbed> {
        if self.info.pooling != llama_engine_core::embed::Pooling::Rank {
            return Err(EngineError::invalid(
                "rerank",
                format!("{} is not a reranker: its GGUF's pooling is not rank (load a reranker, such as a BERT classifier or a Qwen3-Reranker converted by llama.cpp)", self.info.name),
            ));
        }
        let request = llama_engine_core::embed::parse_rerank_request(request)?;
        let model = self.model()?;
        let vocab = model.vocab();
        // (llama_model_chat_template(model, "rerank")'s key, read as metadata:
        // llama-cpp-2's chat_template(Some(name)) passes a name it has freed.)
        let template = model.meta_val_str("tokenizer.chat_template.rerank").ok();
        let tokens = |text: &str, special: bool| vocab.tokenize(text.as_bytes(), false, special);
        let query = tokens(&request.query, false);
        let eos = if vocab.eos().0 >= 0 { vocab.eos() } else { vocab.sep() };
        let mut inputs = Vec::with_capacity(request.documents.len());
        for (i, doc) in request.documents.iter().enumerate() {
            let input = match &template {
                Some(t) => tokens(&t.replace("{query}", &request.query).replace("{document}", doc), true),
                None => {
                    let mut v = Vec::new();
                    if vocab.should_add_bos() {
                        v.push(vocab.bos());
                    }
                    v.extend_from_slice(&query);
                    if vocab.should_add_eos() {
                        v.push(eos);
                    }
                    if vocab.should_add_sep() {
                        v.push(vocab.sep());
                    }
                    v.extend(tokens(doc, false));
                    if vocab.should_add_eos() {
                        v.push(eos);
                    }
                    v
                }
            };
            if input.is_empty() {
                return Err(EngineError::invalid(&format!("documents[{i}]"), "the pair made no tokens"));
            }
            if input.len() > self.info.n_ctx as usize {
                return Err(EngineError::invalid(
                    &format!("documents[{i}]"),
                    format!(
                        "too large: {} tokens with the query; the engine scores at most {} per pair (its contextSize)",
                        input.len(),
                        self.info.n_ctx
                    ),
                ));
            }
            inputs.push(input);
        }
        let media = vec![Vec::new(); inputs.len()];
        Ok(embed::EmbedJob::new(inputs, media, false))
    }

    /// Queues a prepared `embed()` call; its answer goes to `sink`.
    pub fn submit_embed(&self, job: embed::PreparedEmbed, sink: Box<dyn EventSink>) {
        if let Err(job) = self.shared.submit_embed(job.with_sink(sink)) {
            job.fail(EngineError::disposed());
        }
    }

    pub fn next_job_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a job. On a disposed engine the sink is finished with DISPOSED.
    pub fn submit(&self, job: Job) {
        if let Err(job) = self.shared.submit(job) {
            job.sink.finish(Err(EngineError::disposed()));
        }
    }

    /// Aborts one job: a queued one leaves the queue and resolves at once
    /// with an empty, aborted result; a running one stops within one step.
    pub fn abort(&self, id: u64) {
        if let Some(job) = self.shared.abort(id) {
            let result = worker::aborted_before_start(&job.request, &self.info, self.info.batch_invariant);
            job.sink.finish(Ok(result));
        }
    }

    /// Stops every request that is running now; queued ones are untouched.
    pub fn cancel_running(&self) {
        self.shared.cancel_running();
    }

    pub fn status(&self) -> Status {
        let counts = self.shared.counts();
        let published = self.shared.published();
        Status {
            queued: counts.queued,
            active: counts.active,
            disposed: counts.closed,
            batch_cost_ms: published.batch_cost_ms,
            draft_step_ms: published.draft_step_ms,
            tokens_cached: published.tokens_cached,
            prompt_cache: published.prompt_cache,
            threads_in_use: published.threads_in_use,
            decodes: published.decodes,
            decoded_slots: published.decoded_slots,
            slots: published.slots,
        }
    }

    /// Stops the engine: running requests end as aborted, queued ones reject
    /// with DISPOSED, and the models are freed when the thread exits.
    /// Returns the thread to join (off the JS thread).
    pub fn close(&self) -> Option<JoinHandle<()>> {
        if let Some(p) = self.preparer.get() {
            p.stop();
        }
        let (jobs, embeds) = self.shared.close();
        for job in jobs {
            job.sink.finish(Err(EngineError::disposed()));
        }
        for job in embeds {
            job.fail(EngineError::disposed());
        }
        self.vocab.close();
        self.thread.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Writes the dynamic n-gram cache (to `path`, or to `ngramCachePath`).
    pub fn save_ngram_cache(&self, path: Option<&str>) -> Result<usize> {
        let path = path
            .or(self.ngram_path.as_deref())
            .ok_or_else(|| EngineError::invalid("path", "no path given and the engine was loaded without ngramCachePath"))?;
        let cache = self.shared.ngram.dynamic.lock().unwrap_or_else(|p| p.into_inner()).clone();
        cache.save(Path::new(path))?;
        Ok(cache.len())
    }

    /// Writes the suffix drafter's shared indexes, every namespace (to
    /// `path`, or to `suffixCachePath`); the tokens written.
    pub fn save_suffix_cache(&self, path: Option<&str>) -> Result<usize> {
        let path = path
            .or(self.suffix_path.as_deref())
            .ok_or_else(|| EngineError::invalid("path", "no path given and the engine was loaded without suffixCachePath"))?;
        // A copy, so that slots go on drafting while the file is written.
        let store = self.shared.ngram.suffix.lock().unwrap_or_else(|p| p.into_inner()).clone();
        store.save(Path::new(path), self.info.vocab_id)?;
        Ok(store.n_tokens())
    }

    /// The suffix drafter's shared indexes: tokens, outputs, namespaces,
    /// the cap, and why `suffixCachePath` could not be read.
    pub fn suffix_status(&self) -> (usize, usize, usize, usize, &[String]) {
        let s = self.shared.ngram.suffix.lock().unwrap_or_else(|p| p.into_inner());
        (s.n_tokens(), s.n_sequences(), s.n_namespaces(), s.cap(), &self.suffix_errors)
    }

    /// Entries of the dynamic and the static n-gram cache, and why a
    /// configured cache file could not be used.
    pub fn ngram_status(&self) -> (usize, usize, &[String]) {
        let ngram = &self.shared.ngram;
        let dynamic = ngram.dynamic.lock().map(|c| c.len()).unwrap_or(0);
        let fixed = ngram.fixed.as_ref().map_or(0, |c| c.len());
        (dynamic, fixed, &self.ngram_errors)
    }

    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Garbage-collected without dispose(): let the thread finish on its own.
        let _ = self.close();
    }
}

/// Loads the dynamic and static n-gram caches named in the options. A file
/// that cannot be read is reported and skipped: speculation works without it.
fn load_ngram_caches(opts: &EngineOptions) -> (NgramStore, Vec<String>) {
    let mut errors = Vec::new();
    let mut store = NgramStore {
        suffix: Arc::new(Mutex::new(SuffixStore::new(opts.suffix_cache_tokens))),
        suffix_namespace: opts.suffix_namespace.clone(),
        ..Default::default()
    };
    if let Some(path) = &opts.ngram_cache_path {
        if Path::new(path).exists() {
            match NgramCache::load(Path::new(path)) {
                Ok(c) => store.dynamic = Arc::new(Mutex::new(c)),
                Err(e) => errors.push(format!("ngramCachePath: {}", e.message)),
            }
        }
    }
    if let Some(path) = &opts.static_ngram_cache_path {
        match NgramCache::load(Path::new(path)) {
            Ok(c) => store.fixed = Some(Arc::new(c)),
            Err(e) => errors.push(format!("staticNgramCachePath: {}", e.message)),
        }
    }
    (store, errors)
}

/// Reads `suffixCachePath` into the shared suffix store, when the file
/// exists. A file that is damaged, of another vocabulary or unreadable is
/// reported and left alone: the engine starts with an empty store (and a
/// later save replaces the file).
fn load_suffix_cache(opts: &EngineOptions, shared: &Shared, vocab: VocabId) -> Vec<String> {
    let Some(path) = &opts.suffix_cache_path else { return Vec::new() };
    if !Path::new(path).exists() {
        return Vec::new();
    }
    match SuffixStore::load(Path::new(path), opts.suffix_cache_tokens, vocab) {
        Ok(store) => {
            *shared.ngram.suffix.lock().unwrap_or_else(|p| p.into_inner()) = store;
            Vec::new()
        }
        Err(e) => vec![format!("suffixCachePath: {}", e.message)],
    }
}
