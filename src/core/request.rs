//! Completion requests: parsing and validation of the llama.cpp server /
//! legacy JSON-RPC fields (CONTRACT.md §3).
//!
//! Everything a request carries is checked here, before any of it reaches
//! llama.cpp: its asserts abort the whole process, so no value may get past
//! this module unchecked.

use std::borrow::Cow;
use std::fmt::Display;

use serde_json::{Map, Number, Value};

use crate::core::chat::{parse_messages, ChatMessage};
use crate::core::error::{EngineError, Result};
use crate::core::gbnf::check_gbnf;

const MAX_PROMPT_BYTES: usize = 8 * 1024 * 1024;
const MAX_PROMPT_ITEMS: usize = 1_000_000;
const MAX_STOP_STRINGS: usize = 64;
const MAX_STOP_BYTES: usize = 1024;
const MAX_N_PROBS: i64 = 256;
/// Kept below serde_json's parser recursion limit (128) so the schema we store
/// can always be parsed back, and so nothing downstream recurses too deeply.
const MAX_SCHEMA_DEPTH: usize = 100;
const I32_MAX: i64 = i32::MAX as i64;
const I32_MIN: i64 = i32::MIN as i64;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    #[default]
    Auto,
    Off,
    Draft,
    Ngram,
    NgramDraft,
}

impl SpecMode {
    pub const ALL: [SpecMode; 5] = [SpecMode::Auto, SpecMode::Off, SpecMode::Draft, SpecMode::Ngram, SpecMode::NgramDraft];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecMode::Auto => "auto",
            SpecMode::Off => "off",
            SpecMode::Draft => "draft",
            SpecMode::Ngram => "ngram",
            SpecMode::NgramDraft => "ngram+draft",
        }
    }

    /// Parses a wire name (case-sensitive).
    pub fn parse(name: &str) -> Option<SpecMode> {
        Self::ALL.into_iter().find(|mode| mode.as_str() == name)
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
}

impl Default for SpeculativeParams {
    fn default() -> Self {
        SpeculativeParams { mode: SpecMode::Auto, n_max: 16, n_min: 0, p_min: 0.75, adaptive: true, n_parallel: 1, p_split: 0.1 }
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
    pub cache_prompt: bool,
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
    pub speculative: SpeculativeParams,
}

/// All defaults and an empty prompt.
impl Default for CompletionRequest {
    fn default() -> Self {
        CompletionRequest {
            prompt: Vec::new(),
            messages: None,
            n_predict: -1,
            n_keep: 0,
            stop: Vec::new(),
            n_probs: 0,
            grammar: None,
            json_schema: None,
            cache_prompt: true,
            ignore_eos: false,
            sampling: SamplingParams::default(),
            speculative: SpeculativeParams::default(),
        }
    }
}

impl CompletionRequest {
    /// The `generation_settings` object of the legacy final response.
    pub fn generation_settings(&self, n_ctx: u32, model: &str) -> Value {
        let s = &self.sampling;
        let spec = &self.speculative;
        let logit_bias: Vec<Value> =
            s.logit_bias.iter().map(|&(id, bias)| Value::from(vec![id.into(), bias.map_or(Value::Bool(false), f32_json)])).collect();
        let json_schema = self.json_schema.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or(Value::Null);
        let speculative = object([
            ("mode", spec.mode.as_str().into()),
            ("n_max", spec.n_max.into()),
            ("n_min", spec.n_min.into()),
            ("p_min", f32_json(spec.p_min)),
            ("adaptive", spec.adaptive.into()),
            ("n_parallel", spec.n_parallel.into()),
            ("p_split", f32_json(spec.p_split)),
        ]);
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
            ("logit_bias", logit_bias.into()),
            ("n_probs", self.n_probs.into()),
            ("grammar", self.grammar.as_deref().unwrap_or("").into()),
            ("json_schema", json_schema),
            ("cache_prompt", self.cache_prompt.into()),
            ("speculative", speculative),
        ])
    }
}

/// Parses and validates a request object.
pub fn parse_request(value: &Value, limits: &RequestLimits) -> Result<CompletionRequest> {
    let map =
        value.as_object().ok_or_else(|| EngineError::invalid("request", format!("expected a JSON object, got {}", type_name(value))))?;
    let f = Fields { map, prefix: "" };
    let d = CompletionRequest::default();

    let (prompt, messages) = match (f.get("prompt"), f.get("messages")) {
        (Some(_), Some(_)) => return Err(f.err("messages", "give either prompt or messages, not both")),
        (None, Some(m)) => (Vec::new(), Some(parse_messages(m, "messages")?)),
        (p, None) => (parse_prompt(p, limits.n_vocab)?, None),
    };
    let grammar = f.string("grammar")?.filter(|g| !g.is_empty()).map(str::to_owned);
    if let Some(g) = &grammar {
        check_gbnf(g).map_err(|why| EngineError::invalid("grammar", why))?;
    }
    let json_schema = parse_json_schema(f.get("json_schema"))?;
    if grammar.is_some() && json_schema.is_some() {
        return Err(f.err("json_schema", "grammar and json_schema cannot both be set"));
    }

    Ok(CompletionRequest {
        prompt,
        messages,
        n_predict: f.int("n_predict", -1, I32_MAX)?.unwrap_or(d.n_predict),
        n_keep: f.int("n_keep", -1, I32_MAX)?.unwrap_or(d.n_keep),
        stop: parse_stop(f.get("stop"))?,
        n_probs: f.int("n_probs", 0, MAX_N_PROBS)?.unwrap_or(d.n_probs),
        grammar,
        json_schema,
        cache_prompt: f.bool("cache_prompt")?.unwrap_or(d.cache_prompt),
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(d.ignore_eos),
        sampling: parse_sampling(&f, limits)?,
        speculative: parse_speculative(f.get("speculative"))?,
    })
}

/// The legacy JSON-RPC form: a JSON object is a request, any other text is a
/// plain prompt with all defaults.
pub fn parse_request_json(text: &str, limits: &RequestLimits) -> Result<CompletionRequest> {
    if text.trim_start().starts_with('{') {
        let value: Value = serde_json::from_str(text).map_err(|e| EngineError::invalid("request", format!("invalid JSON: {e}")))?;
        return parse_request(&value, limits);
    }
    check_prompt_size(text.len())?;
    Ok(CompletionRequest { prompt: vec![PromptPart::Text(text.to_owned())], ..Default::default() })
}

fn parse_sampling(f: &Fields<'_>, limits: &RequestLimits) -> Result<SamplingParams> {
    let d = SamplingParams::default();
    let any = (f64::NEG_INFINITY, f64::INFINITY);
    let non_negative = (0.0, f64::INFINITY);
    let unit = (0.0, 1.0);
    Ok(SamplingParams {
        temperature: f.float("temperature", any)?.unwrap_or(d.temperature),
        top_k: f.int("top_k", I32_MIN, I32_MAX)?.unwrap_or(d.top_k),
        top_p: f.float("top_p", unit)?.unwrap_or(d.top_p),
        min_p: f.float("min_p", unit)?.unwrap_or(d.min_p),
        typical_p: f.float("typical_p", unit)?.unwrap_or(d.typical_p),
        repeat_last_n: f.int("repeat_last_n", -1, I32_MAX)?.unwrap_or(d.repeat_last_n),
        repeat_penalty: f.float("repeat_penalty", non_negative)?.unwrap_or(d.repeat_penalty),
        presence_penalty: f.float("presence_penalty", any)?.unwrap_or(d.presence_penalty),
        frequency_penalty: f.float("frequency_penalty", any)?.unwrap_or(d.frequency_penalty),
        mirostat: f.int("mirostat", 0, 2)?.unwrap_or(d.mirostat),
        mirostat_tau: f.float("mirostat_tau", non_negative)?.unwrap_or(d.mirostat_tau),
        mirostat_eta: f.float("mirostat_eta", non_negative)?.unwrap_or(d.mirostat_eta),
        // -1 is the wire spelling of "random".
        seed: f.int::<i64>("seed", -1, u32::MAX.into())?.and_then(|s| u32::try_from(s).ok()),
        logit_bias: parse_logit_bias(f.get("logit_bias"), limits.n_vocab)?,
    })
}

fn parse_speculative(value: Option<&Value>) -> Result<SpeculativeParams> {
    let d = SpeculativeParams::default();
    let map = match value {
        None => return Ok(d),
        Some(Value::Object(map)) => map,
        Some(other) => return Err(EngineError::invalid("speculative", format!("expected an object, got {}", type_name(other)))),
    };
    let f = Fields { map, prefix: "speculative." };
    let mode = f.check("mode", |v| {
        let name = v.as_str().ok_or_else(|| format!("expected a string, got {}", type_name(v)))?;
        SpecMode::parse(name).ok_or_else(|| {
            let names: Vec<String> = SpecMode::ALL.iter().map(|m| format!("{:?}", m.as_str())).collect();
            format!("expected one of {}, got {:?}", names.join(", "), truncate(name, 40))
        })
    })?;
    let n_max = f.int("n_max", 0, 64)?.unwrap_or(d.n_max);
    let n_min = f.int("n_min", 0, 64)?.unwrap_or(d.n_min);
    if n_min > n_max {
        return Err(f.err("n_min", format!("must be <= n_max ({n_max}), got {n_min}")));
    }
    Ok(SpeculativeParams {
        mode: mode.unwrap_or(d.mode),
        n_max,
        n_min,
        p_min: f.float("p_min", (0.0, 1.0))?.unwrap_or(d.p_min),
        adaptive: f.bool("adaptive")?.unwrap_or(d.adaptive),
        n_parallel: f.int("n_parallel", 1, 8)?.unwrap_or(d.n_parallel),
        p_split: f.float("p_split", (0.0, 1.0))?.unwrap_or(d.p_split),
    })
}

fn parse_prompt(value: Option<&Value>, n_vocab: i32) -> Result<Vec<PromptPart>> {
    let items = match value {
        None => return Err(EngineError::invalid("prompt", "required (or messages)")),
        Some(Value::String(text)) => {
            check_prompt_size(text.len())?;
            return Ok(vec![PromptPart::Text(text.clone())]);
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(EngineError::invalid(
                "prompt",
                format!("expected a string or an array of strings and token ids, got {}", type_name(other)),
            ))
        }
    };
    if items.len() > MAX_PROMPT_ITEMS {
        return Err(EngineError::invalid("prompt", format!("at most {MAX_PROMPT_ITEMS} items are allowed, got {}", items.len())));
    }
    let mut text_bytes = 0;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(text) => {
                text_bytes += text.len();
                check_prompt_size(text_bytes)?;
                Ok(PromptPart::Text(text.clone()))
            }
            Value::Number(_) => {
                token_id(item, n_vocab).map(PromptPart::Token).map_err(|why| EngineError::invalid(&format!("prompt[{i}]"), why))
            }
            other => {
                Err(EngineError::invalid(&format!("prompt[{i}]"), format!("expected a string or a token id, got {}", type_name(other))))
            }
        })
        .collect()
}

fn check_prompt_size(bytes: usize) -> Result<()> {
    if bytes > MAX_PROMPT_BYTES {
        return Err(EngineError::invalid("prompt", format!("at most {MAX_PROMPT_BYTES} bytes of text are allowed, got {bytes} or more")));
    }
    Ok(())
}

fn parse_stop(value: Option<&Value>) -> Result<Vec<String>> {
    let items = match value {
        None => return Ok(Vec::new()),
        Some(Value::String(text)) => {
            let text = stop_string(text).map_err(|why| EngineError::invalid("stop", why))?;
            return Ok(text.into_iter().collect());
        }
        Some(Value::Array(items)) => items,
        Some(other) => return Err(EngineError::invalid("stop", format!("expected an array of strings, got {}", type_name(other)))),
    };
    if items.len() > MAX_STOP_STRINGS {
        return Err(EngineError::invalid("stop", format!("at most {MAX_STOP_STRINGS} strings are allowed, got {}", items.len())));
    }
    let mut stop = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let text = item
            .as_str()
            .ok_or_else(|| format!("expected a string, got {}", type_name(item)))
            .and_then(stop_string)
            .map_err(|why| EngineError::invalid(&format!("stop[{i}]"), why))?;
        stop.extend(text);
    }
    Ok(stop)
}

/// `None` for an empty stop string: it would match everywhere.
fn stop_string(text: &str) -> Result<Option<String>, String> {
    if text.len() > MAX_STOP_BYTES {
        return Err(format!("at most {MAX_STOP_BYTES} bytes are allowed, got {}", text.len()));
    }
    Ok((!text.is_empty()).then(|| text.to_owned()))
}

fn parse_logit_bias(value: Option<&Value>, n_vocab: i32) -> Result<Vec<(i32, Option<f32>)>> {
    let max_entries = usize::try_from(n_vocab).unwrap_or(0);
    let too_many = |n: usize| EngineError::invalid("logit_bias", format!("at most {max_entries} entries are allowed, got {n}"));
    match value {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            if items.len() > max_entries {
                return Err(too_many(items.len()));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| bias_pair(item, n_vocab).map_err(|why| EngineError::invalid(&format!("logit_bias[{i}]"), why)))
                .collect()
        }
        Some(Value::Object(map)) => {
            if map.len() > max_entries {
                return Err(too_many(map.len()));
            }
            map.iter()
                .map(|(key, bias)| {
                    let token = key.parse::<i32>().ok().filter(|&t| (0..n_vocab).contains(&t)).ok_or_else(|| {
                        EngineError::invalid(
                            "logit_bias",
                            format!("key {:?} is not a token id between 0 and {}", truncate(key, 40), i64::from(n_vocab) - 1),
                        )
                    })?;
                    let bias = bias_value(bias).map_err(|why| EngineError::invalid(&format!("logit_bias.{token}"), why))?;
                    Ok((token, bias))
                })
                .collect()
        }
        Some(other) => {
            Err(EngineError::invalid("logit_bias", format!("expected an array of [token, bias] pairs, got {}", type_name(other))))
        }
    }
}

fn bias_pair(item: &Value, n_vocab: i32) -> Result<(i32, Option<f32>), String> {
    match item {
        Value::Array(pair) if pair.len() == 2 => {
            let token = token_id(&pair[0], n_vocab).map_err(|why| format!("token: {why}"))?;
            let bias = bias_value(&pair[1]).map_err(|why| format!("bias: {why}"))?;
            Ok((token, bias))
        }
        Value::Array(other) => Err(format!("expected a [token, bias] pair, got an array of {} items", other.len())),
        other => Err(format!("expected a [token, bias] pair, got {}", type_name(other))),
    }
}

/// `false` → `None` (never sample the token).
fn bias_value(value: &Value) -> Result<Option<f32>, String> {
    match value {
        Value::Bool(false) => Ok(None),
        Value::Bool(true) => Err("expected a number or false, got true".to_owned()),
        _ => float_in(value, f64::NEG_INFINITY, f64::INFINITY).map(Some),
    }
}

fn token_id(value: &Value, n_vocab: i32) -> Result<i32, String> {
    let id = int_in(value, 0, i64::from(n_vocab) - 1)?;
    i32::try_from(id).map_err(|_| format!("{id} is not a token id"))
}

fn parse_json_schema(value: Option<&Value>) -> Result<Option<String>> {
    let invalid = |why: String| EngineError::invalid("json_schema", why);
    let schema = match value {
        None => return Ok(None),
        Some(Value::String(text)) if text.is_empty() => return Ok(None),
        Some(Value::String(text)) => Cow::Owned(serde_json::from_str::<Value>(text).map_err(|e| invalid(format!("not valid JSON: {e}")))?),
        Some(other) => Cow::Borrowed(other),
    };
    if !matches!(*schema, Value::Object(_) | Value::Bool(_)) {
        return Err(invalid(format!("expected a JSON schema (an object, a boolean or a string holding one), got {}", type_name(&schema))));
    }
    if nesting_exceeds(&schema, MAX_SCHEMA_DEPTH) {
        return Err(invalid(format!("nested more than {MAX_SCHEMA_DEPTH} levels deep")));
    }
    serde_json::to_string(&*schema).map(Some).map_err(|e| invalid(e.to_string()))
}

/// Iterative, so that a deeply nested value cannot overflow the stack here.
fn nesting_exceeds(value: &Value, limit: usize) -> bool {
    let mut stack = vec![(value, 1)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth > limit {
            return true;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

/// Typed access to the fields of one JSON object; `null` counts as absent.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Prepended to error field names, e.g. "speculative.".
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn err(&self, key: &str, why: impl Display) -> EngineError {
        EngineError::invalid(&format!("{}{key}", self.prefix), why)
    }

    fn check<T>(&self, key: &str, parse: impl FnOnce(&'a Value) -> Result<T, String>) -> Result<Option<T>> {
        self.get(key).map(parse).transpose().map_err(|why| self.err(key, why))
    }

    fn int<T: TryFrom<i64>>(&self, key: &str, min: i64, max: i64) -> Result<Option<T>> {
        self.check(key, |v| {
            let n = int_in(v, min, max)?;
            T::try_from(n).map_err(|_| format!("{n} is out of range"))
        })
    }

    /// `range` is inclusive; infinite bounds mean unbounded.
    fn float(&self, key: &str, range: (f64, f64)) -> Result<Option<f32>> {
        self.check(key, |v| float_in(v, range.0, range.1))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.check(key, |v| v.as_bool().ok_or_else(|| format!("expected a boolean, got {}", type_name(v))))
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>> {
        self.check(key, |v| v.as_str().ok_or_else(|| format!("expected a string, got {}", type_name(v))))
    }
}

/// An integral JSON number (`5.0` counts) in `min..=max`.
fn int_in(value: &Value, min: i64, max: i64) -> Result<i64, String> {
    let Value::Number(n) = value else {
        return Err(format!("expected an integer, got {}", type_name(value)));
    };
    let out_of_range = || format!("must be an integer between {min} and {max}, got {n}");
    let int = if let Some(int) = n.as_i64() {
        int
    } else if n.as_u64().is_some() {
        return Err(out_of_range());
    } else {
        let x = finite(n)?;
        if x.fract() != 0.0 {
            return Err(format!("expected an integer, got {n}"));
        }
        if x < min as f64 || x > max as f64 {
            return Err(out_of_range());
        }
        x as i64
    };
    if (min..=max).contains(&int) {
        Ok(int)
    } else {
        Err(out_of_range())
    }
}

/// A finite JSON number in `min..=max` that is also finite as an `f32`.
fn float_in(value: &Value, min: f64, max: f64) -> Result<f32, String> {
    let Value::Number(n) = value else {
        return Err(format!("expected a number, got {}", type_name(value)));
    };
    let x = finite(n)?;
    if x < min || x > max {
        return Err(match (min.is_finite(), max.is_finite()) {
            (true, true) => format!("must be between {min} and {max}, got {n}"),
            (true, false) => format!("must be >= {min}, got {n}"),
            _ => format!("must be <= {max}, got {n}"),
        });
    }
    let x = x as f32;
    if !x.is_finite() {
        return Err(format!("{n} is too large for a 32-bit float"));
    }
    // Normalizes -0.0, which would otherwise show up in generation_settings.
    Ok(if x == 0.0 { 0.0 } else { x })
}

fn finite(n: &Number) -> Result<f64, String> {
    n.as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("expected a finite number, got {n}"))
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// At most `max_chars` characters of user text, for error messages.
fn truncate(text: &str, max_chars: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => Cow::Owned(format!("{}…", &text[..end])),
        None => Cow::Borrowed(text),
    }
}

/// An `f32` as the JSON number with the shortest decimal form that reads back
/// as the same `f32` (0.8, not 0.800000011920929).
fn f32_json(x: f32) -> Value {
    let shortest = x.to_string().parse::<f64>().unwrap_or(f64::from(x));
    Number::from_f64(shortest).map_or(Value::Null, Value::Number)
}

fn object<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Object(entries.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::error::ErrorCode;
    use serde_json::json;

    const LIMITS: RequestLimits = RequestLimits { n_vocab: 1000, n_ctx: 4096 };

    fn parse(value: &Value) -> Result<CompletionRequest> {
        parse_request(value, &LIMITS)
    }

    fn ok(value: Value) -> CompletionRequest {
        parse(&value).unwrap_or_else(|e| panic!("{value} should parse: {e}"))
    }

    /// `fields` merged over a valid minimal request.
    fn with(fields: Value) -> Value {
        let mut request = json!({ "prompt": "Hello" });
        for (key, value) in fields.as_object().expect("an object") {
            request[key] = value.clone();
        }
        request
    }

    #[track_caller]
    fn assert_invalid(result: Result<CompletionRequest>, field: &str) -> String {
        let err = result.expect_err(&format!("expected an error on {field}"));
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{err}");
        assert!(err.message.starts_with(&format!("{field}: ")), "expected field {field:?}, got {:?}", err.message);
        err.message
    }

    #[track_caller]
    fn rejects(value: Value, field: &str) -> String {
        let result = parse(&value);
        assert_invalid(result, field)
    }

    #[test]
    fn defaults() {
        let r = ok(json!({ "prompt": "Hi" }));
        assert_eq!(r.prompt, vec![PromptPart::Text("Hi".into())]);
        assert_eq!(r, CompletionRequest { prompt: r.prompt.clone(), ..Default::default() });
        assert_eq!(r.n_predict, -1);
        assert_eq!(r.n_keep, 0);
        assert!(r.stop.is_empty());
        assert_eq!(r.n_probs, 0);
        assert_eq!(r.grammar, None);
        assert_eq!(r.json_schema, None);
        assert!(r.cache_prompt);
        assert!(!r.ignore_eos);

        let s = &r.sampling;
        assert_eq!(s.temperature, 0.8);
        assert_eq!(s.top_k, 40);
        assert_eq!(s.top_p, 0.95);
        assert_eq!(s.min_p, 0.05);
        assert_eq!(s.typical_p, 1.0);
        assert_eq!(s.repeat_last_n, 64);
        assert_eq!(s.repeat_penalty, 1.0);
        assert_eq!(s.presence_penalty, 0.0);
        assert_eq!(s.frequency_penalty, 0.0);
        assert_eq!(s.mirostat, 0);
        assert_eq!(s.mirostat_tau, 5.0);
        assert_eq!(s.mirostat_eta, 0.1);
        assert_eq!(s.seed, None);
        assert!(s.logit_bias.is_empty());

        let p = &r.speculative;
        assert_eq!(p.mode, SpecMode::Auto);
        assert_eq!(p.n_max, 16);
        assert_eq!(p.n_min, 0);
        assert_eq!(p.p_min, 0.75);
        assert!(p.adaptive);
        assert_eq!(p.n_parallel, 1);
        assert_eq!(p.p_split, 0.1);
    }

    #[test]
    fn null_fields_are_defaults_and_unknown_fields_ignored() {
        let r = ok(json!({
            "prompt": "x", "n_predict": null, "temperature": null, "stop": null, "logit_bias": null,
            "speculative": null, "grammar": null, "json_schema": null, "seed": null,
            "unknown": { "deep": [1, 2, "x"] }, "stream": true,
        }));
        assert_eq!(r, CompletionRequest { prompt: vec![PromptPart::Text("x".into())], ..Default::default() });
        let r = ok(json!({ "prompt": "x", "speculative": { "n_max": null, "whatever": 1 } }));
        assert_eq!(r.speculative, SpeculativeParams::default());
    }

    #[test]
    fn every_field_round_trips() {
        let r = ok(json!({
            "prompt": ["a", 1, "b", 999],
            "n_predict": 128, "n_keep": -1, "stop": ["</s>", "", "\n\n"], "n_probs": 256,
            "grammar": "root ::= \"x\"", "cache_prompt": false, "ignore_eos": true,
            "temperature": -0.5, "top_k": -3, "top_p": 0.5, "min_p": 0.0, "typical_p": 0.25,
            "repeat_last_n": -1, "repeat_penalty": 1.1, "presence_penalty": -2.0, "frequency_penalty": 1.5,
            "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2, "seed": 4294967295u64,
            "logit_bias": [[5, -1.5], [7, false], [0, 100]],
            "speculative": { "mode": "ngram+draft", "n_max": 8, "n_min": 2, "p_min": 0.5,
                             "adaptive": false, "n_parallel": 4, "p_split": 0.3 },
        }));
        assert_eq!(
            r.prompt,
            vec![PromptPart::Text("a".into()), PromptPart::Token(1), PromptPart::Text("b".into()), PromptPart::Token(999)]
        );
        assert_eq!((r.n_predict, r.n_keep, r.n_probs), (128, -1, 256));
        assert_eq!(r.stop, vec!["</s>".to_owned(), "\n\n".to_owned()]);
        assert_eq!(r.grammar.as_deref(), Some("root ::= \"x\""));
        assert!(!r.cache_prompt && r.ignore_eos);
        let s = &r.sampling;
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p, s.typical_p), (-0.5, -3, 0.5, 0.0, 0.25));
        assert_eq!((s.repeat_last_n, s.repeat_penalty), (-1, 1.1));
        assert_eq!((s.presence_penalty, s.frequency_penalty), (-2.0, 1.5));
        assert_eq!((s.mirostat, s.mirostat_tau, s.mirostat_eta), (2, 3.0, 0.2));
        assert_eq!(s.seed, Some(u32::MAX));
        assert_eq!(s.logit_bias, vec![(5, Some(-1.5)), (7, None), (0, Some(100.0))]);
        assert_eq!(
            r.speculative,
            SpeculativeParams { mode: SpecMode::NgramDraft, n_max: 8, n_min: 2, p_min: 0.5, adaptive: false, n_parallel: 4, p_split: 0.3 }
        );
    }

    #[test]
    fn spec_modes() {
        for mode in SpecMode::ALL {
            assert_eq!(SpecMode::parse(mode.as_str()), Some(mode));
            let r = ok(with(json!({ "speculative": { "mode": mode.as_str() } })));
            assert_eq!(r.speculative.mode, mode);
        }
        assert_eq!(SpecMode::parse("AUTO"), None);
    }

    #[test]
    fn seeds() {
        assert_eq!(ok(with(json!({ "seed": -1 }))).sampling.seed, None);
        assert_eq!(ok(with(json!({ "seed": -1.0 }))).sampling.seed, None);
        assert_eq!(ok(with(json!({ "seed": 0 }))).sampling.seed, Some(0));
        assert_eq!(ok(with(json!({ "seed": 42.0 }))).sampling.seed, Some(42));
        rejects(with(json!({ "seed": 4294967296u64 })), "seed");
        rejects(with(json!({ "seed": -2 })), "seed");
        rejects(with(json!({ "seed": "42" })), "seed");
    }

    #[test]
    fn integral_floats_and_negative_zero() {
        let r = ok(with(json!({ "n_predict": 5.0, "top_k": -0.0, "temperature": -0.0, "n_probs": 256.0 })));
        assert_eq!((r.n_predict, r.sampling.top_k, r.n_probs), (5, 0, 256));
        assert!(r.sampling.temperature.is_sign_positive());
        assert_eq!(ok(with(json!({ "n_predict": i32::MAX }))).n_predict, i32::MAX);
        assert_eq!(ok(with(json!({ "top_k": i32::MIN }))).sampling.top_k, i32::MIN);
    }

    #[test]
    fn prompt_forms() {
        assert_eq!(ok(json!({ "prompt": "" })).prompt, vec![PromptPart::Text(String::new())]);
        assert_eq!(ok(json!({ "prompt": [] })).prompt, vec![]);
        assert_eq!(ok(json!({ "prompt": [3.0] })).prompt, vec![PromptPart::Token(3)]);
        rejects(json!({ "prompt": [1, [2]] }), "prompt[1]");
        rejects(json!({ "prompt": [1, { "a": 1 }] }), "prompt[1]");
        rejects(json!({ "prompt": ["a", "b", 1000] }), "prompt[2]");
        rejects(json!({ "prompt": [-1] }), "prompt[0]");
        rejects(json!({ "prompt": [1.5] }), "prompt[0]");
        rejects(json!({ "prompt": [true] }), "prompt[0]");
        rejects(json!({ "prompt": [null] }), "prompt[0]");
        assert_eq!(rejects(json!({ "n_predict": 1 }), "prompt"), "prompt: required (or messages)");
        assert_eq!(rejects(json!({ "prompt": null }), "prompt"), "prompt: required (or messages)");
    }

    #[test]
    fn messages_instead_of_a_prompt() {
        let r = ok(json!({ "messages": [{ "role": "user", "content": "Hi" }] }));
        assert_eq!(r.prompt, vec![]);
        assert_eq!(r.messages.unwrap()[0].content.as_deref(), Some("Hi"));
        // `null` means absent, as for every field.
        assert!(ok(json!({ "prompt": "x", "messages": null })).messages.is_none());
        rejects(json!({ "prompt": "x", "messages": [{ "role": "user", "content": "Hi" }] }), "messages");
        rejects(json!({ "messages": {} }), "messages");
        rejects(json!({ "messages": [{ "role": "user", "content": 1 }] }), "messages[0].content");
    }

    #[test]
    fn prompt_size_limits() {
        let big = "x".repeat(MAX_PROMPT_BYTES);
        assert_eq!(ok(json!({ "prompt": big })).prompt.len(), 1);
        rejects(json!({ "prompt": format!("{big}y") }), "prompt");
        let half = "x".repeat(MAX_PROMPT_BYTES / 2 + 1);
        rejects(json!({ "prompt": [half.clone(), 5, half] }), "prompt");
        let many = Value::Array(vec![json!(1); MAX_PROMPT_ITEMS + 1]);
        rejects(json!({ "prompt": many }), "prompt");
        let max = Value::Array(vec![json!(1); MAX_PROMPT_ITEMS]);
        assert_eq!(ok(json!({ "prompt": max })).prompt.len(), MAX_PROMPT_ITEMS);
    }

    #[test]
    fn stop_forms() {
        assert_eq!(ok(with(json!({ "stop": "END" }))).stop, vec!["END".to_owned()]);
        assert!(ok(with(json!({ "stop": "" }))).stop.is_empty());
        assert!(ok(with(json!({ "stop": [] }))).stop.is_empty());
        let max: Vec<String> = (0..MAX_STOP_STRINGS).map(|i| i.to_string()).collect();
        assert_eq!(ok(with(json!({ "stop": max }))).stop.len(), MAX_STOP_STRINGS);
        let too_many: Vec<String> = (0..=MAX_STOP_STRINGS).map(|i| i.to_string()).collect();
        rejects(with(json!({ "stop": too_many })), "stop");
        assert_eq!(ok(with(json!({ "stop": ["é".repeat(512)] }))).stop[0].len(), 1024);
        rejects(with(json!({ "stop": ["a", "x".repeat(1025)] })), "stop[1]");
        rejects(with(json!({ "stop": "x".repeat(1025) })), "stop");
        rejects(with(json!({ "stop": ["a", 1] })), "stop[1]");
        rejects(with(json!({ "stop": 5 })), "stop");
    }

    #[test]
    fn logit_bias_forms() {
        let r = ok(with(json!({ "logit_bias": { "5": 2.5, "999": false, "0": -1 } })));
        let mut bias = r.sampling.logit_bias;
        bias.sort_by_key(|&(id, _)| id);
        assert_eq!(bias, vec![(0, Some(-1.0)), (5, Some(2.5)), (999, None)]);
        rejects(with(json!({ "logit_bias": [[1, 1.0], [2, 1.0], [3, 1.0], [1000, 1.0]] })), "logit_bias[3]");
        rejects(with(json!({ "logit_bias": [[1, true]] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": [[1, "1"]] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": [[1, 1e300]] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": [[1]] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": [[1, 2, 3]] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": [5] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": [["hello", 1]] })), "logit_bias[0]");
        rejects(with(json!({ "logit_bias": { "abc": 1 } })), "logit_bias");
        rejects(with(json!({ "logit_bias": { "1000": 1 } })), "logit_bias");
        rejects(with(json!({ "logit_bias": { "-1": 1 } })), "logit_bias");
        rejects(with(json!({ "logit_bias": { "5": true } })), "logit_bias.5");
        rejects(with(json!({ "logit_bias": "x" })), "logit_bias");
        let limits = RequestLimits { n_vocab: 2, n_ctx: 16 };
        let three = with(json!({ "logit_bias": [[0, 1], [1, 1], [0, 2]] }));
        assert_invalid(parse_request(&three, &limits), "logit_bias");
    }

    #[test]
    fn grammar_and_json_schema() {
        assert_eq!(ok(with(json!({ "grammar": "" }))).grammar, None);
        let schema = json!({ "type": "object", "properties": { "a": { "type": "integer" } } });
        let r = ok(with(json!({ "json_schema": schema.clone() })));
        assert_eq!(serde_json::from_str::<Value>(r.json_schema.as_deref().unwrap()).unwrap(), schema);
        let r = ok(with(json!({ "json_schema": schema.to_string() })));
        assert_eq!(serde_json::from_str::<Value>(r.json_schema.as_deref().unwrap()).unwrap(), schema);
        assert_eq!(ok(with(json!({ "json_schema": true }))).json_schema.as_deref(), Some("true"));
        assert_eq!(ok(with(json!({ "json_schema": "" }))).json_schema, None);
        // An empty grammar does not conflict.
        assert!(ok(with(json!({ "grammar": "", "json_schema": {} }))).json_schema.is_some());
        let msg = rejects(with(json!({ "grammar": "root ::= \"a\"", "json_schema": {} })), "json_schema");
        assert!(msg.contains("cannot both be set"), "{msg}");
        rejects(with(json!({ "json_schema": "{not json" })), "json_schema");
        rejects(with(json!({ "json_schema": "5" })), "json_schema");
        rejects(with(json!({ "json_schema": 5 })), "json_schema");
        rejects(with(json!({ "json_schema": [] })), "json_schema");
        rejects(with(json!({ "grammar": 5 })), "grammar");

        let mut deep = json!({});
        for _ in 0..MAX_SCHEMA_DEPTH - 1 {
            deep = json!({ "a": deep });
        }
        assert!(ok(with(json!({ "json_schema": deep.clone() }))).json_schema.is_some());
        rejects(with(json!({ "json_schema": { "a": deep } })), "json_schema");
    }

    #[test]
    fn speculative_rules() {
        rejects(with(json!({ "speculative": "draft" })), "speculative");
        rejects(with(json!({ "speculative": [] })), "speculative");
        rejects(with(json!({ "speculative": { "mode": "fast" } })), "speculative.mode");
        rejects(with(json!({ "speculative": { "mode": 1 } })), "speculative.mode");
        rejects(with(json!({ "speculative": { "n_max": 65 } })), "speculative.n_max");
        rejects(with(json!({ "speculative": { "n_max": -1 } })), "speculative.n_max");
        rejects(with(json!({ "speculative": { "n_min": 65 } })), "speculative.n_min");
        rejects(with(json!({ "speculative": { "n_min": 5, "n_max": 4 } })), "speculative.n_min");
        rejects(with(json!({ "speculative": { "n_min": 17 } })), "speculative.n_min");
        rejects(with(json!({ "speculative": { "p_min": 1.01 } })), "speculative.p_min");
        rejects(with(json!({ "speculative": { "p_split": -0.1 } })), "speculative.p_split");
        rejects(with(json!({ "speculative": { "n_parallel": 0 } })), "speculative.n_parallel");
        rejects(with(json!({ "speculative": { "n_parallel": 9 } })), "speculative.n_parallel");
        rejects(with(json!({ "speculative": { "adaptive": 1 } })), "speculative.adaptive");
        let r = ok(with(json!({ "speculative": { "n_min": 64, "n_max": 64, "n_parallel": 8 } })));
        assert_eq!((r.speculative.n_min, r.speculative.n_max, r.speculative.n_parallel), (64, 64, 8));
        assert_eq!(ok(with(json!({ "speculative": { "n_max": 0 } }))).speculative.n_max, 0);
    }

    #[test]
    fn malformed_requests() {
        let cases: Vec<(Value, &str)> = vec![
            (json!("just a string"), "request"),
            (json!([1, 2]), "request"),
            (json!(null), "request"),
            (json!(5), "request"),
            (json!({ "prompt": 5 }), "prompt"),
            (json!({ "prompt": true }), "prompt"),
            (json!({ "prompt": { "text": "x" } }), "prompt"),
            (with(json!({ "n_predict": "5" })), "n_predict"),
            (with(json!({ "n_predict": 5.5 })), "n_predict"),
            (with(json!({ "n_predict": -2 })), "n_predict"),
            (with(json!({ "n_predict": 2147483648u64 })), "n_predict"),
            (with(json!({ "n_predict": u64::MAX })), "n_predict"),
            (with(json!({ "n_predict": i64::MIN })), "n_predict"),
            (with(json!({ "n_predict": 1e308 })), "n_predict"),
            (with(json!({ "n_predict": -1e308 })), "n_predict"),
            (with(json!({ "n_keep": -2 })), "n_keep"),
            (with(json!({ "n_keep": true })), "n_keep"),
            (with(json!({ "n_probs": 257 })), "n_probs"),
            (with(json!({ "n_probs": -1 })), "n_probs"),
            (with(json!({ "temperature": "NaN" })), "temperature"),
            (with(json!({ "temperature": "Infinity" })), "temperature"),
            (with(json!({ "temperature": "-Infinity" })), "temperature"),
            (with(json!({ "temperature": 1e308 })), "temperature"),
            (with(json!({ "temperature": [0.5] })), "temperature"),
            (with(json!({ "top_k": 1.5 })), "top_k"),
            (with(json!({ "top_k": 3e9 })), "top_k"),
            (with(json!({ "top_p": 1.5 })), "top_p"),
            (with(json!({ "top_p": -0.01 })), "top_p"),
            (with(json!({ "min_p": 2 })), "min_p"),
            (with(json!({ "typical_p": -1 })), "typical_p"),
            (with(json!({ "repeat_last_n": -2 })), "repeat_last_n"),
            (with(json!({ "repeat_penalty": -0.5 })), "repeat_penalty"),
            (with(json!({ "presence_penalty": "1" })), "presence_penalty"),
            (with(json!({ "frequency_penalty": -1e39 })), "frequency_penalty"),
            (with(json!({ "mirostat": 3 })), "mirostat"),
            (with(json!({ "mirostat": 1.5 })), "mirostat"),
            (with(json!({ "mirostat": -1 })), "mirostat"),
            (with(json!({ "mirostat_tau": -1 })), "mirostat_tau"),
            (with(json!({ "mirostat_eta": -0.1 })), "mirostat_eta"),
            (with(json!({ "seed": 1.5 })), "seed"),
            (with(json!({ "seed": u64::MAX })), "seed"),
            (with(json!({ "cache_prompt": "true" })), "cache_prompt"),
            (with(json!({ "cache_prompt": 1 })), "cache_prompt"),
            (with(json!({ "ignore_eos": "false" })), "ignore_eos"),
            (with(json!({ "stop": { "a": 1 } })), "stop"),
            (with(json!({ "stop": [["nested"]] })), "stop[0]"),
            (with(json!({ "logit_bias": [[1.5, 1]] })), "logit_bias[0]"),
            (with(json!({ "logit_bias": 1 })), "logit_bias"),
            (with(json!({ "grammar": ["a"] })), "grammar"),
            (with(json!({ "speculative": true })), "speculative"),
            (with(json!({ "speculative": { "mode": "Draft" } })), "speculative.mode"),
            (with(json!({ "speculative": { "n_max": 4.5 } })), "speculative.n_max"),
        ];
        assert!(cases.len() >= 30);
        for (value, field) in cases {
            rejects(value, field);
        }
    }

    #[test]
    fn error_messages_are_helpful() {
        let msg = rejects(with(json!({ "n_predict": "5" })), "n_predict");
        assert!(msg.contains("got string"), "{msg}");
        let msg = rejects(with(json!({ "top_p": "0.5" })), "top_p");
        assert_eq!(msg, "top_p: expected a number, got string");
        let msg = rejects(with(json!({ "mirostat": 3 })), "mirostat");
        assert!(msg.contains("between 0 and 2"), "{msg}");
        let msg = rejects(with(json!({ "top_p": 2 })), "top_p");
        assert!(msg.contains("between 0 and 1"), "{msg}");
        let msg = rejects(with(json!({ "speculative": { "mode": "x".repeat(10_000) } })), "speculative.mode");
        assert!(msg.len() < 300, "{msg}");
    }

    #[test]
    fn json_text_forms() {
        let r = parse_request_json("Tell me a story", &LIMITS).unwrap();
        assert_eq!(r, CompletionRequest { prompt: vec![PromptPart::Text("Tell me a story".into())], ..Default::default() });
        // Plain text is kept verbatim, leading whitespace included.
        let r = parse_request_json("  [1, 2] not json", &LIMITS).unwrap();
        assert_eq!(r.prompt, vec![PromptPart::Text("  [1, 2] not json".into())]);
        assert_eq!(parse_request_json("", &LIMITS).unwrap().prompt, vec![PromptPart::Text(String::new())]);

        let r = parse_request_json(" \n{\"prompt\": [1, \"x\"], \"n_predict\": 3}", &LIMITS).unwrap();
        assert_eq!(r.prompt, vec![PromptPart::Token(1), PromptPart::Text("x".into())]);
        assert_eq!(r.n_predict, 3);

        assert_invalid(parse_request_json("{\"prompt\": ", &LIMITS), "request");
        assert_invalid(parse_request_json("{prompt: 'x'}", &LIMITS), "request");
        assert_invalid(parse_request_json("{\"prompt\": \"x\"} trailing", &LIMITS), "request");
        assert_invalid(parse_request_json("{\"n_predict\": 1}", &LIMITS), "prompt");
        assert_invalid(parse_request_json("{\"prompt\": \"x\", \"top_p\": NaN}", &LIMITS), "request");
        assert_invalid(parse_request_json("{\"prompt\": \"x\", \"n_predict\": 1e999}", &LIMITS), "request");
        let deep = format!("{{\"prompt\": \"x\", \"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_invalid(parse_request_json(&deep, &LIMITS), "request");
        let big = "y".repeat(MAX_PROMPT_BYTES + 1);
        assert_invalid(parse_request_json(&big, &LIMITS), "prompt");
    }

    #[test]
    fn generation_settings_shape() {
        let r = ok(json!({
            "prompt": "x", "temperature": 0.7, "seed": 7, "stop": ["a"], "n_predict": 10,
            "logit_bias": [[3, 0.5], [4, false]], "n_probs": 2, "json_schema": { "type": "string" },
            "speculative": { "mode": "ngram", "p_min": 0.6 },
        }));
        let gs = r.generation_settings(2048, "model.gguf");
        assert_eq!(gs["n_ctx"], 2048);
        assert_eq!(gs["model"], "model.gguf");
        assert_eq!(gs["seed"], 7);
        assert_eq!(gs["temperature"], json!(0.7));
        assert_eq!(gs["temp"], json!(0.7));
        assert_eq!(gs["top_k"], 40);
        assert_eq!(gs["top_p"], json!(0.95));
        assert_eq!(gs["min_p"], json!(0.05));
        assert_eq!(gs["typical_p"], json!(1.0));
        assert_eq!(gs["repeat_last_n"], 64);
        assert_eq!(gs["repeat_penalty"], json!(1.0));
        assert_eq!(gs["presence_penalty"], json!(0.0));
        assert_eq!(gs["frequency_penalty"], json!(0.0));
        assert_eq!(gs["mirostat"], 0);
        assert_eq!(gs["mirostat_tau"], json!(5.0));
        assert_eq!(gs["mirostat_eta"], json!(0.1));
        assert_eq!(gs["stop"], json!(["a"]));
        assert_eq!(gs["n_predict"], 10);
        assert_eq!(gs["n_keep"], 0);
        assert_eq!(gs["ignore_eos"], false);
        assert_eq!(gs["logit_bias"], json!([[3, 0.5], [4, false]]));
        assert_eq!(gs["n_probs"], 2);
        assert_eq!(gs["grammar"], "");
        assert_eq!(gs["json_schema"], json!({ "type": "string" }));
        assert_eq!(gs["cache_prompt"], true);
        assert_eq!(
            gs["speculative"],
            json!({ "mode": "ngram", "n_max": 16, "n_min": 0, "p_min": 0.6, "adaptive": true,
                    "n_parallel": 1, "p_split": 0.1 })
        );
        assert_eq!(gs.as_object().unwrap().len(), 26);

        let gs = ok(json!({ "prompt": "x", "grammar": "root ::= \"a\"" })).generation_settings(1, "m");
        assert_eq!(gs["seed"], -1);
        assert_eq!(gs["json_schema"], Value::Null);
        assert_eq!(gs["grammar"], "root ::= \"a\"");
    }

    #[test]
    fn never_panics_on_odd_numbers() {
        let odd = [
            json!(1e308),
            json!(-1e308),
            json!(f64::MIN_POSITIVE),
            json!(-0.0),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(i64::MAX),
            json!(9.223372036854776e18),
            json!(4294967295.5),
            json!(-1.0000000001),
        ];
        let fields = [
            "n_predict",
            "n_keep",
            "n_probs",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "typical_p",
            "repeat_last_n",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
            "mirostat",
            "mirostat_tau",
            "mirostat_eta",
            "seed",
            "stop",
            "logit_bias",
            "grammar",
            "json_schema",
            "cache_prompt",
            "ignore_eos",
            "speculative",
            "prompt",
        ];
        for field in fields {
            for n in &odd {
                let _ = parse(&with(json!({ field: n.clone() })));
                let _ = parse(&with(json!({ field: [n.clone()] })));
                let _ = parse(&with(json!({ field: [[n.clone(), n.clone()]] })));
                let _ = parse(&with(json!({ "speculative": { field: n.clone() } })));
                let _ = parse(&with(json!({ "logit_bias": { n.to_string(): n.clone() } })));
            }
        }
        for n_vocab in [i32::MIN, -1, 0, 1, i32::MAX] {
            let limits = RequestLimits { n_vocab, n_ctx: 0 };
            let _ = parse_request(&json!({ "prompt": [0, 1, -1, i64::MAX], "logit_bias": [[0, 1]] }), &limits);
            let _ = parse_request(&json!({ "prompt": "x", "logit_bias": { "0": 1 } }), &limits);
        }
    }
}
