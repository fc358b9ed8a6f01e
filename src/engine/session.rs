//! One request, start to finish, on the engine thread: prompt evaluation with
//! KV-cache reuse, the decoding loop, stop conditions, context shift, events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use serde_json::{json, Value};

use super::draft_model::DraftModel;
use super::model::{self, EngineOptions, ModelInfo};
use super::sampler::{TokenSampler, DEAD_END};
use crate::core::controller::{BatchCost, DraftController};
use crate::core::drafter::{Draft, Drafter};
use crate::core::error::{EngineError, ErrorCode, Result};
use crate::core::events::{
    CompletionResult, DrafterStats, EventSink, SpeculativeStats, Timings, TokenEvent, TokenOut, TokenProb, TokenSource,
};
use crate::core::invariance::{InvarianceCheck, CHECK_SIZES};
use crate::core::ngram::{NgramCache, NgramDrafter, NgramParams, CLASS_PRIORS};
use crate::core::prompt;
use crate::core::random::{self, Rng};
use crate::core::request::{CompletionRequest, PromptPart, SpecMode};
use crate::core::text::TextStream;
use crate::core::verify::{verify_stochastic, Dist, Verdict};

pub struct Models {
    pub target: Arc<LlamaModel>,
    pub draft: Option<Arc<LlamaModel>>,
    pub info: ModelInfo,
}

impl Models {
    pub fn load(opts: &EngineOptions, progress: Option<Box<dyn FnMut(f32) + Send>>) -> Result<Models> {
        // With a draft model, the first half of the progress is the target's.
        let has_draft = opts.draft_model_path.is_some();
        let progress = progress.map(|p| std::sync::Arc::new(std::sync::Mutex::new(p)));
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

pub struct Session<'m> {
    models: &'m Models,
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    /// Tokens whose keys/values are in sequence 0, at positions 0..len.
    cached: Vec<LlamaToken>,
    draft: Option<DraftModel<'m>>,
    /// Measured cost of target batches by size; persists across requests.
    costs: BatchCost,
    draft_step_ms: Option<f64>,
    /// The draft model's cost per token when it evaluates many at once
    /// (catching up with a prompt), measured at load and when it happens.
    draft_prefill_ms: Option<f64>,
    /// The draft model's controller, kept across requests: how well the
    /// draft model predicts this target is a property of the pair more than
    /// of one request. Keyed by the settings it was made for.
    model_ctl: Option<(ControllerKey, DraftController)>,
    ngram: NgramStore,
    /// The load-time self-check: are logits bit-identical alone and in a batch?
    invariance: InvarianceCheck,
}

/// (n_max, adaptive, greedy): requests with these equal share a controller.
type ControllerKey = (usize, bool, bool);

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Eos,
    Word,
    Limit,
    Abort,
}

impl<'m> Session<'m> {
    pub fn new(models: &'m Models, opts: &EngineOptions, ngram: NgramStore) -> Result<Self> {
        let info = &models.info;
        let load_err = |what: &str, path: &str, e: String| {
            EngineError::new(ErrorCode::ModelLoadFailed, format!("{path}: cannot create the {what} context ({e})"))
        };
        let ctx = models
            .target
            .new_context(model::backend()?, model::context_params(opts, info.n_ctx, MAX_SEQS))
            .map_err(|e| load_err("target", &opts.model_path, e.to_string()))?;
        let draft = match (&models.draft, &opts.draft_model_path) {
            (Some(m), Some(path)) => {
                let dctx = m
                    .new_context(model::backend()?, model::context_params(opts, info.n_ctx, MAX_SEQS))
                    .map_err(|e| load_err("draft", path, e.to_string()))?;
                Some(DraftModel::new(m, dctx, info.n_batch as usize))
            }
            _ => None,
        };
        let mut session = Session {
            models,
            ctx,
            batch: LlamaBatch::new(info.n_batch as usize, MAX_SEQS as i32),
            cached: Vec::new(),
            draft,
            costs: BatchCost::new(MAX_BATCH_COST),
            draft_step_ms: None,
            draft_prefill_ms: None,
            model_ctl: None,
            ngram,
            invariance: InvarianceCheck::default(),
        };
        session.invariance = session.calibrate();
        Ok(session)
    }

    pub fn invariance(&self) -> &InvarianceCheck {
        &self.invariance
    }

    pub fn tokens_cached(&self) -> usize {
        self.cached.len()
    }

    /// Measured costs: target batch of n tokens (index n), draft step.
    pub fn costs(&self) -> (Vec<Option<f64>>, Option<f64>) {
        ((0..=16).map(|n| if n == 0 { None } else { self.costs.measured(n) }).collect(), self.draft_step_ms)
    }

    /// Forgets the KV caches (after a failure left them in an unknown state).
    pub fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        self.cached.clear();
        if let Some(d) = self.draft.as_mut() {
            d.reset();
        }
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
                PromptPart::Chat(s) => tokens.extend(model::tokenize_chat(&self.models.target, s)),
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
            crate::core::gbnf::check_gbnf(&g)
                .map_err(|why| EngineError::invalid("json_schema", format!("its grammar is too large: {why}")))?;
            return Ok(Some(g));
        }
        Ok(req.grammar.clone())
    }

    /// The drafters this request may use, in chain order.
    fn drafters(&self, req: &CompletionRequest) -> Result<Vec<DrafterKind>> {
        let has_model = self.draft.is_some();
        let need_model = |kinds: Vec<DrafterKind>| {
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
            SpecMode::Ngram => Ok(vec![DrafterKind::Ngram]),
            SpecMode::Draft => need_model(vec![DrafterKind::Model]),
            SpecMode::NgramDraft => need_model(vec![DrafterKind::Ngram, DrafterKind::Model]),
            SpecMode::Auto if has_model => Ok(vec![DrafterKind::Ngram, DrafterKind::Model]),
            SpecMode::Auto => Ok(vec![DrafterKind::Ngram]),
        }
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
                self.batch.add(t, (base + i) as i32, &[0], logits).map_err(|e| EngineError::internal(format!("batch: {e}")))?;
            }
            self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
            self.cached.extend_from_slice(chunk);
        }
        Ok(true)
    }

    /// One target pass over `[pending, drafts…]` with logits for every
    /// position. `pending` joins the cache; the drafts are cached too and
    /// trimmed by the caller once verified. Returns the decode time (ms).
    fn eval_step(&mut self, pending: LlamaToken, drafts: &[i32]) -> Result<f64> {
        let base = self.cached.len();
        self.batch.clear();
        let add = |b: &mut LlamaBatch, t: LlamaToken, pos: usize| {
            b.add(t, pos as i32, &[0], true).map_err(|e| EngineError::internal(format!("batch: {e}")))
        };
        add(&mut self.batch, pending, base)?;
        for (i, &d) in drafts.iter().enumerate() {
            add(&mut self.batch, LlamaToken(d), base + 1 + i)?;
        }
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
        let ms = ms(t);
        self.cached.push(pending);
        self.cached.extend(drafts.iter().map(|&d| LlamaToken(d)));
        Ok(ms)
    }

    /// Folds the draft model's last drafting time into its per-step cost.
    fn note_draft_cost(&mut self) {
        if let Some(d) = self.draft.as_ref().filter(|d| d.last_decoded > 0) {
            // The usual catch-up (the pending token and the accepted drafts)
            // is part of what a proposed token costs; a long one (a prompt,
            // tokens produced while the draft model was idle) is a one-time
            // setup, priced separately.
            let (ms, setup) = if d.last_synced > SMALL_CATCH_UP { (d.last_ms - d.last_sync_ms, true) } else { (d.last_ms, false) };
            if d.last_proposed > 0 {
                let per = ms.max(0.0) / d.last_proposed as f64;
                self.draft_step_ms = Some(self.draft_step_ms.map_or(per, |o| o * 0.8 + per * 0.2));
            }
            if setup {
                let per = d.last_sync_ms / d.last_synced as f64;
                self.draft_prefill_ms = Some(self.draft_prefill_ms.map_or(per, |o| o * 0.5 + per * 0.5));
            }
        }
    }

    /// What drafting with the draft model now first costs to catch up with
    /// `history`, beyond the usual few tokens.
    fn draft_setup_ms(&self, history: &[i32]) -> f64 {
        let Some(d) = self.draft.as_ref() else { return 0.0 };
        let behind = d.behind(history);
        if behind <= SMALL_CATCH_UP {
            return 0.0;
        }
        let per = self.draft_prefill_ms.or(self.draft_step_ms).unwrap_or(0.0);
        behind as f64 * per
    }

    /// Removes cached positions from `len` on (rejected drafts).
    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        if len < self.cached.len() {
            self.ctx.kv_cache_seq_rm(0, Some(len as u32), None).map_err(|e| EngineError::internal(format!("kv cache: {e}")))?;
            self.cached.truncate(len);
        }
        Ok(())
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

    /// Measures, once at load, what a target batch of n tokens costs on this
    /// machine and what a draft-model step costs, so the controller can price
    /// a draft before the first one is tried; and checks that every position
    /// of those batches gets bit-identical logits to plain decoding of the
    /// same tokens, one at a time (`core::invariance`). Leaves both caches
    /// empty.
    fn calibrate(&mut self) -> InvarianceCheck {
        let start = Instant::now();
        let mut check = InvarianceCheck::default();
        let tokens = self.calibration_tokens();
        let (n_ctx, n_batch) = (self.n_ctx(), self.models.info.n_batch as usize);
        // A short context first, like a real prompt (it also warms up).
        let prefix = 32.min(n_ctx / 4).max(1);
        let base = prefix;
        let sizes: Vec<usize> = CHECK_SIZES.into_iter().filter(|&n| base + n < n_ctx && n <= n_batch).collect();
        let outcome = self.eval(&tokens[..prefix], None).and_then(|_| {
            // Plain decoding of the rows, one token at a time: the reference
            // every batch is compared with (and the cost of a batch of one).
            let rows = &tokens[base..base + sizes.last().copied().unwrap_or(1)];
            let mut reference = Vec::with_capacity(rows.len());
            for (i, &t) in rows.iter().enumerate() {
                self.decode_alone(t, base + i)?;
                reference.push(self.ctx.get_logits_ith(0).to_vec());
            }
            for &n in &sizes {
                self.check_batch(&rows[..n], base, &reference[..n], &mut check)?;
            }
            Ok(())
        });
        if let Err(e) = outcome {
            check.fail(e.message);
        }
        check.ms = ms(start);
        let token = tokens[0];
        if let Some(d) = self.draft.as_mut() {
            let steps: Vec<f64> = (0..3).filter_map(|_| d.measure_step_ms(token)).collect();
            self.draft_step_ms = steps.into_iter().reduce(f64::min);
            let _ = d.measure_batch_ms(token, 32); // warm-up
            self.draft_prefill_ms = d.measure_batch_ms(token, 32);
        }
        self.reset();
        check
    }

    /// Varied, real tokens for calibration (prose, code, digits, accents),
    /// enough for the prefix and the largest checked batch.
    fn calibration_tokens(&self) -> Vec<LlamaToken> {
        const TEXT: &str = "The lighthouse keeper wrote down the weather at 6:45 every evening. \
            fn main() { let total: u32 = (1..=10).map(|x| x * x).sum(); println!(\"{total}\"); } \
            Naïve café owners in Zürich sold 1,024 croissants; 37% were déjà réservés. \
            {\"name\": \"Alice\", \"age\": 31, \"tags\": [\"a\", \"b\"]} <div class=\"note\">Done.</div>";
        let n = 32 + CHECK_SIZES[CHECK_SIZES.len() - 1];
        let vocab = self.models.target.vocab();
        let mut tokens: Vec<LlamaToken> = vocab.tokenize(TEXT.as_bytes(), false, false);
        tokens.retain(|t| (0..self.models.info.n_vocab).contains(&t.0));
        if tokens.is_empty() {
            tokens.push(LlamaToken(0));
        }
        tokens.iter().copied().cycle().take(n).collect()
    }

    /// Decodes one token at `pos` (the cache holds positions before it) with
    /// its logits, timed as a batch of one.
    fn decode_alone(&mut self, token: LlamaToken, pos: usize) -> Result<()> {
        self.batch.clear();
        self.batch.add(token, pos as i32, &[0], true).map_err(|e| EngineError::internal(format!("batch: {e}")))?;
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
        self.costs.observe(1, ms(t));
        Ok(())
    }

    /// Decodes `rows` as one batch at positions from `base` (timed) and
    /// compares every row's logits bit for bit with `reference`, the same
    /// rows decoded one at a time. Leaves the cache at `base`.
    fn check_batch(&mut self, rows: &[LlamaToken], base: usize, reference: &[Vec<f32>], check: &mut InvarianceCheck) -> Result<()> {
        let n = rows.len();
        let cache_err = |e: llama_cpp_2::context::kv_cache::KvCacheConversionError| EngineError::internal(format!("kv cache: {e}"));
        self.ctx.kv_cache_seq_rm(0, Some(base as u32), None).map_err(cache_err)?;
        self.batch.clear();
        for (i, &t) in rows.iter().enumerate() {
            self.batch.add(t, (base + i) as i32, &[0], true).map_err(|e| EngineError::internal(format!("batch: {e}")))?;
        }
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
        self.costs.observe(n, ms(t));
        if (0..n).all(|r| check.compare(n, r, &reference[r], self.ctx.get_logits_ith(r as i32))) {
            check.passed(n);
        }
        self.ctx.kv_cache_seq_rm(0, Some(base as u32), None).map_err(cache_err)?;
        Ok(())
    }

    fn generate(&mut self, req: &CompletionRequest, sink: &mut dyn EventSink, cancel: &AtomicBool) -> Result<CompletionResult> {
        let info = &self.models.info;
        let n_ctx = self.n_ctx();
        if cancel.load(Ordering::SeqCst) {
            return Ok(aborted_before_start(req, info, self.invariance.holds()));
        }
        let t_start = Instant::now();
        let grammar = Self::grammar(req)?;
        let mut sampler = TokenSampler::new(&self.models.target, req, grammar.as_deref(), &info.eog, info.n_ctx)?;
        let kinds = if sampler.supports_speculation() { self.drafters(req)? } else { vec![] };

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
            let mut r = aborted_before_start(req, info, self.invariance.holds());
            r.tokens_evaluated = n_prompt;
            r.tokens_cached = tokens_cached;
            return Ok(r);
        }
        let prompt_ms = ms(t_start);
        let t_gen = Instant::now();

        // Drafters for this request, each with its own controller.
        let spec = &req.speculative;
        let prompt_ids: Vec<i32> = tokens.iter().map(|t| t.0).collect();
        let mut ngram = kinds.contains(&DrafterKind::Ngram).then(|| {
            let mut d = NgramDrafter::new(NgramParams::default(), self.ngram.dynamic.clone(), self.ngram.fixed.clone());
            d.begin(&prompt_ids);
            d
        });
        if let Some(d) = self.draft.as_mut() {
            let seed = req.sampling.seed.map(|s| s as u64 ^ 0x9E37_79B9_7F4A_7C15).unwrap_or_else(|| random::from_os().random());
            d.configure(req.sampling.temperature, spec.p_min, seed);
        }
        let ctl_key: ControllerKey = (spec.n_max, spec.adaptive, sampler.is_greedy());
        let mut slots: Vec<Slot> = kinds
            .iter()
            .map(|&kind| Slot {
                kind,
                ctl: match kind {
                    // N-gram acceptance depends on how much the answer copies
                    // from this prompt: every request starts afresh.
                    DrafterKind::Ngram => DraftController::new(spec.n_max, spec.adaptive, kind.prior_acceptance())
                        .with_loss_check(false)
                        .with_classes(&CLASS_PRIORS),
                    DrafterKind::Model => match self.model_ctl.take() {
                        Some((key, ctl)) if key == ctl_key => ctl,
                        _ => DraftController::new(spec.n_max, spec.adaptive, kind.prior_acceptance()),
                    },
                },
                stats: DrafterStats::default(),
            })
            .collect();

        let vocab = self.models.target.vocab();
        let mut text = TextStream::new(req.stop.clone());
        let mut probs_out: Vec<Value> = Vec::new();
        let mut n_gen = 0usize;
        let mut passes = 0usize;
        let mut draft_ms = 0.0f64;
        let want_dist = req.n_probs > 0;
        let greedy = sampler.is_greedy();
        let budget = |n_gen: usize| if req.n_predict < 0 { usize::MAX } else { (req.n_predict as usize).saturating_sub(n_gen) };

        // Each step yields tokens; the first comes from the prompt's logits.
        let mut step_tokens: Vec<(LlamaToken, TokenSource, Option<Dist>)> = Vec::new();
        let mut step_drafted = 0usize;
        let mut step_accepted = 0usize;
        let mut logits_idx = -1i32;
        let mut pending: Option<LlamaToken> = None;
        let stop = 'gen: loop {
            if cancel.load(Ordering::Relaxed) {
                break Stop::Abort;
            }
            if budget(n_gen) == 0 {
                break Stop::Limit;
            }
            let t_step = Instant::now();
            let mut step_slot: Option<usize> = None;
            if let Some(p) = pending {
                // Room for this step: the pending token plus the drafts.
                if self.cached.len() + 1 >= n_ctx {
                    if req.n_predict < 0 {
                        break Stop::Limit;
                    }
                    self.shift_context(n_keep)?;
                    truncated = true;
                }
                // Cells left after `p` and the next pending token. With
                // n_predict = -1 one more is held back: plain decoding stops
                // when the cache reaches n_ctx - 2, and a step that filled the
                // room would end one token later than it.
                let reserve = if req.n_predict < 0 { 3 } else { 2 };
                let room = n_ctx.saturating_sub(self.cached.len() + reserve).min(info.n_batch as usize - 1);
                let available = spec.n_max.min(room).min(budget(n_gen).saturating_sub(1));
                let mut history: Vec<i32> = self.cached.iter().map(|t| t.0).collect();
                history.push(p.0);
                let mut draft: Option<(usize, Draft)> = None;
                if !slots.is_empty() && available > 0 {
                    for (si, slot) in slots.iter_mut().enumerate() {
                        let cost = match slot.kind {
                            DrafterKind::Model => self.draft_step_ms,
                            DrafterKind::Ngram => Some(0.01),
                        };
                        if let Some(c) = cost {
                            slot.ctl.observe_draft_cost(1, c);
                        }
                        if slot.kind == DrafterKind::Ngram {
                            // A lookup costs next to nothing: look first, then
                            // decide how much of what it found is worth verifying.
                            let t = Instant::now();
                            let proposed = ngram.as_mut().and_then(|d| d.draft(&history, available));
                            draft_ms += ms(t);
                            let Some(mut d) = proposed else { continue };
                            let k = slot.ctl.next_length_classified(&self.costs, &d.classes);
                            if k < spec.n_min.max(1) {
                                continue;
                            }
                            d.truncate(k);
                            draft = Some((si, d));
                            break;
                        }
                        let setup = self.draft_setup_ms(&history);
                        let k = slot.ctl.next_length_with_setup(&self.costs, available, setup);
                        if k == 0 {
                            continue;
                        }
                        let t = Instant::now();
                        let proposed = self.draft.as_mut().and_then(|d| {
                            if spec.n_parallel > 1 {
                                d.draft_tree(&history, k, spec.n_parallel, spec.p_split)
                            } else {
                                d.draft(&history, k)
                            }
                        });
                        draft_ms += ms(t);
                        self.note_draft_cost();
                        if let Some(mut d) = proposed {
                            d.truncate(k);
                            if d.len() >= spec.n_min.max(1) {
                                draft = Some((si, d));
                                break;
                            }
                        }
                    }
                }
                step_slot = draft.as_ref().map(|(si, _)| *si);
                let drafted: Vec<i32> = draft.as_ref().map(|(_, d)| d.tokens.clone()).unwrap_or_default();
                let t_verify = self.eval_step(p, &drafted)?;
                passes += 1;
                self.costs.observe(drafted.len() + 1, t_verify);
                // Verify drafts in order; each position sees only what was
                // accepted before it (penalties, grammar).
                let base = self.cached.len() - drafted.len(); // cache length after `p`
                let mut n_ok = 0usize;
                step_tokens.clear();
                if let Some((si, d)) = &draft {
                    for (i, &x) in d.tokens.iter().enumerate() {
                        let (token, dist, ok) = if greedy {
                            let (t, dist) = sampler.sample(&self.ctx, i as i32, want_dist);
                            (t, dist, t.0 == x)
                        } else {
                            let pdist = sampler.distribution(&self.ctx, i as i32);
                            let q = d.dists[i].clone().unwrap_or_else(|| Dist::point(x));
                            if pdist.is_empty() {
                                (DEAD_END, Some(pdist), false)
                            } else {
                                match verify_stochastic(&pdist, &q, x, sampler.rng()) {
                                    Verdict::Accept => (LlamaToken(x), Some(pdist), true),
                                    Verdict::Reject { token } => (LlamaToken(token), Some(pdist), false),
                                }
                            }
                        };
                        sampler.accept(token);
                        let source = if ok { d.source } else { TokenSource::Target };
                        step_tokens.push((token, source, dist));
                        if ok {
                            n_ok += 1;
                        }
                        if !ok || token == DEAD_END || (vocab.is_eog(token) && !req.ignore_eos) || step_tokens.len() >= budget(n_gen) {
                            break;
                        }
                    }
                    let slot = &mut slots[*si];
                    slot.ctl.observe_acceptance(d.len(), n_ok);
                    slot.ctl.observe_classes(&d.classes, n_ok);
                    slot.stats.n_drafted += d.len();
                    slot.stats.n_accepted += n_ok;
                    match slot.kind {
                        DrafterKind::Ngram => ngram.as_mut().map(|g| g.accept(n_ok)),
                        DrafterKind::Model => self.draft.as_mut().map(|g| g.accept(n_ok)),
                    };
                    if n_ok == d.len() {
                        slot.ctl.reset_backoff();
                    }
                }
                step_drafted = drafted.len();
                step_accepted = n_ok;
                // Keep `p` and the accepted drafts; drop rejected positions.
                self.truncate_cache(base + n_ok)?;
                let all_ok = n_ok == drafted.len();
                let last_is_eog = step_tokens.last().is_some_and(|(t, _, _)| *t == DEAD_END || (vocab.is_eog(*t) && !req.ignore_eos));
                if all_ok && !last_is_eog && step_tokens.len() < budget(n_gen) {
                    // Every draft accepted (or none proposed): the target adds one more.
                    logits_idx = drafted.len() as i32;
                } else {
                    logits_idx = i32::MIN;
                }
            }
            if logits_idx != i32::MIN {
                let (token, dist) = sampler.sample(&self.ctx, logits_idx, want_dist);
                sampler.accept(token);
                step_tokens.push((token, TokenSource::Target, dist));
            }
            if pending.is_some() && !step_tokens.is_empty() {
                // Wall time per token, drafting included, is what decides.
                let spent = ms(t_step);
                for (si, slot) in slots.iter_mut().enumerate() {
                    match step_slot {
                        Some(s) if s == si => slot.ctl.observe_step(true, step_tokens.len(), spent),
                        None => slot.ctl.observe_step(false, step_tokens.len(), spent),
                        _ => {}
                    }
                }
            }
            // Emit this step's tokens, stopping at the first end condition.
            let mut out = Vec::with_capacity(step_tokens.len());
            let mut content = String::new();
            let mut stop = None;
            for (token, source, dist) in step_tokens.drain(..) {
                if token == DEAD_END || (vocab.is_eog(token) && !req.ignore_eos) {
                    stop = Some(Stop::Eos);
                    break;
                }
                n_gen += 1;
                pending = Some(token);
                let piece = vocab.token_to_piece(token, false, None);
                let pushed = text.push(&piece);
                content.push_str(&pushed.text);
                let mut t = TokenOut { id: token.0, piece: String::from_utf8_lossy(&piece).into_owned(), source, probs: None };
                if let (true, Some(d)) = (want_dist, dist.as_ref()) {
                    let probs = top_probs(&self.models.target, d, req.n_probs);
                    probs_out.push(legacy_probs(&t.piece, &probs));
                    t.probs = Some(probs);
                }
                out.push(t);
                if pushed.stop.is_some() {
                    stop = Some(Stop::Word);
                    break;
                }
                if budget(n_gen) == 0 {
                    stop = Some(Stop::Limit);
                    break;
                }
            }
            // With n_predict = -1 generation ends when the context is full.
            if stop.is_none() && req.n_predict < 0 && self.cached.len() + 2 >= n_ctx {
                stop = Some(Stop::Limit);
            }
            if stop.is_some() {
                content.push_str(&text.finish());
            }
            if !out.is_empty() || !content.is_empty() {
                let event = TokenEvent { content, tokens: out, n_drafted: step_drafted, n_accepted: step_accepted };
                if !sink.token(&event) {
                    break 'gen Stop::Abort;
                }
            }
            if let Some(s) = stop {
                break s;
            }
            logits_idx = i32::MIN;
        };
        // Anything still held back (a partial stop prefix, an incomplete
        // character) is released when generation ends for another reason.
        if matches!(stop, Stop::Abort) || (stop == Stop::Limit && text.held_bytes() > 0) {
            let rest = text.finish();
            if !rest.is_empty() {
                sink.token(&TokenEvent { content: rest, tokens: vec![], n_drafted: 0, n_accepted: 0 });
            }
        }
        if let Some(mut d) = ngram {
            d.end();
        }
        if let Some(slot) = slots.iter().find(|s| s.kind == DrafterKind::Model) {
            self.model_ctl = Some((ctl_key, slot.ctl.clone()));
        }
        let predicted_ms = ms(t_gen);
        let mut stats = SpeculativeStats {
            mode: req.speculative.mode.as_str().into(),
            target_passes: passes,
            draft_ms,
            batch_invariant: self.invariance.holds(),
            ..Default::default()
        };
        for slot in &slots {
            stats.n_drafted += slot.stats.n_drafted;
            stats.n_accepted += slot.stats.n_accepted;
            let entry = stats.drafters.entry(slot.kind.name().to_string()).or_default();
            entry.n_drafted += slot.stats.n_drafted;
            entry.n_accepted += slot.stats.n_accepted;
        }
        stats.acceptance_rate = if stats.n_drafted > 0 { stats.n_accepted as f64 / stats.n_drafted as f64 } else { 0.0 };
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
            speculative: stats,
            completion_probabilities: want_dist.then_some(probs_out),
        })
    }
}

/// Sequences a context and its batches hold: the history (0) plus up to 8
/// tree branches. `LlamaBatch::add` does not check seq ids against what the
/// batch was allocated for, so every batch is allocated for all of them.
pub const MAX_SEQS: u32 = 9;

/// A draft model catching up with at most this many tokens is drafting as
/// usual (the pending token, the accepted drafts); more is a one-time setup.
const SMALL_CATCH_UP: usize = 4;

/// Largest target batch the cost model tracks (n_max 64 + 1).
const MAX_BATCH_COST: usize = 65;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DrafterKind {
    Ngram,
    Model,
}

impl DrafterKind {
    fn name(self) -> &'static str {
        match self {
            DrafterKind::Ngram => "ngram",
            DrafterKind::Model => "draft",
        }
    }

    /// Acceptance assumed before any is measured.
    fn prior_acceptance(self) -> f64 {
        match self {
            DrafterKind::Ngram => crate::core::replay::NGRAM_PRIOR,
            DrafterKind::Model => 0.7,
        }
    }
}

struct Slot {
    kind: DrafterKind,
    ctl: DraftController,
    stats: DrafterStats,
}

/// The n-gram caches shared by every request of an engine.
#[derive(Clone, Default)]
pub struct NgramStore {
    pub dynamic: Arc<Mutex<NgramCache>>,
    pub fixed: Option<Arc<NgramCache>>,
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

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
