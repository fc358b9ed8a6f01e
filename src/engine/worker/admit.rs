//! Admission: a queued job becomes a request in a free slot, with its
//! sampler chain, its drafters and its prompt tokens.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::{aborted_before_start, panic_error, Worker};
use crate::core::error::{EngineError, Result};
use crate::core::request::gbnf::check_gbnf;
use crate::core::request::{prompt, CompletionRequest, PromptPart, SpecMode};
use crate::core::speculation::controller::DraftController;
use crate::core::speculation::drafter::DrafterChain;
use crate::core::speculation::ngram::{NgramDrafter, NgramParams, CLASS_PRIORS, NGRAM_PRIOR};
use crate::engine::draft_model::{DraftSettings, ModelDrafter};
use crate::engine::model;
use crate::engine::sampler::TokenSampler;
use crate::engine::shared::Job;
use crate::engine::slot::{PromptTokens, Request};

const PANIC_PROMPT: &str = "__llama_engine_panic__";

/// Acceptance assumed for a draft model before any is measured.
const MODEL_PRIOR: f64 = 0.7;

/// What a request needs before it takes a slot.
struct Prepared {
    sampler: TokenSampler,
    kinds: Vec<SpecMode>,
    prompt: PromptTokens,
}

impl<'m> Worker<'m> {
    /// Starts `job` in a free slot: the one whose cache shares the longest
    /// prefix with its prompt (a chat's next turn lands where its last turn
    /// was), else the lowest. A request that cannot start is answered here.
    /// A panic while preparing (grammars, tokenizing: nothing of the
    /// engine's state is touched yet) fails this request only.
    pub fn admit(&mut self, job: Job) {
        if job.cancel.load(Ordering::SeqCst) {
            let result = aborted_before_start(&job.request, &self.models.info, self.invariance.holds());
            self.shared.request_ended(job.id);
            job.sink.finish(Ok(result));
            return;
        }
        let prepared = catch_unwind(AssertUnwindSafe(|| self.prepare(&job.request))).unwrap_or_else(|panic| Err(panic_error(&*panic)));
        match prepared {
            Ok(prepared) => self.start(job, prepared),
            Err(e) => {
                self.shared.request_ended(job.id);
                job.sink.finish(Err(e));
            }
        }
    }

    fn prepare(&self, req: &CompletionRequest) -> Result<Prepared> {
        // Fault injection for the test suite: with LLAMA_ENGINE_FAULT_INJECTION=1
        // in the environment, the prompt "__llama_engine_panic__" panics here.
        if req.prompt == [PromptPart::Text(PANIC_PROMPT.into())] && std::env::var("LLAMA_ENGINE_FAULT_INJECTION").is_ok_and(|v| v == "1") {
            panic!("fault injected by {PANIC_PROMPT}");
        }
        let info = &self.models.info;
        let grammar = grammar(req, &self.models.target)?;
        let sampler = TokenSampler::new(&self.models.target, req, grammar.as_deref(), &info.eog, info.n_ctx)?;
        let kinds = if sampler.supports_speculation() { self.drafter_kinds(req)? } else { Vec::new() };
        let mut tokens = self.tokenize_prompt(req)?;
        let n_given = tokens.len();
        let n_keep = prompt::effective_n_keep(req.n_keep, n_given, self.n_ctx);
        let truncated = prompt::truncate_prompt(&mut tokens, n_keep, self.n_ctx);
        Ok(Prepared { sampler, kinds, prompt: PromptTokens { tokens, n_given, n_keep, truncated } })
    }

    fn start(&mut self, job: Job, p: Prepared) {
        let tokens = &p.prompt.tokens;
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_free())
            .map(|(i, s)| (i, if job.request.cache_prompt { prompt::common_prefix(&s.cached, tokens) } else { 0 }))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)));
        let Some((i, mut n_past)) = best else { return };
        if n_past == tokens.len() {
            n_past -= 1; // at least one token must be evaluated to get logits
        }
        let seq = self.slots[i].seq;
        if self.ctx.kv_cache_seq_rm(seq, Some(n_past as u32), None).is_err() {
            let _ = self.ctx.kv_cache_seq_rm(seq, None, None);
            n_past = 0;
        }
        self.slots[i].cached.truncate(n_past);
        let chain = self.chain(&job.request, &p.kinds, i, p.sampler.is_greedy(), p.sampler.seed());
        self.slots[i].request = Some(Box::new(Request::new(job, p.sampler, chain, p.prompt, n_past)));
    }

    /// The drafters a request may use, in chain order.
    fn drafter_kinds(&self, req: &CompletionRequest) -> Result<Vec<SpecMode>> {
        let has_model = self.draft.is_some();
        let need_model = |kinds: Vec<SpecMode>| {
            if has_model {
                Ok(kinds)
            } else {
                Err(EngineError::invalid(
                    "speculative.mode",
                    format!("\"{}\" needs a draft model: load the engine with draftModelPath", req.speculative.mode.as_str()),
                ))
            }
        };
        match req.speculative.mode {
            SpecMode::Off => Ok(vec![]),
            SpecMode::Ngram => Ok(vec![SpecMode::Ngram]),
            SpecMode::Draft => need_model(vec![SpecMode::Draft]),
            SpecMode::NgramDraft => need_model(vec![SpecMode::Ngram, SpecMode::Draft]),
            SpecMode::Auto if has_model => Ok(vec![SpecMode::Ngram, SpecMode::Draft]),
            SpecMode::Auto => Ok(vec![SpecMode::Ngram]),
        }
    }

    /// The request's drafters, each with its own controller.
    fn chain(&mut self, req: &CompletionRequest, kinds: &[SpecMode], slot: usize, greedy: bool, seed: u64) -> DrafterChain<'m> {
        let spec = &req.speculative;
        let mut chain = DrafterChain::new(spec.n_min);
        for kind in kinds {
            match kind {
                SpecMode::Ngram => {
                    // N-gram acceptance depends on how much the answer copies
                    // from this prompt: every request starts afresh.
                    let ctl =
                        DraftController::new(spec.n_max, spec.adaptive, NGRAM_PRIOR).with_loss_check(false).with_classes(&CLASS_PRIORS);
                    let ngram = &self.shared.ngram;
                    let d = NgramDrafter::new(NgramParams::default(), ngram.dynamic.clone(), ngram.fixed.clone());
                    chain.push(Box::new(d), ctl);
                }
                _ => {
                    let Some(cx) = self.draft.clone() else { continue };
                    let key = (spec.n_max, spec.adaptive, greedy);
                    let ctl = match self.model_ctls.iter().position(|(k, _)| *k == key) {
                        Some(p) => self.model_ctls.swap_remove(p).1,
                        None => DraftController::new(spec.n_max, spec.adaptive, MODEL_PRIOR),
                    };
                    let settings = DraftSettings {
                        temperature: req.sampling.temperature,
                        p_min: spec.p_min,
                        n_parallel: spec.n_parallel,
                        p_split: spec.p_split,
                    };
                    chain.push(Box::new(ModelDrafter::new(cx, slot, settings, seed)), ctl);
                }
            }
        }
        chain
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
                PromptPart::Chat(s) => tokens.extend(model::tokenize_chat(&self.models.target, s)),
            }
        }
        if tokens.is_empty() {
            return Err(EngineError::invalid("prompt", "is empty and the model adds no BOS token: give at least one token"));
        }
        Ok(tokens)
    }
}

/// The GBNF a request's sampler enforces: its `grammar`, or the grammar its
/// `json_schema` converts to, checked (`core::request::gbnf`) against this
/// model's vocabulary, so that llama.cpp's parser never sees a grammar it
/// would reject (it prints them).
fn grammar(req: &CompletionRequest, model: &LlamaModel) -> Result<Option<String>> {
    let (g, field) = match (&req.json_schema, &req.grammar) {
        (Some(schema), _) => {
            let g = llama_cpp_2::json_schema_to_grammar(schema)
                .map_err(|e| EngineError::invalid("json_schema", format!("cannot be turned into a grammar ({e})")))?;
            (g, "json_schema")
        }
        (None, Some(g)) => (g.clone(), "grammar"),
        (None, None) => return Ok(None),
    };
    let checked = check_gbnf(&g).map_err(|why| EngineError::invalid(field, why))?;
    let vocab = model.vocab();
    for text in &checked.named_tokens {
        if vocab.tokenize(text.as_bytes(), false, true).len() != 1 {
            return Err(EngineError::invalid(field, format!("{text} is not a token of this model")));
        }
    }
    let n_vocab = model.n_vocab();
    if let Some(id) = checked.token_ids.iter().find(|&&id| id >= n_vocab as u32) {
        return Err(EngineError::invalid(field, format!("<[{id}]> is not a token id of this model (0..{n_vocab})")));
    }
    Ok(Some(g))
}
