//! A slot: one KV stream of the target context (llama.cpp sequence `seq`),
//! what it holds, and the request generating in it, if any. Everything a
//! request owns lives in its `Request`: its sampler chain, drafters, text
//! stream, counters and clock, so requests decoded side by side share
//! nothing but the batch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use serde_json::{json, Value};

use super::sampler::{TokenSampler, DEAD_END};
use super::Job;
use crate::core::drafter::DrafterChain;
use crate::core::events::{CompletionResult, EventSink, SpeculativeStats, Timings, TokenEvent, TokenOut, TokenProb, TokenSource};
use crate::core::request::CompletionRequest;
use crate::core::text::TextStream;
use crate::core::verify::Dist;

pub struct Slot<'m> {
    /// The llama.cpp sequence (and KV stream) of this slot.
    pub seq: i32,
    /// Tokens whose keys and values the stream holds, at positions 0..len.
    pub cached: Vec<LlamaToken>,
    pub request: Option<Box<Request<'m>>>,
}

impl Slot<'_> {
    pub fn new(seq: i32) -> Self {
        Slot { seq, cached: Vec::new(), request: None }
    }

    pub fn is_free(&self) -> bool {
        self.request.is_none()
    }
}

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Its prompt is being evaluated (the slot's cache holds a prefix of it).
    Prefill,
    /// Generating; `pending` is the last token produced, not yet decoded.
    Generate { pending: LlamaToken },
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Eos,
    Word,
    Limit,
    Abort,
}

/// A token a step produced, where it came from, and the distribution it was
/// chosen from (when the request wants probabilities).
pub type StepToken = (LlamaToken, TokenSource, Option<Dist>);

pub struct Request<'m> {
    pub id: u64,
    pub req: CompletionRequest,
    pub sink: Box<dyn EventSink>,
    pub cancel: Arc<AtomicBool>,
    pub sampler: TokenSampler,
    pub chain: DrafterChain<'m>,
    pub text: TextStream,
    pub phase: Phase,
    /// The prompt as evaluated (after truncation), its length as given, the
    /// tokens kept on a shift, and the prefix found in the slot's cache.
    pub prompt: Vec<LlamaToken>,
    pub n_prompt: usize,
    pub n_keep: usize,
    pub truncated: bool,
    pub tokens_cached: usize,
    pub n_gen: usize,
    pub passes: usize,
    pub probs_out: Vec<Value>,
    pub started: Instant,
    pub prompt_ms: f64,
    /// When generation began (the prompt was done).
    pub generating_since: Option<Instant>,
}

impl<'m> Request<'m> {
    pub fn from_job(
        job: Job,
        sampler: TokenSampler,
        chain: DrafterChain<'m>,
        prompt: Vec<LlamaToken>,
        n_prompt: usize,
        n_keep: usize,
        truncated: bool,
    ) -> Self {
        let text = TextStream::new(job.request.stop.clone());
        Request {
            id: job.id,
            req: job.request,
            sink: job.sink,
            cancel: job.cancel,
            sampler,
            chain,
            text,
            phase: Phase::Prefill,
            prompt,
            n_prompt,
            n_keep,
            truncated,
            tokens_cached: 0,
            n_gen: 0,
            passes: 0,
            probs_out: Vec::new(),
            started: Instant::now(),
            prompt_ms: 0.0,
            generating_since: None,
        }
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Tokens still allowed by `n_predict` (unbounded with -1).
    pub fn budget(&self) -> usize {
        if self.req.n_predict < 0 {
            usize::MAX
        } else {
            (self.req.n_predict as usize).saturating_sub(self.n_gen)
        }
    }

    pub fn wants_dist(&self) -> bool {
        self.req.n_probs > 0
    }

    /// Whether `token` ends generation (end of generation unless ignored,
    /// or a grammar that allows nothing more).
    pub fn ends(&self, model: &LlamaModel, token: LlamaToken) -> bool {
        token == DEAD_END || (model.vocab().is_eog(token) && !self.req.ignore_eos)
    }

    /// The prompt is evaluated: generation starts.
    pub fn prompt_done(&mut self) {
        self.prompt_ms = ms(self.started);
        self.generating_since = Some(Instant::now());
    }

    /// Streams this step's tokens as one event, stopping at the first end
    /// condition; returns why generation ended, if it did. `cached_after` is
    /// the slot's cache length after the step (for the full-context stop).
    pub fn emit(
        &mut self,
        model: &LlamaModel,
        tokens: Vec<StepToken>,
        drafted: usize,
        accepted: usize,
        n_ctx: usize,
        cached_after: usize,
    ) -> Option<Stop> {
        let vocab = model.vocab();
        let mut out = Vec::with_capacity(tokens.len());
        let mut content = String::new();
        let mut stop = None;
        for (token, source, dist) in tokens {
            if self.ends(model, token) {
                stop = Some(Stop::Eos);
                break;
            }
            self.n_gen += 1;
            self.phase = Phase::Generate { pending: token };
            let piece = vocab.token_to_piece(token, false, None);
            let pushed = self.text.push(&piece);
            content.push_str(&pushed.text);
            let mut t = TokenOut { id: token.0, piece: String::from_utf8_lossy(&piece).into_owned(), source, probs: None };
            if let (true, Some(d)) = (self.wants_dist(), dist.as_ref()) {
                let probs = top_probs(model, d, self.req.n_probs);
                self.probs_out.push(legacy_probs(&t.piece, &probs));
                t.probs = Some(probs);
            }
            out.push(t);
            if pushed.stop.is_some() {
                stop = Some(Stop::Word);
                break;
            }
            if self.budget() == 0 {
                stop = Some(Stop::Limit);
                break;
            }
        }
        // With n_predict = -1 generation ends when the context is full.
        if stop.is_none() && self.req.n_predict < 0 && cached_after + 2 >= n_ctx {
            stop = Some(Stop::Limit);
        }
        if stop.is_some() {
            content.push_str(&self.text.finish());
        }
        if (!out.is_empty() || !content.is_empty())
            && !self.sink.token(&TokenEvent { content, tokens: out, n_drafted: drafted, n_accepted: accepted })
        {
            return Some(Stop::Abort);
        }
        stop
    }

    /// The final result, after anything still held back (a partial stop
    /// prefix, an incomplete character) was released when generation ended
    /// for a reason that does not flush it.
    pub fn result(&mut self, stop: Stop, model_name: &str, n_ctx: u32, batch_invariant: bool) -> CompletionResult {
        if matches!(stop, Stop::Abort) || (stop == Stop::Limit && self.text.held_bytes() > 0) {
            let rest = self.text.finish();
            if !rest.is_empty() {
                self.sink.token(&TokenEvent { content: rest, tokens: vec![], n_drafted: 0, n_accepted: 0 });
            }
        }
        self.chain.end();
        let mut stats = SpeculativeStats {
            mode: self.req.speculative.mode.as_str().into(),
            target_passes: self.passes,
            draft_ms: self.chain.draft_ms,
            batch_invariant,
            ..Default::default()
        };
        for (name, s) in self.chain.stats() {
            stats.n_drafted += s.n_drafted;
            stats.n_accepted += s.n_accepted;
            let entry = stats.drafters.entry(name.to_string()).or_default();
            entry.n_drafted += s.n_drafted;
            entry.n_accepted += s.n_accepted;
        }
        stats.acceptance_rate = if stats.n_drafted > 0 { stats.n_accepted as f64 / stats.n_drafted as f64 } else { 0.0 };
        let predicted_ms = self.generating_since.map_or(0.0, ms);
        let prompt_ms = if self.generating_since.is_some() { self.prompt_ms } else { ms(self.started) };
        CompletionResult {
            content: self.text.content().to_string(),
            stop: true,
            model: model_name.to_string(),
            tokens_predicted: self.n_gen,
            tokens_evaluated: self.n_prompt,
            tokens_cached: self.tokens_cached,
            truncated: self.truncated,
            stopped_eos: stop == Stop::Eos,
            stopped_word: stop == Stop::Word,
            stopped_limit: stop == Stop::Limit,
            stopped_abort: stop == Stop::Abort,
            stopping_word: self.text.stopped().unwrap_or_default().to_string(),
            generation_settings: self.req.generation_settings(n_ctx, model_name),
            timings: Timings::new(self.prompt.len().saturating_sub(self.tokens_cached), prompt_ms, self.n_gen, predicted_ms),
            speculative: stats,
            completion_probabilities: self.wants_dist().then(|| std::mem::take(&mut self.probs_out)),
        }
    }
}

fn top_probs(model: &LlamaModel, dist: &Dist, n: usize) -> Vec<TokenProb> {
    let vocab = model.vocab();
    dist.top(n)
        .into_iter()
        .map(|(id, prob)| TokenProb {
            id,
            piece: String::from_utf8_lossy(&vocab.token_to_piece(LlamaToken(id), false, None)).into_owned(),
            prob,
        })
        .collect()
}

/// The legacy `completion_probabilities` entry for one token.
fn legacy_probs(piece: &str, probs: &[TokenProb]) -> Value {
    json!({
        "content": piece,
        "probs": probs.iter().map(|p| json!({ "tok_str": p.piece, "prob": p.prob })).collect::<Vec<_>>(),
    })
}

pub fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
