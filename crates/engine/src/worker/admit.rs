//! Admission: a queued job becomes a request in a free slot, with its
//! sampler chain, its drafters and its prompt tokens.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::prefix::Start;
use super::{aborted_before_start, Worker};
use crate::compile::CompileThread;
use crate::draft_model::{DraftContext, DraftSettings, ModelDrafter};
use crate::media::MediaSpan;
use crate::model;
use crate::sampler::TokenSampler;
use crate::shared::{Job, NgramStore, SessionJob};
use crate::slot::{ControllerKey, KeptController, PromptTokens, Request};
use llama_engine_core::chat::format::{json_answer, ChatPlan};
use llama_engine_core::chat::tools::ResponseFormat;
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::gbnf::check_gbnf;
use llama_engine_core::request::{prompt, CompletionRequest, PromptPart, SpecMode, SpeculativeParams};
use llama_engine_core::sampling::budget::ReasoningBudget;
use llama_engine_core::sampling::constraint::{Compiler, Constraint, Grammar};
use llama_engine_core::sampling::forced::Tokenize;
use llama_engine_core::speculation::controller::DraftController;
use llama_engine_core::speculation::drafter::{Drafter, DrafterChain};
use llama_engine_core::speculation::ngram::NgramCache;
use llama_engine_core::speculation::registry::{self, DrafterEntry, DrafterHost};
use llama_engine_core::speculation::suffix::SuffixStore;

const PANIC_PROMPT: &str = "__llama_engine_panic__";
/// The prompt that panics while its job is placed in a slot (past
/// `prepare`, whose own guard answers the request): the job goes with the
/// panic and its promise must still say why.
const PANIC_PLACING_PROMPT: &str = "__llama_engine_panic_placing__";
/// The prompt that aborts the process (the fault an isolated engine survives).
const ABORT_PROMPT: &str = "__llama_engine_abort__";

/// Compiled constraints kept for the next requests with the same grammar
/// (agents send the same tools every turn): a copy costs microseconds, a
/// compile milliseconds.
const COMPILED_KEPT: usize = 16;

/// What a request needs before it takes a slot.
struct Prepared {
    sampler: TokenSampler,
    /// Its drafters, in chain order (none when it does not speculate).
    drafters: Vec<&'static DrafterEntry>,
    prompt: PromptTokens,
    constraint: Option<Rc<RefCell<Constraint>>>,
    /// Its scale of every loaded LoRA adapter.
    lora: Vec<f32>,
}

impl<'m> Worker<'m> {
    /// Starts `job` in a free slot: the one whose cache shares the longest
    /// prefix with its prompt (a chat's next turn lands where its last turn
    /// was), else the lowest. A request that cannot start is answered here.
    /// A panic while preparing (grammars, tokenizing: nothing of the
    /// engine's state is touched yet) fails this request only.
    pub fn admit(&mut self, mut job: Job) {
        match job.session.take() {
            Some(SessionJob::Load(session, slot)) => return self.load_session(job, *session, slot),
            Some(SessionJob::SaveSlot { slot, path }) => return self.save_slot(job, slot, path),
            Some(SessionJob::EraseSlot { slot }) => return self.erase_slot(job, slot),
            other => job.session = other,
        }
        if job.cancel.load(Ordering::SeqCst) && job.session.is_none() {
            let result = aborted_before_start(&job.request, &self.models.info, self.invariance.holds());
            self.shared.request_ended(job.id);
            job.sink.finish(Ok(result));
            return;
        }
        let mut job = match self.compile_first(job) {
            Some(job) => job,
            None => return,
        };
        let compiled = job.compiled.take();
        let tokens = job.tokens.take();
        let media = std::mem::take(&mut job.media);
        let prepared = catch_unwind(AssertUnwindSafe(|| self.prepare(&job.request, &job.plan, compiled, tokens, media)))
            .unwrap_or_else(|panic| Err(EngineError::from_panic(&*panic)));
        match prepared {
            Ok(prepared) => self.start(job, prepared),
            Err(e) => {
                self.shared.request_ended(job.id);
                job.sink.finish(Err(e));
            }
        }
    }

    /// A job whose constraint is neither compiled nor kept from an earlier
    /// request goes to the compiling thread (it comes back to the front of
    /// the queue with it); others go on. `None`: the job is on its way.
    fn compile_first(&mut self, job: Job) -> Option<Job> {
        let Some((grammar, field)) = &job.plan.grammar else { return Some(job) };
        if job.compiled.is_some() || self.compiled.iter().any(|(g, _)| g == grammar) {
            return Some(job);
        }
        let (grammar, field) = (grammar.clone(), *field);
        if self.compile_thread.is_none() {
            let env = llama_cpp_2::sampling::LlamaSampler::llguidance_tok_env(&self.models.target);
            let started = Compiler::new(&env)
                .map_err(EngineError::internal)
                .and_then(|compiler| CompileThread::start(compiler, self.shared.clone(), locate_error));
            match started {
                Ok(t) => self.compile_thread = Some(t),
                Err(e) => {
                    self.shared.request_ended(job.id);
                    job.sink.finish(Err(e));
                    return None;
                }
            }
        }
        let thread = self.compile_thread.as_ref().expect("started above");
        if let Err(job) = thread.submit(job, grammar, field) {
            self.shared.request_ended(job.id);
            job.sink.finish(Err(EngineError::internal("the compiling thread has stopped")));
        }
        None
    }

    fn prepare(
        &mut self,
        req: &CompletionRequest,
        plan: &ChatPlan,
        compiled: Option<Result<(Grammar, Constraint)>>,
        tokens: Option<Vec<LlamaToken>>,
        media: Vec<MediaSpan>,
    ) -> Result<Prepared> {
        // Fault injection for the test suite: with LLAMA_ENGINE_FAULT_INJECTION=1
        // in the environment, the prompt "__llama_engine_panic__" panics here and
        // "__llama_engine_abort__" aborts the process (for isolation tests).
        let faults = std::env::var("LLAMA_ENGINE_FAULT_INJECTION").is_ok_and(|v| v == "1");
        if faults && req.prompt == [PromptPart::Text(PANIC_PROMPT.into())] {
            panic!("fault injected by {PANIC_PROMPT}");
        }
        if faults && req.prompt == [PromptPart::Text(ABORT_PROMPT.into())] {
            eprintln!("llama-engine: fault injected by {ABORT_PROMPT}: aborting");
            std::process::abort();
        }
        let lora = self.loras.scales_for(req.lora.as_deref())?;
        let grammar = grammar(req, &self.models.target)?;
        let constraint = match &plan.grammar {
            Some((g, _)) => match self.constraint(g, compiled) {
                Ok(c) => Some(Rc::new(RefCell::new(c))),
                // A family's own call grammar that llguidance cannot follow
                // from this prompt: the call is read, not forced.
                Err(_) if matches!(g, Grammar::LarkAfter(..)) => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let info = &self.models.info;
        let mut sampler = TokenSampler::new(&self.models.target, req, grammar.as_deref(), constraint.clone(), &info.eog, info.n_ctx)?;
        if let Some(budget_plan) = &plan.reasoning_budget {
            let model = self.models.target.clone();
            let tokens = |text: &str| -> Vec<i32> { model.vocab().tokenize(text.as_bytes(), false, true).iter().map(|t| t.0).collect() };
            if let Some(budget) =
                ReasoningBudget::new(tokens(&budget_plan.start), tokens(&budget_plan.end), budget_plan.budget, budget_plan.open)
            {
                let completes = Box::new(move |t: i32| {
                    let piece = model.vocab().token_to_piece(LlamaToken(t), false, None);
                    std::str::from_utf8(&piece).map_or_else(|e| e.error_len().is_some(), |_| true)
                });
                sampler = sampler.with_reasoning_budget(budget, completes);
            }
        }
        // (With media the draft model reads the text around them: `draft_model::text_only`.)
        let drafters = if sampler.supports_speculation() { self.drafters(req)? } else { Vec::new() };
        let mut tokens = match tokens {
            Some(t) => t,
            None => model::tokenize_prompt(&self.models.target, req, &self.models.info)?,
        };
        let n_given = tokens.len();
        if !media.is_empty() && n_given >= self.n_ctx {
            return Err(EngineError::invalid(
                "messages",
                format!("the prompt with its images and audio takes {n_given} tokens; the context holds {}", self.n_ctx),
            ));
        }
        // llama-server's rule without context shift: the prompt and one token to generate.
        if !req.context_shift && n_given >= self.n_ctx {
            return Err(EngineError::context_exceeded(n_given, self.n_ctx));
        }
        let n_keep = prompt::effective_n_keep(req.n_keep, n_given, self.n_ctx);
        let truncated = prompt::truncate_prompt(&mut tokens, n_keep, self.n_ctx);
        if truncated {
            tokens.shrink_to_fit();
            crate::memory::release_after(4 * n_given);
        }
        Ok(Prepared { sampler, drafters, prompt: PromptTokens { tokens, n_given, n_keep, truncated, media }, constraint, lora })
    }

    /// The request's constraint: the one the compiling thread made for it
    /// (kept for later requests with the same grammar), or a copy of one
    /// kept, written in this model's canonical tokens where text is forced.
    fn constraint(&mut self, grammar: &Grammar, compiled: Option<Result<(Grammar, Constraint)>>) -> Result<Constraint> {
        let model = self.models.target.clone();
        let tokenize: Tokenize =
            Arc::new(move |bytes: &[u8]| model.vocab().tokenize(bytes, false, false).into_iter().map(|t| t.0).collect());
        let c = match compiled {
            Some(Ok((g, c))) => {
                if self.compiled.len() >= COMPILED_KEPT {
                    self.compiled.remove(0);
                }
                self.compiled.push((g, c.deep_clone()));
                c
            }
            Some(Err(e)) => return Err(e),
            None => {
                let i = self
                    .compiled
                    .iter()
                    .position(|(g, _)| g == grammar)
                    .ok_or_else(|| EngineError::internal("a constraint was not compiled"))?;
                let kept = self.compiled.remove(i);
                let copy = kept.1.deep_clone();
                self.compiled.push(kept);
                copy
            }
        };
        Ok(c.with_tokenizer(tokenize))
    }

    fn start(&mut self, job: Job, p: Prepared) {
        if std::env::var("LLAMA_ENGINE_FAULT_INJECTION").is_ok_and(|v| v == "1")
            && job.request.prompt == [PromptPart::Text(PANIC_PLACING_PROMPT.into())]
        {
            panic!("fault injected by {PANIC_PLACING_PROMPT}");
        }
        let tag = llama_engine_core::request::lora_tag(&p.lora);
        if tag != 0 && job.session.is_some() {
            self.shared.request_ended(job.id);
            let e =
                EngineError::invalid("lora", "a session is saved from cells without LoRA adapters: save it with a request that uses none");
            return job.sink.finish(Err(e));
        }
        let positions = crate::media::positions_of(&p.prompt.media);
        let Some((i, start)) = self.place(&p.prompt.tokens, &positions, job.request.cache_prompt, tag, job.request.id_slot) else { return };
        let chain = self.chain(&job.request, &p.drafters, i, p.sampler.is_greedy(), p.sampler.seed(), p.constraint.clone());
        let (n_past, wait) = match start {
            Start::Ready(n) => (n, None),
            Start::Wait(w) => (0, Some(w)),
        };
        let mut request = Box::new(Request::new(job, p.sampler, chain, p.prompt, n_past));
        request.set_lora(p.lora);
        self.slots[i].request = Some(request);
        self.slots[i].wait = wait;
    }

    /// The drafters a request may use, in chain order.
    /// The drafters a request runs, from the table (`registry::chain_for`):
    /// none for `off`; a mode naming a drafter that needs the draft model
    /// this engine lacks is refused.
    fn drafters(&self, req: &CompletionRequest) -> Result<Vec<&'static DrafterEntry>> {
        let named = match req.speculative.mode {
            SpecMode::Off => return Ok(Vec::new()),
            SpecMode::Auto => None,
            SpecMode::Only(set) => Some(set),
        };
        registry::chain_for(named, self.draft.is_some()).map_err(|_| {
            EngineError::invalid(
                "speculative.mode",
                format!("\"{}\" needs a draft model: load the engine with draftModelPath", req.speculative.mode.as_str()),
            )
        })
    }

    /// The request's drafters, each made by its table entry with its own
    /// controller, in table order (what its constraint forces first).
    fn chain(
        &mut self,
        req: &CompletionRequest,
        drafters: &[&'static DrafterEntry],
        slot: usize,
        greedy: bool,
        seed: u64,
        constraint: Option<Rc<RefCell<Constraint>>>,
    ) -> DrafterChain<'m> {
        let spec = &req.speculative;
        let mut chain = DrafterChain::new(spec.n_min);
        let settings =
            DraftSettings { temperature: req.sampling.temperature, p_min: spec.p_min, n_parallel: spec.n_parallel, p_split: spec.p_split };
        let mut host = Host {
            spec,
            key: (spec.n_max, spec.adaptive, greedy),
            constraint,
            ngram: &self.shared.ngram,
            draft: self.draft.clone().map(|cx| (cx, slot, settings, seed)),
            kept: &mut self.kept_ctls,
        };
        for e in drafters {
            if let Some((drafter, ctl)) = (e.make)(e, &mut host) {
                chain.push(drafter, ctl);
            }
        }
        chain
    }
}

/// What the engine offers the drafters a request makes.
struct Host<'a, 'm> {
    spec: &'a SpeculativeParams,
    /// The settings a kept controller is looked up by.
    key: ControllerKey,
    constraint: Option<Rc<RefCell<Constraint>>>,
    ngram: &'a NgramStore,
    draft: Option<(Rc<RefCell<DraftContext<'m>>>, usize, DraftSettings, u64)>,
    kept: &'a mut Vec<KeptController>,
}

impl<'m> DrafterHost<'m> for Host<'_, 'm> {
    fn n_max(&self) -> usize {
        self.spec.n_max
    }

    fn adaptive(&self) -> bool {
        self.spec.adaptive
    }

    fn in_auto(&self) -> bool {
        self.spec.mode == SpecMode::Auto
    }

    fn constraint(&self) -> Option<Rc<RefCell<Constraint>>> {
        self.constraint.clone()
    }

    fn ngram_caches(&self) -> (Arc<Mutex<NgramCache>>, Option<Arc<NgramCache>>) {
        (self.ngram.dynamic.clone(), self.ngram.fixed.clone())
    }

    fn suffix_store(&self) -> (Arc<Mutex<SuffixStore>>, String) {
        let namespace = self.spec.namespace.clone().unwrap_or_else(|| self.ngram.suffix_namespace.clone());
        (self.ngram.suffix.clone(), namespace)
    }

    fn draft_model(&mut self) -> Option<Box<dyn Drafter + 'm>> {
        let (cx, slot, settings, seed) = self.draft.take()?;
        Some(Box::new(ModelDrafter::new(cx, slot, settings, seed)))
    }

    fn kept_controller(&mut self, name: &'static str) -> Option<DraftController> {
        let p = self.kept.iter().position(|(k, _)| *k == (name, self.key))?;
        Some(self.kept.swap_remove(p).1)
    }
}

/// The GBNF a request's sampler enforces (its `grammar`), checked
/// (`core::gbnf`) against this model's vocabulary, so that
/// llama.cpp's parser never sees a grammar it would reject (it prints them).
fn grammar(req: &CompletionRequest, model: &LlamaModel) -> Result<Option<String>> {
    let Some(g) = &req.grammar else { return Ok(None) };
    let field = "grammar";
    let checked = check_gbnf(g).map_err(|why| EngineError::invalid(field, why))?;
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
    Ok(Some(g.clone()))
}

/// The error of a constraint that does not compile, naming the field and,
/// where it can be found, the tool and the place in its schema.
fn locate_error(compiler: &Compiler, field: &str, job: &Job, why: String) -> EngineError {
    let req = &job.request;
    let cannot = |at: String, why: &str| EngineError::invalid(&at, format!("cannot be compiled: {why}"));
    if field == "tools" {
        for (i, tool) in req.chat.tools.iter().enumerate() {
            if let Err(e) = compiler.compile(&json_answer(&tool.parameters)) {
                return cannot(format!("tools[{i}].function.parameters{}", compiler.locate(&tool.parameters)), &e);
            }
        }
    }
    let schema = match (&req.chat.response_format, &req.json_schema) {
        (_, Some(text)) if field == "json_schema" => serde_json::from_str(text).ok(),
        (Some(ResponseFormat::Json(s)), _) => Some(s.clone()),
        _ => None,
    };
    if let Some(schema) = schema {
        if let Err(e) = compiler.compile(&json_answer(&schema)) {
            let at = if field == "json_schema" { "json_schema".to_string() } else { "response_format.json_schema.schema".to_string() };
            return cannot(format!("{at}{}", compiler.locate(&schema)), &e);
        }
    }
    cannot(field.to_string(), &why)
}
