//! The one list of request fields: each wire name with how its value is
//! checked, its default and a line of documentation. The parser reads its
//! ranges from here; the fuzz tests draw field names from here; the binding
//! exports the list (`requestFields()`), from which the CLI builds its flags,
//! the OpenAI example server its pass-through, and the docs test checks
//! `index.d.ts` and the README.

use serde_json::{json, Value};

const I32_MAX: i64 = i32::MAX as i64;
const I32_MIN: i64 = i32::MIN as i64;
const INF: f64 = f64::INFINITY;

/// How a field's value is checked.
/// The strings of a `Kind::Listed`, computed from their table.
#[derive(Clone, Copy)]
pub struct Listing(pub fn() -> &'static [&'static str]);

impl Listing {
    pub fn get(&self) -> &'static [&'static str] {
        (self.0)()
    }
}

impl PartialEq for Listing {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl std::fmt::Debug for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// An integral number (`5.0` counts) in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    /// A finite number in `min..=max` (infinite bounds: unbounded).
    Float {
        min: f64,
        max: f64,
    },
    Bool,
    Text,
    /// One of these strings.
    Choice(&'static [&'static str]),
    /// One of the strings a table elsewhere lists (the drafters' modes).
    Listed(Listing),
    /// An object whose fields are listed too.
    Object(&'static [Field]),
    /// A structured value checked by its own parser; its TypeScript type.
    Other(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
    /// The default as JSON text; empty when there is none (required, or
    /// absent means "not used").
    pub default: &'static str,
    pub doc: &'static str,
}

impl Field {
    const fn new(name: &'static str, kind: Kind, default: &'static str, doc: &'static str) -> Field {
        Field { name, kind, default, doc }
    }

    /// Its type in `index.d.ts`.
    pub fn ts_type(&self) -> String {
        match self.kind {
            Kind::Int { .. } | Kind::Float { .. } => "number".into(),
            Kind::Bool => "boolean".into(),
            Kind::Text => "string".into(),
            Kind::Choice(names) => names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(" | "),
            Kind::Listed(names) => names.get().iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(" | "),
            Kind::Object(_) => "object".into(),
            Kind::Other(ts) => ts.into(),
        }
    }

    /// The field as the binding exports it.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "name": self.name, "type": self.ts_type(), "doc": self.doc });
        let default = serde_json::from_str::<Value>(self.default).ok();
        if let Some(d) = default {
            v["default"] = d;
        }
        match self.kind {
            Kind::Int { min, max } => {
                v["kind"] = "int".into();
                v["min"] = min.into();
                v["max"] = max.into();
            }
            Kind::Float { min, max } => {
                v["kind"] = "float".into();
                if min.is_finite() {
                    v["min"] = min.into();
                }
                if max.is_finite() {
                    v["max"] = max.into();
                }
            }
            Kind::Bool => v["kind"] = "bool".into(),
            Kind::Text => v["kind"] = "string".into(),
            Kind::Choice(names) => {
                v["kind"] = "choice".into();
                v["choices"] = names.to_vec().into();
            }
            Kind::Listed(names) => {
                v["kind"] = "choice".into();
                v["choices"] = names.get().to_vec().into();
            }
            Kind::Object(fields) => {
                v["kind"] = "object".into();
                v["fields"] = fields.iter().map(Field::to_json).collect::<Vec<_>>().into();
            }
            Kind::Other(_) => v["kind"] = "other".into(),
        }
        v
    }
}

pub const PROMPT: Field = Field::new(
    "prompt",
    Kind::Other("string | (string | number)[]"),
    "",
    "the prompt: a string, or an array mixing strings and token ids (exactly one of prompt and messages)",
);
pub const MESSAGES: Field =
    Field::new("messages", Kind::Other("ChatMessage[]"), "", "chat messages, rendered with the model's chat template");
pub const INPUT_PREFIX: Field = Field::new(
    "input_prefix",
    Kind::Text,
    "",
    "fill-in-the-middle: the text before the gap (with input_suffix; the model's FIM tokens frame them, prompt is appended to it)",
);
pub const INPUT_SUFFIX: Field = Field::new("input_suffix", Kind::Text, "", "fill-in-the-middle: the text after the gap");
pub const INPUT_EXTRA: Field = Field::new(
    "input_extra",
    Kind::Other("{ filename?: string; text: string }[]"),
    "",
    "fill-in-the-middle: other files of the project, put before the prefix",
);
pub const N_PREDICT: Field = Field::new(
    "n_predict",
    Kind::Int { min: -1, max: I32_MAX },
    "-1",
    "tokens to generate; -1 = until end of generation or a full context",
);
pub const N_KEEP: Field = Field::new(
    "n_keep",
    Kind::Int { min: -1, max: I32_MAX },
    "0",
    "prompt tokens kept when the prompt is truncated or the context shifted (-1 = all)",
);
pub const STOP: Field = Field::new("stop", Kind::Other("string | string[]"), "[]", "stop strings (not part of the output)");
pub const N_PROBS: Field =
    Field::new("n_probs", Kind::Int { min: 0, max: 256 }, "0", "top-n probabilities per token in events and the result");
pub const GRAMMAR: Field = Field::new("grammar", Kind::Text, "", "a GBNF grammar constraining the output");
pub const JSON_SCHEMA: Field =
    Field::new("json_schema", Kind::Other("object | boolean | string"), "", "a JSON schema the output must match");
pub const CACHE_PROMPT: Field =
    Field::new("cache_prompt", Kind::Bool, "true", "reuse the KV cache for the longest common prefix with earlier requests");
pub const CONTEXT_SHIFT: Field = Field::new(
    "context_shift",
    Kind::Bool,
    "true",
    "a full context shifts (a long prompt is truncated); false: such a prompt is refused (CONTEXT_EXCEEDED) and such a generation ends",
);
pub const RETURN_PROGRESS: Field = Field::new(
    "return_progress",
    Kind::Bool,
    "false",
    "a progress event as the prompt is evaluated: { total, cache, processed, time_ms } before the first chunk and after each",
);
pub const ID_SLOT: Field = Field::new(
    "id_slot",
    Kind::Int { min: -1, max: I32_MAX },
    "-1",
    "the slot to run in when it is free (llama-server's: its cells are reused as far as they match); -1: the free slot whose cells fit the prompt best",
);
pub const IGNORE_EOS: Field = Field::new("ignore_eos", Kind::Bool, "false", "keep generating past end-of-generation tokens");
pub const TEMPERATURE: Field = Field::new("temperature", Kind::Float { min: -INF, max: INF }, "0.8", "<= 0 is greedy");
pub const TOP_K: Field = Field::new("top_k", Kind::Int { min: I32_MIN, max: I32_MAX }, "40", "top-k sampling (<= 0 disables)");
pub const TOP_P: Field = Field::new("top_p", Kind::Float { min: 0.0, max: 1.0 }, "0.95", "top-p (nucleus) sampling (1 disables)");
pub const MIN_P: Field = Field::new("min_p", Kind::Float { min: 0.0, max: 1.0 }, "0.05", "min-p sampling (0 disables)");
pub const TYPICAL_P: Field = Field::new("typical_p", Kind::Float { min: 0.0, max: 1.0 }, "1.0", "locally typical sampling (1 disables)");
pub const REPEAT_LAST_N: Field = Field::new(
    "repeat_last_n",
    Kind::Int { min: -1, max: I32_MAX },
    "64",
    "tokens of prompt and output the penalties look at (-1 = the whole context)",
);
pub const REPEAT_PENALTY: Field =
    Field::new("repeat_penalty", Kind::Float { min: 0.0, max: INF }, "1.0", "repetition penalty (1 disables)");
pub const PRESENCE_PENALTY: Field = Field::new("presence_penalty", Kind::Float { min: -INF, max: INF }, "0.0", "presence penalty");
pub const FREQUENCY_PENALTY: Field = Field::new("frequency_penalty", Kind::Float { min: -INF, max: INF }, "0.0", "frequency penalty");
pub const MIROSTAT: Field = Field::new("mirostat", Kind::Int { min: 0, max: 2 }, "0", "Mirostat sampling, version 1 or 2 (0 = off)");
pub const MIROSTAT_TAU: Field = Field::new("mirostat_tau", Kind::Float { min: 0.0, max: INF }, "5.0", "Mirostat target entropy");
pub const MIROSTAT_ETA: Field = Field::new("mirostat_eta", Kind::Float { min: 0.0, max: INF }, "0.1", "Mirostat learning rate");
pub const SEED: Field = Field::new(
    "seed",
    Kind::Int { min: -1, max: u32::MAX as i64 },
    "-1",
    "sampling seed (-1 = random); the same seed gives the same output",
);
pub const LOGIT_BIAS: Field = Field::new(
    "logit_bias",
    Kind::Other("[number, number | false][] | Record<string, number | false>"),
    "[]",
    "[[token, bias | false], …]; false bans the token",
);

pub const TOOLS: Field = Field::new("tools", Kind::Other("ChatTool[]"), "", "functions the model may call (OpenAI's shape); with messages");
pub const TOOL_CHOICE: Field = Field::new(
    "tool_choice",
    Kind::Other("\"auto\" | \"none\" | \"required\" | { type: \"function\"; function: { name: string } }"),
    "\"auto\"",
    "whether and which tool the model calls; a call it starts is always valid",
);
pub const PARALLEL_TOOL_CALLS: Field =
    Field::new("parallel_tool_calls", Kind::Bool, "true", "whether the model may call several tools in one turn");
pub const RESPONSE_FORMAT: Field = Field::new(
    "response_format",
    Kind::Other("{ type: \"text\" | \"json_object\" } | { type: \"json_schema\"; json_schema: { name?: string; schema?: object; strict?: boolean } }"),
    "",
    "the answer as JSON (matching a schema)",
);
pub const CHAT_TEMPLATE_KWARGS: Field = Field::new(
    "chat_template_kwargs",
    Kind::Other("Record<string, unknown>"),
    "",
    "extra variables for the chat template (e.g. enable_thinking)",
);
pub const REASONING_FORMAT: Field = Field::new(
    "reasoning_format",
    Kind::Choice(&["auto", "none"]),
    "\"auto\"",
    "auto: the model's <think> reasoning goes to reasoning_content; none: it stays in content",
);
pub const REASONING_EFFORT: Field = Field::new(
    "reasoning_effort",
    Kind::Choice(&["low", "medium", "high"]),
    "",
    "how much the model should think, for templates that read it (gpt-oss); the template variable reasoning_effort",
);
pub const REASONING_BUDGET: Field = Field::new(
    "reasoning_budget",
    Kind::Int { min: -1, max: I32_MAX },
    "-1",
    "most tokens of thinking per block: at the budget the family's end of thinking is forced and the answer goes on (-1: no limit; 0: none)",
);
pub const LORA: Field = Field::new(
    "lora",
    Kind::Other("{ id: number; scale: number }[]"),
    "",
    "LoRA adapters for this request: ids in load order (EngineOptions.loras), adapters not listed off; absent: the load scales",
);

pub const SPEC_MODE: Field = Field::new(
    "mode",
    Kind::Listed(Listing(crate::speculation::registry::mode_names)),
    "\"auto\"",
    "which drafters propose tokens (auto = every drafter this engine has)",
);
pub const SPEC_N_MAX: Field = Field::new("n_max", Kind::Int { min: 0, max: 64 }, "16", "most tokens drafted in one step");
pub const SPEC_N_MIN: Field = Field::new("n_min", Kind::Int { min: 0, max: 64 }, "0", "drafts shorter than this are dropped");
pub const SPEC_P_MIN: Field = Field::new(
    "p_min",
    Kind::Float { min: 0.0, max: 1.0 },
    "0.75",
    "the draft model stops drafting when its top candidate is less probable than this; with adaptive, where tokens that sure stop paying (learnt, never above this)",
);
pub const SPEC_ADAPTIVE: Field =
    Field::new("adaptive", Kind::Bool, "true", "choose the draft length each step from measured costs; false drafts up to n_max");
pub const SPEC_N_PARALLEL: Field = Field::new("n_parallel", Kind::Int { min: 1, max: 8 }, "1", "draft-tree branches (1 = a chain)");
pub const SPEC_P_SPLIT: Field = Field::new(
    "p_split",
    Kind::Float { min: 0.0, max: 1.0 },
    "0.1",
    "a draft-tree branch splits where the runner-up is more probable than this",
);

pub const SPEC_NAMESPACE: Field = Field::new(
    "namespace",
    Kind::Text,
    "",
    "which of the suffix drafter's shared indexes this request reads and adds its output to (one per agent or project; at most 128 bytes); absent: the engine's suffixNamespace",
);

pub const SPECULATIVE_FIELDS: &[Field] =
    &[SPEC_MODE, SPEC_N_MAX, SPEC_N_MIN, SPEC_P_MIN, SPEC_ADAPTIVE, SPEC_N_PARALLEL, SPEC_P_SPLIT, SPEC_NAMESPACE];

pub const SPECULATIVE: Field = Field::new("speculative", Kind::Object(SPECULATIVE_FIELDS), "", "speculative decoding settings");

/// Every request field, in documentation order.
pub const REQUEST_FIELDS: &[Field] = &[
    PROMPT,
    MESSAGES,
    INPUT_PREFIX,
    INPUT_SUFFIX,
    INPUT_EXTRA,
    N_PREDICT,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    MIN_P,
    TYPICAL_P,
    REPEAT_LAST_N,
    REPEAT_PENALTY,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    MIROSTAT,
    MIROSTAT_TAU,
    MIROSTAT_ETA,
    SEED,
    N_KEEP,
    STOP,
    IGNORE_EOS,
    LOGIT_BIAS,
    N_PROBS,
    GRAMMAR,
    JSON_SCHEMA,
    TOOLS,
    TOOL_CHOICE,
    PARALLEL_TOOL_CALLS,
    RESPONSE_FORMAT,
    CHAT_TEMPLATE_KWARGS,
    REASONING_FORMAT,
    REASONING_EFFORT,
    REASONING_BUDGET,
    LORA,
    CACHE_PROMPT,
    CONTEXT_SHIFT,
    RETURN_PROGRESS,
    ID_SLOT,
    SPECULATIVE,
];

/// The list as the binding exports it.
pub fn request_fields_json() -> Value {
    REQUEST_FIELDS.iter().map(Field::to_json).collect::<Vec<_>>().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse_request, RequestLimits};

    #[test]
    fn names_are_unique() {
        for list in [REQUEST_FIELDS, SPECULATIVE_FIELDS] {
            let mut names: Vec<&str> = list.iter().map(|f| f.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), list.len());
        }
    }

    /// The documented default of every field is what the parser fills in
    /// (as `generation_settings` reports it).
    #[test]
    fn documented_defaults_are_the_parsers() {
        let limits = RequestLimits { n_vocab: 100, n_ctx: 512 };
        let r = parse_request(&json!({ "prompt": "x" }), &limits).unwrap();
        let settings = r.generation_settings(512, "m", &[]);
        let mut checked = 0;
        for (list, at) in [(REQUEST_FIELDS, &settings), (SPECULATIVE_FIELDS, &settings["speculative"])] {
            for f in list {
                let Ok(default) = serde_json::from_str::<Value>(f.default) else { continue };
                let actual = &at[f.name];
                let same = match (&default, actual) {
                    (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                    (a, b) => a == b,
                };
                assert!(same, "{}: documented {default}, parsed {actual}", f.name);
                checked += 1;
            }
        }
        assert!(checked >= 25, "{checked}");
    }

    #[test]
    fn exported_shape() {
        let v = request_fields_json();
        let top_p = v.as_array().unwrap().iter().find(|f| f["name"] == "top_p").unwrap();
        assert_eq!(top_p["kind"], "float");
        assert_eq!(top_p["min"], 0.0);
        assert_eq!(top_p["max"], 1.0);
        let spec = v.as_array().unwrap().iter().find(|f| f["name"] == "speculative").unwrap();
        assert_eq!(spec["fields"].as_array().unwrap().len(), SPECULATIVE_FIELDS.len());
        assert_eq!(SPEC_MODE.ts_type().matches('|').count() + 1, crate::speculation::registry::mode_names().len());
        assert!(SPEC_MODE.ts_type().starts_with(r#""auto" | "off" | "suffix" | "ngram" | "draft""#));
    }
}
