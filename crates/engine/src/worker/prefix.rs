//! Where a new prompt's cells come from: its slot's own cache, another
//! slot's (copied), the host-memory prompt cache (restored), or a prefix
//! another slot is evaluating right now (waited for, then copied) — so a
//! prefix shared by many requests is computed once. What a slot held before
//! it is overwritten goes to the prompt cache.
//!
//! Every reuse is exact: slots keep cell i at position i (or where M-RoPE
//! media put it; a context shift ends that for the shifted part, which is
//! never reused), copies keep the cell layout, restores fill an emptied
//! stream from cell 0 at the positions the state was saved with, and the batch
//! invariance the engine checks at load makes a cell the same whichever
//! batch computed it.

use llama_cpp_2::token::LlamaToken;

use super::Worker;
use crate::kv;
use crate::media::Positions;
use crate::slot::Wait;
use llama_engine_core::request::prompt::common_prefix;

/// Tokens a copy or a restore must save over what the slot itself holds:
/// below this, evaluating them costs about what copying costs.
const MIN_GAIN: usize = 16;

/// Where a prompt starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Own,
    Slot(usize),
    Cache(usize),
}

/// How a placed prompt starts.
pub enum Start {
    /// Its slot holds its first `n` tokens.
    Ready(usize),
    /// It waits for another slot to evaluate a prefix it shares.
    Wait(Wait),
}

fn ids(tokens: &[LlamaToken]) -> Vec<i32> {
    tokens.iter().map(|t| t.0).collect()
}

impl Worker<'_> {
    /// Picks a free slot for `tokens` and what it starts from. `reuse`
    /// false (a request with `cache_prompt: false`) evaluates all of it.
    /// The slot: the free one whose own cache shares the most with the
    /// prompt (a chat's next turn lands where its last turn was) unless
    /// that would throw most of its cache away while an empty slot is free;
    /// with nothing shared, an empty slot, else the least recently used.
    /// `tag`: the request's LoRA adapters (cells computed with others are
    /// not reused).
    pub(super) fn place(
        &mut self,
        tokens: &[LlamaToken],
        positions: &Positions,
        reuse: bool,
        tag: u64,
        prefer: Option<usize>,
    ) -> Option<(usize, Start)> {
        let prompt = ids(tokens);
        let free: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].is_free()).collect();
        let own = |w: &Self, i: usize| if reuse { w.reuse(i, &prompt, tag) } else { 0 };
        let empty = free.iter().copied().find(|&i| self.slots[i].cached.is_empty());
        let best_own = free.iter().copied().max_by_key(|&i| (own(self, i), std::cmp::Reverse(i)))?;
        let target = match (own(self, best_own), empty) {
            // The slot asked for (a request's `id_slot`), when it is free.
            _ if prefer.is_some_and(|s| free.contains(&s)) => prefer.unwrap_or(best_own),
            (n, Some(e)) if n * 2 < self.slots[best_own].cached.len() => e,
            (0, None) => free.iter().copied().min_by_key(|&i| self.slots[i].used)?,
            (0, Some(e)) => e,
            _ => best_own,
        };
        self.clock += 1;
        self.slots[target].used = self.clock;
        if reuse {
            if let Some(wait) = self.worth_waiting(target, &prompt, tag) {
                return Some((target, Start::Wait(wait)));
            }
        }
        Some((target, Start::Ready(self.fill(target, &prompt, positions, reuse, tag))))
    }

    /// What slot `s`'s cells give `prompt` with the adapters of `tag`.
    fn reuse(&self, s: usize, prompt: &[i32], tag: u64) -> usize {
        if self.slots[s].lora_tag == tag {
            self.slots[s].reuse_for(prompt)
        } else {
            0
        }
    }

    /// A prefix of `prompt` that a slot is evaluating now, longer by
    /// `MIN_GAIN` than anything ready: worth waiting for.
    fn worth_waiting(&self, target: usize, prompt: &[i32], tag: u64) -> Option<Wait> {
        let (ready, _) = self.best_source(target, prompt, tag);
        let cap = prompt.len().saturating_sub(1);
        (0..self.slots.len())
            .filter(|&s| s != target && self.slots[s].is_prefilling())
            .filter_map(|s| {
                let r = self.slots[s].request.as_ref().filter(|r| r.lora_tag() == tag)?;
                let n = common_prefix(&ids(r.prompt()), prompt).min(cap);
                (n >= ready + MIN_GAIN).then_some(Wait { donor: s, donor_id: r.id(), n })
            })
            .max_by_key(|w| w.n)
    }

    /// The longest reusable prefix for slot `target`: its own, another
    /// slot's or a prompt-cache entry's (these only when they save
    /// `MIN_GAIN` tokens over its own).
    fn best_source(&self, target: usize, prompt: &[i32], tag: u64) -> (usize, Source) {
        let own = self.reuse(target, prompt, tag);
        let mut best = (own, Source::Own);
        for s in 0..self.slots.len() {
            let n = self.reuse(s, prompt, tag);
            if s != target && n > best.0 {
                best = (n, Source::Slot(s));
            }
        }
        if let Some((e, n)) = self.prompt_cache.best(prompt, tag) {
            if n > best.0 {
                best = (n, Source::Cache(e));
            }
        }
        if best.1 != Source::Own && best.0 < own + MIN_GAIN {
            best = (own, Source::Own);
        }
        best
    }

    /// Fills slot `target` with the longest reusable prefix of `prompt`
    /// (none without `reuse`), keeping what it held in the prompt cache
    /// first; returns the tokens it holds. `positions`: where the prompt's
    /// tokens sit (cells are cut by position).
    pub(super) fn fill(&mut self, target: usize, prompt: &[i32], positions: &Positions, reuse: bool, tag: u64) -> usize {
        let (n, source) = if reuse { self.best_source(target, prompt, tag) } else { (0, Source::Own) };
        self.keep_in_cache(target, if source == Source::Own { n } else { 0 });
        // Keeping the slot's state may have changed the prompt cache (the
        // entries it extends or nearly copies go, the least recently used
        // make room): an entry index found before is not one now. Decide
        // again on the cache as it is.
        let (n, source) = if matches!(source, Source::Cache(_)) { self.best_source(target, prompt, tag) } else { (n, source) };
        // From here its cells are this request's adapters' (those it keeps
        // were computed with them too, or it keeps none), at its positions
        // (those it keeps are a prefix of its tokens, placed as they are).
        self.slots[target].lora_tag = tag;
        self.slots[target].positions = positions.clone();
        let seq = self.slots[target].seq;
        let n_seq = self.slots.len() as i32;
        let done = match source {
            Source::Own => kv::keep(&mut self.ctx, seq, positions.pos(n)).map(|_| {
                self.slots[target].keep(n);
                n
            }),
            Source::Slot(s) => kv::copy(&mut self.ctx, self.slots[s].seq, seq, n_seq)
                .and_then(|_| kv::keep(&mut self.ctx, seq, positions.pos(n)))
                .map(|_| {
                    let held: Vec<LlamaToken> = self.slots[s].cached[..n].to_vec();
                    let window_from = self.slots[s].window_from();
                    self.slots[target].hold(&held, window_from);
                    self.slots[target].copy_pending = true;
                    n
                }),
            Source::Cache(e) => {
                let entry = self.prompt_cache.hit(e);
                let (len, held) = (entry.tokens.len(), entry.tokens[..n].iter().map(|&t| LlamaToken(t)).collect::<Vec<_>>());
                let window_from = if entry.windowed { len } else { 0 };
                match kv::restore(&mut self.ctx, seq, n_seq, &entry.cells, len, &entry.positions) {
                    Ok(()) => kv::keep(&mut self.ctx, seq, positions.pos(n)).map(|_| {
                        self.slots[target].hold(&held, window_from);
                        n
                    }),
                    Err(_) => {
                        self.prompt_cache.remove(e);
                        kv::clear(&mut self.ctx, seq).map(|_| 0)
                    }
                }
            }
        };
        match done {
            Ok(n) => {
                self.slots[target].keep(n);
                n
            }
            Err(_) => {
                let _ = kv::clear(&mut self.ctx, seq);
                self.slots[target].keep(0);
                0
            }
        }
    }

    /// Before slot `i`'s cells past `kept` are overwritten: keeps its state
    /// in the prompt cache, when the cache is on, the slot's cells are
    /// readable and exact (no pending copy, no context shift), the loss is
    /// worth it and no entry holds it already.
    fn keep_in_cache(&mut self, i: usize, kept: usize) {
        let slot = &self.slots[i];
        let n = slot.cached.len();
        if !self.prompt_cache.is_on() || slot.copy_pending || slot.reusable().len() != n || n < kept + MIN_GAIN {
            return;
        }
        let tokens = ids(&slot.cached);
        let tag = slot.lora_tag;
        if self.prompt_cache.holds(&tokens, tag) {
            return;
        }
        let positions = slot.positions.prefix(n);
        let Ok(cells) = kv::save(&self.ctx, slot.seq) else { return };
        if let Ok(layout) = cells.check(n, &positions) {
            let held = self.prompt_cache.stats().bytes + cells.len();
            self.prompt_cache.insert(tokens, cells, layout.windowed, tag, positions);
            // States it replaced or pushed out are megabytes each: give them back.
            crate::memory::release_after(held.saturating_sub(self.prompt_cache.stats().bytes));
        }
    }

    /// Requests waiting for a prefix another slot evaluates: those whose
    /// donor holds it now (or stopped evaluating it) take it.
    pub(super) fn resolve_waits(&mut self) {
        for i in 0..self.slots.len() {
            let Some(w) = self.slots[i].wait else { continue };
            let Some(r) = self.slots[i].request.as_ref() else {
                self.slots[i].wait = None;
                continue;
            };
            let prompt = ids(r.prompt());
            let positions = r.positions().clone();
            let tag = r.lora_tag();
            let donor = &self.slots[w.donor];
            let evaluating = donor.is_prefilling() && donor.request.as_ref().is_some_and(|d| d.id() == w.donor_id);
            if evaluating && donor.reusable().len() < w.n {
                continue;
            }
            self.slots[i].wait = None;
            let n = self.fill(i, &prompt, &positions, true, tag);
            if let Some(r) = self.slots[i].request.as_mut() {
                r.set_reused(n);
            }
        }
    }
}
