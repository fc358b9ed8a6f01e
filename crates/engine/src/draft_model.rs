//! The draft model: one context shared by every slot, sequence s holding
//! slot s's history (`DraftContext`), and per request a `ModelDrafter` that
//! drafts for its slot's sequence. Each sequence's KV cache follows the
//! target's accepted tokens lazily: before drafting it is cut back to the
//! longest prefix it shares with the history, and only the missing tokens
//! are evaluated (in one batch).

use llama_engine_core::sampling::math::exp_f32;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::sampler::argmax;
use llama_engine_core::request::prompt::common_prefix;
use llama_engine_core::sampling::noise::PositionNoise;
use llama_engine_core::sampling::Dist;
use llama_engine_core::speculation::controller::confidence_class;
use llama_engine_core::speculation::draft_model::ENTRY as DRAFT;
use llama_engine_core::speculation::drafter::{Draft, Drafter, SpareBranches};
use llama_engine_core::text::events::TokenSource;

/// Candidates kept from the draft's distribution when sampling (a draft is a
/// proposal: how it was chosen does not change what the target outputs).
const DRAFT_TOP_K: usize = 40;

/// Most branches of a draft tree (`speculative.n_parallel`).
pub const MAX_BRANCHES: usize = 8;

/// A draft model catching up with at most this many tokens is drafting as
/// usual (the pending token, the accepted drafts); more is a one-time setup.
const SMALL_CATCH_UP: usize = 4;

/// What the draft model evaluates before a draft while drafting step after
/// step: the target's pending token, after the last draft token when the
/// whole draft was accepted.
const USUAL_CATCH_UP: usize = 2;

/// The draft model's context and what its sequences hold.
pub struct DraftContext<'m> {
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    /// Per slot: tokens in its sequence, positions 0..len.
    cached: Vec<Vec<LlamaToken>>,
    n_batch: usize,
    /// Measured cost of drafting one token (ms), and per token of a long
    /// catch-up (evaluating a prompt in batches).
    pub step_ms: Option<f64>,
    pub prefill_ms: Option<f64>,
}

impl<'m> DraftContext<'m> {
    /// `slots` sequences for the slots, then `MAX_BRANCHES` scratch
    /// sequences for tree branches.
    pub fn new(ctx: LlamaContext<'m>, slots: usize, n_batch: usize) -> Self {
        DraftContext { ctx, batch: LlamaBatch::new(n_batch, 1), cached: vec![Vec::new(); slots], n_batch, step_ms: None, prefill_ms: None }
    }

    /// Sequences the context needs for `slots` slots.
    pub fn sequences(slots: usize) -> u32 {
        (slots + MAX_BRANCHES) as u32
    }

    fn scratch(&self, branch: usize) -> i32 {
        (self.cached.len() + branch) as i32
    }

    pub fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        for c in &mut self.cached {
            c.clear();
        }
    }

    fn reset_seq(&mut self, seq: usize) {
        let _ = self.ctx.kv_cache_seq_rm(seq as i32, None, None);
        self.cached[seq].clear();
    }

    /// Tokens of `history` sequence `seq` lacks: what drafting now would
    /// first have to evaluate (at least the last token, for its logits).
    pub fn behind(&self, seq: usize, history: &[i32]) -> usize {
        let shared = self.cached[seq].iter().zip(history).take_while(|(a, b)| a.0 == **b).count();
        (history.len() - shared).max(1)
    }

    /// Measures, once at load, a draft step and a long catch-up per token,
    /// in sequence 0 (left empty).
    pub fn calibrate(&mut self, token: LlamaToken) {
        let step = |dc: &mut Self| -> Option<f64> {
            dc.batch.clear();
            dc.batch.add(token, 0, &[0], true).ok()?;
            let t = Instant::now();
            dc.ctx.decode(&mut dc.batch).ok()?;
            let ms = ms(t);
            let _ = dc.ctx.kv_cache_seq_rm(0, None, None);
            Some(ms)
        };
        let batch = |dc: &mut Self, n: usize| -> Option<f64> {
            let n = n.min(dc.n_batch).max(1);
            dc.batch.clear();
            for i in 0..n {
                dc.batch.add(token, i as i32, &[0], i + 1 == n).ok()?;
            }
            let t = Instant::now();
            dc.ctx.decode(&mut dc.batch).ok()?;
            let ms = ms(t);
            let _ = dc.ctx.kv_cache_seq_rm(0, None, None);
            Some(ms / n as f64)
        };
        self.step_ms = (0..3).filter_map(|_| step(self)).reduce(f64::min);
        let _ = batch(self, 32); // warm-up
        self.prefill_ms = batch(self, 32);
        self.reset();
    }

    /// Decodes `tokens` into sequence `seq` after what it holds, logits for
    /// the last one only.
    fn decode(&mut self, seq: usize, tokens: &[LlamaToken]) -> bool {
        for (ci, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let last_chunk = (ci + 1) * self.n_batch >= tokens.len();
            self.batch.clear();
            let base = self.cached[seq].len();
            for (i, &t) in chunk.iter().enumerate() {
                if self.batch.add(t, (base + i) as i32, &[seq as i32], last_chunk && i + 1 == chunk.len()).is_err() {
                    return false;
                }
            }
            if self.ctx.decode(&mut self.batch).is_err() {
                self.reset_seq(seq);
                return false;
            }
            self.cached[seq].extend_from_slice(chunk);
        }
        true
    }

    /// Brings sequence `seq` to `history`, with logits for its last token.
    /// Returns (ok, tokens evaluated, ms).
    fn sync(&mut self, seq: usize, history: &[LlamaToken]) -> (bool, usize, f64) {
        let mut keep = common_prefix(&self.cached[seq], history);
        if keep == history.len() {
            keep -= 1; // re-evaluate the last token to get its logits
        }
        if self.ctx.kv_cache_seq_rm(seq as i32, Some(keep as u32), None).is_err() {
            self.reset_seq(seq);
            keep = 0;
        }
        self.cached[seq].truncate(keep);
        let t = Instant::now();
        let ok = self.decode(seq, &history[keep..]);
        (ok, history.len() - keep, ms(t))
    }

    /// Folds a draft's timing into the costs the controller prices with.
    /// `proposed` tokens took `steps` decodes of one token (`steps_ms`,
    /// their picks included) after a catch-up of `synced` tokens
    /// (`sync_ms`). The usual catch-up (the pending token and at most one
    /// accepted draft) is a decode like the others, so it is part of what a
    /// proposed token costs; a longer one (a probe after plain steps, a new
    /// prompt) is not: counted per proposed token it would make one probe
    /// look several steps dear, and drafting that pays would stop. Past
    /// `SMALL_CATCH_UP` it is a one-time setup, priced per token.
    fn note(&mut self, proposed: usize, steps: usize, steps_ms: f64, synced: usize, sync_ms: f64) {
        let per = if synced <= USUAL_CATCH_UP && proposed > 0 {
            Some((sync_ms + steps_ms) / proposed as f64)
        } else if steps > 0 {
            Some(steps_ms / steps as f64)
        } else {
            None
        };
        if let Some(per) = per {
            self.step_ms = Some(self.step_ms.map_or(per, |o| o * 0.8 + per * 0.2));
        }
        if synced > SMALL_CATCH_UP {
            let per = sync_ms / synced as f64;
            self.prefill_ms = Some(self.prefill_ms.map_or(per, |o| o * 0.5 + per * 0.5));
        }
    }

    /// The distribution at the last output, at `temperature` (<= 0: 1).
    fn distribution(&self, temperature: f32) -> Dist {
        let logits = self.ctx.get_logits_ith(-1);
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = DRAFT_TOP_K.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let ids: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        let scaled: Vec<f32> = idx.iter().map(|&i| logits[i] / t).collect();
        Dist::from_logits(&ids, &scaled)
    }
}

/// What a request asks of the draft model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftSettings {
    /// <= 0: greedy drafts.
    pub temperature: f32,
    /// Drafting stops below this confidence.
    pub p_min: f32,
    /// Tree branches (1 = a chain) and the probability above which a branch splits.
    pub n_parallel: usize,
    pub p_split: f32,
}

/// Drafting with the draft model for one request, in its slot's sequence.
pub struct ModelDrafter<'m> {
    cx: Rc<RefCell<DraftContext<'m>>>,
    seq: usize,
    settings: DraftSettings,
    /// The request's sampling seed: sampled drafts use the target's noise.
    seed: u64,
    /// The branches of the last tree that were not proposed.
    spares: SpareBranches,
    /// The confidence below which the chain stops, as the controller
    /// learnt it pays (at most `p_min`); `p_min` until it says.
    floor: f32,
}

impl<'m> ModelDrafter<'m> {
    pub fn new(cx: Rc<RefCell<DraftContext<'m>>>, seq: usize, settings: DraftSettings, seed: u64) -> Self {
        ModelDrafter { cx, seq, settings, seed, spares: SpareBranches::default(), floor: settings.p_min }
    }

    /// A chain of up to `n_max` tokens: the top candidate at each step
    /// (greedy), or a sample of the draft's distribution with the noise the
    /// target samples that position with — so the draft proposes the
    /// target's own choice whenever the two models broadly agree.
    fn chain(&mut self, history: &[i32], n_max: usize, position: usize) -> Option<Draft> {
        let history: Vec<LlamaToken> = history.iter().map(|&t| LlamaToken(t)).collect();
        let mut cx = self.cx.borrow_mut();
        let (ok, synced, sync_ms) = cx.sync(self.seq, &history);
        let mut draft = Draft::new(Vec::new(), TokenSource(DRAFT.name), Vec::new());
        let start = Instant::now();
        let mut steps = 0;
        if ok {
            let greedy = self.settings.temperature <= 0.0;
            for i in 0..n_max {
                let (token, confidence) = if greedy {
                    let logits = cx.ctx.get_logits_ith(-1);
                    let best = argmax(logits);
                    // Confidence of the greedy pick: its softmax probability.
                    let max = logits[best as usize];
                    let z: f32 = logits.iter().map(|&l| exp_f32(l - max)).sum();
                    (best, 1.0 / z)
                } else {
                    let q = cx.distribution(self.settings.temperature);
                    let Some(x) = q.sample(&mut PositionNoise::new(self.seed, (position + i) as u64)) else { break };
                    (x, q.probs.iter().cloned().fold(0.0f32, f32::max))
                };
                if confidence < self.floor.min(self.settings.p_min) {
                    break;
                }
                draft.tokens.push(token);
                draft.classes.push(confidence_class(confidence));
                if i + 1 == n_max {
                    break;
                }
                steps += 1;
                if !cx.decode(self.seq, &[LlamaToken(token)]) {
                    break;
                }
            }
        }
        cx.note(draft.len(), steps, ms(start), synced, sync_ms);
        (!draft.is_empty()).then_some(draft)
    }

    /// Drafts with a tree, as the seeds' speculative.cpp: up to
    /// `n_parallel` paths, `depth` tokens deep, a branch splitting where a
    /// runner-up candidate is more probable than `p_split`. Tokens are the
    /// model's top candidates (deterministic), so each is a point mass for
    /// stochastic verification.
    ///
    /// Only the first branch (the top candidates all the way) is proposed;
    /// the others are kept. Where the target rejects the proposal at a split
    /// and its own token starts another branch, the rest of that branch is
    /// the next step's draft, without running the draft model. The target so
    /// verifies one chain per step, in the cells plain decoding would use:
    /// verifying all branches in one batch would put the later branches'
    /// nodes behind cells of the first, and attention would then sum in
    /// another order than plain decoding does.
    fn tree(&mut self, history: &[i32], depth: usize) -> Option<Draft> {
        if let Some(tokens) = self.spares.continuation(history, depth) {
            return Some(point_masses(tokens));
        }
        let mut cx = self.cx.borrow_mut();
        let history_tokens: Vec<LlamaToken> = history.iter().map(|&t| LlamaToken(t)).collect();
        let (ok, synced, sync_ms) = cx.sync(self.seq, &history_tokens);
        let start = Instant::now();
        let branches = if ok { grow_tree(&mut cx, self.seq, depth, self.settings) } else { Vec::new() };
        let proposed: usize = branches.iter().map(Vec::len).sum();
        // A tree's decodes are batches of its live branches: its time is
        // shared by every token it proposed.
        cx.note(proposed, proposed, ms(start), synced, sync_ms);
        let mut branches = branches.into_iter();
        let first = branches.next()?;
        self.spares.keep(history, branches);
        Some(point_masses(first))
    }
}

/// Grows the branches of a draft tree from sequence `seq`'s last logits;
/// branch b lives in scratch sequence b while it grows.
fn grow_tree(cx: &mut DraftContext, seq: usize, depth: usize, s: DraftSettings) -> Vec<Vec<i32>> {
    struct Live {
        branch: usize,
        logits: i32,
        active: bool,
    }
    let n_branches = s.n_parallel.clamp(1, MAX_BRANCHES);
    let base = cx.cached[seq].len();
    let mut branches: Vec<Vec<i32>> = vec![Vec::new()];
    let _ = cx.ctx.kv_cache_seq_cp(seq as i32, cx.scratch(0), None, None);
    let mut live = vec![Live { branch: 0, logits: -1, active: true }];
    for d in 0..depth {
        let mut next: Vec<(usize, i32)> = Vec::new();
        for li in 0..live.len() {
            if !live[li].active {
                continue;
            }
            let logits = cx.ctx.get_logits_ith(live[li].logits);
            let (top, second) = top_two(logits);
            let max = logits[top as usize];
            let z: f32 = logits.iter().map(|&l| exp_f32(l - max)).sum();
            if 1.0 / z < s.p_min {
                live[li].active = false;
                continue;
            }
            let b = live[li].branch;
            branches[b].push(top);
            next.push((b, top));
            let p_second = exp_f32(logits[second as usize] - max) / z;
            if branches.len() < n_branches && p_second > s.p_split && d + 1 < depth {
                let nb = branches.len();
                let mut tokens = branches[b].clone();
                *tokens.last_mut().expect("just pushed") = second;
                branches.push(tokens);
                let _ = cx.ctx.kv_cache_seq_cp(cx.scratch(b), cx.scratch(nb), None, None);
                live.push(Live { branch: nb, logits: -1, active: true });
                next.push((nb, second));
            }
        }
        if next.is_empty() || d + 1 == depth {
            break;
        }
        cx.batch.clear();
        for (i, &(b, t)) in next.iter().enumerate() {
            let scratch = cx.scratch(b);
            if cx.batch.add(LlamaToken(t), (base + d) as i32, &[scratch], true).is_err() {
                break;
            }
            if let Some(l) = live.iter_mut().find(|l| l.branch == b) {
                l.logits = i as i32;
            }
        }
        if cx.ctx.decode(&mut cx.batch).is_err() {
            break;
        }
    }
    for b in 0..branches.len() {
        let scratch = cx.scratch(b);
        let _ = cx.ctx.kv_cache_seq_rm(scratch, None, None);
    }
    branches.retain(|b| !b.is_empty());
    branches
}

impl Drafter for ModelDrafter<'_> {
    fn name(&self) -> &'static str {
        DRAFT.name
    }

    fn draft(&mut self, history: &[i32], n_max: usize, position: usize) -> Option<Draft> {
        let history = text_only(history);
        if n_max == 0 || history.is_empty() {
            return None;
        }
        if self.settings.n_parallel > 1 {
            self.tree(&history, n_max)
        } else {
            // (`position` is the target's: the sampling noise of the
            // position the draft continues.)
            self.chain(&history, n_max, position)
        }
    }

    fn set_floor(&mut self, floor: f32) {
        self.floor = floor;
    }

    fn ms_per_token(&self) -> Option<f64> {
        self.cx.borrow().step_ms
    }

    /// Catching up with more than the usual few tokens (a new prompt,
    /// tokens produced while the draft model was not drafting).
    fn setup_ms(&self, history: &[i32]) -> f64 {
        let cx = self.cx.borrow();
        let behind = cx.behind(self.seq, &text_only(history));
        if behind <= SMALL_CATCH_UP {
            return 0.0;
        }
        behind as f64 * cx.prefill_ms.or(cx.step_ms).unwrap_or(0.0)
    }
}

/// The draft model reads text only: a history without its media tokens (an
/// image's or a clip's, `media::is_media_token`), the text around them in
/// order. It drafts from what the conversation says; the target, which
/// read the media, verifies, so the output is the target's either way.
fn text_only(history: &[i32]) -> std::borrow::Cow<'_, [i32]> {
    if history.iter().all(|&t| !crate::media::is_media_token(LlamaToken(t))) {
        std::borrow::Cow::Borrowed(history)
    } else {
        std::borrow::Cow::Owned(history.iter().copied().filter(|&t| !crate::media::is_media_token(LlamaToken(t))).collect())
    }
}

/// A draft of deterministic choices: each token a point mass for verification.
fn point_masses(tokens: Vec<i32>) -> Draft {
    Draft::new(tokens, TokenSource(DRAFT.name), Vec::new())
}

/// The two largest logits' ids.
fn top_two(logits: &[f32]) -> (i32, i32) {
    let (mut a, mut b) = (0usize, usize::MAX);
    for (i, &v) in logits.iter().enumerate().skip(1) {
        if v > logits[a] {
            b = a;
            a = i;
        } else if b == usize::MAX || v > logits[b] {
            b = i;
        }
    }
    if b == usize::MAX {
        b = a;
    }
    (a as i32, b as i32)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
