//! The shapes that leave the engine: one `TokenEvent` per decoding step and a
//! `CompletionResult` at the end. Serialised once, at the
//! boundary, with the wire names below.

use serde::Serialize;
use serde_json::Value;

use crate::chat::output::ToolCallDelta;
use crate::error::EngineError;

/// Where an emitted token came from: `target` (sampled by the target model:
/// plain decoding, a correction or a bonus token) or the name of the drafter
/// that proposed it and the target accepted (`speculation::registry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct TokenSource(pub &'static str);

impl TokenSource {
    pub const TARGET: TokenSource = TokenSource("target");
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenProb {
    pub id: i32,
    pub piece: String,
    pub prob: f32,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenOut {
    pub id: i32,
    pub piece: String,
    pub source: TokenSource,
    /// With `n_probs`: this token's own probability in the distribution it
    /// was chosen from (the same as `probs`' entries; 0 when a constraint
    /// chose a token the distribution gave none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prob: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probs: Option<Vec<TokenProb>>,
}

/// How far a request's prompt is evaluated (`return_progress`): its
/// tokens, those found in the cache, those in the cache now (cached ones
/// included), and the ms since the request began.
#[derive(Debug, Clone, Serialize)]
pub struct PromptProgress {
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    pub time_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenEvent {
    /// Text safe to show: whole UTF-8 characters, stop-string prefixes held back.
    pub content: String,
    /// Reasoning text of this step (chat requests whose model thinks).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reasoning: String,
    /// Tool-call deltas of this step: a call's index, id and name first,
    /// then fragments of its arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
    pub tokens: Vec<TokenOut>,
    pub n_drafted: usize,
    pub n_accepted: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Images and audio in the prompt; ms the projector spent encoding the
    /// ones not kept from earlier requests; ms their embeddings took to go
    /// into the context (both part of `prompt_ms`).
    pub media_n: usize,
    pub media_encode_ms: f64,
    pub media_decode_ms: f64,
}

impl Timings {
    pub fn new(prompt_n: usize, prompt_ms: f64, predicted_n: usize, predicted_ms: f64) -> Self {
        let per_token = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let per_second = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 };
        Timings {
            prompt_n,
            prompt_ms,
            prompt_per_token_ms: per_token(prompt_ms, prompt_n),
            prompt_per_second: per_second(prompt_ms, prompt_n),
            predicted_n,
            predicted_ms,
            predicted_per_token_ms: per_token(predicted_ms, predicted_n),
            predicted_per_second: per_second(predicted_ms, predicted_n),
            media_n: 0,
            media_encode_ms: 0.0,
            media_decode_ms: 0.0,
        }
    }

    /// With the media of the prompt: how many, and the ms they took.
    pub fn with_media(mut self, n: usize, encode_ms: f64, decode_ms: f64) -> Self {
        (self.media_n, self.media_encode_ms, self.media_decode_ms) = (n, encode_ms, decode_ms);
        self
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DrafterStats {
    pub n_drafted: usize,
    pub n_accepted: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SpeculativeStats {
    pub mode: String,
    pub n_drafted: usize,
    pub n_accepted: usize,
    pub acceptance_rate: f64,
    pub target_passes: usize,
    pub draft_ms: f64,
    pub drafters: std::collections::BTreeMap<String, DrafterStats>,
    /// The engine's load-time self-check (`status().batchInvariant`): when
    /// false, verification batches may round differently from one-token
    /// decoding and greedy output may differ from mode "off" in near-ties.
    pub batch_invariant: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionResult {
    pub content: String,
    pub stop: bool,
    pub model: String,
    pub tokens_predicted: usize,
    pub tokens_evaluated: usize,
    pub tokens_cached: usize,
    pub truncated: bool,
    pub stopped_eos: bool,
    pub stopped_word: bool,
    pub stopped_limit: bool,
    pub stopped_abort: bool,
    pub stopping_word: String,
    pub generation_settings: Value,
    pub timings: Timings,
    pub speculative: SpeculativeStats,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_probabilities: Option<Vec<Value>>,
    /// The tool calls that ended the turn (when the model called tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ResultToolCall>>,
    /// The model's reasoning, apart from `content` (`reasoning_format` auto).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The turn ended with tool calls (OpenAI's `finish_reason: "tool_calls"`).
    pub stopped_tool_calls: bool,
}

/// A tool call in a result, in OpenAI's shape.
#[derive(Debug, Clone, Serialize)]
pub struct ResultToolCall {
    pub id: String,
    pub r#type: &'static str,
    pub function: ResultFunction,
}

#[derive(Debug, Clone, Serialize)]
pub struct ResultFunction {
    pub name: String,
    /// A JSON text.
    pub arguments: String,
}

/// The keys of every shape that leaves the engine as JSON, by the name of
/// its TypeScript interface in `index.d.ts`: one instance of each with every
/// field set and every optional one present. The instances are written
/// field by field (no `..Default::default()`), so a new field does not
/// compile until it is set here; the binding exports this as `wireShapes()`
/// and the docs test holds `index.d.ts` to it.
pub fn wire_shapes() -> Value {
    let prob = TokenProb { id: 1, piece: "a".into(), prob: 1.0 };
    let token = TokenOut { id: 1, piece: "a".into(), source: TokenSource::TARGET, prob: Some(1.0), probs: Some(vec![prob.clone()]) };
    let delta = ToolCallDelta { index: 0, id: Some("call_0".into()), name: Some("f".into()), arguments: Some("{}".into()) };
    let event = TokenEvent {
        content: "a".into(),
        reasoning: "r".into(),
        tool_calls: vec![delta.clone()],
        tokens: vec![token.clone()],
        n_drafted: 1,
        n_accepted: 1,
    };
    let call =
        ResultToolCall { id: "call_0".into(), r#type: "function", function: ResultFunction { name: "f".into(), arguments: "{}".into() } };
    let timings = Timings::new(1, 1.0, 1, 1.0);
    let speculative = SpeculativeStats {
        mode: "auto".into(),
        n_drafted: 1,
        n_accepted: 1,
        acceptance_rate: 1.0,
        target_passes: 1,
        draft_ms: 1.0,
        drafters: [("ngram".to_string(), DrafterStats { n_drafted: 1, n_accepted: 1 })].into(),
        batch_invariant: true,
    };
    let result = CompletionResult {
        content: "a".into(),
        stop: true,
        model: "m".into(),
        tokens_predicted: 1,
        tokens_evaluated: 1,
        tokens_cached: 0,
        truncated: false,
        stopped_eos: true,
        stopped_word: false,
        stopped_limit: false,
        stopped_abort: false,
        stopping_word: String::new(),
        generation_settings: Value::Object(Default::default()),
        timings: timings.clone(),
        speculative: speculative.clone(),
        completion_probabilities: Some(Vec::new()),
        tool_calls: Some(vec![call.clone()]),
        reasoning_content: Some("r".into()),
        stopped_tool_calls: true,
    };
    fn keys(v: impl Serialize) -> Value {
        let v = serde_json::to_value(v).unwrap_or(Value::Null);
        v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default().into()
    }
    serde_json::json!({
        "TokenEvent": keys(&event),
        "GeneratedToken": keys(&token),
        "TokenProbability": keys(&prob),
        "ToolCallDelta": keys(&delta),
        "CompletionResult": keys(&result),
        "Timings": keys(&timings),
        "SpeculativeStats": keys(&speculative),
        "ToolCall": keys(&call),
        "ProgressEvent": keys(&PromptProgress { total: 1, cache: 0, processed: 1, time_ms: 1.0 }),
    })
}

/// Receives what one request produces, in order. Implemented by the binding
/// (a threadsafe function into JavaScript) and by tests.
pub trait EventSink: Send {
    /// One decoding step. Returns false when the receiver is gone, so the
    /// engine can stop generating for nobody.
    fn token(&mut self, event: &TokenEvent) -> bool;
    /// How far the prompt is evaluated (requests with `return_progress`).
    /// Returns false when the receiver is gone.
    fn progress(&mut self, _progress: &PromptProgress) -> bool {
        true
    }
    /// The request is over; called exactly once, after the last `token`.
    fn finish(self: Box<Self>, outcome: Result<CompletionResult, EngineError>);
    /// A job that is not a completion (saving or loading a session) is
    /// over: its answer, in place of `finish`.
    fn reply(self: Box<Self>, outcome: Result<serde_json::Value, EngineError>);
}
