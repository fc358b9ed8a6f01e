//! The N-API binding: converts between JavaScript and the engine, nothing
//! more. Every type that crosses the boundary is defined here. Errors cross
//! as `Error("<CODE>: <message>")`; `index.js` turns the prefix into `code`.

mod sink;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use serde_json::{json, Value};

use crate::core::chat::parse_messages;
use crate::core::error::EngineError;
use crate::core::options::parse_engine_options;
use crate::core::request::{parse_request_json, RequestLimits};
use crate::engine::{Engine, Job};
use sink::JsEventSink;

fn js_err(e: EngineError) -> napi::Error {
    napi::Error::from_reason(e.to_string())
}

fn parse_json(text: &str, what: &str) -> std::result::Result<Value, EngineError> {
    serde_json::from_str(text).map_err(|e| EngineError::invalid(what, format!("not valid JSON ({e})")))
}

#[napi]
pub struct NativeEngine {
    engine: Arc<Engine>,
}

pub struct LoadTask {
    options: Option<crate::core::options::EngineOptions>,
    progress: Option<ThreadsafeFunction<f64, (), f64, Status, false, false, 0>>,
}

impl Task for LoadTask {
    type Output = Engine;
    type JsValue = NativeEngine;

    fn compute(&mut self) -> Result<Engine> {
        let options = self.options.take().ok_or_else(|| napi::Error::from_reason("INTERNAL: load ran twice"))?;
        let progress = self.progress.take().map(|tsfn| {
            Box::new(move |f: f32| {
                tsfn.call(f as f64, ThreadsafeFunctionCallMode::NonBlocking);
            }) as Box<dyn FnMut(f32) + Send>
        });
        Engine::load(options, progress).map_err(js_err)
    }

    fn resolve(&mut self, _env: Env, engine: Engine) -> Result<NativeEngine> {
        Ok(NativeEngine { engine: Arc::new(engine) })
    }
}

pub struct JoinTask {
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Task for JoinTask {
    type Output = ();
    type JsValue = ();

    fn compute(&mut self) -> Result<()> {
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| napi::Error::from_reason("INTERNAL: the engine thread panicked"))?;
        }
        Ok(())
    }

    fn resolve(&mut self, _env: Env, _: ()) -> Result<()> {
        Ok(())
    }
}

#[napi]
impl NativeEngine {
    /// Loads the model(s) on a new engine thread. `optionsJson` is the
    /// `EngineOptions` object without `onProgress`, as JSON.
    #[napi(ts_return_type = "Promise<NativeEngine>")]
    pub fn load(options_json: String, on_progress: Option<Function<f64, ()>>) -> Result<AsyncTask<LoadTask>> {
        let options = parse_json(&options_json, "options").and_then(|v| parse_engine_options(&v)).map_err(js_err)?;
        let progress = match on_progress {
            Some(f) => Some(f.build_threadsafe_function().callee_handled::<false>().weak::<false>().build()?),
            None => None,
        };
        Ok(AsyncTask::new(LoadTask { options: Some(options), progress }))
    }

    #[napi(catch_unwind)]
    pub fn tokenize(&self, text: String, add_bos: bool, special: bool) -> Result<Vec<i32>> {
        self.engine.tokenize(&text, add_bos, special).map_err(js_err)
    }

    #[napi(catch_unwind)]
    pub fn detokenize(&self, tokens: Vec<i32>) -> Result<String> {
        self.engine.detokenize(&tokens).map_err(js_err)
    }

    /// Validates and queues a request; returns its job id. Every event, then
    /// exactly one `done` or `error`, arrives as JSON through `onEvent`.
    #[napi(catch_unwind)]
    pub fn submit(&self, request_json: String, on_event: Function<String, ()>) -> Result<f64> {
        if self.engine.is_closed() {
            return Err(js_err(EngineError::disposed()));
        }
        let info = self.engine.info();
        let limits = RequestLimits { n_vocab: info.n_vocab, n_ctx: info.n_ctx };
        let mut request = parse_request_json(&request_json, &limits).map_err(js_err)?;
        self.engine.render_messages(&mut request).map_err(js_err)?;
        let tsfn = on_event.build_threadsafe_function().callee_handled::<false>().weak::<false>().build()?;
        let id = self.engine.next_job_id();
        self.engine.submit(Job { id, request, sink: Box::new(JsEventSink::new(tsfn)), cancel: Arc::new(AtomicBool::new(false)) });
        Ok(id as f64)
    }

    /// Renders chat messages (JSON) with the engine's chat template.
    #[napi(catch_unwind)]
    pub fn apply_chat_template(&self, messages_json: String, add_generation_prompt: bool) -> Result<String> {
        let messages = parse_json(&messages_json, "messages").and_then(|v| parse_messages(&v, "messages")).map_err(js_err)?;
        self.engine.apply_chat_template(&messages, add_generation_prompt).map_err(js_err)
    }

    /// Aborts one request, queued or running.
    #[napi]
    pub fn abort(&self, id: f64) {
        self.engine.abort(id as u64);
    }

    /// Stops the request that is running now.
    #[napi]
    pub fn cancel(&self) {
        self.engine.cancel_running();
    }

    #[napi(ts_return_type = "Record<string, unknown>")]
    pub fn status(&self) -> Value {
        let st = self.engine.status();
        let info = self.engine.info();
        let (ngram_dynamic, ngram_static, ngram_errors) = self.engine.ngram_status();
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
            "vocabSize": info.n_vocab,
            "batchInvariant": info.batch_invariant,
            "batchInvariance": info.batch_invariance,
            "cpuBackend": crate::engine::ggml_setup::cpu_backend(),
            "tokensCached": st.tokens_cached,
            "batchCostMs": st.batch_cost_ms,
            "draftStepMs": st.draft_step_ms,
            "ngramCache": {
                "dynamicEntries": ngram_dynamic,
                "staticEntries": ngram_static,
                "errors": ngram_errors,
            },
        })
    }

    /// Writes the dynamic n-gram cache in llama.cpp's lookup format; resolves
    /// with the number of n-grams written.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn save_ngram_cache(&self, path: Option<String>) -> AsyncTask<SaveNgramTask> {
        AsyncTask::new(SaveNgramTask { engine: self.engine.clone(), path })
    }

    /// Stops the engine and frees the models; resolves when they are freed.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn dispose(&self) -> AsyncTask<JoinTask> {
        AsyncTask::new(JoinTask { thread: self.engine.close() })
    }
}

pub struct SaveNgramTask {
    engine: Arc<Engine>,
    path: Option<String>,
}

impl Task for SaveNgramTask {
    type Output = usize;
    type JsValue = u32;

    fn compute(&mut self) -> Result<usize> {
        if self.engine.is_closed() {
            return Err(js_err(EngineError::disposed()));
        }
        self.engine.save_ngram_cache(self.path.as_deref()).map_err(js_err)
    }

    fn resolve(&mut self, _env: Env, n: usize) -> Result<u32> {
        Ok(n as u32)
    }
}

pub struct QuantizeTask {
    input: String,
    output: String,
    ftype: String,
}

impl Task for QuantizeTask {
    type Output = ();
    type JsValue = ();

    fn compute(&mut self) -> Result<()> {
        crate::engine::model::quantize(&self.input, &self.output, &self.ftype).map_err(js_err)
    }

    fn resolve(&mut self, _env: Env, _: ()) -> Result<()> {
        Ok(())
    }
}

/// Re-quantizes a GGUF model with llama.cpp (`ftype`: "Q2_K", "Q3_K_M",
/// "Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16" or "F32"). Used
/// to make the test fixtures.
#[napi(ts_return_type = "Promise<void>")]
pub fn quantize_model(input: String, output: String, ftype: String) -> AsyncTask<QuantizeTask> {
    AsyncTask::new(QuantizeTask { input, output, ftype })
}
