//! llama-engine's N-API binding, the addon itself: converts between
//! JavaScript and the engine (`llama-engine-runtime`, over the decoding core
//! `llama-engine-core`), nothing more. Every type that crosses the boundary
//! is defined here. Errors cross as JavaScript `Error`s with their stable
//! `code` set (`error`); requests, events and results cross as JSON (`sink`).

mod error;
mod sink;

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use serde_json::{json, Value};

use error::{js_error, or_throw};
use llama_engine_core::error::{EngineError, ErrorCode, Result as EngineResult};
use llama_engine_core::request::fields::request_fields_json;
use llama_engine_core::request::options::{parse_engine_options, EngineOptions};
use llama_engine_runtime::vocab::Vocab;
use llama_engine_runtime::{Engine, Progress};
use sink::JsEventSink;

fn parse_json(text: &str, what: &str) -> EngineResult<Value> {
    serde_json::from_str(text).map_err(|e| EngineError::invalid(what, format!("not valid JSON ({e})")))
}

/// Work done off the JS thread whose outcome is an engine result: the
/// promise resolves with `JsValue` or rejects with the engine error (its
/// `code` set).
pub trait EngineTask: Send {
    type Output: Send + 'static;
    type JsValue: ToNapiValue + TypeName;
    fn run(&mut self) -> EngineResult<Self::Output>;
    fn to_js(&mut self, env: &Env, output: Self::Output) -> Result<Self::JsValue>;
}

/// The `Task` every `EngineTask` runs as.
pub struct Off<T: EngineTask>(T);

impl<T: EngineTask> Task for Off<T> {
    type Output = EngineResult<T::Output>;
    type JsValue = T::JsValue;

    fn compute(&mut self) -> Result<Self::Output> {
        Ok(self.0.run())
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> Result<T::JsValue> {
        match output {
            Ok(out) => self.0.to_js(&env, out),
            Err(e) => Err(js_error(&env, e)),
        }
    }
}

type ProgressFn = ThreadsafeFunction<f64, (), f64, Status, false, false, 0>;

pub struct LoadTask {
    options: Option<EngineOptions>,
    progress: Option<ProgressFn>,
}

impl EngineTask for LoadTask {
    type Output = Engine;
    type JsValue = NativeEngine;

    fn run(&mut self) -> EngineResult<Engine> {
        let options = self.options.take().ok_or_else(|| EngineError::internal("load ran twice"))?;
        let progress = self.progress.take().map(|tsfn| {
            Box::new(move |f: f32| {
                tsfn.call(f as f64, ThreadsafeFunctionCallMode::NonBlocking);
            }) as Progress
        });
        Engine::load(options, progress)
    }

    fn to_js(&mut self, env: &Env, engine: Engine) -> Result<NativeEngine> {
        let engine = Arc::new(engine);
        engine.start_preparing().map_err(|e| js_error(env, e))?;
        Ok(NativeEngine { engine })
    }
}

pub struct JoinTask {
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EngineTask for JoinTask {
    type Output = ();
    type JsValue = ();

    fn run(&mut self) -> EngineResult<()> {
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| EngineError::internal("the engine thread panicked"))?;
        }
        Ok(())
    }

    fn to_js(&mut self, _env: &Env, _: ()) -> Result<()> {
        Ok(())
    }
}

pub struct SaveNgramTask {
    engine: Arc<Engine>,
    path: Option<String>,
    /// The suffix drafter's store rather than the n-gram cache.
    suffix: bool,
}

impl EngineTask for SaveNgramTask {
    type Output = usize;
    type JsValue = u32;

    fn run(&mut self) -> EngineResult<usize> {
        if self.engine.is_closed() {
            return Err(EngineError::disposed());
        }
        if self.suffix {
            self.engine.save_suffix_cache(self.path.as_deref())
        } else {
            self.engine.save_ngram_cache(self.path.as_deref())
        }
    }

    fn to_js(&mut self, _env: &Env, n: usize) -> Result<u32> {
        Ok(n as u32)
    }
}

/// Text work of any size, off the JS thread.
pub enum TextOp {
    Tokenize { text: String, add_bos: bool, special: bool },
    Detokenize { tokens: Vec<i32>, pieces: bool },
    Template { request_json: String, add_generation_prompt: bool },
}

pub struct TextTask {
    vocab: Arc<Vocab>,
    op: TextOp,
}

pub enum TextOut {
    Tokens(Vec<i32>),
    Text(String),
    Pieces(Vec<String>),
}

/// Tokens' texts as one string and where each ends (UTF-16 offsets), so
/// that a million of them cross into JavaScript as two values, not a
/// million strings made on the JS thread.
#[napi(object)]
pub struct JoinedPieces {
    pub text: String,
    pub ends: Uint32Array,
}

impl EngineTask for TextTask {
    type Output = TextOut;
    type JsValue = Either3<Int32Array, String, JoinedPieces>;

    fn run(&mut self) -> EngineResult<TextOut> {
        let vocab = self.vocab.clone();
        let op = std::mem::replace(&mut self.op, TextOp::Detokenize { tokens: Vec::new(), pieces: false });
        // On a low-priority thread: the engine's steps go first.
        llama_engine_runtime::background::run_low(move || {
            let size = match &op {
                TextOp::Tokenize { text, .. } => text.len(),
                TextOp::Detokenize { tokens, .. } => 4 * tokens.len(),
                TextOp::Template { request_json, .. } => request_json.len(),
            };
            let out = match &op {
                TextOp::Tokenize { text, add_bos, special } => vocab.tokenize(text, *add_bos, *special).map(TextOut::Tokens),
                TextOp::Detokenize { tokens, pieces: false } => vocab.detokenize(tokens).map(TextOut::Text),
                TextOp::Detokenize { tokens, pieces: true } => vocab.pieces(tokens).map(TextOut::Pieces),
                TextOp::Template { request_json, add_generation_prompt } => {
                    vocab.render_json(request_json, *add_generation_prompt).map(TextOut::Text)
                }
            };
            llama_engine_runtime::memory::release_after(size);
            out
        })
    }

    fn to_js(&mut self, _env: &Env, out: TextOut) -> Result<Self::JsValue> {
        Ok(match out {
            TextOut::Tokens(t) => Either3::A(Int32Array::new(t)),
            TextOut::Text(t) => Either3::B(t),
            TextOut::Pieces(pieces) => {
                let mut ends = Vec::with_capacity(pieces.len());
                let mut at = 0u32;
                for p in &pieces {
                    at += p.encode_utf16().count() as u32;
                    ends.push(at);
                }
                Either3::C(JoinedPieces { text: pieces.concat(), ends: Uint32Array::new(ends) })
            }
        })
    }
}

pub struct QuantizeTask {
    input: String,
    output: String,
    ftype: String,
}

impl EngineTask for QuantizeTask {
    type Output = ();
    type JsValue = ();

    fn run(&mut self) -> EngineResult<()> {
        llama_engine_runtime::model::quantize(&self.input, &self.output, &self.ftype)
    }

    fn to_js(&mut self, _env: &Env, _: ()) -> Result<()> {
        Ok(())
    }
}

#[napi]
pub struct NativeEngine {
    engine: Arc<Engine>,
}

#[napi]
impl NativeEngine {
    /// Loads the model(s) on a new engine thread. `optionsJson` is the
    /// `EngineOptions` object without `onProgress`, as JSON.
    #[napi(ts_return_type = "Promise<NativeEngine>")]
    pub fn load(env: &Env, options_json: String, on_progress: Option<Function<f64, ()>>) -> Result<AsyncTask<Off<LoadTask>>> {
        let options = or_throw(env, parse_json(&options_json, "options").and_then(|v| parse_engine_options(&v)))?;
        let progress = match on_progress {
            Some(f) => Some(f.build_threadsafe_function().callee_handled::<false>().weak::<false>().build()?),
            None => None,
        };
        Ok(AsyncTask::new(Off(LoadTask { options: Some(options), progress })))
    }

    #[napi(catch_unwind)]
    pub fn tokenize(&self, env: &Env, text: String, add_bos: bool, special: bool) -> Result<Vec<i32>> {
        or_throw(env, self.engine.vocab().tokenize(&text, add_bos, special))
    }

    #[napi(catch_unwind)]
    pub fn detokenize(&self, env: &Env, tokens: Vec<i32>) -> Result<String> {
        or_throw(env, self.engine.vocab().detokenize(&tokens))
    }

    /// Queues a request (JSON); returns its job id at once. It is parsed,
    /// rendered and tokenized off the JS thread; every event, then exactly
    /// one `done` event or an `Error` (an invalid request's too), arrives
    /// through `onEvent`.
    #[napi(catch_unwind, ts_args_type = "requestJson: string, onEvent: (event: string | Error) => void")]
    pub fn submit(&self, env: &Env, request_json: String, on_event: Function<'_, String, ()>) -> Result<f64> {
        if self.engine.is_closed() {
            return or_throw(env, Err(EngineError::disposed()));
        }
        let tsfn = JsEventSink::function(&on_event)?;
        let id = self.engine.next_job_id();
        self.engine.submit_json(id, request_json, Box::new(JsEventSink::new(tsfn)));
        Ok(id as f64)
    }

    /// Queues an `embed()` call (`{ input, normalize?, truncate? }` as
    /// JSON), checked and tokenized off the JS thread; its answer (`{
    /// embeddings: base64[], tokens }`, each vector's little-endian f32
    /// bytes) or its error arrives through `onEvent`.
    #[napi(catch_unwind, ts_args_type = "requestJson: string, onEvent: (event: string | Error) => void")]
    pub fn embed(&self, env: &Env, request_json: String, on_event: Function<'_, String, ()>) -> Result<()> {
        if self.engine.is_closed() {
            return or_throw(env, Err(EngineError::disposed()));
        }
        let tsfn = JsEventSink::function(&on_event)?;
        self.engine.prepare_then(Box::new(JsEventSink::new(tsfn)), move |engine, sink| {
            let prepared = parse_json(&request_json, "input").and_then(|v| engine.prepare_embed(&v));
            llama_engine_runtime::memory::release_after(request_json.len());
            match prepared {
                Ok(job) => engine.submit_embed(job, sink),
                Err(e) => sink.reply(Err(e)),
            }
        });
        Ok(())
    }

    /// A chat answer read as the engine reads its own (`parseChatOutput`):
    /// `requestJson` holds the tools and settings.
    #[napi(catch_unwind, ts_return_type = "{ content: string; reasoning_content?: string; tool_calls?: Record<string, unknown>[] }")]
    pub fn parse_chat_output(&self, env: &Env, text: String, request_json: String) -> Result<Value> {
        or_throw(env, self.engine.vocab().parse_output(&request_json, &text))
    }

    /// `tokenize` on a thread of the libuv pool, for text of any size.
    #[napi(ts_return_type = "Promise<Int32Array>")]
    pub fn tokenize_async(&self, text: String, add_bos: bool, special: bool) -> AsyncTask<Off<TextTask>> {
        AsyncTask::new(Off(TextTask { vocab: self.engine.vocab().clone(), op: TextOp::Tokenize { text, add_bos, special } }))
    }

    /// `detokenize` on a thread of the libuv pool; with `pieces`, each
    /// token's own text instead of the whole (`/tokenize`'s `with_pieces`).
    #[napi(ts_return_type = "Promise<string | JoinedPieces>")]
    pub fn detokenize_async(&self, tokens: Int32Array, pieces: bool) -> AsyncTask<Off<TextTask>> {
        AsyncTask::new(Off(TextTask { vocab: self.engine.vocab().clone(), op: TextOp::Detokenize { tokens: tokens.to_vec(), pieces } }))
    }

    /// `applyChatTemplate` on a thread of the libuv pool.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn apply_chat_template_async(&self, request_json: String, add_generation_prompt: bool) -> AsyncTask<Off<TextTask>> {
        AsyncTask::new(Off(TextTask { vocab: self.engine.vocab().clone(), op: TextOp::Template { request_json, add_generation_prompt } }))
    }

    /// Renders a chat request's messages (JSON: `messages` and the fields that
    /// reach the template, e.g. `tools`) with the engine's chat template.
    #[napi(catch_unwind)]
    pub fn apply_chat_template(&self, env: &Env, request_json: String, add_generation_prompt: bool) -> Result<String> {
        or_throw(env, self.engine.vocab().render_json(&request_json, add_generation_prompt))
    }

    /// Aborts one request, queued or running.
    #[napi]
    pub fn abort(&self, id: f64) {
        self.engine.abort(id as u64);
    }

    /// Saves a conversation's (`{ messages, tools? … }` or `{ prompt }`,
    /// JSON) KV cells to `path`; the answer (`{ tokens, exact, bytes }`) or
    /// its error arrives through `onEvent`, as a request's `done` does.
    #[napi(catch_unwind, ts_args_type = "path: string, conversationJson: string, onEvent: (event: string | Error) => void")]
    pub fn save_session(&self, path: String, conversation_json: String, on_event: Function<'_, String, ()>) -> Result<()> {
        let tsfn = JsEventSink::function(&on_event)?;
        self.engine.save_session(path, conversation_json, Box::new(JsEventSink::new(tsfn)));
        Ok(())
    }

    /// Loads a session file into a free slot, or into idle slot `slot`;
    /// the answer (`{ tokens, exact, slot, messages | prompt }`) or its
    /// error arrives through `onEvent`.
    #[napi(catch_unwind, ts_args_type = "path: string, slot: number | null, onEvent: (event: string | Error) => void")]
    pub fn load_session(&self, path: String, slot: Option<u32>, on_event: Function<'_, String, ()>) -> Result<()> {
        let tsfn = JsEventSink::function(&on_event)?;
        self.engine.load_session(&path, slot.map(|s| s as usize), Box::new(JsEventSink::new(tsfn)));
        Ok(())
    }

    /// Writes what idle slot `slot` holds to `path` as a session file; the
    /// answer (`{ tokens, exact, bytes }`) or its error arrives through `onEvent`.
    #[napi(catch_unwind, ts_args_type = "slot: number, path: string, onEvent: (event: string | Error) => void")]
    pub fn save_slot(&self, slot: u32, path: String, on_event: Function<'_, String, ()>) -> Result<()> {
        let tsfn = JsEventSink::function(&on_event)?;
        self.engine.save_slot(slot as usize, &path, Box::new(JsEventSink::new(tsfn)));
        Ok(())
    }

    /// Drops the cells of idle slot `slot`; the answer (`{ tokens }`) or its
    /// error arrives through `onEvent`.
    #[napi(catch_unwind, ts_args_type = "slot: number, onEvent: (event: string | Error) => void")]
    pub fn erase_slot(&self, slot: u32, on_event: Function<'_, String, ()>) -> Result<()> {
        let tsfn = JsEventSink::function(&on_event)?;
        self.engine.erase_slot(slot as usize, Box::new(JsEventSink::new(tsfn)));
        Ok(())
    }

    /// Stops every running request (queued ones then start).
    #[napi]
    pub fn cancel(&self) {
        self.engine.cancel_running();
    }

    #[napi(ts_return_type = "Record<string, unknown>")]
    pub fn status(&self) -> Value {
        let st = self.engine.status();
        let info = self.engine.info();
        let (ngram_dynamic, ngram_static, ngram_errors) = self.engine.ngram_status();
        let (suffix_tokens, suffix_outputs, suffix_namespaces, suffix_cap, suffix_errors) = self.engine.suffix_status();
        json!({
            "queued": st.queued,
            "active": st.active,
            "busy": st.active > 0,
            "parallel": info.parallel,
            "disposed": st.disposed,
            "model": info.name,
            "draftModel": info.draft_name,
            "contextSize": info.n_ctx,
            "trainContextSize": info.n_ctx_train,
            "batchSize": info.n_batch,
            "threads": info.threads,
            "threadsInUse": if st.threads_in_use > 0 { st.threads_in_use } else { info.threads as usize },
            "decodes": { "steps": st.decodes, "slots": st.decoded_slots },
            "vocabSize": info.n_vocab,
            "pooling": info.pooling.as_str(),
            "embeddingSize": info.n_embd,
            "determinism": if info.portable { "portable" } else { "default" },
            "batchInvariant": info.batch_invariant,
            "batchInvariance": info.batch_invariance,
            "cpuBackend": llama_engine_runtime::ggml_setup::cpu_backend(),
            "gpu": gpu_status(info),
            "toolCallFormat": self.engine.vocab().chat_family(),
            "modelPath": info.path,
            "chatTemplate": self.engine.vocab().chat_source(),
            "bosToken": self.engine.vocab().bos,
            "eosToken": self.engine.vocab().eos,
            "tokensCached": st.tokens_cached,
            "promptCache": {
                "entries": st.prompt_cache.entries,
                "bytes": st.prompt_cache.bytes,
                "hits": st.prompt_cache.hits,
                "limitBytes": st.prompt_cache.limit,
            },
            "batchCostMs": st.batch_cost_ms,
            "draftStepMs": st.draft_step_ms,
            "slots": st.slots.iter().enumerate().map(|(i, s)| json!({
                "id": i,
                "busy": s.request.is_some(),
                "requestId": s.request,
                "contextSize": info.n_ctx,
                "promptTokens": s.prompt_tokens,
                "predicted": s.predicted,
                "cachedTokens": s.cached,
            })).collect::<Vec<_>>(),
            "media": info.media.map(|(vision, audio)| json!({ "vision": vision, "audio": audio })),
            "rpc": if info.rpc.is_empty() { Value::Null } else { json!({ "workers": info.rpc }) },
            "loras": info.loras.iter().enumerate().map(|(i, (path, scale))| json!({ "id": i, "path": path, "scale": scale })).collect::<Vec<_>>(),
            "ngramCache": {
                "dynamicEntries": ngram_dynamic,
                "staticEntries": ngram_static,
                "errors": ngram_errors,
            },
            "suffixCache": {
                "tokens": suffix_tokens,
                "outputs": suffix_outputs,
                "namespaces": suffix_namespaces,
                "limitTokens": suffix_cap,
                "errors": suffix_errors,
            },
        })
    }

    /// Writes the dynamic n-gram cache in llama.cpp's lookup format; resolves
    /// with the number of n-grams written.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn save_ngram_cache(&self, path: Option<String>) -> AsyncTask<Off<SaveNgramTask>> {
        AsyncTask::new(Off(SaveNgramTask { engine: self.engine.clone(), path, suffix: false }))
    }

    /// Writes the suffix drafter's shared indexes (every namespace),
    /// atomically; resolves with the number of tokens written.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn save_suffix_cache(&self, path: Option<String>) -> AsyncTask<Off<SaveNgramTask>> {
        AsyncTask::new(Off(SaveNgramTask { engine: self.engine.clone(), path, suffix: true }))
    }

    /// Stops the engine and frees the models; resolves when they are freed.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn dispose(&self) -> AsyncTask<Off<JoinTask>> {
        AsyncTask::new(Off(JoinTask { thread: self.engine.close() }))
    }
}

pub struct VocabTask {
    options: Option<EngineOptions>,
}

impl EngineTask for VocabTask {
    type Output = Vocab;
    type JsValue = NativeVocab;

    fn run(&mut self) -> EngineResult<Vocab> {
        let options = self.options.take().ok_or_else(|| EngineError::internal("load ran twice"))?;
        Vocab::load(&options)
    }

    fn to_js(&mut self, _env: &Env, vocab: Vocab) -> Result<NativeVocab> {
        Ok(NativeVocab { vocab: Arc::new(vocab) })
    }
}

/// A model's vocabulary and chat template without its weights: the
/// synchronous text work of an engine whose weights live in another
/// process (`isolation: 'process'`).
#[napi]
pub struct NativeVocab {
    vocab: Arc<Vocab>,
}

#[napi]
impl NativeVocab {
    /// Loads the vocabulary (and chat template) of `optionsJson`'s model.
    #[napi(ts_return_type = "Promise<NativeVocab>")]
    pub fn load(env: &Env, options_json: String) -> Result<AsyncTask<Off<VocabTask>>> {
        let options = or_throw(env, parse_json(&options_json, "options").and_then(|v| parse_engine_options(&v)))?;
        Ok(AsyncTask::new(Off(VocabTask { options: Some(options) })))
    }

    #[napi(catch_unwind)]
    pub fn tokenize(&self, env: &Env, text: String, add_bos: bool, special: bool) -> Result<Vec<i32>> {
        or_throw(env, self.vocab.tokenize(&text, add_bos, special))
    }

    #[napi(catch_unwind)]
    pub fn detokenize(&self, env: &Env, tokens: Vec<i32>) -> Result<String> {
        or_throw(env, self.vocab.detokenize(&tokens))
    }

    #[napi(catch_unwind)]
    pub fn apply_chat_template(&self, env: &Env, request_json: String, add_generation_prompt: bool) -> Result<String> {
        or_throw(env, self.vocab.render_json(&request_json, add_generation_prompt))
    }

    #[napi(catch_unwind, ts_return_type = "{ content: string; reasoning_content?: string; tool_calls?: Record<string, unknown>[] }")]
    pub fn parse_chat_output(&self, env: &Env, text: String, request_json: String) -> Result<Value> {
        or_throw(env, self.vocab.parse_output(&request_json, &text))
    }

    #[napi(ts_return_type = "Promise<Int32Array>")]
    pub fn tokenize_async(&self, text: String, add_bos: bool, special: bool) -> AsyncTask<Off<TextTask>> {
        AsyncTask::new(Off(TextTask { vocab: self.vocab.clone(), op: TextOp::Tokenize { text, add_bos, special } }))
    }

    #[napi(ts_return_type = "Promise<string | JoinedPieces>")]
    pub fn detokenize_async(&self, tokens: Int32Array, pieces: bool) -> AsyncTask<Off<TextTask>> {
        AsyncTask::new(Off(TextTask { vocab: self.vocab.clone(), op: TextOp::Detokenize { tokens: tokens.to_vec(), pieces } }))
    }

    #[napi(ts_return_type = "Promise<string>")]
    pub fn apply_chat_template_async(&self, request_json: String, add_generation_prompt: bool) -> AsyncTask<Off<TextTask>> {
        AsyncTask::new(Off(TextTask { vocab: self.vocab.clone(), op: TextOp::Template { request_json, add_generation_prompt } }))
    }

    /// Frees the vocabulary now.
    #[napi]
    pub fn dispose(&self) {
        self.vocab.close();
    }
}

/// Re-quantizes a GGUF model with llama.cpp (`ftype`: "Q2_K", "Q3_K_M",
/// "Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16" or "F32"). Used
/// to make the test fixtures.
#[napi(ts_return_type = "Promise<void>")]
pub fn quantize_model(input: String, output: String, ftype: String) -> AsyncTask<Off<QuantizeTask>> {
    AsyncTask::new(Off(QuantizeTask { input, output, ftype }))
}

pub struct InspectTask {
    options: EngineOptions,
}

impl EngineTask for InspectTask {
    type Output = Value;
    type JsValue = String;

    fn run(&mut self) -> EngineResult<Value> {
        llama_engine_runtime::inspect::inspect(&self.options)
    }

    fn to_js(&mut self, _env: &Env, v: Value) -> Result<String> {
        Ok(v.to_string())
    }
}

/// Describes the GGUF at `optionsJson`'s `modelPath` (a model or a LoRA
/// adapter) and the memory a context of its `contextSize` and `parallel`
/// would take, without loading the weights; resolves with JSON.
#[napi(ts_return_type = "Promise<string>")]
pub fn inspect_model(env: &Env, options_json: String) -> Result<AsyncTask<Off<InspectTask>>> {
    let options = or_throw(env, parse_json(&options_json, "options").and_then(|v| parse_engine_options(&v)))?;
    Ok(AsyncTask::new(Off(InspectTask { options })))
}

pub struct RpcServeTask {
    endpoint: String,
    threads: usize,
    cache_dir: Option<String>,
}

impl EngineTask for RpcServeTask {
    type Output = ();
    type JsValue = ();

    fn run(&mut self) -> EngineResult<()> {
        llama_engine_runtime::rpc::serve(&self.endpoint, self.threads, self.cache_dir.as_deref())
    }

    fn to_js(&mut self, _env: &Env, _: ()) -> Result<()> {
        Ok(())
    }
}

/// Serves this process's CPU back end to RPC clients on `endpoint`
/// (`host:port`) with `threads` threads: `llama-engine rpc-worker`. The
/// promise settles only when the worker could not start (it rejects).
#[napi(ts_return_type = "Promise<void>")]
pub fn rpc_serve(env: &Env, endpoint: String, threads: u32, cache_dir: Option<String>) -> Result<AsyncTask<Off<RpcServeTask>>> {
    let endpoint = or_throw(
        env,
        llama_engine_core::request::options::rpc_endpoint(&endpoint)
            .map_err(|why| EngineError::invalid("endpoint", format!("{why}, got {endpoint:?}"))),
    )?;
    Ok(AsyncTask::new(Off(RpcServeTask { endpoint, threads: threads.max(1) as usize, cache_dir })))
}

/// The portable kernels' digests on fixed inputs (`determinism:
/// 'portable'`): `{ ops: { name: hex }, mismatches: [name] }`, the
/// mismatches against the reference machine's (empty: this CPU computes
/// the same bits).
#[napi]
pub fn portable_digest() -> Value {
    use llama_engine_runtime::portable;
    let _ = llama_engine_runtime::model::backend();
    let ops: serde_json::Map<String, Value> =
        portable::portable_digest().into_iter().map(|(n, h)| (n, Value::String(format!("{h:016x}")))).collect();
    json!({ "ops": ops, "mismatches": portable::portable_mismatches() })
}

/// Whether this build has ggml's RPC back end (`rpc`, `rpc-worker`).
#[napi]
pub fn rpc_available() -> bool {
    llama_engine_runtime::rpc::available()
}

/// `status().gpu`: the devices of the GPU back end, how many layers of each
/// model are on one, and why none are when none are.
fn gpu_status(info: &llama_engine_runtime::model::ModelInfo) -> Value {
    use llama_engine_runtime::gpu;
    let state = gpu::state();
    let devices: Vec<Value> = state.map(|s| s.devices.iter().map(|d| d.to_json()).collect()).unwrap_or_default();
    let used = info.gpu_layers + info.draft_gpu_layers > 0;
    let device = state.filter(|_| used).and_then(|s| s.devices.first()).map(|d| format!("{}: {}", d.name, d.description));
    let reason = if used {
        None
    } else {
        match state.and_then(|s| s.reason.clone()) {
            Some(r) => Some(r),
            None => Some("gpuLayers is 0".to_string()),
        }
    };
    json!({
        "device": device,
        "devices": devices,
        "layers": info.gpu_layers,
        "draftLayers": info.draft_gpu_layers,
        "reason": reason,
    })
}

/// Decides, before the first engine of the process loads, which GPU module
/// llama.cpp's back end loads (`path`, after `probeGpu` succeeded in a child
/// process) or why none (`reason`). False when the back end already started.
#[napi]
pub fn configure_gpu(path: Option<String>, reason: Option<String>) -> bool {
    llama_engine_runtime::gpu::configure(match path {
        Some(p) => Ok(p),
        None => Err(reason.unwrap_or_else(|| "no GPU back end".into())),
    })
}

/// Loads a GPU back-end module in this process and computes on each of its
/// devices: run in a child process (`lib/addon/gpu-probe.js`), where a driver that
/// crashes takes only the child down.
#[napi(ts_return_type = "{ ok: boolean, devices?: Record<string, unknown>[], reason?: string }")]
pub fn probe_gpu(path: String) -> Value {
    match std::panic::catch_unwind(|| llama_engine_runtime::gpu::probe(&path)) {
        Ok(Ok(devices)) => json!({ "ok": true, "devices": devices.iter().map(|d| d.to_json()).collect::<Vec<_>>() }),
        Ok(Err(reason)) => json!({ "ok": false, "reason": reason }),
        Err(_) => json!({ "ok": false, "reason": "the probe panicked" }),
    }
}

/// How this addon was built: `dynamicBackends` when llama.cpp's back ends
/// are modules beside it (the prebuilt packages), which GPU modules can join.
#[napi(ts_return_type = "{ dynamicBackends: boolean }")]
pub fn build_info() -> Value {
    json!({ "dynamicBackends": cfg!(feature = "prebuilt") })
}

/// The stable `code` of every error the engine raises.
#[napi]
pub fn error_codes() -> Vec<&'static str> {
    ErrorCode::ALL.iter().map(|c| c.as_str()).collect()
}

/// Every drafter, in the order a request's chain tries them: its name (a
/// `speculative.mode` word and a token `source`), when it runs, whether it
/// needs a draft model, and the acceptance its controller assumes at first.
#[napi(ts_return_type = "Record<string, unknown>[]")]
pub fn drafters() -> Value {
    llama_engine_core::speculation::registry::drafters_json()
}

/// The keys of every result and event shape the engine emits, by the name
/// of its TypeScript interface (what the docs test holds `index.d.ts` to).
#[napi(ts_return_type = "Record<string, string[]>")]
pub fn wire_shapes() -> Value {
    llama_engine_core::text::events::wire_shapes()
}

/// Every request field: name, TypeScript type, kind, range, default and a
/// line of documentation (the one list the parser checks against).
#[napi(ts_return_type = "Record<string, unknown>[]")]
pub fn request_fields() -> Value {
    request_fields_json()
}

/// Panics are caught (on the engine thread, at the N-API boundary) and
/// become `INTERNAL` errors that carry their message: nothing is printed,
/// unless `LLAMA_ENGINE_LOG` is set. Installed when the addon loads, before
/// anything (llguidance chains its own hook onto this one) can panic.
#[cfg(not(test))]
#[napi_derive::module_init]
fn quiet_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        sink::note_panic(info);
        if std::env::var_os("LLAMA_ENGINE_LOG").is_some() {
            default(info)
        }
    }));
}
