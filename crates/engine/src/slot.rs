//! A slot: one KV stream of the target context (llama.cpp sequence `seq`),
//! what it holds, and the request generating in it, if any. Everything a
//! request owns lives in its `Request`, behind methods: its sampler chain,
//! drafters, text stream, counters and clock, so requests decoded side by
//! side share nothing but the batch.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use serde_json::{json, Value};

use super::model::ModelInfo;
use super::sampler::{TokenSampler, DEAD_END};
use super::shared::{Job, SessionJob};
use llama_engine_core::cache::prompt_cache::reusable;
use llama_engine_core::chat::output::{Delta, OutputParser, ToolCall};
use llama_engine_core::chat::reparse::ReparseReader;
use llama_engine_core::error::EngineError;
use llama_engine_core::request::CompletionRequest;
use llama_engine_core::sampling::constraint::is_limit;
use llama_engine_core::sampling::noise::{self, Rng};
use llama_engine_core::sampling::Dist;
use llama_engine_core::speculation::controller::DraftController;
use llama_engine_core::speculation::cost::DraftPrices;
use llama_engine_core::speculation::drafter::{Draft, DrafterChain};
use llama_engine_core::speculation::registry::DRAFTERS;
use llama_engine_core::speculation::verify::verify_draft;
use llama_engine_core::text::events::{
    CompletionResult, EventSink, PromptProgress, ResultFunction, ResultToolCall, SpeculativeStats, Timings, TokenEvent, TokenOut,
    TokenProb, TokenSource,
};
use llama_engine_core::text::stream::TextStream;

pub struct Slot<'m> {
    /// The llama.cpp sequence (and KV stream) of this slot.
    pub seq: i32,
    /// Tokens whose keys and values the stream holds, at positions 0..len
    /// (or as `positions` says after M-RoPE media).
    pub cached: Vec<LlamaToken>,
    /// Where the cells of `cached` sit: the positions of the prompt that
    /// last took the slot (its first tokens are what the slot kept).
    pub positions: crate::media::Positions,
    /// After a context shift: the first `n` cells are still what computing
    /// their tokens gives; the shifted rest is not (rotated keys).
    shifted: Option<usize>,
    /// Restored from a sliding-window state of this many tokens: the window
    /// before its last token is padding, so the cells can only be continued
    /// from there (see `core::cache::state::Cells::padded`).
    window_from: usize,
    /// A copy into this stream waits for the next decode: its bytes are
    /// stale until then, so they must not be read.
    pub copy_pending: bool,
    /// When it last took a request (the worker's clock): the least recently
    /// used content is overwritten first.
    pub used: u64,
    /// A request waiting for another slot to evaluate the prefix it shares.
    pub wait: Option<Wait>,
    pub request: Option<Box<Request<'m>>>,
    /// The LoRA adapters its cells were computed with
    /// (`core::request::lora_tag`; 0: none).
    pub lora_tag: u64,
}

/// A request that waits for slot `donor` (running request `donor_id`) to
/// hold the first `n` tokens of its prompt, to copy them instead of
/// evaluating them a second time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub donor: usize,
    pub donor_id: u64,
    pub n: usize,
}

impl Slot<'_> {
    pub fn new(seq: i32) -> Self {
        Slot {
            seq,
            cached: Vec::new(),
            positions: Default::default(),
            shifted: None,
            window_from: 0,
            copy_pending: false,
            used: 0,
            wait: None,
            request: None,
            lora_tag: 0,
        }
    }

    pub fn is_free(&self) -> bool {
        self.request.is_none()
    }

    pub fn is_prefilling(&self) -> bool {
        self.wait.is_none() && self.request.as_ref().is_some_and(|r| r.phase == Phase::Prefill)
    }

    /// The cached tokens whose cells are what computing them gives (all of
    /// them unless the context was shifted).
    pub fn reusable(&self) -> &[LlamaToken] {
        &self.cached[..self.shifted.unwrap_or(usize::MAX).min(self.cached.len())]
    }

    /// How many of `prompt`'s tokens this slot's cells give (common prefix,
    /// at most all but its last token; none where the cells cannot be cut
    /// there).
    pub fn reuse_for(&self, prompt: &[i32]) -> usize {
        let held: Vec<i32> = self.reusable().iter().map(|t| t.0).collect();
        let n = reusable(&held, false, prompt);
        if n + 1 < self.window_from {
            0
        } else {
            n
        }
    }

    /// The tokens to continue from, at least, when this slot's cells are
    /// copied (its restored window's last token).
    pub fn window_from(&self) -> usize {
        self.window_from
    }

    /// Keeps the first `n` cached tokens (the caller cut the stream).
    pub fn keep(&mut self, n: usize) {
        self.cached.truncate(n);
        if self.shifted.is_some_and(|k| n <= k) {
            self.shifted = None; // what follows will be computed in place
        }
        if n + 1 < self.window_from {
            self.window_from = 0; // only when emptied: reuse never cuts there
        }
    }

    /// Holds `tokens` now (copied or restored into the stream), continued
    /// from token `window_from` at the earliest.
    pub fn hold(&mut self, tokens: &[LlamaToken], window_from: usize) {
        self.cached.clear();
        self.cached.extend_from_slice(tokens);
        self.shifted = None;
        self.window_from = window_from;
    }

    /// The context was shifted: the first `keep` cells stayed in place.
    pub fn mark_shifted(&mut self, keep: usize) {
        self.shifted = Some(self.shifted.map_or(keep, |k| k.min(keep)));
    }

    /// The token a generating request decodes next; `None` when the slot is
    /// free or still evaluating its prompt.
    pub fn pending(&self) -> Option<LlamaToken> {
        match self.request.as_ref()?.phase {
            Phase::Generate { pending } => Some(pending),
            Phase::Prefill => None,
        }
    }

    pub fn is_generating(&self) -> bool {
        self.pending().is_some()
    }

    /// The history a drafter continues: what the cache holds, then the
    /// pending token.
    pub fn history(&self) -> Vec<i32> {
        let mut history: Vec<i32> = self.cached.iter().map(|t| t.0).collect();
        history.extend(self.pending().map(|t| t.0));
        history
    }
}

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
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
    /// The request's constraint failed (an internal error: it ends with it).
    Failed,
}

/// A token a step produced, where it came from, and the distribution it was
/// chosen from (when the request wants probabilities).
pub type StepToken = (LlamaToken, TokenSource, Option<Dist>);

/// A request's prompt as it will be evaluated.
pub struct PromptTokens {
    /// After truncation to the context.
    pub tokens: Vec<LlamaToken>,
    /// Its length as given.
    pub n_given: usize,
    /// Tokens kept on a context shift.
    pub n_keep: usize,
    pub truncated: bool,
    /// Its images and audio: where each stands in `tokens`.
    pub media: Vec<crate::media::MediaSpan>,
}

/// The settings a kept controller learnt with: `n_max`, `adaptive`, greedy.
pub type ControllerKey = (usize, bool, bool);

/// What a finished request leaves behind for the next one: the controller
/// of a drafter whose table entry keeps it (the draft model's), under its
/// name and the key of the settings it learnt with.
pub type KeptController = ((&'static str, ControllerKey), DraftController);

pub struct Request<'m> {
    id: u64,
    req: CompletionRequest,
    /// The request field whose constraint this is (`tools`, `json_schema`,
    /// `response_format`), to name it when the constraint fails.
    constraint_field: Option<&'static str>,
    /// A session save: where the evaluated prompt's cells go.
    save: Option<(PathBuf, Value)>,
    sink: Box<dyn EventSink>,
    cancel: Arc<AtomicBool>,
    sampler: TokenSampler,
    chain: DrafterChain<'m>,
    text: TextStream,
    /// A chat answer's reasoning and tool calls, read out of its text.
    output: Option<Reader>,
    /// `flush` ran (the text stream and the reader are finished).
    flushed: bool,
    /// Special tokens whose text is kept (the markers `output` reads).
    markers: Vec<i32>,
    phase: Phase,
    prompt: PromptTokens,
    /// Prompt tokens found in the slot's cache.
    tokens_cached: usize,
    n_gen: usize,
    passes: usize,
    probs_out: Vec<Value>,
    started: Instant,
    prompt_ms: f64,
    /// When generation began (the prompt was done).
    generating_since: Option<Instant>,
    /// Its scale of every loaded LoRA adapter, and their tag.
    lora: Vec<f32>,
    lora_tag: u64,
    /// Ms its media took to encode (preparing) and to decode into its cells.
    media_encode_ms: f64,
    media_decode_ms: f64,
    /// Where its tokens sit (`media::Positions`).
    positions: crate::media::Positions,
    /// The first progress event was sent (`return_progress`).
    progress_begun: bool,
}

impl<'m> Request<'m> {
    /// A request starting in a slot whose cache holds the first
    /// `tokens_cached` tokens of its prompt.
    pub fn new(job: Job, mut sampler: TokenSampler, mut chain: DrafterChain<'m>, prompt: PromptTokens, tokens_cached: usize) -> Self {
        sampler.accept_prompt(&prompt.tokens);
        let ids: Vec<i32> = prompt.tokens.iter().map(|t| t.0).collect();
        chain.begin(&ids);
        let id_seed = job.id ^ sampler.seed().rotate_left(17) ^ noise::from_os().random::<u64>();
        let plan = &job.plan;
        let output = match (&plan.reader, &plan.output) {
            (Some(parser), _) => Some(Reader::Whole(ReparseReader::new(parser.clone(), id_seed))),
            (None, Some(f)) => Some(Reader::Ours(Box::new(OutputParser::new(f.clone(), id_seed)))),
            (None, None) => None,
        };
        let markers = job.plan.marker_tokens.clone();
        let constraint_field = job.plan.grammar.as_ref().map(|(_, field)| *field);
        let save = match job.session {
            Some(SessionJob::Save { path, conversation }) => Some((path, conversation)),
            _ => None,
        };
        Request {
            id: job.id,
            save,
            text: TextStream::new(job.request.stop.clone()),
            output,
            flushed: false,
            markers,
            constraint_field,
            req: job.request,
            sink: job.sink,
            cancel: job.cancel,
            sampler,
            chain,
            phase: Phase::Prefill,
            tokens_cached,
            n_gen: 0,
            passes: 0,
            probs_out: Vec::new(),
            started: Instant::now(),
            prompt_ms: 0.0,
            generating_since: None,
            lora: Vec::new(),
            lora_tag: 0,
            media_encode_ms: job.encode_ms,
            media_decode_ms: 0.0,
            positions: crate::media::positions_of(&prompt.media),
            prompt,
            progress_begun: false,
        }
    }

    /// Its media decode took `ms` more.
    pub fn add_media_decode_ms(&mut self, ms: f64) {
        self.media_decode_ms += ms;
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its LoRA scales (one per loaded adapter).
    pub fn set_lora(&mut self, scales: Vec<f32>) {
        self.lora_tag = llama_engine_core::request::lora_tag(&scales);
        self.lora = scales;
    }

    pub fn lora(&self) -> &[f32] {
        &self.lora
    }

    pub fn lora_tag(&self) -> u64 {
        self.lora_tag
    }

    /// Tokens generated so far.
    pub fn predicted(&self) -> usize {
        self.n_gen
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn prompt(&self) -> &[LlamaToken] {
        &self.prompt.tokens
    }

    pub fn n_keep(&self) -> usize {
        self.prompt.n_keep
    }

    /// Whether its prompt holds images or audio (its context is then never
    /// shifted: a shift could cut through one).
    pub fn has_media(&self) -> bool {
        !self.prompt.media.is_empty()
    }

    /// The media chunk of its prompt that starts at token `at`, if one does.
    pub fn media_at(&self, at: usize) -> Option<&crate::media::MediaSpan> {
        self.prompt.media.iter().find(|s| s.start == at)
    }

    /// The position of its token `i` (its index, but after an M-RoPE image).
    pub fn pos(&self, i: usize) -> usize {
        self.positions.pos(i)
    }

    pub fn positions(&self) -> &crate::media::Positions {
        &self.positions
    }

    /// Where the next media chunk at or after token `at` starts.
    pub fn next_media(&self, at: usize) -> Option<usize> {
        self.prompt.media.iter().map(|s| s.start).filter(|&s| s >= at).min()
    }

    /// Aborted (by `abort`, `cancel()` or `dispose()`). A session save is
    /// not a generation to stop: it finishes, unless the engine is closing.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) && self.save.is_none()
    }

    /// With `return_progress`: how far its prompt is evaluated, `processed`
    /// tokens (the cached ones included) in its cells. The first report
    /// (before any chunk is decoded) is sent once, whatever `processed`.
    pub fn report_progress(&mut self, processed: usize, first: bool) {
        if !self.req.return_progress || (first && self.progress_begun) {
            return;
        }
        self.progress_begun = true;
        let progress = PromptProgress { total: self.prompt.tokens.len(), cache: self.tokens_cached, processed, time_ms: ms(self.started) };
        if !self.sink.progress(&progress) {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// The prompt tokens found ready (in its slot, another slot or the
    /// prompt cache) once it is placed.
    pub fn set_reused(&mut self, n: usize) {
        self.tokens_cached = n;
    }

    /// Where a session save writes, and the conversation it records.
    pub fn save_target(&self) -> Option<&(PathBuf, Value)> {
        self.save.as_ref()
    }

    /// Ends a session job with `outcome` instead of a completion result.
    pub fn reply(self, outcome: std::result::Result<Value, EngineError>) {
        self.sink.reply(outcome);
    }

    /// Where a session job's answer goes, for a thread that finishes it.
    pub fn into_sink(self) -> Box<dyn EventSink> {
        self.sink
    }

    /// With `n_predict = -1` generation ends when the context is full; with
    /// a budget the context is shifted and generation goes on.
    /// Whether a full context shifts (`context_shift`).
    pub fn shifts_context(&self) -> bool {
        self.req.context_shift
    }

    pub fn ends_at_full_context(&self) -> bool {
        self.req.n_predict < 0
    }

    /// The context was shifted under this request.
    pub fn mark_truncated(&mut self) {
        self.prompt.truncated = true;
    }

    /// Tokens still allowed by `n_predict` (unbounded with -1).
    fn budget(&self) -> usize {
        if self.req.n_predict < 0 {
            usize::MAX
        } else {
            (self.req.n_predict as usize).saturating_sub(self.n_gen)
        }
    }

    fn wants_dist(&self) -> bool {
        self.req.n_probs > 0
    }

    /// Whether `token` ends generation (end of generation unless ignored,
    /// or a grammar that allows nothing more).
    fn ends(&self, model: &LlamaModel, token: LlamaToken) -> bool {
        token == DEAD_END || (model.vocab().is_eog(token) && !self.req.ignore_eos)
    }

    // ------------------------------------------------------------ drafting

    /// The most tokens this request may draft in a step, with `free_cells`
    /// cells left in its cache and `batch_room` rows left in the batch.
    pub fn draft_room(&self, free_cells: usize, batch_room: usize) -> usize {
        if self.chain.is_empty() || !matches!(self.phase, Phase::Generate { .. }) {
            return 0;
        }
        // Cells kept after the pending token and the next one. With
        // n_predict = -1 one more is held back: plain decoding stops when
        // the cache reaches n_ctx - 2, and a step that filled the room would
        // end one token later than it.
        let reserve = if self.req.n_predict < 0 { 3 } else { 2 };
        self.req.speculative.n_max.min(free_cells.saturating_sub(reserve)).min(batch_room).min(self.budget().saturating_sub(1))
    }

    /// A draft to verify this step, at most `available` tokens, priced by `prices`.
    pub fn propose(&mut self, history: &[i32], available: usize, prices: &DraftPrices) -> Option<Draft> {
        self.chain.propose(history, self.n_gen, available, prices)
    }

    /// The step's joint trim kept the first `n` tokens of this step's draft.
    pub fn trim_draft(&mut self, n: usize) {
        self.chain.trim(n);
    }

    // ------------------------------------------------------------ after a decode

    /// The prompt's last chunk was decoded; its last row (`row`) gives the
    /// first token. Returns it, or why the request ends before it.
    pub fn first_token(&mut self, ctx: &LlamaContext, row: usize) -> Result<StepToken, Stop> {
        self.prompt_ms = ms(self.started);
        self.generating_since = Some(Instant::now());
        // Aborted while its prompt was evaluated, or asked for no tokens: it
        // ends before its first token.
        if self.cancelled() {
            return Err(Stop::Abort);
        }
        if self.budget() == 0 {
            return Err(Stop::Limit);
        }
        let (token, dist) = self.sampler.sample(ctx, row as i32, self.wants_dist(), 0);
        self.sampler.accept(token);
        Ok((token, TokenSource::TARGET, dist))
    }

    /// Verifies a generating request's step (`core::speculation::verify`):
    /// at each row from `first_row` the target chooses the token plain
    /// decoding would choose at that position — its sampler chain sees only
    /// what was accepted before it (penalties, grammar) — and a draft is
    /// accepted while it is that choice. `alone_ms` is the step's wall time
    /// when this request decoded alone. Returns the number of drafts
    /// accepted and the tokens the step produced.
    pub fn verify(
        &mut self,
        model: &LlamaModel,
        ctx: &LlamaContext,
        first_row: usize,
        draft: Option<&Draft>,
        alone_ms: Option<f64>,
    ) -> (usize, Vec<StepToken>) {
        self.passes += 1;
        let want = self.wants_dist();
        let (position, budget) = (self.n_gen, self.budget());
        let ignore_eos = self.req.ignore_eos;
        let ends = |t: i32| t == DEAD_END.0 || (!ignore_eos && model.vocab().is_eog(LlamaToken(t)));
        let drafted: &[i32] = draft.map_or(&[], |d| &d.tokens);
        let sampler = &mut self.sampler;
        let (n_ok, tokens) = verify_draft(drafted, budget, ends, |i| {
            let (token, dist) = sampler.sample(ctx, (first_row + i) as i32, want, position + i);
            sampler.accept(token);
            (token.0, dist)
        });
        if draft.is_some() {
            self.chain.judged(n_ok);
        }
        let source = draft.map_or(TokenSource::TARGET, |d| d.source);
        let tokens: Vec<StepToken> = tokens
            .into_iter()
            .map(|(t, from_draft, dist)| (LlamaToken(t), if from_draft { source } else { TokenSource::TARGET }, dist))
            .collect();
        if let Some(ms) = alone_ms {
            self.chain.observe_step(tokens.len(), ms);
        }
        (n_ok, tokens)
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
        let mut delta = Delta::default();
        let mut stop = None;
        if self.sampler.failure().is_some() {
            return Some(Stop::Failed);
        }
        for (token, source, dist) in tokens {
            if self.ends(model, token) {
                stop = Some(Stop::Eos);
                break;
            }
            self.n_gen += 1;
            self.phase = Phase::Generate { pending: token };
            let piece = vocab.token_to_piece(token, self.markers.contains(&token.0), None);
            let pushed = self.text.push(&piece);
            self.read(&pushed.text, &mut delta);
            let mut t = TokenOut { id: token.0, piece: String::from_utf8_lossy(&piece).into_owned(), source, prob: None, probs: None };
            if let (true, Some(d)) = (self.wants_dist(), dist.as_ref()) {
                let probs = top_probs(model, d, self.req.n_probs);
                self.probs_out.push(legacy_probs(&t.piece, &probs));
                t.prob = Some(d.prob_of(token.0));
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
        if stop.is_none() && self.ends_at_full_context() && cached_after + 2 >= n_ctx {
            stop = Some(Stop::Limit);
        }
        if stop.is_some() {
            self.flush(&mut delta);
        }
        if (!out.is_empty() || !delta.is_empty())
            && !self.sink.token(&TokenEvent {
                content: delta.content,
                reasoning: delta.reasoning,
                tool_calls: delta.tool_calls,
                tokens: out,
                n_drafted: drafted,
                n_accepted: accepted,
            })
        {
            return Some(Stop::Abort);
        }
        stop
    }

    /// Text made safe to show goes to the chat answer's reader, if any.
    fn read(&mut self, text: &str, delta: &mut Delta) {
        match self.output.as_mut() {
            Some(p) => {
                let d = p.push(text);
                delta.content.push_str(&d.content);
                delta.reasoning.push_str(&d.reasoning);
                delta.tool_calls.extend(d.tool_calls);
            }
            None => delta.content.push_str(text),
        }
    }

    /// The end: what the text stream and the reader held back. Once: a
    /// request stopped by its limit reaches it from the step and again from
    /// `finish`.
    fn flush(&mut self, delta: &mut Delta) {
        if std::mem::replace(&mut self.flushed, true) {
            return;
        }
        let rest = self.text.finish();
        self.read(&rest, delta);
        if let Some(p) = self.output.as_mut() {
            let d = p.finish();
            delta.content.push_str(&d.content);
            delta.reasoning.push_str(&d.reasoning);
            delta.tool_calls.extend(d.tool_calls);
        }
    }

    // ------------------------------------------------------------ the end

    /// Ends the request: anything still held back (a partial stop prefix,
    /// an incomplete character) is released when generation ended for a
    /// reason that does not flush it, the result goes to the sink after the
    /// last event. Returns the draft model's controller, to keep for the
    /// next request with the same settings.
    pub fn finish(mut self: Box<Self>, stop: Stop, info: &ModelInfo, batch_invariant: bool) -> Vec<KeptController> {
        if matches!(stop, Stop::Abort | Stop::Failed) || (stop == Stop::Limit && (self.text.held_bytes() > 0 || self.output.is_some())) {
            let mut delta = Delta::default();
            self.flush(&mut delta);
            if !delta.is_empty() {
                self.sink.token(&TokenEvent {
                    content: delta.content,
                    reasoning: delta.reasoning,
                    tool_calls: delta.tool_calls,
                    tokens: vec![],
                    n_drafted: 0,
                    n_accepted: 0,
                });
            }
        }
        self.chain.end();
        if stop == Stop::Failed {
            let why = self.sampler.failure().unwrap_or("the constraint failed").to_string();
            let e = match self.constraint_field {
                Some(field) if is_limit(&why) => {
                    EngineError::invalid(field, format!("this constraint needs more work per token than the engine allows ({why})"))
                }
                _ => EngineError::internal(why),
            };
            self.sink.finish(Err(e));
            return Vec::new();
        }
        let result = self.result(stop, info, batch_invariant);
        let spec = &self.req.speculative;
        let key = (spec.n_max, spec.adaptive, self.sampler.is_greedy());
        let kept = DRAFTERS
            .iter()
            .filter(|e| e.keeps_controller)
            .filter_map(|e| self.chain.take_controller(e.name).map(|ctl| ((e.name, key), ctl)))
            .collect();
        self.sink.finish(Ok(result));
        kept
    }

    /// Ends the request with an error.
    pub fn fail(mut self: Box<Self>, e: &EngineError) {
        self.chain.end();
        self.sink.finish(Err(e.clone()));
    }

    fn result(&mut self, stop: Stop, info: &ModelInfo, batch_invariant: bool) -> CompletionResult {
        let (model_name, n_ctx) = (info.name.as_str(), info.n_ctx);
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
        let (content, reasoning, calls) = match &self.output {
            Some(p) => (p.content().to_string(), p.reasoning().to_string(), p.calls().to_vec()),
            None => (self.text.content().to_string(), String::new(), Vec::new()),
        };
        let stopped_tool_calls = !calls.is_empty() && matches!(stop, Stop::Eos | Stop::Word);
        let prompt_ms = if self.generating_since.is_some() { self.prompt_ms } else { ms(self.started) };
        CompletionResult {
            content,
            stop: true,
            model: model_name.to_string(),
            tokens_predicted: self.n_gen,
            tokens_evaluated: self.prompt.n_given,
            tokens_cached: self.tokens_cached,
            truncated: self.prompt.truncated,
            stopped_eos: stop == Stop::Eos,
            stopped_word: stop == Stop::Word,
            stopped_limit: stop == Stop::Limit,
            stopped_abort: stop == Stop::Abort,
            stopping_word: self.text.stopped().unwrap_or_default().to_string(),
            generation_settings: self.req.generation_settings(n_ctx, model_name, &info.eog),
            timings: Timings::new(self.prompt.tokens.len().saturating_sub(self.tokens_cached), prompt_ms, self.n_gen, predicted_ms)
                .with_media(self.prompt.media.len(), self.media_encode_ms, self.media_decode_ms),
            speculative: stats,
            completion_probabilities: self.wants_dist().then(|| std::mem::take(&mut self.probs_out)),
            tool_calls: (!calls.is_empty()).then(|| {
                calls
                    .into_iter()
                    .map(|c| ResultToolCall {
                        id: c.id,
                        r#type: "function",
                        function: ResultFunction { name: c.name, arguments: c.arguments },
                    })
                    .collect()
            }),
            reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            stopped_tool_calls,
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

/// How a chat answer is read as it streams: by our parser of the families
/// we know, or by reading the whole answer again (llama.cpp's parsers).
enum Reader {
    Ours(Box<OutputParser>),
    Whole(ReparseReader),
}

impl Reader {
    fn push(&mut self, text: &str) -> Delta {
        match self {
            Reader::Ours(p) => p.push(text),
            Reader::Whole(r) => r.push(text),
        }
    }

    fn finish(&mut self) -> Delta {
        match self {
            Reader::Ours(p) => p.finish(),
            Reader::Whole(r) => r.finish(),
        }
    }

    fn content(&self) -> &str {
        match self {
            Reader::Ours(p) => p.content(),
            Reader::Whole(r) => r.content(),
        }
    }

    fn reasoning(&self) -> &str {
        match self {
            Reader::Ours(p) => p.reasoning(),
            Reader::Whole(r) => r.reasoning(),
        }
    }

    fn calls(&self) -> &[ToolCall] {
        match self {
            Reader::Ours(p) => p.calls(),
            Reader::Whole(r) => r.calls(),
        }
    }
}
