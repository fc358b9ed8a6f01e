//! One decoding step of every active request, in named phases:
//!
//! 1. `end_what_must_end` — aborted requests end, full contexts shift;
//! 2. `plan` — what each slot decodes: a generating request its pending
//!    token and maybe a draft, a prefilling one a chunk of its prompt;
//!    drafts are priced by what they add to this batch and trimmed together;
//! 3. `build` — one llama.cpp batch of every part, in sequence order;
//! 4. decode;
//! 5. `accept` — per slot: verify and keep what the target agrees with,
//!    trim the KV cache, stream the tokens, end the request if it is done.
//!
//! A request joins between two steps, and a long prompt is evaluated in
//! chunks beside the requests that are streaming.

use std::time::Instant;

use llama_cpp_2::token::LlamaToken;

use super::Worker;
use crate::slot::{ms, StepToken, Stop};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::request::prompt;
use llama_engine_core::speculation::cost::{ubatches, DraftPrices, Part, StepPrice};
use llama_engine_core::speculation::drafter::Draft;
use llama_engine_core::speculation::schedule::{prefill_chunk, trim, Trimmable};

/// One part of a step's batch: a slot's tokens and what they are for.
struct Planned {
    slot: usize,
    seq: i32,
    tokens: Vec<LlamaToken>,
    /// Prefill: whether this chunk ends the prompt (its last row's logits
    /// then give the first token).
    completes_prompt: bool,
    /// Generate: the draft after the pending token.
    draft: Option<Draft>,
    /// Index of the part's first row in the batch.
    first_row: usize,
}

impl Planned {
    fn part(&self) -> Part {
        Part { seq: self.seq, tokens: self.tokens.len() }
    }
}

fn parts(plan: &[Planned]) -> Vec<Part> {
    plan.iter().map(Planned::part).collect()
}

impl Worker<'_> {
    /// One decoding step of every active request. An error here leaves the
    /// caches in an unknown state: the caller recovers.
    pub fn step(&mut self) -> Result<()> {
        self.end_what_must_end()?;
        self.resolve_waits();
        self.decode_media()?;
        let mut plan = self.plan();
        if plan.is_empty() {
            return Ok(());
        }
        // Progress (`return_progress`): where each prompt starts, before its first chunk.
        for part in plan.iter().filter(|p| p.draft.is_none()) {
            let slot = &mut self.slots[part.slot];
            if slot.is_generating() {
                continue;
            }
            let processed = slot.cached.len();
            if let Some(r) = slot.request.as_mut() {
                r.report_progress(processed, true);
            }
        }
        self.build(&mut plan)?;
        self.apply_threads(self.batch.n_tokens() as usize);
        self.apply_loras()?;
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).map_err(|e| EngineError::internal(format!("llama_decode failed: {e}")))?;
        let step_ms = ms(t);
        self.decodes += 1;
        self.decoded_slots += plan.len() as u64;
        // The decode applied every pending copy between streams.
        for slot in &mut self.slots {
            slot.copy_pending = false;
        }
        if ubatches(&parts(&plan), self.slots.len(), self.n_batch).len() == 1 {
            let n = self.batch.n_tokens() as usize;
            self.costs.observe(n, step_ms);
            self.threads.observe(n, step_ms, self.reference.estimate(n));
        }
        // Wall time per token is only this request's own when it decoded alone.
        let alone = plan.len() == 1;
        for part in plan {
            self.accept(part, alone.then_some(step_ms))?;
        }
        Ok(())
    }

    /// Requests aborted since the last step end now; a generating request
    /// whose context is full shifts it (or ends, with n_predict = -1).
    fn end_what_must_end(&mut self) -> Result<()> {
        for i in 0..self.slots.len() {
            let slot = &self.slots[i];
            let Some(r) = slot.request.as_ref() else { continue };
            // (A session save ignores `cancel()`, not `dispose()`.)
            if r.cancelled() || (r.save_target().is_some() && self.shared.is_closed()) {
                self.finish(i, Stop::Abort);
                continue;
            }
            if slot.is_generating() && slot.cached.len() + 1 >= self.n_ctx {
                if !r.shifts_context() {
                    // As llama-server without context shift: the answer is cut.
                    if let Some(r) = self.slots[i].request.as_mut() {
                        r.mark_truncated();
                    }
                    self.finish(i, Stop::Limit);
                } else if r.ends_at_full_context() || r.has_media() {
                    self.finish(i, Stop::Limit);
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
        let keep = (r.n_keep() + 1).min(n_past.saturating_sub(1));
        let discard = prompt::shift_discard(n_past, r.n_keep()).min(n_past - keep);
        let err = |e: llama_cpp_2::context::kv_cache::KvCacheConversionError| EngineError::internal(format!("context shift: {e}"));
        self.ctx.kv_cache_seq_rm(slot.seq, Some(keep as u32), Some((keep + discard) as u32)).map_err(err)?;
        self.ctx.kv_cache_seq_add(slot.seq, Some((keep + discard) as u32), Some(n_past as u32), -(discard as i32)).map_err(err)?;
        slot.cached.drain(keep..keep + discard);
        r.mark_truncated();
        slot.mark_shifted(keep);
        Ok(())
    }

    /// Prompts whose next tokens are an image or audio: its embeddings go
    /// into the slot's cells now, in decodes of their own (a batch holds
    /// tokens or embeddings, not both), with the request's adapters.
    fn decode_media(&mut self) -> Result<()> {
        let Some(projector) = self.projector.clone() else { return Ok(()) };
        for i in 0..self.slots.len() {
            if !self.slots[i].is_prefilling() {
                continue;
            }
            let done = self.slots[i].cached.len();
            let Some(r) = self.slots[i].request.as_ref() else { continue };
            let Some(span) = r.media_at(done).cloned() else { continue };
            let n_past = r.pos(done);
            self.apply_threads(span.chunk.n_tokens.min(self.n_batch));
            self.apply_loras()?;
            let t = Instant::now();
            // SAFETY: raw_ctx is this worker's live target context.
            unsafe { projector.decode(self.raw_ctx, &span, n_past, self.slots[i].seq)? };
            let slot = &mut self.slots[i];
            slot.cached.extend(std::iter::repeat_n(span.chunk.token(), span.chunk.n_tokens));
            if let Some(r) = slot.request.as_mut() {
                r.add_media_decode_ms(ms(t));
            }
        }
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
        let generating: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].is_generating()).take(self.n_batch).collect();
        let mut prefilling: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].is_prefilling()).collect();
        prefilling.sort_by_key(|&i| self.slots[i].request.as_ref().map(|r| r.started()));
        let mut plan: Vec<Planned> = Vec::new();
        let mut used = generating.len();
        let mut first = true;
        for i in prefilling {
            let slot = &self.slots[i];
            let Some(r) = slot.request.as_ref() else { continue };
            let done = slot.cached.len();
            let left = r.prompt().len() - done;
            // Text up to the next image or audio (`decode_media` takes it).
            let text = r.next_media(done).map_or(left, |s| s - done);
            let chunk = prefill_chunk(text, used, !generating.is_empty(), self.n_batch.saturating_sub(used), &self.costs, first);
            if chunk == 0 {
                continue;
            }
            first = false;
            used += chunk;
            let tokens = r.prompt()[done..done + chunk].to_vec();
            plan.push(Planned { slot: i, seq: slot.seq, tokens, completes_prompt: chunk == left, draft: None, first_row: 0 });
        }
        let prefill = parts(&plan);
        let generating_seqs: Vec<i32> = generating.iter().map(|&g| self.slots[g].seq).collect();
        for &i in &generating {
            let mut draft = self.plan_draft(i, &plan, &prefill, &generating_seqs, used);
            // A drafter that learnt from a prompt with media could propose a
            // media chunk's id: the draft ends before it.
            if let Some(d) = draft.as_mut() {
                if let Some(k) = d.tokens.iter().position(|&t| t < 0) {
                    d.truncate(k);
                    if let Some(r) = self.slots[i].request.as_mut() {
                        r.trim_draft(k);
                    }
                }
            }
            let draft = draft.filter(|d| !d.is_empty());
            used += draft.as_ref().map_or(0, Draft::len);
            let slot = &self.slots[i];
            let Some(pending) = slot.pending() else { continue };
            let mut tokens = vec![pending];
            tokens.extend(draft.iter().flat_map(|d| d.tokens.iter().map(|&t| LlamaToken(t))));
            plan.push(Planned { slot: i, seq: slot.seq, tokens, completes_prompt: false, draft, first_row: 0 });
        }
        plan.sort_by_key(|p| p.seq);
        if generating.len() > 1 {
            self.trim_drafts(&mut plan);
        }
        plan
    }

    /// The draft generating request `i` verifies this step, if one pays.
    fn plan_draft(&mut self, i: usize, plan: &[Planned], prefill: &[Part], generating: &[i32], used: usize) -> Option<Draft> {
        let (n_ctx, n_batch, n_stream) = (self.n_ctx, self.n_batch, self.slots.len());
        let slot = &self.slots[i];
        let available = slot.request.as_ref()?.draft_room(n_ctx.saturating_sub(slot.cached.len()), n_batch.saturating_sub(used));
        if available == 0 {
            return None;
        }
        // Every other part of the step as planned so far (requests not yet
        // planned decode their pending token at least). Another request's
        // draft that the joint trim may still cut counts as its pending
        // token only: a draft model spends real time before the trim, so
        // its draft must pay against the step without them (a lookup
        // priced optimistically must not make it look cheap).
        let seq = slot.seq;
        let mut others: Vec<Part> = plan
            .iter()
            .map(|p| match &p.draft {
                Some(d) if !d.fixed => Part { seq: p.seq, tokens: 1 },
                _ => p.part(),
            })
            .collect();
        let unplanned: Vec<Part> =
            generating.iter().filter(|&&g| g != seq && !others.iter().any(|p| p.seq == g)).map(|&g| Part { seq: g, tokens: 1 }).collect();
        others.extend(unplanned);
        let prices = DraftPrices {
            lookup: StepPrice::shared(prefill, generating, available, n_stream, n_batch, &self.costs),
            made: StepPrice::in_step(&others, generating.len(), seq, available, n_stream, n_batch, &self.costs),
        };
        let history = slot.history();
        self.slots[i].request.as_mut()?.propose(&history, available, &prices)
    }

    /// Drafts were planned one request at a time; together they may split
    /// the batch into more micro-batches than any of them was priced for.
    /// Cuts them to the lengths that give the step the most expected tokens
    /// per ms (`core::speculation::schedule::trim`); fixed lengths and
    /// probes stay.
    fn trim_drafts(&mut self, plan: &mut [Planned]) {
        let mut fixed: Vec<Part> = Vec::new();
        let mut fixed_tokens = 0.0;
        let mut cuttable: Vec<usize> = Vec::new();
        for (j, p) in plan.iter().enumerate() {
            match &p.draft {
                Some(d) if !d.fixed && d.expected.len() == d.len() + 1 => cuttable.push(j),
                Some(d) => {
                    fixed.push(p.part());
                    fixed_tokens += d.expected.get(d.len()).copied().unwrap_or(1.0);
                }
                None => {
                    fixed.push(p.part());
                    if self.slots[p.slot].is_generating() {
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
                .filter_map(|&j| plan[j].draft.as_ref().map(|d| Trimmable { seq: plan[j].seq, expected: &d.expected }))
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
                r.trim_draft(k);
            }
        }
    }

    /// The batch: every part's tokens in sequence order, at the positions
    /// after what its slot holds; logits for every generating row and for
    /// the last row of a prompt.
    fn build(&mut self, plan: &mut [Planned]) -> Result<()> {
        self.batch.clear();
        let mut row = 0;
        for part in plan.iter_mut() {
            let slot = &self.slots[part.slot];
            let generating = slot.is_generating();
            part.first_row = row;
            let base = slot.cached.len();
            let positions = slot.request.as_ref().map(|r| r.positions());
            for (j, &t) in part.tokens.iter().enumerate() {
                let logits = generating || (part.completes_prompt && j + 1 == part.tokens.len());
                let pos = positions.map_or(base + j, |p| p.pos(base + j));
                self.batch.add(t, pos as i32, &[slot.seq], logits).map_err(|e| EngineError::internal(format!("batch: {e}")))?;
                row += 1;
            }
        }
        Ok(())
    }

    /// After the decode: verifies and accepts one part's tokens, streams
    /// them, and ends the request if it is done.
    fn accept(&mut self, part: Planned, alone_ms: Option<f64>) -> Result<()> {
        let i = part.slot;
        let model = &self.models.target;
        let slot = &mut self.slots[i];
        let generating = slot.is_generating();
        let Some(r) = slot.request.as_mut() else { return Ok(()) };
        slot.cached.extend_from_slice(&part.tokens);
        let tokens: Vec<StepToken>;
        let (mut drafted, mut accepted) = (0, 0);
        if !generating {
            r.report_progress(slot.cached.len(), false);
            if !part.completes_prompt {
                return Ok(());
            }
            match r.first_token(&self.ctx, part.first_row + part.tokens.len() - 1) {
                Ok(token) => tokens = vec![token],
                Err(stop) => {
                    self.finish(i, stop);
                    return Ok(());
                }
            }
        } else {
            let base = slot.cached.len() - part.tokens.len() + 1; // cache length after the pending token
            let (n_ok, verified) = r.verify(model, &self.ctx, part.first_row, part.draft.as_ref(), alone_ms);
            tokens = verified;
            if let Some(d) = &part.draft {
                drafted = d.len();
                accepted = n_ok;
            }
            // Keep the pending token and the accepted drafts.
            if base + n_ok < slot.cached.len() {
                self.ctx
                    .kv_cache_seq_rm(slot.seq, Some(r.pos(base + n_ok) as u32), None)
                    .map_err(|e| EngineError::internal(format!("kv cache: {e}")))?;
                slot.cached.truncate(base + n_ok); // past any shift point: the pending token's cell stays
            }
        }
        let cached_after = slot.cached.len();
        if let Some(stop) = r.emit(model, tokens, drafted, accepted, self.n_ctx, cached_after) {
            self.finish(i, stop);
        }
        Ok(())
    }
}
