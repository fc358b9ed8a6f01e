//! The target's sampler: the request's whole chain (logit bias, penalties,
//! grammar, top-k/typical/top-p/min-p, temperature) applied by llama.cpp, a
//! schema or tool-call constraint applied by llguidance, and the final draw
//! done here from the resulting distribution. Owning the draw is what lets
//! speculative verification use exactly the distribution that plain
//! decoding samples from.

use std::cell::RefCell;
use std::rc::Rc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::request::{CompletionRequest, SamplingParams};
use llama_engine_core::sampling::budget::ReasoningBudget;
use llama_engine_core::sampling::constraint::{Constraint, Next};
use llama_engine_core::sampling::noise::{self, PositionNoise, Rng};
use llama_engine_core::sampling::Dist;

/// What `sample` returns when the chain leaves no candidate (a grammar that is
/// complete while the end of generation is banned by `ignore_eos`, or that
/// cannot continue): the request ends there, as at an end-of-generation token.
/// Never decoded, accepted or detokenized.
pub const DEAD_END: LlamaToken = LlamaToken(-1);

/// Whether a token's bytes end a UTF-8 character.
pub type EndsCharacter = Box<dyn Fn(i32) -> bool>;

pub struct TokenSampler {
    /// History-dependent transforms (logit bias, penalties). `None` when the
    /// request has none, so greedy decoding can take the argmax of raw logits.
    history: Option<LlamaSampler>,
    /// A GBNF `grammar`, applied by llama.cpp's sampler.
    grammar: Option<LlamaSampler>,
    /// A schema or tool-call constraint, computed by llguidance; shared
    /// with the request's grammar drafter.
    constraint: Option<Rc<RefCell<Constraint>>>,
    /// Why the constraint stopped working (the request then ends with an error).
    failure: Option<String>,
    /// `reasoning_budget`: forces the end of thinking once it is spent;
    /// with whether a token ends a UTF-8 character.
    budget: Option<(ReasoningBudget, EndsCharacter)>,
    /// Truncation and temperature; only used when sampling.
    shape: Option<LlamaSampler>,
    /// Mirostat picks the token itself (and adapts after each pick).
    mirostat: Option<LlamaSampler>,
    greedy: bool,
    /// The request's seed (drawn from the OS when it gave none): with the
    /// position of a token, it fixes the noise that token is sampled with.
    seed: u64,
    scratch: Vec<LlamaTokenData>,
}

impl TokenSampler {
    pub fn new(
        model: &LlamaModel,
        req: &CompletionRequest,
        grammar: Option<&str>,
        constraint: Option<Rc<RefCell<Constraint>>>,
        eog: &[i32],
        n_ctx: u32,
    ) -> Result<Self> {
        let p = &req.sampling;
        let n_vocab = model.n_vocab();
        let mut history = Vec::new();
        let mut biases: Vec<LlamaLogitBias> =
            p.logit_bias.iter().map(|&(id, bias)| LlamaLogitBias::new(LlamaToken(id), bias.unwrap_or(f32::NEG_INFINITY))).collect();
        if req.ignore_eos {
            biases.extend(eog.iter().map(|&id| LlamaLogitBias::new(LlamaToken(id), f32::NEG_INFINITY)));
        }
        if !biases.is_empty() {
            history.push(LlamaSampler::logit_bias(n_vocab, &biases));
        }
        if has_penalties(p) {
            let last_n = if p.repeat_last_n < 0 { n_ctx as i32 } else { p.repeat_last_n };
            history.push(LlamaSampler::penalties(n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty));
        }
        let grammar = match grammar {
            Some(g) => Some(
                LlamaSampler::grammar(model, g, "root")
                    .map_err(|e| EngineError::invalid("grammar", format!("not a valid grammar ({e})")))?,
            ),
            None => None,
        };
        let greedy = p.temperature <= 0.0;
        let mut shape = Vec::new();
        let mut mirostat = None;
        if !greedy {
            if p.mirostat == 0 {
                if p.top_k > 0 {
                    shape.push(LlamaSampler::top_k(p.top_k));
                }
                if p.typical_p < 1.0 {
                    shape.push(LlamaSampler::typical(p.typical_p, 1));
                }
                if p.top_p < 1.0 {
                    shape.push(LlamaSampler::top_p(p.top_p, 1));
                }
                if p.min_p > 0.0 {
                    shape.push(LlamaSampler::min_p(p.min_p, 1));
                }
                shape.push(LlamaSampler::temp(p.temperature));
            } else {
                let seed = p.seed.unwrap_or_else(|| noise::from_os().random());
                shape.push(LlamaSampler::temp(p.temperature));
                mirostat = Some(if p.mirostat == 1 {
                    LlamaSampler::mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100)
                } else {
                    LlamaSampler::mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta)
                });
            }
        }
        let seed = p.seed.map_or_else(|| noise::from_os().random(), u64::from);
        let chain = |v: Vec<LlamaSampler>| (!v.is_empty()).then(|| LlamaSampler::chain_simple(v));
        Ok(TokenSampler {
            history: chain(history),
            grammar,
            constraint,
            failure: None,
            budget: None,
            shape: chain(shape),
            mirostat,
            greedy,
            seed,
            scratch: Vec::new(),
        })
    }

    /// Limits thinking to `budget`'s tokens; `completes` says whether a
    /// token ends a UTF-8 character (the end is forced only after one).
    pub fn with_reasoning_budget(mut self, budget: ReasoningBudget, completes: EndsCharacter) -> Self {
        self.budget = Some((budget, completes));
        self
    }

    /// The token the thinking budget forces next, if it forces one.
    fn budget_forced(&self) -> Option<i32> {
        self.budget.as_ref().and_then(|(b, _)| b.forced())
    }

    /// Masks all but the token the thinking budget forces, if any.
    fn apply_budget(&self, arr: &mut LlamaTokenDataArray) {
        if let Some(id) = self.budget_forced() {
            for d in arr.data.iter_mut() {
                if d.id().0 != id {
                    d.set_logit(f32::NEG_INFINITY);
                }
            }
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    /// Mirostat adapts to each token it picks, so it cannot verify drafts.
    pub fn supports_speculation(&self) -> bool {
        self.mirostat.is_none()
    }

    /// Feeds prompt tokens to the penalties (not to the grammar, which
    /// constrains generated text only).
    pub fn accept_prompt(&mut self, tokens: &[LlamaToken]) {
        if let Some(h) = self.history.as_mut() {
            // (Media chunks' tokens are not text: penalties skip them.)
            for &t in tokens.iter().filter(|t| !crate::media::is_media_token(**t)) {
                h.accept(t);
            }
        }
    }

    /// Records a token as generated: updates penalties and grammar state.
    pub fn accept(&mut self, token: LlamaToken) {
        if token == DEAD_END {
            return;
        }
        if let Some(h) = self.history.as_mut() {
            h.accept(token);
        }
        if let Some(g) = self.grammar.as_mut() {
            g.accept(token);
        }
        if let Some(c) = &self.constraint {
            if let Err(e) = c.borrow_mut().consume(token.0) {
                self.failure.get_or_insert(e);
            }
        }
        if let Some(m) = self.mirostat.as_mut() {
            m.accept(token);
        }
        if let Some((b, completes)) = self.budget.as_mut() {
            b.accept(token.0, completes(token.0));
        }
    }

    /// Why the request's constraint failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    fn fast_path(&self) -> bool {
        self.greedy && self.history.is_none() && self.grammar.is_none() && self.constraint.is_none() && self.budget_forced().is_none()
    }

    /// Masks what the constraint does not allow (everything, once it
    /// failed): all but the canonical token where it forces text.
    fn apply_constraint(&mut self, arr: &mut LlamaTokenDataArray) {
        let Some(c) = &self.constraint else { return };
        let mut c = c.borrow_mut();
        match c.next_token() {
            Ok(Next::Forced(id)) => {
                for d in arr.data.iter_mut() {
                    if d.id().0 != id {
                        d.set_logit(f32::NEG_INFINITY);
                    }
                }
            }
            Ok(Next::Mask(mask)) => {
                for d in arr.data.iter_mut() {
                    if !c.is_allowed(&mask, d.id().0) {
                        d.set_logit(f32::NEG_INFINITY);
                    }
                }
            }
            Err(e) => {
                self.failure.get_or_insert(e);
                for d in arr.data.iter_mut() {
                    d.set_logit(f32::NEG_INFINITY);
                }
            }
        }
    }

    /// Runs the chain on the logits at `idx` and returns the candidates left.
    fn transformed(&mut self, ctx: &LlamaContext, idx: i32) -> LlamaTokenDataArray {
        let logits = ctx.get_logits_ith(idx);
        let mut data = std::mem::take(&mut self.scratch);
        data.clear();
        data.extend(logits.iter().enumerate().map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)));
        let mut arr = LlamaTokenDataArray::new(data, false);
        if let Some(h) = self.history.as_mut() {
            arr.apply_sampler(h);
        }
        if let Some(g) = self.grammar.as_mut() {
            arr.apply_sampler(g);
        }
        self.apply_constraint(&mut arr);
        self.apply_budget(&mut arr);
        if !self.greedy {
            if let Some(s) = self.shape.as_mut() {
                arr.apply_sampler(s);
            }
        }
        arr
    }

    /// The target distribution p at output `idx`: the whole chain applied,
    /// then a softmax over what is left. At temperature <= 0 this is the
    /// softmax of the (biased, penalised, grammar-constrained) logits; its
    /// argmax is the greedy choice.
    pub fn distribution(&mut self, ctx: &LlamaContext, idx: i32) -> Dist {
        let arr = self.transformed(ctx, idx);
        let (ids, logits): (Vec<i32>, Vec<f32>) = arr.data.iter().map(|d| (d.id().0, d.logit())).unzip();
        self.scratch = arr.data;
        Dist::from_logits(&ids, &logits)
    }

    /// Picks the token at output `idx` of the batch (does not accept it),
    /// the `position`-th token the request generates; `DEAD_END` when the
    /// chain allows no token at all. Sampling draws with the noise of
    /// (seed, position) alone, so a token is the same whether decoded
    /// plainly or verified in a draft. Returns the distribution it was
    /// drawn from when `want_dist` or when it is needed anyway.
    pub fn sample(&mut self, ctx: &LlamaContext, idx: i32, want_dist: bool, position: usize) -> (LlamaToken, Option<Dist>) {
        if self.fast_path() && !want_dist {
            return (LlamaToken(argmax(ctx.get_logits_ith(idx))), None);
        }
        if self.mirostat.is_some() {
            let mut arr = {
                let logits = ctx.get_logits_ith(idx);
                let data = logits.iter().enumerate().map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0));
                LlamaTokenDataArray::new(data.collect(), false)
            };
            for s in [self.history.as_mut(), self.grammar.as_mut()].into_iter().flatten() {
                arr.apply_sampler(s);
            }
            self.apply_constraint(&mut arr);
            self.apply_budget(&mut arr);
            if let Some(s) = self.shape.as_mut() {
                arr.apply_sampler(s);
            }
            let (ids, logits): (Vec<i32>, Vec<f32>) = arr.data.iter().map(|d| (d.id().0, d.logit())).unzip();
            let dist = Dist::from_logits(&ids, &logits);
            if let Some(m) = self.mirostat.as_mut() {
                arr.apply_sampler(m);
            }
            let token =
                if dist.is_empty() { DEAD_END } else { arr.selected_token().unwrap_or_else(|| LlamaToken(dist.argmax().unwrap_or(0))) };
            return (token, Some(dist));
        }
        if self.greedy && !want_dist {
            // Greedy needs only the argmax of what the chain leaves.
            let arr = self.transformed(ctx, idx);
            let best = arr
                .data
                .iter()
                .filter(|d| d.logit() > f32::NEG_INFINITY)
                .max_by(|a, b| a.logit().total_cmp(&b.logit()).then(b.id().0.cmp(&a.id().0)));
            let token = best.map(|d| d.id()).unwrap_or(DEAD_END);
            self.scratch = arr.data;
            return (token, None);
        }
        let dist = self.distribution(ctx, idx);
        let token = if self.greedy { dist.argmax() } else { dist.sample(&mut PositionNoise::new(self.seed, position as u64)) };
        (token.map_or(DEAD_END, LlamaToken), Some(dist))
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }
}

fn has_penalties(p: &SamplingParams) -> bool {
    p.repeat_last_n != 0 && (p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
}

/// Index of the largest logit; ties go to the lowest id, as llama.cpp's greedy.
pub fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as i32
}

#[cfg(test)]
mod tests {
    use llama_engine_core::gbnf::check_gbnf;
    use std::ffi::CString;

    /// llama.cpp's own verdict on a grammar (no vocabulary: no named tokens).
    fn llama_accepts(grammar: &str) -> bool {
        let (Ok(g), Ok(root)) = (CString::new(grammar), CString::new("root")) else { return false };
        // SAFETY: plain C strings; the sampler is freed at once.
        unsafe {
            let s = llama_cpp_sys_2::llama_sampler_init_grammar(std::ptr::null(), g.as_ptr(), root.as_ptr());
            if s.is_null() {
                return false;
            }
            llama_cpp_sys_2::llama_sampler_free(s);
            true
        }
    }

    /// Runs `f` with the process's stderr sent to /dev/null: llama.cpp's
    /// parser prints every grammar it rejects.
    fn quietly<T>(f: impl FnOnce() -> T) -> T {
        extern "C" {
            fn dup(fd: i32) -> i32;
            fn dup2(from: i32, to: i32) -> i32;
            fn close(fd: i32) -> i32;
        }
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null").expect("/dev/null");
        use std::os::fd::AsRawFd;
        // SAFETY: saves and restores fd 2 around `f`.
        let saved = unsafe { dup(2) };
        unsafe { dup2(null.as_raw_fd(), 2) };
        let out = f();
        unsafe {
            dup2(saved, 2);
            close(saved);
        }
        out
    }

    /// A random grammar: well formed by construction, then in half of the
    /// cases one byte deleted, inserted or replaced.
    fn grammar(seed: &mut u64) -> String {
        let mut next = |n: usize| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (*seed >> 33) as usize % n
        };
        let items = [
            "\"a\"",
            "\"b\\n\"",
            "[a-z]",
            "[^x]",
            "[\\]-]",
            ".",
            "x",
            "y",
            "root",
            "(x | \"c\")",
            "(\"d\" y)",
            "<[5]>",
            "!<[6]>",
            "\"\"",
            "[]",
            "(\n\"e\"\n)",
            "\"f\"",
            "[0-9]",
            "(\"g\" | [h-k])",
            "\"\\u00e9\"",
        ];
        let ops = ["", "", "", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "{0}", "{ 2 , 3 }"];
        let mut g = String::new();
        for name in ["root", "x", "y"] {
            g.push_str(name);
            g.push_str(" ::= ");
            for alt in 0..1 + next(3) {
                if alt > 0 {
                    g.push_str(" | ");
                }
                for k in 0..1 + next(4) {
                    if k > 0 {
                        g.push(' ');
                    }
                    g.push_str(items[next(items.len())]);
                    g.push_str(ops[next(ops.len())]);
                }
            }
            g.push_str(if next(5) == 0 { " # note\n" } else { "\n" });
        }
        if next(2) == 0 {
            let bytes =
                ["\"", "[", "]", "(", ")", "{", "}", "|", "*", "\\", "<", ">", "!", "\n", ":", "1", ",", "-", "^", " ", "é", "#", "z"];
            let mut chars: Vec<char> = g.chars().collect();
            let at = next(chars.len());
            match next(3) {
                0 => {
                    chars.remove(at);
                }
                1 => chars.splice(at..at, bytes[next(bytes.len())].chars()).for_each(drop),
                _ => chars.splice(at..at + 1, bytes[next(bytes.len())].chars()).for_each(drop),
            }
            g = chars.into_iter().collect();
        }
        g
    }

    /// The GBNF check accepts exactly what llama.cpp's parser accepts (so a
    /// grammar that passes it never makes llama.cpp print), except what it
    /// refuses for its bounds.
    #[test]
    fn the_gbnf_check_agrees_with_llama_cpp() {
        let mut seed = 5u64;
        let (mut accepted, mut rejected) = (0, 0);
        quietly(|| {
            for _ in 0..8000 {
                let g = grammar(&mut seed);
                if g.is_empty() {
                    continue; // no grammar at all (a request drops an empty one)
                }
                match check_gbnf(&g) {
                    // Named tokens need a vocabulary, which this test has not.
                    Ok(checked) if !checked.named_tokens.is_empty() => {}
                    Ok(_) => {
                        assert!(llama_accepts(&g), "we accept, llama.cpp rejects: {g:?}");
                        accepted += 1;
                    }
                    // What is refused for its bounds, or for left recursion
                    // through a rule that can match nothing (which llama.cpp
                    // misses), may hang or exhaust llama.cpp: not asked.
                    Err(why)
                        if why.contains("repetition")
                            || why.contains("too complex")
                            || why.contains("elements")
                            || why.contains("left recursion") => {}
                    Err(why) => {
                        assert!(!llama_accepts(&g), "we reject ({why}), llama.cpp accepts: {g:?}");
                        rejected += 1;
                    }
                }
            }
        });
        assert!(accepted > 500 && rejected > 500, "{accepted} accepted, {rejected} rejected");
    }
}
