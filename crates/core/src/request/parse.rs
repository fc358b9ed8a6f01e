//! Parsing and validation of completion requests (the llama.cpp server /
//! legacy JSON-RPC fields). Everything a request carries is checked here,
//! before any of it reaches llama.cpp: its asserts abort the whole process,
//! so no value may get past this module unchecked. Ranges and names come
//! from `fields`.

use std::borrow::Cow;
use std::fmt::Display;

use serde_json::{Map, Number, Value};

use super::fields::*;
use super::infill::Infill;
use super::{CompletionRequest, PromptPart, RequestLimits, SamplingParams, SpecMode, SpeculativeParams, MAX_LORAS, MAX_LORA_SCALE};
use crate::chat::parse_messages;
use crate::chat::tools::{parse_chat_options, ResponseFormat};
use crate::error::{EngineError, Result};
use crate::gbnf::check_gbnf;
use crate::json::describe::{truncate, type_name};
use crate::speculation::suffix::namespace_problem;

pub(super) const MAX_PROMPT_BYTES: usize = 8 * 1024 * 1024;
pub(super) const MAX_PROMPT_ITEMS: usize = 1_000_000;
pub(super) const MAX_STOP_STRINGS: usize = 64;
pub(super) const MAX_STOP_BYTES: usize = 1024;
/// Kept below serde_json's parser recursion limit (128) so the schema we store
/// can always be parsed back, and so nothing downstream recurses too deeply.
pub(super) const MAX_SCHEMA_DEPTH: usize = 100;

/// Parses and validates a request object.
pub fn parse_request(value: &Value, limits: &RequestLimits) -> Result<CompletionRequest> {
    let map =
        value.as_object().ok_or_else(|| EngineError::invalid("request", format!("expected a JSON object, got {}", type_name(value))))?;
    let f = Fields { map, prefix: "" };
    let d = CompletionRequest::default();

    let infill = parse_infill(&f)?;
    let (prompt, messages) = match (f.get(&PROMPT), f.get(&MESSAGES)) {
        (Some(_), Some(_)) => return Err(f.err(&MESSAGES, "give either prompt or messages, not both")),
        (_, Some(_)) if infill.is_some() => return Err(f.err(&MESSAGES, "fill-in-the-middle (input_prefix) takes a prompt, not messages")),
        (None, Some(m)) => (Vec::new(), Some(parse_messages(m, "messages")?)),
        (None, None) if infill.is_some() => (Vec::new(), None),
        (p, None) => (parse_prompt(p, limits.n_vocab)?, None),
    };
    // llama-server's { prompt_string, multimodal_data }: its text as a chat's (special tokens parsed), its files.
    let (prompt, prompt_media) = match f.get(&PROMPT) {
        Some(Value::Object(obj)) if messages.is_none() => {
            let (text, media) = super::media::multimodal_prompt(obj, PROMPT.name)?;
            check_prompt_size(text.len())?;
            (if media.is_empty() { vec![PromptPart::Text(text)] } else { vec![PromptPart::Chat(text)] }, media)
        }
        _ => (prompt, Vec::new()),
    };
    let grammar = f.string(&GRAMMAR)?.filter(|g| !g.is_empty()).map(str::to_owned);
    if let Some(g) = &grammar {
        check_gbnf(g).map_err(|why| EngineError::invalid("grammar", why))?;
    }
    let json_schema = parse_json_schema(f.get(&JSON_SCHEMA))?;
    if grammar.is_some() && json_schema.is_some() {
        return Err(f.err(&JSON_SCHEMA, "grammar and json_schema cannot both be set"));
    }
    let chat = parse_chat_options(|name| map.get(name).filter(|v| !v.is_null()))?;
    if messages.is_none() {
        for (field, set) in [
            (&TOOLS, !chat.tools.is_empty()),
            (&TOOL_CHOICE, f.get(&TOOL_CHOICE).is_some()),
            (&CHAT_TEMPLATE_KWARGS, !chat.template_kwargs.is_empty()),
            (&REASONING_BUDGET, chat.reasoning_budget.is_some()),
        ] {
            if set {
                return Err(f.err(field, "needs messages (a chat request), not a prompt"));
            }
        }
    }
    let json_answer = matches!(chat.response_format, Some(ResponseFormat::Json(_)));
    // With tools, whether they bring a constraint depends on the model's
    // family (engine::chat::prepare says); a JSON answer always does.
    if grammar.is_some() && json_answer {
        return Err(f.err(&GRAMMAR, "cannot be combined with a JSON response_format (it brings its own constraint)"));
    }
    if json_schema.is_some() && json_answer {
        return Err(f.err(&RESPONSE_FORMAT, "json_schema and a JSON response_format cannot both be set"));
    }

    Ok(CompletionRequest {
        prompt,
        messages,
        infill,
        n_predict: f.int(&N_PREDICT)?.unwrap_or(d.n_predict),
        n_keep: f.int(&N_KEEP)?.unwrap_or(d.n_keep),
        stop: parse_stop(f.get(&STOP))?,
        n_probs: f.int(&N_PROBS)?.unwrap_or(d.n_probs),
        grammar,
        json_schema,
        chat,
        cache_prompt: f.bool(&CACHE_PROMPT)?.unwrap_or(d.cache_prompt),
        context_shift: f.bool(&CONTEXT_SHIFT)?.unwrap_or(d.context_shift),
        return_progress: f.bool(&RETURN_PROGRESS)?.unwrap_or(d.return_progress),
        ignore_eos: f.bool(&IGNORE_EOS)?.unwrap_or(d.ignore_eos),
        id_slot: f.int(&ID_SLOT)?.and_then(|s: i64| usize::try_from(s).ok()),
        prompt_media,
        sampling: parse_sampling(&f, limits)?,
        speculative: parse_speculative(f.get(&SPECULATIVE))?,
        lora: parse_lora(f.get(&LORA))?,
    })
}

/// Most files `input_extra` may list, and the longest file name.
pub(super) const MAX_INFILL_EXTRA: usize = 1024;
pub(super) const MAX_FILENAME_BYTES: usize = 4096;

/// `input_prefix`, `input_suffix` and `input_extra`: a fill-in-the-middle
/// request gives the first two (llama.cpp's /infill requires both); their
/// text counts toward the prompt's bound with the prompt's own.
fn parse_infill(f: &Fields<'_>) -> Result<Option<Infill>> {
    let prefix = f.string(&INPUT_PREFIX)?;
    let suffix = f.string(&INPUT_SUFFIX)?;
    let extra = f.get(&INPUT_EXTRA);
    let (prefix, suffix) = match (prefix, suffix) {
        (None, None) if extra.is_none() => return Ok(None),
        (Some(p), Some(s)) => (p, s),
        (None, _) => return Err(f.err(&INPUT_PREFIX, "required for fill-in-the-middle (with input_suffix)")),
        (_, None) => return Err(f.err(&INPUT_SUFFIX, "required for fill-in-the-middle (with input_prefix)")),
    };
    let mut bytes = prefix.len() + suffix.len();
    let items = match extra {
        None => &Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(f.err(&INPUT_EXTRA, format!("expected an array of {{ filename, text }}, got {}", type_name(other)))),
    };
    if items.len() > MAX_INFILL_EXTRA {
        return Err(f.err(&INPUT_EXTRA, format!("at most {MAX_INFILL_EXTRA} files are allowed, got {}", items.len())));
    }
    let mut files = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = |why: String| EngineError::invalid(&format!("{}[{i}]", INPUT_EXTRA.name), why);
        let obj = item.as_object().ok_or_else(|| at(format!("expected an object {{ filename, text }}, got {}", type_name(item))))?;
        let text = match obj.get("text") {
            Some(Value::String(t)) => t,
            Some(other) => return Err(at(format!("text: expected a string, got {}", type_name(other)))),
            None => return Err(at("text: required".into())),
        };
        // llama.cpp's default name for a file given without one.
        let filename = match obj.get("filename") {
            None | Some(Value::Null) => "tmp",
            Some(Value::String(n)) if n.len() <= MAX_FILENAME_BYTES => n,
            Some(Value::String(_)) => return Err(at(format!("filename: at most {MAX_FILENAME_BYTES} bytes"))),
            Some(other) => return Err(at(format!("filename: expected a string, got {}", type_name(other)))),
        };
        bytes += text.len() + filename.len();
        check_prompt_size(bytes)?;
        files.push((filename.to_owned(), text.clone()));
    }
    check_prompt_size(bytes)?;
    Ok(Some(Infill { prefix: prefix.to_owned(), suffix: suffix.to_owned(), extra: files }))
}

/// `[{ id, scale }, …]`: ids unique integers below `MAX_LORAS`, finite
/// scales of at most `MAX_LORA_SCALE` in magnitude. Whether an id names a
/// loaded adapter is the engine's to check.
fn parse_lora(value: Option<&Value>) -> Result<Option<Vec<(u32, f32)>>> {
    let items = match value {
        None => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(EngineError::invalid(LORA.name, format!("expected an array of {{ id, scale }}, got {}", type_name(other))))
        }
    };
    if items.len() > MAX_LORAS {
        return Err(EngineError::invalid(LORA.name, format!("at most {MAX_LORAS} entries are allowed, got {}", items.len())));
    }
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = |why: String| EngineError::invalid(&format!("{}[{i}]", LORA.name), why);
        let obj = item.as_object().ok_or_else(|| at(format!("expected an object {{ id, scale }}, got {}", type_name(item))))?;
        let id = obj
            .get("id")
            .and_then(Value::as_f64)
            .filter(|v| v.fract() == 0.0 && *v >= 0.0 && *v < MAX_LORAS as f64)
            .ok_or_else(|| at(format!("id: expected an integer in 0..{MAX_LORAS}")))? as u32;
        let scale = match obj.get("scale") {
            None => 1.0,
            Some(v) => v
                .as_f64()
                .filter(|s| s.is_finite() && s.abs() <= f64::from(MAX_LORA_SCALE))
                .ok_or_else(|| at(format!("scale: expected a finite number within ±{MAX_LORA_SCALE}")))? as f32,
        };
        if out.iter().any(|&(other, _)| other == id) {
            return Err(at(format!("id {id} is listed twice")));
        }
        out.push((id, scale));
    }
    Ok(Some(out))
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
    Ok(SamplingParams {
        temperature: f.float(&TEMPERATURE)?.unwrap_or(d.temperature),
        top_k: f.int(&TOP_K)?.unwrap_or(d.top_k),
        top_p: f.float(&TOP_P)?.unwrap_or(d.top_p),
        min_p: f.float(&MIN_P)?.unwrap_or(d.min_p),
        typical_p: f.float(&TYPICAL_P)?.unwrap_or(d.typical_p),
        repeat_last_n: f.int(&REPEAT_LAST_N)?.unwrap_or(d.repeat_last_n),
        repeat_penalty: f.float(&REPEAT_PENALTY)?.unwrap_or(d.repeat_penalty),
        presence_penalty: f.float(&PRESENCE_PENALTY)?.unwrap_or(d.presence_penalty),
        frequency_penalty: f.float(&FREQUENCY_PENALTY)?.unwrap_or(d.frequency_penalty),
        mirostat: f.int(&MIROSTAT)?.unwrap_or(d.mirostat),
        mirostat_tau: f.float(&MIROSTAT_TAU)?.unwrap_or(d.mirostat_tau),
        mirostat_eta: f.float(&MIROSTAT_ETA)?.unwrap_or(d.mirostat_eta),
        // -1 is the wire spelling of "random".
        seed: f.int::<i64>(&SEED)?.and_then(|s| u32::try_from(s).ok()),
        logit_bias: parse_logit_bias(f.get(&LOGIT_BIAS), limits.n_vocab)?,
    })
}

fn parse_speculative(value: Option<&Value>) -> Result<SpeculativeParams> {
    let d = SpeculativeParams::default();
    let map = match value {
        None => return Ok(d),
        Some(Value::Object(map)) => map,
        Some(other) => return Err(EngineError::invalid(SPECULATIVE.name, format!("expected an object, got {}", type_name(other)))),
    };
    let f = Fields { map, prefix: "speculative." };
    let mode = f.check(&SPEC_MODE, |v| {
        let name = v.as_str().ok_or_else(|| format!("expected a string, got {}", type_name(v)))?;
        SpecMode::parse(name).ok_or_else(|| {
            let names: Vec<String> = SpecMode::all().map(|m| format!("{:?}", m.as_str())).collect();
            format!("expected one of {}, got {:?}", names.join(", "), truncate(name, 40))
        })
    })?;
    let n_max = f.int(&SPEC_N_MAX)?.unwrap_or(d.n_max);
    let n_min = f.int(&SPEC_N_MIN)?.unwrap_or(d.n_min);
    if n_min > n_max {
        return Err(f.err(&SPEC_N_MIN, format!("must be <= n_max ({n_max}), got {n_min}")));
    }
    Ok(SpeculativeParams {
        mode: mode.unwrap_or(d.mode),
        n_max,
        n_min,
        p_min: f.float(&SPEC_P_MIN)?.unwrap_or(d.p_min),
        adaptive: f.bool(&SPEC_ADAPTIVE)?.unwrap_or(d.adaptive),
        n_parallel: f.int(&SPEC_N_PARALLEL)?.unwrap_or(d.n_parallel),
        p_split: f.float(&SPEC_P_SPLIT)?.unwrap_or(d.p_split),
        namespace: f.check(&SPEC_NAMESPACE, |v| {
            let name = v.as_str().ok_or_else(|| format!("expected a string, got {}", type_name(v)))?;
            namespace_problem(name).map_or(Ok(name.to_owned()), Err)
        })?,
    })
}

fn parse_prompt(value: Option<&Value>, n_vocab: i32) -> Result<Vec<PromptPart>> {
    let items = match value {
        None => return Err(EngineError::invalid(PROMPT.name, "required (or messages)")),
        Some(Value::String(text)) => {
            check_prompt_size(text.len())?;
            return Ok(vec![PromptPart::Text(text.clone())]);
        }
        Some(Value::Array(items)) => items,
        // { prompt_string, multimodal_data }: read by the caller.
        Some(Value::Object(_)) => return Ok(Vec::new()),
        Some(other) => {
            return Err(EngineError::invalid(
                PROMPT.name,
                format!(
                    "expected a string, an array of strings and token ids, or {{ prompt_string, multimodal_data }}, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    if items.len() > MAX_PROMPT_ITEMS {
        return Err(EngineError::invalid(PROMPT.name, format!("at most {MAX_PROMPT_ITEMS} items are allowed, got {}", items.len())));
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
        return Err(EngineError::invalid(
            PROMPT.name,
            format!("at most {MAX_PROMPT_BYTES} bytes of text are allowed, got {bytes} or more"),
        ));
    }
    Ok(())
}

fn parse_stop(value: Option<&Value>) -> Result<Vec<String>> {
    let items = match value {
        None => return Ok(Vec::new()),
        Some(Value::String(text)) => {
            let text = stop_string(text).map_err(|why| EngineError::invalid(STOP.name, why))?;
            return Ok(text.into_iter().collect());
        }
        Some(Value::Array(items)) => items,
        Some(other) => return Err(EngineError::invalid(STOP.name, format!("expected an array of strings, got {}", type_name(other)))),
    };
    if items.len() > MAX_STOP_STRINGS {
        return Err(EngineError::invalid(STOP.name, format!("at most {MAX_STOP_STRINGS} strings are allowed, got {}", items.len())));
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
    let too_many = |n: usize| EngineError::invalid(LOGIT_BIAS.name, format!("at most {max_entries} entries are allowed, got {n}"));
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
            Err(EngineError::invalid(LOGIT_BIAS.name, format!("expected an array of [token, bias] pairs, got {}", type_name(other))))
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
    let invalid = |why: String| EngineError::invalid(JSON_SCHEMA.name, why);
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
    crate::json::schema::check_schema(&schema, JSON_SCHEMA.name)?;
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

/// Typed access to the fields of one JSON object, by their entries in
/// `fields` (which hold the ranges); `null` counts as absent.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Prepended to error field names, e.g. "speculative.".
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn get(&self, field: &Field) -> Option<&'a Value> {
        self.map.get(field.name).filter(|v| !v.is_null())
    }

    fn err(&self, field: &Field, why: impl Display) -> EngineError {
        EngineError::invalid(&format!("{}{}", self.prefix, field.name), why)
    }

    fn check<T>(&self, field: &Field, parse: impl FnOnce(&'a Value) -> Result<T, String>) -> Result<Option<T>> {
        self.get(field).map(parse).transpose().map_err(|why| self.err(field, why))
    }

    fn int<T: TryFrom<i64>>(&self, field: &Field) -> Result<Option<T>> {
        let Kind::Int { min, max } = field.kind else { unreachable!("{} is not an integer field", field.name) };
        self.check(field, |v| {
            let n = int_in(v, min, max)?;
            T::try_from(n).map_err(|_| format!("{n} is out of range"))
        })
    }

    fn float(&self, field: &Field) -> Result<Option<f32>> {
        let Kind::Float { min, max } = field.kind else { unreachable!("{} is not a number field", field.name) };
        self.check(field, |v| float_in(v, min, max))
    }

    fn bool(&self, field: &Field) -> Result<Option<bool>> {
        self.check(field, |v| v.as_bool().ok_or_else(|| format!("expected a boolean, got {}", type_name(v))))
    }

    fn string(&self, field: &Field) -> Result<Option<&'a str>> {
        self.check(field, |v| v.as_str().ok_or_else(|| format!("expected a string, got {}", type_name(v))))
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

/// An `f32` as the JSON number with the shortest decimal form that reads back
/// as the same `f32` (0.8, not 0.800000011920929).
pub(super) fn f32_json(x: f32) -> Value {
    let shortest = x.to_string().parse::<f64>().unwrap_or(f64::from(x));
    Number::from_f64(shortest).map_or(Value::Null, Value::Number)
}

pub(super) fn object<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Object(entries.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}
