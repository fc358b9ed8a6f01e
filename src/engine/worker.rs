//! The engine thread's work: admitting requests into slots and decoding all
//! of them together, one llama.cpp batch per step. A step runs in named
//! phases — end what must end, plan (prompt chunks and drafts), build the
//! batch, decode, then per slot verify and accept, and emit events — so a
//! request joins between two steps and a long prompt is evaluated in chunks
//! beside the requests that are streaming.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::calibrate::{calibrate, calibration_tokens};
use super::draft_model::{DraftContext, DraftSettings, ModelDrafter};
use super::model::{self, EngineOptions, ModelInfo};
use super::sampler::{TokenSampler, DEAD_END};
use super::slot::{ms, Phase, Request, Slot, StepToken, Stop};
use super::Job;
use crate::core::controller::{BatchCost, DraftController};
use crate::core::drafter::{Draft, DrafterChain, Prices};
use crate::core::error::{EngineError, ErrorCode, Result};
use crate::core::events::{CompletionResult, SpeculativeStats, TokenSource};
use crate::core::invariance::InvarianceCheck;
use crate::core::ngram::{NgramCache, NgramDrafter, NgramParams, CLASS_PRIORS};
use crate::core::prompt;
use crate::core::request::{CompletionRequest, PromptPart, SpecMode};
use crate::core::schedule::{prefill_chunk, trim, ubatches, Part, StepPrice, Trimmable};
use crate::core::verify::verify_draft;

const PANIC_PROMPT: &str = "__llama_engine_panic__";

/// Prompt tokens a request may evaluate in one step while others stream:
/// they wait at most one such chunk between two token events.
const PREFILL_CHUNK: usize = 128;

/// Acceptance assumed for a draft model before any is measured.
const MODEL_PRIOR: f64 = 0.7;

/// (n_max, adaptive, greedy): requests with these equal share the draft
/// model's controller, which persists across requests.
type ControllerKey = (usize, bool, bool);

pub struct Models {
    pub target: Arc<LlamaModel>,
    pub draft: Option<Arc<LlamaModel>>,
    pub info: ModelInfo,
}

impl Models {
    pub fn load(opts: &EngineOptions, progress: Option<Box<dyn FnMut(f32) + Send>>) -> Result<Models> {
        // With a draft model, the first half of the progress is the target's.
        let has_draft = opts.draft_model_path.is_some();
        let progress = progress.map(|p| Arc::new(Mutex::new(p)));
        let part = |offset: f32, scale: f32| {
            progress.clone().map(|p| {
                Box::new(move |f: f32| {
                    if let Ok(mut cb) = p.lock() {
                        cb(offset + f * scale)
                    }
                }) as Box<dyn FnMut(f32) + Send>
            })
        };
        let target = model::load_model(&opts.model_path, opts.gpu_layers, part(0.0, if has_draft { 0.5 } else { 1.0 }))?;
        let draft = match &opts.draft_model_path {
            Some(path) => {
                let draft = model::load_model(path, opts.draft_gpu_layers, part(0.5, 0.5))?;
                model::check_compatible(&target, &draft)?;
                Some(draft)
            }
            None => None,
        };
        let info = model::model_info(&target, opts);
        Ok(Models { target, draft, info })
    }
}

/// The n-gram caches shared by every request of an engine.
#[derive(Clone, Default)]
pub struct NgramStore {
    pub dynamic: Arc<Mutex<NgramCache>>,
    pub fixed: Option<Arc<NgramCache>>,
}

/// How the engine thread tells the handle that a request is over.
pub trait Finished {
    fn finished(&self, id: u64);
}

/// One part of a step's batch: a slot's tokens and what they are for.
struct Planned {
    slot: usize,
    tokens: Vec<LlamaToken>,
    /// Prefill: whether this chunk ends the prompt (its last row's logits
    /// then give the first token). Generate: the draft after the pending token.
    completes_prompt: bool,
    draft: Option<Draft>,
    /// Index of the part's first row in the batch.
    first_row: usize,
}

pub struct Worker<'m> {
    models: &'m Models,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    pub slots: Vec<Slot<'m>>,
    costs: BatchCost,
    draft: Option<Rc<RefCell<DraftContext<'m>>>>,
    model_ctls: Vec<(ControllerKey, DraftController)>,
    ngram: NgramStore,
    invariance: InvarianceCheck,
    n_ctx: usize,
    n_batch: usize,
}

impl<'m> Worker<'m> {
    pub fn new(models: &'m Models, opts: &EngineOptions, ngram: NgramStore) -> Result<Self> {
        let info = &models.info;
        let parallel = info.parallel;
        let load_err = |what: &str, path: &str, e: String| {
            EngineError::new(ErrorCode::ModelLoadFailed, format!("{path}: cannot create the {what} context ({e})"))
        };
        // One KV stream per slot: a request's attention then sums over its
        // own cells in the order plain decoding does, whoever shares the
        // batch (a unified cache would interleave neighbours' cells).
        let params = model::context_params(opts, info.n_ctx * parallel as u32, parallel as u32, false);
        let ctx = models.target.new_context(model::backend()?, params).map_err(|e| load_err("target", &opts.model_path, e.to_string()))?;
        let draft = match (&models.draft, &opts.draft_model_path) {
            (Some(m), Some(path)) => {
                let params = model::context_params(opts, info.n_ctx * parallel as u32, DraftContext::sequences(parallel), true);
                let dctx = m.new_context(model::backend()?, params).map_err(|e| load_err("draft", path, e.to_string()))?;
                Some(Rc::new(RefCell::new(DraftContext::new(dctx, parallel, info.n_batch as usize))))
            }
            _ => None,
        };
        let n_batch = info.n_batch as usize;
        let mut worker = Worker {
            models,
            ctx,
            batch: LlamaBatch::new(n_batch, 1),
            slots: (0..parallel).map(|s| Slot::new(s as i32)).collect(),
            costs: BatchCost::new(n_batch + 1),
            draft,
            model_ctls: Vec::new(),
            ngram,
            invariance: InvarianceCheck::default(),
            n_ctx: info.n_ctx as usize,
            n_batch,
        };
        worker.invariance =
            calibrate(&mut worker.ctx, &mut worker.batch, &models.target, worker.n_ctx, n_batch, parallel, &mut worker.costs);
        if let Some(d) = &worker.draft {
            d.borrow_mut().calibrate(calibration_tokens(&models.target)[0]);
        }
        Ok(worker)
    }

    pub fn invariance(&self) -> &InvarianceCheck {
        &self.invariance
    }

    /// Measured costs: target batch of n tokens (index n), draft step.
    pub fn costs(&self) -> (Vec<Option<f64>>, Option<f64>) {
        let batch = (0..=33).map(|n| if n == 0 { None } else { self.costs.measured(n) }).collect();
        (batch, self.draft.as_ref().and_then(|d| d.borrow().step_ms))
    }

    pub fn tokens_cached(&self) -> usize {
        self.slots.iter().map(|s| s.cached.len()).sum()
    }

    pub fn active(&self) -> usize {
        self.slots.iter().filter(|s| !s.is_free()).count()
    }

    pub fn has_free_slot(&self) -> bool {
        self.slots.iter().any(Slot::is_free)
    }

    /// Forgets every KV cache (after a failure left them in an unknown state).
    pub fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        for s in &mut self.slots {
            s.cached.clear();
        }
        if let Some(d) = &self.draft {
            d.borrow_mut().reset();
        }
    }

    // ------------------------------------------------------------ admission

    /// Starts `job` in a free slot: the one whose cache shares the longest
    /// prefix with its prompt (a chat's next turn lands where its last turn
    /// was), else the lowest. A request that cannot start is answered here.
    /// A panic while preparing (grammars, tokenizing: nothing of the
    /// engine's state is touched yet) fails this request only.
    pub fn admit(&mut self, job: Job, done: &dyn Finished) {
        if job.cancel.load(std::sync::atomic::Ordering::SeqCst) {
            let result = aborted_before_start(&job.request, &self.models.info, self.invariance.holds());
            done.finished(job.id);
            job.sink.finish(Ok(result));
            return;
        }
        let prepared = catch_unwind(AssertUnwindSafe(|| self.prepare(&job.request))).unwrap_or_else(|panic| Err(panic_error(&*panic)));
        match prepared {
            Ok(prepared) => self.start(job, prepared),
            Err(e) => {
                done.finished(job.id);
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
        let grammar = grammar(req)?;
        let sampler = TokenSampler::new(&self.models.target, req, grammar.as_deref(), &info.eog, info.n_ctx)?;
        let kinds = if sampler.supports_speculation() { self.drafter_kinds(req)? } else { Vec::new() };
        let mut tokens = self.tokenize_prompt(req)?;
        let n_prompt = tokens.len();
        let n_keep = prompt::effective_n_keep(req.n_keep, n_prompt, self.n_ctx);
        let truncated = prompt::truncate_prompt(&mut tokens, n_keep, self.n_ctx);
        Ok(Prepared { sampler, kinds, tokens, n_prompt, n_keep, truncated })
    }

    fn start(&mut self, job: Job, p: Prepared) {
        let req = &job.request;
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_free())
            .map(|(i, s)| (i, if req.cache_prompt { prompt::common_prefix(&s.cached, &p.tokens) } else { 0 }))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)));
        let Some((i, mut n_past)) = best else { return };
        if n_past == p.tokens.len() {
            n_past -= 1; // at least one token must be evaluated to get logits
        }
        let seq = self.slots[i].seq;
        if self.ctx.kv_cache_seq_rm(seq, Some(n_past as u32), None).is_err() {
            let _ = self.ctx.kv_cache_seq_rm(seq, None, None);
            n_past = 0;
        }
        self.slots[i].cached.truncate(n_past);
        let mut sampler = p.sampler;
        sampler.accept_prompt(&p.tokens);
        let chain = self.chain(req, &p.kinds, i, sampler.is_greedy(), sampler.seed());
        let mut request = Request::from_job(job, sampler, chain, p.tokens, p.n_prompt, p.n_keep, p.truncated);
        request.tokens_cached = n_past;
        let prompt_ids: Vec<i32> = request.prompt.iter().map(|t| t.0).collect();
        request.chain.begin(&prompt_ids);
        self.slots[i].request = Some(Box::new(request));
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
                    let ctl = DraftController::new(spec.n_max, spec.adaptive, crate::core::replay::NGRAM_PRIOR)
                        .with_loss_check(false)
                        .with_classes(&CLASS_PRIORS);
                    let d = NgramDrafter::new(NgramParams::default(), self.ngram.dynamic.clone(), self.ngram.fixed.clone());
                    chain.push(Box::new(d), ctl);
                }
                _ => {
                    let Some(cx) = self.draft.clone() else { continue };
                    let key: ControllerKey = (spec.n_max, spec.adaptive, greedy);
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

    // ------------------------------------------------------------ one step

    /// One decoding step of every active request. An error here leaves the
    /// caches in an unknown state: the caller fails the active requests.
    pub fn step(&mut self, done: &dyn Finished) -> Result<()> {
        self.end_what_must_end(done)?;
        let mut plan = self.plan();
        if plan.is_empty() {
            return Ok(());
        }
        self.build(&mut plan)?;
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
        let step_ms = ms(t);
        let parts: Vec<Part> = plan.iter().map(|p| Part { seq: self.slots[p.slot].seq, tokens: p.tokens.len() }).collect();
        if ubatches(&parts, self.slots.len(), self.n_batch).len() == 1 {
            self.costs.observe(self.batch.n_tokens() as usize, step_ms);
        }
        // Wall time per token is only this request's own when it decoded alone.
        let alone = plan.len() == 1;
        for part in plan {
            self.accept(part, alone.then_some(step_ms), done)?;
        }
        Ok(())
    }

    /// Requests aborted since the last step end now; a generating request
    /// whose context is full shifts it (or ends, with n_predict = -1).
    fn end_what_must_end(&mut self, done: &dyn Finished) -> Result<()> {
        for i in 0..self.slots.len() {
            let Some(r) = self.slots[i].request.as_ref() else { continue };
            if r.cancelled() {
                self.finish(i, Stop::Abort, done);
                continue;
            }
            if matches!(r.phase, Phase::Generate { .. }) && self.slots[i].cached.len() + 1 >= self.n_ctx {
                if r.req.n_predict < 0 {
                    self.finish(i, Stop::Limit, done);
                } else {
                    self.shift_context(i)?;
                }
            }
        }
        Ok(())
    }

    /// The legacy context shift, in slot `i`'s stream: keep the first
    /// n_keep (+BOS) tokens, drop half of the rest, slide the remainder down.
    fn shift_context(&mut self, i: usize) -> Result<()> {
        let slot = &mut self.slots[i];
        let Some(r) = slot.request.as_mut() else { return Ok(()) };
        let n_past = slot.cached.len();
        let keep = (r.n_keep + 1).min(n_past.saturating_sub(1));
        let discard = prompt::shift_discard(n_past, r.n_keep).min(n_past - keep);
        let err = |e: llama_cpp_2::context::kv_cache::KvCacheConversionError| EngineError::internal(format!("context shift: {e}"));
        self.ctx.kv_cache_seq_rm(slot.seq, Some(keep as u32), Some((keep + discard) as u32)).map_err(err)?;
        self.ctx.kv_cache_seq_add(slot.seq, Some((keep + discard) as u32), Some(n_past as u32), -(discard as i32)).map_err(err)?;
        slot.cached.drain(keep..keep + discard);
        r.truncated = true;
        Ok(())
    }

    /// What each active request decodes this step. Generating requests get
    /// their pending token; prompts get what is left of the batch, in chunks
    /// while others stream; then each generating request may add a draft,
    /// priced by what it adds to this batch, and the drafts are trimmed
    /// together to what pays in the batch they make.
    fn plan(&mut self) -> Vec<Planned> {
        // (With more generating requests than a batch holds — a tiny
        // batchSize — the rest wait: a batch never exceeds n_batch, which
        // llama.cpp asserts.)
        let generating: Vec<usize> = (0..self.slots.len())
            .filter(|&i| matches!(self.slots[i].request.as_ref().map(|r| r.phase), Some(Phase::Generate { .. })))
            .take(self.n_batch)
            .collect();
        let mut prefilling: Vec<usize> =
            (0..self.slots.len()).filter(|&i| self.slots[i].request.as_ref().is_some_and(|r| r.phase == Phase::Prefill)).collect();
        prefilling.sort_by_key(|&i| self.slots[i].request.as_ref().map(|r| r.started));
        let mut plan: Vec<Planned> = Vec::new();
        let mut used = generating.len();
        for i in prefilling {
            let (r, cached) = (self.slots[i].request.as_ref().expect("active"), &self.slots[i].cached);
            let left = r.prompt.len() - cached.len();
            let chunk = prefill_chunk(left, !generating.is_empty(), self.n_batch.saturating_sub(used), PREFILL_CHUNK);
            if chunk == 0 {
                continue;
            }
            used += chunk;
            let tokens = r.prompt[cached.len()..cached.len() + chunk].to_vec();
            plan.push(Planned { slot: i, tokens, completes_prompt: chunk == left, draft: None, first_row: 0 });
        }
        let prefill: Vec<Part> = plan.iter().map(|p| Part { seq: self.slots[p.slot].seq, tokens: p.tokens.len() }).collect();
        let generating_seqs: Vec<i32> = generating.iter().map(|&g| self.slots[g].seq).collect();
        for &i in &generating {
            let draft = self.plan_draft(i, &plan, &prefill, &generating_seqs, used);
            used += draft.as_ref().map_or(0, Draft::len);
            let slot = &self.slots[i];
            let Some(Phase::Generate { pending }) = slot.request.as_ref().map(|r| r.phase) else { continue };
            let mut tokens = vec![pending];
            tokens.extend(draft.iter().flat_map(|d| d.tokens.iter().map(|&t| LlamaToken(t))));
            plan.push(Planned { slot: i, tokens, completes_prompt: false, draft, first_row: 0 });
        }
        plan.sort_by_key(|p| self.slots[p.slot].seq);
        if generating.len() > 1 {
            self.trim_drafts(&mut plan);
        }
        plan
    }

    /// Drafts were planned one request at a time; together they may split
    /// the batch into more micro-batches than any of them was priced for.
    /// Cuts them to the lengths that give the step the most expected tokens
    /// per ms (`core::schedule::trim`); fixed lengths and probes stay.
    fn trim_drafts(&mut self, plan: &mut [Planned]) {
        let mut fixed: Vec<Part> = Vec::new();
        let mut fixed_tokens = 0.0;
        let mut cuttable: Vec<usize> = Vec::new();
        for (j, p) in plan.iter().enumerate() {
            let seq = self.slots[p.slot].seq;
            match &p.draft {
                Some(d) if !d.fixed && d.expected.len() == d.len() + 1 => cuttable.push(j),
                Some(d) => {
                    fixed.push(Part { seq, tokens: p.tokens.len() });
                    fixed_tokens += d.expected.get(d.len()).copied().unwrap_or(1.0);
                }
                None => {
                    fixed.push(Part { seq, tokens: p.tokens.len() });
                    if matches!(self.slots[p.slot].request.as_ref().map(|r| r.phase), Some(Phase::Generate { .. })) {
                        fixed_tokens += 1.0;
                    }
                }
            }
        }
        if cuttable.is_empty() {
            return;
        }
        let lengths = {
            let drafts: Vec<Trimmable> = cuttable
                .iter()
                .filter_map(|&j| plan[j].draft.as_ref().map(|d| Trimmable { seq: self.slots[plan[j].slot].seq, expected: &d.expected }))
                .collect();
            trim(&fixed, fixed_tokens, &drafts, self.slots.len(), self.n_batch, &self.costs)
        };
        for (&j, &k) in cuttable.iter().zip(&lengths) {
            let part = &mut plan[j];
            let Some(d) = part.draft.as_mut() else { continue };
            if k >= d.len() {
                continue;
            }
            d.truncate(k);
            part.tokens.truncate(1 + k);
            if k == 0 {
                part.draft = None;
            }
            if let Some(r) = self.slots[part.slot].request.as_mut() {
                r.chain.trim(k);
            }
        }
    }

    /// The draft generating request `i` verifies this step, if one pays.
    fn plan_draft(&mut self, i: usize, plan: &[Planned], prefill: &[Part], generating: &[i32], used: usize) -> Option<Draft> {
        let (n_ctx, n_batch, n_stream) = (self.n_ctx, self.n_batch, self.slots.len());
        // Every other part of the step as planned so far (requests not yet
        // planned decode their pending token at least).
        let seq = self.slots[i].seq;
        let mut others: Vec<Part> = plan.iter().map(|p| Part { seq: self.slots[p.slot].seq, tokens: p.tokens.len() }).collect();
        let unplanned: Vec<Part> =
            generating.iter().filter(|&&g| g != seq && !others.iter().any(|p| p.seq == g)).map(|&g| Part { seq: g, tokens: 1 }).collect();
        others.extend(unplanned);
        let slot = &mut self.slots[i];
        let r = slot.request.as_mut()?;
        let Phase::Generate { pending } = r.phase else { return None };
        if r.chain.is_empty() {
            return None;
        }
        // Cells left after the pending token and the next one. With
        // n_predict = -1 one more is held back: plain decoding stops when
        // the cache reaches n_ctx - 2, and a step that filled the room would
        // end one token later than it.
        let reserve = if r.req.n_predict < 0 { 3 } else { 2 };
        let room = n_ctx.saturating_sub(slot.cached.len() + reserve).min(n_batch.saturating_sub(used));
        let available = r.req.speculative.n_max.min(room).min(r.budget().saturating_sub(1));
        if available == 0 {
            return None;
        }
        let prices = Prices {
            lookup: StepPrice::shared(prefill, generating, available, n_stream, n_batch, &self.costs),
            made: StepPrice::in_step(&others, generating.len(), seq, available, n_stream, n_batch, &self.costs),
        };
        let mut history: Vec<i32> = slot.cached.iter().map(|t| t.0).collect();
        history.push(pending.0);
        r.chain.propose(&history, r.n_gen, available, &prices)
    }

    /// The batch: every part's tokens in sequence order, at the positions
    /// after what its slot holds; logits for every generating row and for
    /// the last row of a prompt.
    fn build(&mut self, plan: &mut [Planned]) -> Result<()> {
        self.batch.clear();
        let mut row = 0;
        for part in plan.iter_mut() {
            let slot = &self.slots[part.slot];
            let generating = matches!(slot.request.as_ref().map(|r| r.phase), Some(Phase::Generate { .. }));
            part.first_row = row;
            let base = slot.cached.len();
            for (j, &t) in part.tokens.iter().enumerate() {
                let logits = generating || (part.completes_prompt && j + 1 == part.tokens.len());
                self.batch.add(t, (base + j) as i32, &[slot.seq], logits).map_err(|e| EngineError::internal(format!("batch: {e}")))?;
                row += 1;
            }
        }
        Ok(())
    }

    /// After the decode: verifies and accepts one part's tokens, streams
    /// them, and ends the request if it is done.
    fn accept(&mut self, part: Planned, alone_ms: Option<f64>, done: &dyn Finished) -> Result<()> {
        let i = part.slot;
        let model = &self.models.target;
        let slot = &mut self.slots[i];
        let Some(r) = slot.request.as_mut() else { return Ok(()) };
        slot.cached.extend_from_slice(&part.tokens);
        let mut tokens: Vec<StepToken> = Vec::new();
        let (mut drafted, mut accepted) = (0, 0);
        match r.phase {
            Phase::Prefill => {
                if !part.completes_prompt {
                    return Ok(());
                }
                r.prompt_done();
                // Aborted while its prompt was evaluated, or asked for no
                // tokens: it ends before its first token.
                let stop = if r.cancelled() { Some(Stop::Abort) } else { (r.budget() == 0).then_some(Stop::Limit) };
                if let Some(stop) = stop {
                    self.finish(i, stop, done);
                    return Ok(());
                }
                let (token, dist) = r.sampler.sample(&self.ctx, (part.first_row + part.tokens.len() - 1) as i32, r.wants_dist(), 0);
                r.sampler.accept(token);
                tokens.push((token, TokenSource::Target, dist));
            }
            Phase::Generate { .. } => {
                r.passes += 1;
                let base = slot.cached.len() - part.tokens.len() + 1; // cache length after the pending token
                let (n_ok, verified) = verify(r, model, &self.ctx, part.first_row, part.draft.as_ref());
                tokens = verified;
                if let Some(d) = &part.draft {
                    r.chain.judged(n_ok);
                    drafted = d.len();
                    accepted = n_ok;
                }
                // Keep the pending token and the accepted drafts.
                if base + n_ok < slot.cached.len() {
                    self.ctx
                        .kv_cache_seq_rm(slot.seq, Some((base + n_ok) as u32), None)
                        .map_err(|e| EngineError::internal(format!("kv cache: {e}")))?;
                    slot.cached.truncate(base + n_ok);
                }
                if let Some(ms) = alone_ms {
                    r.chain.observe_step(tokens.len(), ms);
                }
            }
        }
        let cached_after = slot.cached.len();
        if let Some(stop) = r.emit(model, tokens, drafted, accepted, self.n_ctx, cached_after) {
            self.finish(i, stop, done);
        }
        Ok(())
    }

    /// Ends slot `i`'s request: its result goes to its sink after its last
    /// event; the draft model's controller is kept for the next request.
    pub fn finish(&mut self, i: usize, stop: Stop, done: &dyn Finished) {
        let Some(mut r) = self.slots[i].request.take() else { return };
        let greedy = r.sampler.is_greedy();
        let key: ControllerKey = (r.req.speculative.n_max, r.req.speculative.adaptive, greedy);
        if let Some(ctl) = r.chain.take_controller("draft") {
            self.model_ctls.retain(|(k, _)| *k != key);
            self.model_ctls.push((key, ctl));
        }
        let info = &self.models.info;
        let result = r.result(stop, &info.name, info.n_ctx, self.invariance.holds());
        done.finished(r.id);
        r.sink.finish(Ok(result));
    }

    /// Ends every active request with `e` (a failed step).
    pub fn fail_all(&mut self, e: &EngineError, done: &dyn Finished) {
        for slot in &mut self.slots {
            if let Some(mut r) = slot.request.take() {
                r.chain.end();
                done.finished(r.id);
                r.sink.finish(Err(e.clone()));
            }
        }
    }
}

/// What a request needs before it takes a slot.
struct Prepared {
    sampler: TokenSampler,
    kinds: Vec<SpecMode>,
    tokens: Vec<LlamaToken>,
    n_prompt: usize,
    n_keep: usize,
    truncated: bool,
}

/// Verifies a generating request's step (`core::verify`): at each row the
/// target chooses the token plain decoding would choose at that position —
/// its sampler chain sees only what was accepted before it (penalties,
/// grammar) — and a draft is accepted while it is that choice. Returns the
/// number of drafts accepted and the tokens the step produced.
fn verify(r: &mut Request, model: &LlamaModel, ctx: &LlamaContext, first_row: usize, draft: Option<&Draft>) -> (usize, Vec<StepToken>) {
    let want = r.wants_dist();
    let (position, budget) = (r.n_gen, r.budget());
    let ignore_eos = r.req.ignore_eos;
    let ends = |t: i32| t == DEAD_END.0 || (!ignore_eos && model.vocab().is_eog(LlamaToken(t)));
    let drafted: &[i32] = draft.map_or(&[], |d| &d.tokens);
    let sampler = &mut r.sampler;
    let (n_ok, tokens) = verify_draft(drafted, budget, ends, |i| {
        let (token, dist) = sampler.sample(ctx, (first_row + i) as i32, want, position + i);
        sampler.accept(token);
        (token.0, dist)
    });
    let source = draft.map_or(TokenSource::Target, |d| d.source);
    let tokens = tokens
        .into_iter()
        .map(|(t, from_draft, dist)| (LlamaToken(t), if from_draft { source } else { TokenSource::Target }, dist))
        .collect();
    (n_ok, tokens)
}

/// The error a caught panic becomes.
pub fn panic_error(panic: &(dyn std::any::Any + Send)) -> EngineError {
    let why = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    EngineError::internal(format!("the engine recovered from a panic: {why}"))
}

fn grammar(req: &CompletionRequest) -> Result<Option<String>> {
    if let Some(schema) = &req.json_schema {
        let g = llama_cpp_2::json_schema_to_grammar(schema)
            .map_err(|e| EngineError::invalid("json_schema", format!("cannot be turned into a grammar ({e})")))?;
        crate::core::gbnf::check_gbnf(&g).map_err(|why| EngineError::invalid("json_schema", format!("its grammar is too large: {why}")))?;
        return Ok(Some(g));
    }
    Ok(req.grammar.clone())
}

/// The result of a request that was aborted before it produced anything.
pub fn aborted_before_start(req: &CompletionRequest, info: &ModelInfo, batch_invariant: bool) -> CompletionResult {
    CompletionResult {
        stop: true,
        model: info.name.clone(),
        stopped_abort: true,
        generation_settings: req.generation_settings(info.n_ctx, &info.name),
        speculative: SpeculativeStats { mode: req.speculative.mode.as_str().into(), batch_invariant, ..Default::default() },
        completion_probabilities: (req.n_probs > 0).then(Vec::new),
        ..Default::default()
    }
}
