//! The engine thread's state: the models and contexts, the slots, what was
//! measured, and the shared queue it answers to. Requests join in
//! `admit.rs`; one decoding step of all of them, in named phases, is
//! `step.rs`.

mod admit;
mod prefix;
mod session;
mod step;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;

use super::calibrate::{calibrate, calibration_tokens, earlier_verdict, keep_verdict, Limits};
use super::compile::CompileThread;
use super::draft_model::DraftContext;
use super::embed::{EmbedJob, Embedder};
use super::llama_log;
use super::model::{self, EngineOptions, ModelInfo, Progress};
use super::shared::{Published, Shared};
use super::slot::{KeptController, Slot, Stop};
use llama_engine_core::cache::prompt_cache::PromptCache;
use llama_engine_core::cache::session::fingerprint;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::request::CompletionRequest;
use llama_engine_core::sampling::constraint::{Constraint, Grammar};
use llama_engine_core::speculation::cost::BatchCost;
use llama_engine_core::speculation::invariance::InvarianceCheck;
use llama_engine_core::text::events::{CompletionResult, SpeculativeStats};
use llama_engine_core::threads::ThreadGovernor;

/// The models an engine thread owns.
pub struct Models {
    pub target: Arc<LlamaModel>,
    pub draft: Option<Arc<LlamaModel>>,
    pub info: ModelInfo,
    /// The weight types of both models' files (ggml's names).
    pub weight_types: Vec<String>,
}

impl Models {
    pub fn load(opts: &EngineOptions, progress: Option<Progress>) -> Result<Models> {
        // With a draft model, the first half of the progress is the target's.
        let has_draft = opts.draft_model_path.is_some();
        let progress = progress.map(|p| Arc::new(Mutex::new(p)));
        let part = |offset: f32, scale: f32| {
            progress.clone().map(|p| {
                Box::new(move |f: f32| {
                    if let Ok(mut cb) = p.lock() {
                        cb(offset + f * scale)
                    }
                }) as Progress
            })
        };
        // The target's layers on RPC workers when `rpc` names them (the draft stays here).
        let rpc = super::rpc::devices(&opts.rpc)?;
        let loaded =
            model::load_model(&opts.model_path, opts.gpu_layers, &rpc, opts.portable, part(0.0, if has_draft { 0.5 } else { 1.0 }))?;
        let (target, mut weight_types) = (loaded.model, loaded.weight_types);
        let draft = match &opts.draft_model_path {
            Some(path) => {
                let loaded = model::load_model(path, opts.draft_gpu_layers, &[], opts.portable, part(0.5, 0.5))?;
                model::check_compatible(&target, &loaded.model)?;
                weight_types.extend(loaded.weight_types);
                weight_types.sort();
                weight_types.dedup();
                Some(loaded.model)
            }
            None => None,
        };
        let mut info = model::model_info(&target, opts);
        info.loras = opts.loras.iter().map(|l| (l.path.clone(), l.scale)).collect();
        if let Some(d) = &draft {
            info.draft_gpu_layers = super::gpu::offloaded_layers(opts.draft_gpu_layers, d.n_layer());
        }
        if info.gpu_layers + info.draft_gpu_layers > 0 {
            if let Some(dev) = super::gpu::state().and_then(|s| s.devices.first()) {
                info.compute_id = format!(
                    "{} + {} {} ({} + {} layers)",
                    info.compute_id, dev.backend, dev.description, info.gpu_layers, info.draft_gpu_layers
                );
            }
        }
        // Unreadable now (it was just loaded): sessions then match nothing.
        info.fingerprint = fingerprint(std::path::Path::new(&opts.model_path)).unwrap_or_default();
        Ok(Models { target, draft, info, weight_types })
    }
}

pub struct Worker<'m> {
    models: &'m Models,
    shared: Arc<Shared>,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    slots: Vec<Slot<'m>>,
    costs: BatchCost,
    draft: Option<Rc<RefCell<DraftContext<'m>>>>,
    /// Controllers of drafters that keep theirs across requests (the draft
    /// model's), by drafter and settings.
    kept_ctls: Vec<KeptController>,
    invariance: InvarianceCheck,
    /// The thread that compiles constraints (started at the first one).
    compile_thread: Option<CompileThread>,
    /// Recently compiled constraints, newest last.
    compiled: Vec<(Grammar, Constraint)>,
    /// States of prompts that left their slot (`promptCacheMB`).
    prompt_cache: PromptCache,
    /// Counts placements: a slot's `used` is the last it took.
    clock: u64,
    n_ctx: usize,
    n_batch: usize,
    /// The `embed()` context, made at the first call.
    embedder: Option<Embedder<'m>>,
    /// The load options, for the embedding context.
    opts: EngineOptions,
    /// How many threads a step computes with (all, or one on a busy
    /// machine), by its times against the costs measured at load.
    threads: ThreadGovernor,
    reference: BatchCost,
    /// The thread cap in force on this thread (llama.cpp's).
    threads_applied: usize,
    /// LoRA adapters of the target context (`EngineOptions.loras`).
    loras: super::lora::Adapters,
    /// The multimodal projector (`mmprojPath`), shared with the preparing
    /// thread, and the target context's pointer its decodes take.
    pub projector: Option<Arc<super::media::Projector>>,
    raw_ctx: *mut llama_cpp_sys_2::llama_context,
    /// The target's decoding steps (one `llama_decode` each) and the slots
    /// they served, summed (`status().decodes`, llama-server's metrics).
    decodes: u64,
    decoded_slots: u64,
}

impl<'m> Worker<'m> {
    pub fn new(models: &'m Models, opts: &EngineOptions, shared: Arc<Shared>) -> Result<Self> {
        let info = &models.info;
        let parallel = info.parallel;
        let load_err = |what: &str, path: &str, e: String, log: Vec<(llama_log::Level, String)>| {
            let why = llama_log::reason(&log).unwrap_or(e);
            EngineError::new(ErrorCode::ModelLoadFailed, format!("{path}: cannot create the {what} context ({why})"))
        };
        // One KV stream per slot: a request's attention then sums over its
        // own cells in the order plain decoding does, whoever shares the
        // batch (a unified cache would interleave neighbours' cells).
        let params = model::context_params(opts, info.n_ctx * parallel as u32, parallel as u32, false);
        let backend = model::backend()?;
        let (ctx, log) = llama_log::capture(|| models.target.new_context(backend, params));
        let ctx = ctx.map_err(|e| load_err("target", &opts.model_path, e.to_string(), log))?;
        // Right after the context (its pointer is the last llama.cpp made here).
        let loras = super::lora::Adapters::load(&ctx, &opts.model_path, &opts.loras)?;
        // SAFETY: reads a thread-local pointer llama.cpp set as it made `ctx`.
        let raw_ctx = unsafe { llama_cpp_sys_2::llama_last_context_created() };
        crate::portable::set_portable(raw_ctx, opts.portable).map_err(|why| load_err("target", &opts.model_path, why, Vec::new()))?;
        let projector = match &opts.mmproj_path {
            Some(path) => {
                // SAFETY: the context's model is the live target.
                let model = unsafe { llama_cpp_sys_2::llama_get_model(raw_ctx) };
                // SAFETY: the target model outlives the worker and its projector.
                Some(Arc::new(unsafe { super::media::Projector::load(path, model, opts.threads, info.n_batch as usize)? }))
            }
            None => None,
        };
        let draft = match (&models.draft, &opts.draft_model_path) {
            (Some(m), Some(path)) => {
                let params = model::context_params(opts, info.n_ctx * parallel as u32, DraftContext::sequences(parallel), true);
                let (dctx, log) = llama_log::capture(|| m.new_context(backend, params));
                let dctx = dctx.map_err(|e| load_err("draft", path, e.to_string(), log))?;
                // SAFETY: as for the target's, right after the draft context was made.
                let raw = unsafe { llama_cpp_sys_2::llama_last_context_created() };
                crate::portable::set_portable(raw, opts.portable).map_err(|why| load_err("draft", path, why, Vec::new()))?;
                Some(Rc::new(RefCell::new(DraftContext::new(dctx, parallel, info.n_batch as usize))))
            }
            _ => None,
        };
        let n_batch = info.n_batch as usize;
        let mut worker = Worker {
            models,
            shared,
            ctx,
            batch: LlamaBatch::new(n_batch, 1),
            slots: (0..parallel).map(|s| Slot::new(s as i32)).collect(),
            costs: BatchCost::new(n_batch + 1),
            draft,
            kept_ctls: Vec::new(),
            invariance: InvarianceCheck::default(),
            compile_thread: None,
            compiled: Vec::new(),
            prompt_cache: PromptCache::new(opts.prompt_cache_mb.saturating_mul(1 << 20)),
            clock: 0,
            n_ctx: info.n_ctx as usize,
            n_batch,
            embedder: None,
            opts: opts.clone(),
            threads: ThreadGovernor::new(opts.threads.max(1) as usize),
            reference: BatchCost::new(1),
            threads_applied: 0,
            loras,
            projector,
            raw_ctx,
            decodes: 0,
            decoded_slots: 0,
        };
        // A cap left on this thread (none is, a thread per engine) would skew the costs.
        set_thread_cap(0);
        let limits =
            Limits { n_ctx: worker.n_ctx, n_batch, n_seq: parallel, threads: opts.threads.max(1) as usize, portable: opts.portable };
        // Everything the verdict depends on: the model file, its adapters,
        // the context's shape, the threads, what computes, the fast kernels
        // on (an environment setting can change them), the build. Without a
        // fingerprint or a build, no earlier verdict can be known to apply.
        let build = crate::ggml_setup::build_id();
        let key = format!(
            "{}|{:?}|{}|{}|{}|{}|{}|{:?}|{}|{}",
            info.fingerprint,
            info.loras,
            limits.n_ctx,
            limits.n_batch,
            limits.n_seq,
            limits.threads,
            info.compute_id,
            models.weight_types,
            crate::ggml_setup::fast_kernels(),
            build
        );
        // Portable mode always runs the check: its decodes also show every
        // op the model computes has a portable kernel.
        let known = !info.fingerprint.is_empty() && !build.is_empty() && !opts.portable;
        if opts.portable {
            crate::portable::portable_reset_gaps();
        }
        let file = opts.self_check_cache.as_deref().map(std::path::Path::new);
        worker.invariance = match if known { earlier_verdict(&key, file) } else { None } {
            Some((check, costs)) => {
                worker.costs = costs;
                check
            }
            None => {
                let check = calibrate(&mut worker.ctx, &mut worker.batch, &models.target, &models.weight_types, limits, &mut worker.costs);
                if known {
                    keep_verdict(&key, &check, &worker.costs, file);
                }
                check
            }
        };
        if let Some(d) = &worker.draft {
            d.borrow_mut().calibrate(calibration_tokens(&models.target)[0]);
        }
        if opts.portable {
            if let Some(op) = crate::portable::portable_first_gap() {
                // A product's gap is its weights' type: name the types no portable kernel reads.
                let uncovered: Vec<&str> = models
                    .weight_types
                    .iter()
                    .map(String::as_str)
                    .filter(|t| {
                        !crate::matmul_check::PORTABLE_TYPES.iter().any(|p| p.eq_ignore_ascii_case(t)) && !t.eq_ignore_ascii_case("F32")
                    })
                    .collect();
                let what =
                    if op == "MUL_MAT" && !uncovered.is_empty() { format!("products with {} weights", uncovered.join(", ")) } else { op };
                return Err(EngineError::new(
                    ErrorCode::ModelLoadFailed,
                    format!(
                        "{}: determinism 'portable': the model computes {what}, which has no portable kernel (docs/testing.md lists the ops and weight types portable mode covers)",
                        opts.model_path
                    ),
                ));
            }
        }
        worker.reference = worker.costs.clone();
        Ok(worker)
    }

    /// Caps this thread's decodes at the governor's thread count for a
    /// step of `tokens`.
    fn apply_threads(&mut self, tokens: usize) {
        let n = self.threads.threads_for(tokens);
        if n != self.threads_applied {
            set_thread_cap(if n == self.opts.threads.max(1) as usize { 0 } else { n });
            self.threads_applied = n;
        }
    }

    /// Gives the context each slot's LoRA scales before a decode.
    fn apply_loras(&mut self) -> Result<()> {
        if self.loras.is_empty() {
            return Ok(());
        }
        let per_seq: Vec<&[f32]> = self.slots.iter().map(|s| s.request.as_ref().map_or(&[][..], |r| r.lora())).collect();
        self.loras.apply(&per_seq)
    }

    /// Threads the next step computes with.
    pub fn threads_in_use(&self) -> usize {
        self.threads.threads()
    }

    /// Computes the next chunk of an `embed()` call; true when it is done.
    /// The embedding context is made at the first call, and made again
    /// after a failure.
    pub fn embed_step(&mut self, job: &mut EmbedJob) -> Result<bool> {
        let models: &'m Models = self.models;
        if self.embedder.is_none() {
            self.embedder = Some(Embedder::new(&models.target, &self.opts, &models.info, self.projector.clone())?);
        }
        let Some(embedder) = self.embedder.as_mut() else { unreachable!() };
        let done = embedder.step(job, &models.info);
        if done.is_err() {
            self.embedder = None;
        } else {
            // A pass of the model too (llama-server counts its embeddings'
            // decodes in n_decode_total): one input served.
            self.decodes += 1;
            self.decoded_slots += 1;
        }
        done
    }

    /// Frees the embedding context (after a panic in it).
    pub fn drop_embedder(&mut self) {
        self.embedder = None;
    }

    pub fn invariance(&self) -> &InvarianceCheck {
        &self.invariance
    }

    /// Publishes what `status()` reports: measured costs, cached tokens.
    pub fn publish(&self) {
        let batch_cost_ms = (0..=33).map(|n| if n == 0 { None } else { self.costs.measured(n) }).collect();
        self.shared.publish(Published {
            batch_cost_ms,
            draft_step_ms: self.draft.as_ref().and_then(|d| d.borrow().step_ms),
            tokens_cached: self.slots.iter().map(|s| s.cached.len()).sum(),
            prompt_cache: self.prompt_cache.stats(),
            threads_in_use: self.threads.threads(),
            decodes: self.decodes,
            decoded_slots: self.decoded_slots,
            slots: self
                .slots
                .iter()
                .map(|s| super::shared::SlotStatus {
                    request: s.request.as_ref().map(|r| r.id()),
                    prompt_tokens: s.request.as_ref().map_or(0, |r| r.prompt().len()),
                    predicted: s.request.as_ref().map_or(0, |r| r.predicted()),
                    cached: s.cached.len(),
                })
                .collect(),
        });
    }

    pub fn active(&self) -> usize {
        self.slots.iter().filter(|s| !s.is_free()).count()
    }

    pub fn has_free_slot(&self) -> bool {
        self.slots.iter().any(Slot::is_free)
    }

    /// After a failed step or a panic: every active request ends with `e`,
    /// and every KV cache is forgotten (its state is unknown).
    pub fn recover(&mut self, e: &EngineError) {
        for slot in &mut self.slots {
            if let Some(r) = slot.request.take() {
                self.shared.request_ended(r.id());
                r.fail(e);
            }
        }
        self.ctx.clear_kv_cache();
        for s in &mut self.slots {
            s.keep(0);
            s.copy_pending = false;
            s.wait = None;
        }
        if let Some(d) = &self.draft {
            d.borrow_mut().reset();
        }
    }

    /// Ends slot `i`'s request: its result goes to its sink after its last
    /// event; the draft model's controller is kept for the next request.
    /// What `status()` reports is published first: a caller that reads it
    /// once the promise settles sees this request's prompt-cache hit and
    /// slot (a short request can start and end within one step, before the
    /// step's own publication).
    fn finish(&mut self, i: usize, stop: Stop) {
        self.slots[i].wait = None;
        let Some(r) = self.slots[i].request.take() else { return };
        self.publish();
        self.shared.request_ended(r.id());
        if r.save_target().is_some() {
            self.finish_save(i, *r, stop);
            return;
        }
        let info = &self.models.info;
        for (key, ctl) in r.finish(stop, info, self.invariance.holds()) {
            self.kept_ctls.retain(|(k, _)| *k != key);
            self.kept_ctls.push((key, ctl));
        }
    }
}

/// llama.cpp's cap on the threads of this thread's decodes (patch 0004; 0: none).
fn set_thread_cap(n: usize) {
    // SAFETY: sets a thread-local integer in llama.cpp.
    unsafe { llama_cpp_sys_2::llama_set_thread_cap(n as i32) }
}

/// The result of a request that was aborted before it produced anything.
pub fn aborted_before_start(req: &CompletionRequest, info: &ModelInfo, batch_invariant: bool) -> CompletionResult {
    CompletionResult {
        stop: true,
        model: info.name.clone(),
        stopped_abort: true,
        generation_settings: req.generation_settings(info.n_ctx, &info.name, &info.eog),
        speculative: SpeculativeStats { mode: req.speculative.mode.as_str().into(), batch_invariant, ..Default::default() },
        completion_probabilities: (req.n_probs > 0).then(Vec::new),
        ..Default::default()
    }
}
