//! `embed()` on the engine thread: a context of its own (made at the first
//! call, with embeddings on), fed one chunk of one input between decoding
//! steps, so generating slots keep streaming beside it.
//!
//! Every input is computed alone, from an empty cache, in chunks of
//! `CHUNK` tokens (a bidirectional encoder: the whole input in one pass),
//! and its rows are pooled in token order (`core::embed::Pooler`): its
//! vector is the same, bit for bit, whatever inputs or requests share the
//! call or the engine.

use llama_cpp_2::context::params::LlamaPoolingType;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use serde_json::json;

use super::model::{self, EngineOptions, ModelInfo};
use llama_engine_core::embed::{to_base64, Pooler};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::text::events::EventSink;

/// Tokens per pass for a decoder. Small enough that a pass costs a few
/// decoding steps of the slots beside it, and that llama.cpp's logits
/// buffer (which a decoder fills for every row) stays small.
pub const CHUNK: usize = 64;

/// One `embed()` call: its inputs, tokenized and fitted to the limit.
pub struct EmbedJob {
    pub inputs: Vec<Vec<LlamaToken>>,
    pub normalize: bool,
    pub sink: Box<dyn EventSink>,
    /// Vectors of the inputs done.
    done: Vec<Vec<f32>>,
    /// The input in progress: its pooler and the tokens already passed.
    current: Option<(Pooler, usize)>,
}

impl EmbedJob {
    pub fn new(inputs: Vec<Vec<LlamaToken>>, normalize: bool, sink: Box<dyn EventSink>) -> Self {
        EmbedJob { inputs, normalize, sink, done: Vec::new(), current: None }
    }

    fn is_done(&self) -> bool {
        self.done.len() == self.inputs.len()
    }

    /// Answers with the vectors (each one's f32 bytes in base64) and the
    /// number of input tokens.
    pub fn answer(self) {
        let tokens: usize = self.inputs.iter().map(Vec::len).sum();
        let embeddings: Vec<String> = self.done.iter().map(|v| to_base64(v)).collect();
        self.sink.reply(Ok(json!({ "embeddings": embeddings, "tokens": tokens })));
    }

    pub fn fail(self, e: EngineError) {
        self.sink.reply(Err(e));
    }
}

/// The embedding context.
pub struct Embedder<'m> {
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    chunk: usize,
}

impl<'m> Embedder<'m> {
    pub fn new(model: &'m LlamaModel, opts: &EngineOptions, info: &ModelInfo) -> Result<Self> {
        let limit = info.n_ctx;
        let chunk = if info.causal { CHUNK.min(limit as usize) } else { limit as usize };
        // Pooling is done here (`Pooler`), from every row's vector: llama.cpp
        // pools per micro-batch, which would cut a chunked input.
        let params = model::context_params(opts, limit, 1, false)
            .with_n_batch(chunk as u32)
            .with_n_ubatch(chunk as u32)
            .with_embeddings(true)
            .with_pooling_type(LlamaPoolingType::None);
        let ctx = model
            .new_context(model::backend()?, params)
            .map_err(|e| EngineError::internal(format!("cannot create the embedding context ({e})")))?;
        Ok(Embedder { ctx, batch: LlamaBatch::new(chunk, 1), chunk })
    }

    /// Passes the next chunk of `job`; true when every input is done.
    pub fn step(&mut self, job: &mut EmbedJob, info: &ModelInfo) -> Result<bool> {
        let i = job.done.len();
        let input = &job.inputs[i];
        let (mut pooler, start) = match job.current.take() {
            Some(current) => current,
            None => {
                self.ctx.clear_kv_cache();
                (Pooler::new(info.pooling, info.n_embd), 0)
            }
        };
        let end = (start + self.chunk).min(input.len());
        self.batch.clear();
        for (k, &token) in input[start..end].iter().enumerate() {
            self.batch
                .add(token, (start + k) as i32, &[0], true)
                .map_err(|e| EngineError::internal(format!("cannot fill the embedding batch ({e})")))?;
        }
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("cannot compute embeddings ({e})")))?;
        for k in 0..end - start {
            let row = self
                .ctx
                .embeddings_ith(k as i32)
                .map_err(|e| EngineError::internal(format!("no embedding for token {} of input {i} ({e})", start + k)))?;
            pooler.add(row);
        }
        if end == input.len() {
            job.done.push(pooler.finish(job.normalize));
        } else {
            job.current = Some((pooler, end));
        }
        Ok(job.is_done())
    }
}
