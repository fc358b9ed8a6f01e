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

use std::sync::Arc;

use super::media::{positions_of, MediaSpan, Projector};
use super::model::{self, EngineOptions, ModelInfo};
use llama_engine_core::embed::{to_base64, Pooler, Pooling};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::text::events::EventSink;

/// Tokens per pass for a decoder. Small enough that a pass costs a few
/// decoding steps of the slots beside it, and that llama.cpp's logits
/// buffer (which a decoder fills for every row) stays small.
pub const CHUNK: usize = 64;

/// An `embed()` call prepared: its inputs tokenized and fitted to the
/// limit, each one's images and audio encoded (their tokens in `inputs`
/// stand as media ids, `media::MediaSpan`).
pub struct PreparedEmbed {
    inputs: Vec<Vec<LlamaToken>>,
    media: Vec<Vec<MediaSpan>>,
    normalize: bool,
}

impl PreparedEmbed {
    /// The job that answers `sink`.
    pub fn with_sink(self, sink: Box<dyn EventSink>) -> EmbedJob {
        EmbedJob { inputs: self.inputs, media: self.media, normalize: self.normalize, sink, done: Vec::new(), current: None }
    }
}

/// One `embed()` call on the engine thread.
pub struct EmbedJob {
    pub inputs: Vec<Vec<LlamaToken>>,
    media: Vec<Vec<MediaSpan>>,
    pub normalize: bool,
    pub sink: Box<dyn EventSink>,
    /// Vectors of the inputs done.
    done: Vec<Vec<f32>>,
    /// The input in progress: its pooler and the tokens already passed.
    current: Option<(Pooler, usize)>,
}

impl EmbedJob {
    /// `media[i]`: input i's images and audio (empty for text).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inputs: Vec<Vec<LlamaToken>>, media: Vec<Vec<MediaSpan>>, normalize: bool) -> PreparedEmbed {
        PreparedEmbed { inputs, media, normalize }
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
    /// Its llama.cpp pointer, for the projector's decodes.
    raw: *mut llama_cpp_sys_2::llama_context,
    projector: Option<Arc<Projector>>,
    batch: LlamaBatch<'static>,
    chunk: usize,
}

impl<'m> Embedder<'m> {
    pub fn new(model: &'m LlamaModel, opts: &EngineOptions, info: &ModelInfo, projector: Option<Arc<Projector>>) -> Result<Self> {
        let limit = info.n_ctx;
        let chunk = if info.causal { CHUNK.min(limit as usize) } else { limit as usize };
        // An image with non-causal attention must be one micro-batch: as
        // large as the target context's, which the projector decodes in.
        let n_batch = if projector.is_some() { chunk.max(info.n_batch as usize) } else { chunk };
        // Pooling is done here (`Pooler`), from every row's vector: llama.cpp
        // pools per micro-batch, which would cut a chunked input. A
        // reranker's score is llama.cpp's (its classifier head, in the
        // graph): read after an input's last chunk, which holds the token it
        // pools (the first of the one pass of an encoder, the last for a decoder).
        let pooling = if info.pooling == Pooling::Rank { LlamaPoolingType::Rank } else { LlamaPoolingType::None };
        let params = model::context_params(opts, limit, 1, false)
            .with_n_batch(n_batch as u32)
            .with_n_ubatch(n_batch as u32)
            .with_embeddings(true)
            .with_pooling_type(pooling);
        let ctx = model
            .new_context(model::backend()?, params)
            .map_err(|e| EngineError::internal(format!("cannot create the embedding context ({e})")))?;
        // SAFETY: reads a thread-local pointer llama.cpp set as it made `ctx`.
        let raw = unsafe { llama_cpp_sys_2::llama_last_context_created() };
        crate::portable::set_portable(raw, opts.portable).map_err(EngineError::internal)?;
        Ok(Embedder { ctx, raw, projector, batch: LlamaBatch::new(chunk, 1), chunk })
    }

    /// Passes the next chunk of `job` (text tokens, or one image or audio
    /// clip); true when every input is done. Media rows are not pooled:
    /// they reach the vector through the text rows' attention (as in
    /// llama.cpp's server), so an input that ends in text pools as its text.
    pub fn step(&mut self, job: &mut EmbedJob, info: &ModelInfo) -> Result<bool> {
        let i = job.done.len();
        let input = &job.inputs[i];
        let spans = &job.media[i];
        let (mut pooler, start) = match job.current.take() {
            Some(current) => current,
            None => {
                self.ctx.clear_kv_cache();
                (Pooler::new(info.pooling, info.n_embd), 0)
            }
        };
        let positions = positions_of(spans);
        if let Some(span) = spans.iter().find(|s| s.start == start) {
            let projector = self.projector.as_ref().ok_or_else(|| EngineError::internal("media to embed without a projector"))?;
            // SAFETY: `raw` is this embedder's live context, of the projector's model.
            unsafe { projector.decode(self.raw, span, positions.pos(start), 0)? };
            let end = span.end();
            return Ok(self.advance(job, i, pooler, end));
        }
        let next_media = spans.iter().map(|s| s.start).filter(|&s| s > start).min().unwrap_or(input.len());
        let end = (start + self.chunk).min(next_media);
        self.batch.clear();
        for (k, &token) in input[start..end].iter().enumerate() {
            self.batch
                .add(token, positions.pos(start + k) as i32, &[0], true)
                .map_err(|e| EngineError::internal(format!("cannot fill the embedding batch ({e})")))?;
        }
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("cannot compute embeddings ({e})")))?;
        if info.pooling == Pooling::Rank {
            if end >= input.len() {
                let score = self.ctx.embeddings_seq_ith(0).map_err(|e| EngineError::internal(format!("no score for input {i} ({e})")))?;
                pooler.add(score);
            }
            return Ok(self.advance(job, i, pooler, end));
        }
        for k in 0..end - start {
            let row = self
                .ctx
                .embeddings_ith(k as i32)
                .map_err(|e| EngineError::internal(format!("no embedding for token {} of input {i} ({e})", start + k)))?;
            pooler.add(row);
        }
        Ok(self.advance(job, i, pooler, end))
    }

    /// Input `i` of `job` has passed up to token `end`: done, or to go on.
    fn advance(&self, job: &mut EmbedJob, i: usize, pooler: Pooler, end: usize) -> bool {
        if end >= job.inputs[i].len() {
            job.done.push(pooler.finish(job.normalize));
        } else {
            job.current = Some((pooler, end));
        }
        job.is_done()
    }
}
