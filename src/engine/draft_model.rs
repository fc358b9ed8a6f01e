//! The draft model as a `Drafter`: a small model with its own context whose
//! KV cache follows the target's accepted tokens. Rejected positions are
//! removed lazily: before drafting, the cache is cut back to the longest
//! prefix it shares with the accepted history, and only the missing tokens
//! are evaluated (in one batch).

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::sampler::argmax;
use crate::core::drafter::{Draft, Drafter, SpareBranches};
use crate::core::events::TokenSource;
use crate::core::prompt::common_prefix;
use crate::core::random::{self, SamplingRng};
use crate::core::verify::Dist;

/// Candidates kept from the draft's distribution when sampling: q only has
/// to be the distribution the draft was drawn from, so truncating it is
/// exact as long as verification sees the same q.
const DRAFT_TOP_K: usize = 40;

pub struct DraftModel<'m> {
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    cached: Vec<LlamaToken>,
    n_batch: usize,
    /// Per request: temperature (<= 0 → greedy drafts), confidence floor, rng.
    temperature: f32,
    p_min: f32,
    rng: SamplingRng,
    /// Time spent in the last `draft` call, for the cost model.
    pub last_ms: f64,
    /// Tokens decoded by the last `draft` call (catch-up plus drafted).
    pub last_decoded: usize,
    /// Tokens the last `draft` call proposed.
    pub last_proposed: usize,
    /// Of the last call: tokens evaluated to catch up with the history, and
    /// the time that took (part of `last_ms`).
    pub last_synced: usize,
    pub last_sync_ms: f64,
    /// The branches of the last draft tree that were not proposed.
    spares: SpareBranches,
}

impl<'m> DraftModel<'m> {
    pub fn new(_model: &'m LlamaModel, ctx: LlamaContext<'m>, n_batch: usize) -> Self {
        DraftModel {
            ctx,
            batch: LlamaBatch::new(n_batch, super::session::MAX_SEQS as i32),
            cached: Vec::new(),
            n_batch,
            temperature: 0.0,
            p_min: 0.0,
            rng: random::seeded(0),
            last_ms: 0.0,
            last_decoded: 0,
            last_proposed: 0,
            last_synced: 0,
            last_sync_ms: 0.0,
            spares: SpareBranches::default(),
        }
    }

    /// Tokens of `history` the draft cache lacks: what drafting now would
    /// first have to evaluate (at least the last token, for its logits).
    pub fn behind(&self, history: &[i32]) -> usize {
        let shared = self.cached.iter().zip(history).take_while(|(a, b)| a.0 == **b).count();
        (history.len() - shared).max(1)
    }

    /// Time per token of evaluating `n` tokens in one batch (for pricing a
    /// catch-up with a prompt). Leaves the cache as it was.
    pub fn measure_batch_ms(&mut self, token: LlamaToken, n: usize) -> Option<f64> {
        let pos = self.cached.len();
        let n = n.min(self.n_batch).max(1);
        self.batch.clear();
        for i in 0..n {
            self.batch.add(token, (pos + i) as i32, &[0], i + 1 == n).ok()?;
        }
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).ok()?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let _ = self.ctx.kv_cache_seq_rm(0, Some(pos as u32), None);
        Some(ms / n as f64)
    }

    pub fn configure(&mut self, temperature: f32, p_min: f32, seed: u64) {
        self.temperature = temperature;
        self.p_min = p_min;
        self.rng = random::seeded(seed);
        self.spares.clear();
    }

    pub fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        self.cached.clear();
        self.spares.clear();
    }

    /// Time to decode one token on the draft model (for calibration).
    pub fn measure_step_ms(&mut self, token: LlamaToken) -> Option<f64> {
        let pos = self.cached.len();
        self.batch.clear();
        self.batch.add(token, pos as i32, &[0], true).ok()?;
        let t = Instant::now();
        self.ctx.decode(&mut self.batch).ok()?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let _ = self.ctx.kv_cache_seq_rm(0, Some(pos as u32), None);
        Some(ms)
    }

    fn decode(&mut self, tokens: &[LlamaToken]) -> bool {
        for (ci, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let last_chunk = (ci + 1) * self.n_batch >= tokens.len();
            self.batch.clear();
            let base = self.cached.len();
            for (i, &t) in chunk.iter().enumerate() {
                if self.batch.add(t, (base + i) as i32, &[0], last_chunk && i + 1 == chunk.len()).is_err() {
                    return false;
                }
            }
            if self.ctx.decode(&mut self.batch).is_err() {
                self.reset();
                return false;
            }
            self.cached.extend_from_slice(chunk);
        }
        true
    }

    /// Brings the draft cache to `history` with logits for its last token.
    fn sync(&mut self, history: &[LlamaToken]) -> bool {
        let mut keep = common_prefix(&self.cached, history);
        if keep == history.len() {
            keep -= 1; // re-evaluate the last token to get its logits
        }
        if self.ctx.kv_cache_seq_rm(0, Some(keep as u32), None).is_err() {
            self.reset();
            keep = 0;
        }
        self.cached.truncate(keep);
        self.last_decoded += history.len() - keep;
        let t = Instant::now();
        let ok = self.decode(&history[keep..]);
        self.last_synced = history.len() - keep;
        self.last_sync_ms = t.elapsed().as_secs_f64() * 1000.0;
        ok
    }

    /// The draft's distribution at its last output, at the request's temperature.
    fn distribution(&self) -> Dist {
        let logits = self.ctx.get_logits_ith(-1);
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = DRAFT_TOP_K.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
        let t = if self.temperature > 0.0 { self.temperature } else { 1.0 };
        let ids: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        let scaled: Vec<f32> = idx.iter().map(|&i| logits[i] / t).collect();
        Dist::from_logits(&ids, &scaled)
    }
}

/// One root-to-leaf path of a draft tree; branches share their prefixes.
#[derive(Debug, Clone)]
struct Branch {
    tokens: Vec<i32>,
}

impl DraftModel<'_> {
    /// Drafts with a tree, as the seeds' speculative.cpp: up to `n_branches`
    /// paths, `depth` tokens deep, a branch splitting where a runner-up
    /// candidate is more probable than `p_split`. Tokens are the model's top
    /// candidates (deterministic), so each is a point mass for stochastic
    /// verification.
    ///
    /// Only the first branch (the top candidates all the way) is proposed;
    /// the others are kept. Where the target rejects the proposal at a split
    /// and its own token starts another branch, the rest of that branch is
    /// the next step's draft, without running the draft model (`spare`).
    /// The target so verifies one chain per step, in the cells plain
    /// decoding would use: verifying all branches in one batch would put
    /// the later branches' nodes behind cells of the first, and attention
    /// would then sum in another order than plain decoding does.
    pub fn draft_tree(&mut self, history: &[i32], depth: usize, n_branches: usize, p_split: f32) -> Option<Draft> {
        if let Some(d) = self.spare(history, depth) {
            return Some(d);
        }
        let mut branches = self.grow_tree(history, depth, n_branches, p_split)?.into_iter().map(|b| b.tokens);
        let first = branches.next()?;
        self.spares.keep(history, branches);
        Some(point_masses(first))
    }

    /// The rest of a kept branch that continues `history`, up to `n` tokens.
    fn spare(&mut self, history: &[i32], n: usize) -> Option<Draft> {
        let tokens = self.spares.continuation(history, n)?;
        self.last_ms = 0.0;
        self.last_decoded = 0;
        self.last_proposed = tokens.len();
        self.last_synced = 0;
        self.last_sync_ms = 0.0;
        Some(point_masses(tokens))
    }

    /// Branch b lives in sequence b + 1 of the draft cache while drafting.
    fn grow_tree(&mut self, history: &[i32], depth: usize, n_branches: usize, p_split: f32) -> Option<Vec<Branch>> {
        let start = Instant::now();
        self.last_decoded = 0;
        self.last_proposed = 0;
        self.last_synced = 0;
        self.last_sync_ms = 0.0;
        let history: Vec<LlamaToken> = history.iter().map(|&t| LlamaToken(t)).collect();
        if depth == 0 || history.is_empty() || !self.sync(&history) {
            self.last_ms = start.elapsed().as_secs_f64() * 1000.0;
            return None;
        }
        let base = self.cached.len();
        struct Live {
            branch: usize,
            logits: i32,
            active: bool,
        }
        let mut branches = vec![Branch { tokens: Vec::new() }];
        let _ = self.ctx.kv_cache_seq_cp(0, 1, None, None);
        let mut live = vec![Live { branch: 0, logits: -1, active: true }];
        for d in 0..depth {
            let mut next: Vec<(usize, i32)> = Vec::new();
            let n_live = live.len();
            for li in 0..n_live {
                if !live[li].active {
                    continue;
                }
                let logits = self.ctx.get_logits_ith(live[li].logits);
                let (top, second) = top_two(logits);
                let max = logits[top as usize];
                let z: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
                let p_top = 1.0 / z;
                if p_top < self.p_min {
                    live[li].active = false;
                    continue;
                }
                let b = live[li].branch;
                branches[b].tokens.push(top);
                next.push((b, top));
                let p_second = (logits[second as usize] - max).exp() / z;
                if branches.len() < n_branches && p_second > p_split && d + 1 < depth {
                    let nb = branches.len();
                    let mut tokens = branches[b].tokens.clone();
                    *tokens.last_mut().expect("just pushed") = second;
                    branches.push(Branch { tokens });
                    let _ = self.ctx.kv_cache_seq_cp(b as i32 + 1, nb as i32 + 1, None, None);
                    live.push(Live { branch: nb, logits: -1, active: true });
                    next.push((nb, second));
                }
            }
            if next.is_empty() || d + 1 == depth {
                break;
            }
            self.batch.clear();
            for (i, &(b, t)) in next.iter().enumerate() {
                if self.batch.add(LlamaToken(t), (base + d) as i32, &[b as i32 + 1], true).is_err() {
                    break;
                }
                if let Some(l) = live.iter_mut().find(|l| l.branch == b) {
                    l.logits = i as i32;
                }
            }
            self.last_decoded += next.len();
            if self.ctx.decode(&mut self.batch).is_err() {
                break;
            }
        }
        for b in 0..branches.len() {
            let _ = self.ctx.kv_cache_seq_rm(b as i32 + 1, None, None);
        }
        self.last_ms = start.elapsed().as_secs_f64() * 1000.0;
        branches.retain(|b| !b.tokens.is_empty());
        self.last_proposed = branches.iter().map(|b| b.tokens.len()).sum();
        (!branches.is_empty()).then_some(branches)
    }
}

/// A draft of deterministic choices: each token a point mass for verification.
fn point_masses(tokens: Vec<i32>) -> Draft {
    Draft { dists: vec![None; tokens.len()], tokens, source: TokenSource::Draft, classes: Vec::new() }
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

impl Drafter for DraftModel<'_> {
    fn name(&self) -> &'static str {
        "draft"
    }

    fn begin(&mut self, _prompt: &[i32]) {}

    fn draft(&mut self, history: &[i32], n_max: usize) -> Option<Draft> {
        let start = Instant::now();
        self.last_decoded = 0;
        self.last_proposed = 0;
        self.last_synced = 0;
        self.last_sync_ms = 0.0;
        let history: Vec<LlamaToken> = history.iter().map(|&t| LlamaToken(t)).collect();
        let mut draft = Draft { tokens: Vec::new(), dists: Vec::new(), source: TokenSource::Draft, classes: Vec::new() };
        if n_max == 0 || history.is_empty() || !self.sync(&history) {
            self.last_ms = start.elapsed().as_secs_f64() * 1000.0;
            return None;
        }
        let greedy = self.temperature <= 0.0;
        for i in 0..n_max {
            let (token, confidence, q) = if greedy {
                let logits = self.ctx.get_logits_ith(-1);
                let best = argmax(logits);
                // Confidence of the greedy pick: its softmax probability.
                let max = logits[best as usize];
                let z: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
                (best, 1.0 / z, None)
            } else {
                let q = self.distribution();
                let Some(x) = q.sample(&mut self.rng) else { break };
                let conf = q.probs.iter().cloned().fold(0.0f32, f32::max);
                (x, conf, Some(q))
            };
            if confidence < self.p_min {
                break;
            }
            draft.tokens.push(token);
            draft.dists.push(q);
            if i + 1 == n_max {
                break;
            }
            self.last_decoded += 1;
            if !self.decode(&[LlamaToken(token)]) {
                break;
            }
        }
        self.last_ms = start.elapsed().as_secs_f64() * 1000.0;
        self.last_proposed = draft.len();
        (!draft.is_empty()).then_some(draft)
    }

    fn accept(&mut self, _n_accepted: usize) {}
}
