//! One request, start to finish, on the engine thread: prompt evaluation with
//! KV-cache reuse, the decoding loop, stop conditions, context shift, events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use serde_json::{json, Value};

use super::model::{self, EngineOptions, ModelInfo};
use super::sampler::TokenSampler;
use crate::core::error::{EngineError, Result};
use crate::core::events::{CompletionResult, EventSink, SpeculativeStats, Timings, TokenEvent, TokenOut, TokenProb, TokenSource};
use crate::core::prompt;
use crate::core::request::{CompletionRequest, PromptPart};
use crate::core::text::TextStream;
use crate::core::verify::Dist;

pub struct Models {
    pub target: Arc<LlamaModel>,
    pub info: ModelInfo,
}

impl Models {
    pub fn load(opts: &EngineOptions, progress: Option<Box<dyn FnMut(f32) + Send>>) -> Result<Models> {
        let target = model::load_model(&opts.model_path, opts.gpu_layers, progress)?;
        let info = model::model_info(&target, opts);
        Ok(Models { target, info })
    }
}

pub struct Session<'m> {
    models: &'m Models,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    /// Tokens whose keys/values are in sequence 0, at positions 0..len.
    cached: Vec<LlamaToken>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Eos,
    Word,
    Limit,
    Abort,
}

impl<'m> Session<'m> {
    pub fn new(models: &'m Models, opts: &EngineOptions) -> Result<Self> {
        let info = &models.info;
        let ctx = models
            .target
            .new_context(model::backend()?, model::context_params(opts, info.n_ctx, 1))
            .map_err(|e| EngineError::new(crate::core::error::ErrorCode::ModelLoadFailed, format!("{}: cannot create a context ({e})", opts.model_path)))?;
        Ok(Session { models, ctx, batch: LlamaBatch::new(info.n_batch as usize, 1), cached: Vec::new() })
    }

    pub fn tokens_cached(&self) -> usize {
        self.cached.len()
    }

    /// Forgets the KV cache (after a failure left it in an unknown state).
    pub fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        self.cached.clear();
    }

    fn n_ctx(&self) -> usize {
        self.models.info.n_ctx as usize
    }

    pub fn run(&mut self, req: &CompletionRequest, sink: &mut dyn EventSink, cancel: &AtomicBool) -> Result<CompletionResult> {
        let result = self.generate(req, sink, cancel);
        if result.is_err() {
            self.reset();
        }
        result
    }

    fn tokenize_prompt(&self, req: &CompletionRequest) -> Result<Vec<LlamaToken>> {
        let vocab = self.models.target.vocab();
        let mut tokens = Vec::new();
        for (i, part) in req.prompt.iter().enumerate() {
            match part {
                // Like the legacy server: BOS (when the model wants one) only
                // before a leading string; token ids are taken as given.
                PromptPart::Text(s) => tokens.extend(vocab.tokenize(s.as_bytes(), i == 0, true)),
                PromptPart::Token(t) => tokens.push(LlamaToken(*t)),
            }
        }
        if tokens.is_empty() {
            return Err(EngineError::invalid("prompt", "is empty and the model adds no BOS token: give at least one token"));
        }
        Ok(tokens)
    }

    fn grammar(req: &CompletionRequest) -> Result<Option<String>> {
        if let Some(schema) = &req.json_schema {
            let g = llama_cpp_2::json_schema_to_grammar(schema)
                .map_err(|e| EngineError::invalid("json_schema", format!("cannot be turned into a grammar ({e})")))?;
            return Ok(Some(g));
        }
        Ok(req.grammar.clone())
    }

    /// Decodes `tokens` at positions from `self.cached.len()`, in batches of
    /// at most n_batch; logits only for the last token.
    fn eval(&mut self, tokens: &[LlamaToken], cancel: Option<&AtomicBool>) -> Result<bool> {
        let n_batch = self.models.info.n_batch as usize;
        for (ci, chunk) in tokens.chunks(n_batch).enumerate() {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Ok(false);
            }
            let last_chunk = (ci + 1) * n_batch >= tokens.len();
            self.batch.clear();
            let base = self.cached.len();
            for (i, &t) in chunk.iter().enumerate() {
                let logits = last_chunk && i + 1 == chunk.len();
                self.batch
                    .add(t, (base + i) as i32, &[0], logits)
                    .map_err(|e| EngineError::internal(format!("batch: {e}")))?;
            }
            self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
            self.cached.extend_from_slice(chunk);
        }
        Ok(true)
    }

    /// The legacy context shift: keep the first n_keep (+BOS) tokens, drop
    /// half of the rest, slide the remainder down.
    fn shift_context(&mut self, n_keep: usize) -> Result<()> {
        let n_past = self.cached.len();
        let keep = (n_keep + 1).min(n_past.saturating_sub(1));
        let discard = prompt::shift_discard(n_past, n_keep).min(n_past - keep);
        let mem_err = |e: llama_cpp_2::context::kv_cache::KvCacheConversionError| EngineError::internal(format!("context shift: {e}"));
        self.ctx.kv_cache_seq_rm(0, Some(keep as u32), Some((keep + discard) as u32)).map_err(mem_err)?;
        self.ctx.kv_cache_seq_add(0, Some((keep + discard) as u32), Some(n_past as u32), -(discard as i32)).map_err(mem_err)?;
        self.cached.drain(keep..keep + discard);
        Ok(())
    }

    fn generate(&mut self, req: &CompletionRequest, sink: &mut dyn EventSink, cancel: &AtomicBool) -> Result<CompletionResult> {
        let info = &self.models.info;
        let n_ctx = self.n_ctx();
        if cancel.load(Ordering::SeqCst) {
            return Ok(aborted_before_start(req, info));
        }
        let t_start = Instant::now();
        let grammar = Self::grammar(req)?;
        let mut sampler = TokenSampler::new(&self.models.target, req, grammar.as_deref(), &info.eog, info.n_ctx)?;

        // Prompt: tokenize, fit into the window, reuse the cached prefix.
        let mut tokens = self.tokenize_prompt(req)?;
        let n_prompt = tokens.len();
        let n_keep = prompt::effective_n_keep(req.n_keep, n_prompt, n_ctx);
        let mut truncated = prompt::truncate_prompt(&mut tokens, n_keep, n_ctx);
        let mut n_past = if req.cache_prompt { prompt::common_prefix(&self.cached, &tokens) } else { 0 };
        if n_past == tokens.len() {
            n_past -= 1; // at least one token must be evaluated to get logits
        }
        if self.ctx.kv_cache_seq_rm(0, Some(n_past as u32), None).is_err() {
            self.reset();
            n_past = 0;
        }
        self.cached.truncate(n_past);
        let tokens_cached = n_past;
        sampler.accept_prompt(&tokens);
        if !self.eval(&tokens[n_past..], Some(cancel))? {
            // Aborted during the prompt: keep what is in the cache consistent.
            let mut r = aborted_before_start(req, info);
            r.tokens_evaluated = n_prompt;
            r.tokens_cached = tokens_cached;
            return Ok(r);
        }
        let prompt_ms = ms(t_start);
        let t_gen = Instant::now();

        let vocab = self.models.target.vocab();
        let mut text = TextStream::new(req.stop.clone());
        let mut probs_out: Vec<Value> = Vec::new();
        let mut n_gen = 0usize;
        let mut passes = 0usize;
        let want_dist = req.n_probs > 0;
        let stop = loop {
            if cancel.load(Ordering::Relaxed) {
                break Stop::Abort;
            }
            if req.n_predict >= 0 && n_gen >= req.n_predict as usize {
                break Stop::Limit;
            }
            let (token, dist) = sampler.sample(&self.ctx, -1, want_dist);
            sampler.accept(token);
            if vocab.is_eog(token) && !req.ignore_eos {
                break Stop::Eos;
            }
            n_gen += 1;
            let piece = vocab.token_to_piece(token, false, None);
            let pushed = text.push(&piece);
            let mut out = TokenOut { id: token.0, piece: String::from_utf8_lossy(&piece).into_owned(), source: TokenSource::Target, probs: None };
            if let (true, Some(d)) = (want_dist, dist.as_ref()) {
                let probs = top_probs(&self.models.target, d, req.n_probs);
                probs_out.push(legacy_probs(&out.piece, &probs));
                out.probs = Some(probs);
            }
            let mut stop = if pushed.stop.is_some() {
                Some(Stop::Word)
            } else if req.n_predict >= 0 && n_gen >= req.n_predict as usize {
                Some(Stop::Limit)
            } else {
                None
            };
            // With n_predict = -1 generation ends when the context is full;
            // with a budget it shifts the context and goes on, as the legacy server.
            if stop.is_none() && self.cached.len() + 1 >= n_ctx && req.n_predict < 0 {
                stop = Some(Stop::Limit);
            }
            let mut content = pushed.text;
            if stop.is_some() {
                content.push_str(&text.finish());
            }
            let event = TokenEvent { content, tokens: vec![out], n_drafted: 0, n_accepted: 0 };
            if !sink.token(&event) {
                break Stop::Abort;
            }
            if let Some(s) = stop {
                break s;
            }
            if self.cached.len() + 1 >= n_ctx {
                self.shift_context(n_keep)?;
                truncated = true;
            }
            self.eval(&[token], None)?;
            passes += 1;
        };
        // Anything still held back (a partial stop prefix, an incomplete
        // character) is released when generation ends for another reason.
        if matches!(stop, Stop::Eos | Stop::Abort) {
            let rest = text.finish();
            if !rest.is_empty() {
                sink.token(&TokenEvent { content: rest, tokens: vec![], n_drafted: 0, n_accepted: 0 });
            }
        }
        let predicted_ms = ms(t_gen);
        Ok(CompletionResult {
            content: text.content().to_string(),
            stop: true,
            model: info.name.clone(),
            tokens_predicted: n_gen,
            tokens_evaluated: n_prompt,
            tokens_cached,
            truncated,
            stopped_eos: stop == Stop::Eos,
            stopped_word: stop == Stop::Word,
            stopped_limit: stop == Stop::Limit,
            stopped_abort: stop == Stop::Abort,
            stopping_word: text.stopped().unwrap_or_default().to_string(),
            generation_settings: req.generation_settings(info.n_ctx, &info.name),
            timings: Timings::new(tokens.len() - tokens_cached, prompt_ms, n_gen, predicted_ms),
            speculative: SpeculativeStats { mode: "off".into(), target_passes: passes, ..Default::default() },
            completion_probabilities: want_dist.then_some(probs_out),
        })
    }
}

/// The result of a request that was aborted before it produced anything.
pub fn aborted_before_start(req: &CompletionRequest, info: &ModelInfo) -> CompletionResult {
    CompletionResult {
        stop: true,
        model: info.name.clone(),
        stopped_abort: true,
        generation_settings: req.generation_settings(info.n_ctx, &info.name),
        speculative: SpeculativeStats { mode: req.speculative.mode.as_str().into(), ..Default::default() },
        completion_probabilities: (req.n_probs > 0).then(Vec::new),
        ..Default::default()
    }
}

fn top_probs(model: &LlamaModel, dist: &Dist, n: usize) -> Vec<TokenProb> {
    let vocab = model.vocab();
    dist.top(n)
        .into_iter()
        .map(|(id, prob)| TokenProb { id, piece: String::from_utf8_lossy(&vocab.token_to_piece(LlamaToken(id), false, None)).into_owned(), prob })
        .collect()
}

/// The legacy `completion_probabilities` entry for one token.
fn legacy_probs(piece: &str, probs: &[TokenProb]) -> Value {
    json!({
        "content": piece,
        "probs": probs.iter().map(|p| json!({ "tok_str": p.piece, "prob": p.prob })).collect::<Vec<_>>(),
    })
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
