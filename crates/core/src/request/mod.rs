//! What a caller hands in, parsed and validated before anything reaches
//! llama.cpp: completion requests (`parse`, with the one list of their
//! fields in `fields`), load options (`options`), and the prompt's
//! truncation rules (`prompt`). Grammars are checked by `crate::gbnf`; JSON
//! schemas and the wording of error messages are `crate::json`'s, shared
//! with `chat`. Everything past this module works on the typed, validated
//! values defined here.

pub mod fields;
#[cfg(test)]
mod fuzz;
pub mod infill;
pub mod media;
pub mod options;
pub mod parse;
pub mod prompt;
#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::chat::tools::ChatOptions;
use crate::chat::ChatMessage;
use crate::speculation::registry::{self, DrafterSet};
use parse::{f32_json, object};
pub use parse::{parse_request, parse_request_json};

#[derive(Debug, Clone, PartialEq)]
pub enum PromptPart {
    Text(String),
    Token(i32),
    /// The whole prompt as a chat template rendered it: special tokens are
    /// parsed, and BOS is added only when the text does not begin with it.
    Chat(String),
}

/// What the loaded model allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub n_vocab: i32,
    pub n_ctx: u32,
}

/// `speculative.mode`: every drafter the engine has (`auto`), none
/// (`off`), or the ones it names (`ngram`, `draft`, `ngram+draft`: the names
/// and their sets come from the drafter table, `speculation::registry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    #[default]
    Auto,
    Off,
    Only(DrafterSet),
}

impl SpecMode {
    /// Every mode, in the order of its wire names (`registry::mode_names`).
    pub fn all() -> impl Iterator<Item = SpecMode> {
        registry::mode_names().iter().filter_map(|n| SpecMode::parse(n))
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecMode::Auto => "auto",
            SpecMode::Off => "off",
            SpecMode::Only(set) => registry::name_of_set(set),
        }
    }

    /// Parses a wire name (case-sensitive).
    pub fn parse(name: &str) -> Option<SpecMode> {
        match name {
            "auto" => Some(SpecMode::Auto),
            "off" => Some(SpecMode::Off),
            _ => registry::set_named(name).map(SpecMode::Only),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeParams {
    pub mode: SpecMode,
    pub n_max: usize,
    pub n_min: usize,
    pub p_min: f32,
    pub adaptive: bool,
    pub n_parallel: usize,
    pub p_split: f32,
    /// The suffix drafter's namespace (`None`: the engine's).
    pub namespace: Option<String>,
}

impl Default for SpeculativeParams {
    fn default() -> Self {
        SpeculativeParams {
            mode: SpecMode::Auto,
            n_max: 16,
            n_min: 0,
            p_min: 0.75,
            adaptive: true,
            n_parallel: 1,
            p_split: 0.1,
            namespace: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// `<= 0` means greedy.
    pub temperature: f32,
    /// `<= 0` disables top-k.
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub typical_p: f32,
    /// `-1` means the whole context.
    pub repeat_last_n: i32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub mirostat: u8,
    pub mirostat_tau: f32,
    pub mirostat_eta: f32,
    /// `None` = a random seed.
    pub seed: Option<u32>,
    /// A bias of `None` (the wire value `false`) means the token is never sampled.
    pub logit_bias: Vec<(i32, Option<f32>)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_last_n: 64,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    /// Empty when `messages` is set, until the engine renders them into a
    /// `PromptPart::Chat`.
    pub prompt: Vec<PromptPart>,
    /// Chat messages (exactly one of `prompt` and `messages` is given).
    pub messages: Option<Vec<ChatMessage>>,
    /// Fill-in-the-middle: the prompt is built from these with the model's
    /// FIM tokens (`infill`), `prompt` appended to the prefix.
    pub infill: Option<infill::Infill>,
    /// `-1` = until end of generation or context.
    pub n_predict: i32,
    /// `-1` = keep the whole prompt when the context is shifted.
    pub n_keep: i32,
    /// Never contains empty strings.
    pub stop: Vec<String>,
    pub n_probs: usize,
    /// GBNF; never `Some("")`.
    pub grammar: Option<String>,
    /// A JSON schema, serialized; always valid JSON (an object or a boolean).
    pub json_schema: Option<String>,
    /// Tools, response format, reasoning and template variables (chat requests).
    pub chat: ChatOptions,
    pub cache_prompt: bool,
    /// A full context shifts (legacy); false: a prompt that does not fit is
    /// refused and a generation that fills it ends.
    pub context_shift: bool,
    /// Progress events while the prompt is evaluated.
    pub return_progress: bool,
    pub ignore_eos: bool,
    /// The slot it runs in when that one is free (`id_slot`; `None`: -1,
    /// the free slot whose cells fit best).
    pub id_slot: Option<usize>,
    /// The images and audio of a `{ prompt_string, multimodal_data }`
    /// prompt, each standing in its text as `MEDIA_MARKER`.
    pub prompt_media: Vec<media::MediaInput>,
    pub sampling: SamplingParams,
    pub speculative: SpeculativeParams,
    /// LoRA adapters (id in load order, scale); `None`: the load scales.
    pub lora: Option<Vec<(u32, f32)>>,
}

/// Most LoRA adapters an engine loads, and the largest scale magnitude.
pub const MAX_LORAS: usize = 32;
pub const MAX_LORA_SCALE: f32 = 100.0;

/// A tag for the adapters computing a KV cache's cells: 0 for none (or all
/// at scale 0), else a hash of the (id, scale) pairs in effect. Cells are
/// reused only by requests with the same tag.
pub fn lora_tag(scales: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut any = false;
    for (i, &s) in scales.iter().enumerate() {
        if s != 0.0 {
            any = true;
            for b in (i as u32).to_le_bytes().into_iter().chain(s.to_bits().to_le_bytes()) {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    if any {
        h | 1
    } else {
        0
    }
}

/// All defaults and an empty prompt.
impl Default for CompletionRequest {
    fn default() -> Self {
        CompletionRequest {
            prompt: Vec::new(),
            messages: None,
            infill: None,
            n_predict: -1,
            n_keep: 0,
            stop: Vec::new(),
            n_probs: 0,
            grammar: None,
            json_schema: None,
            chat: ChatOptions::default(),
            cache_prompt: true,
            context_shift: true,
            return_progress: false,
            ignore_eos: false,
            id_slot: None,
            prompt_media: Vec::new(),
            sampling: SamplingParams::default(),
            speculative: SpeculativeParams::default(),
            lora: None,
        }
    }
}

impl CompletionRequest {
    /// Its messages' images and audio, in order (each is a `MEDIA_MARKER`
    /// in its message's text).
    pub fn media(&self) -> Vec<&media::MediaInput> {
        self.messages.iter().flatten().flat_map(|m| m.media.iter()).chain(&self.prompt_media).collect()
    }

    /// The `generation_settings` object of the legacy final response.
    /// `eog`: the model's end-of-generation tokens, which `ignore_eos`
    /// bans (shown among the biases as never sampled, as llama-server
    /// shows them).
    pub fn generation_settings(&self, n_ctx: u32, model: &str, eog: &[i32]) -> Value {
        let s = &self.sampling;
        let spec = &self.speculative;
        let banned = eog.iter().filter(|_| self.ignore_eos).map(|&id| (id, None));
        let logit_bias: Vec<Value> = s
            .logit_bias
            .iter()
            .copied()
            .chain(banned)
            .map(|(id, bias)| Value::from(vec![id.into(), bias.map_or(Value::Bool(false), f32_json)]))
            .collect();
        let json_schema = self.json_schema.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or(Value::Null);
        let mut speculative = object([
            ("mode", spec.mode.as_str().into()),
            ("n_max", spec.n_max.into()),
            ("n_min", spec.n_min.into()),
            ("p_min", f32_json(spec.p_min)),
            ("adaptive", spec.adaptive.into()),
            ("n_parallel", spec.n_parallel.into()),
            ("p_split", f32_json(spec.p_split)),
        ]);
        if let Some(ns) = &spec.namespace {
            speculative["namespace"] = ns.as_str().into();
        }
        object([
            ("n_ctx", n_ctx.into()),
            ("model", model.into()),
            ("seed", s.seed.map_or(-1, i64::from).into()),
            ("temperature", f32_json(s.temperature)),
            ("temp", f32_json(s.temperature)),
            ("top_k", s.top_k.into()),
            ("top_p", f32_json(s.top_p)),
            ("min_p", f32_json(s.min_p)),
            ("typical_p", f32_json(s.typical_p)),
            ("repeat_last_n", s.repeat_last_n.into()),
            ("repeat_penalty", f32_json(s.repeat_penalty)),
            ("presence_penalty", f32_json(s.presence_penalty)),
            ("frequency_penalty", f32_json(s.frequency_penalty)),
            ("mirostat", s.mirostat.into()),
            ("mirostat_tau", f32_json(s.mirostat_tau)),
            ("mirostat_eta", f32_json(s.mirostat_eta)),
            ("stop", self.stop.clone().into()),
            ("n_predict", self.n_predict.into()),
            ("n_keep", self.n_keep.into()),
            ("ignore_eos", self.ignore_eos.into()),
            ("id_slot", self.id_slot.map_or(-1, |s| s as i64).into()),
            ("logit_bias", logit_bias.into()),
            ("n_probs", self.n_probs.into()),
            ("grammar", self.grammar.as_deref().unwrap_or("").into()),
            ("json_schema", json_schema),
            ("cache_prompt", self.cache_prompt.into()),
            ("context_shift", self.context_shift.into()),
            ("return_progress", self.return_progress.into()),
            ("tool_choice", self.chat.tool_choice.to_json()),
            ("parallel_tool_calls", self.chat.parallel_tool_calls.into()),
            ("reasoning_format", self.chat.reasoning_format.as_str().into()),
            ("reasoning_budget", self.chat.reasoning_budget.map_or(-1, i64::from).into()),
            ("speculative", speculative),
            (
                "lora",
                self.lora.as_ref().map_or(Value::Null, |l| {
                    l.iter().map(|&(id, scale)| object([("id", id.into()), ("scale", f32_json(scale))])).collect::<Vec<_>>().into()
                }),
            ),
        ])
    }
}
