//! Property tests of request parsing and validation.
//!
//! Thousands of generated requests — valid field names with hostile values,
//! random JSON, random text — go through `parse_request` and
//! `parse_request_json`. Each must either be accepted, and then satisfy every
//! invariant the engine relies on before it calls llama.cpp, or be rejected
//! with `INVALID_REQUEST` and a message naming the field. Nothing may panic.

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{json, Map, Number, Value};

use crate::error::ErrorCode;
use crate::request::fields::{Field, REQUEST_FIELDS, SPECULATIVE_FIELDS};
use crate::request::{parse_request, parse_request_json, CompletionRequest, PromptPart, RequestLimits};

const LIMITS: RequestLimits = RequestLimits { n_vocab: 49_152, n_ctx: 2048 };

/// Every field name, from the one list of them.
fn names(fields: &'static [Field]) -> Vec<&'static str> {
    fields.iter().map(|f| f.name).collect()
}

/// Numbers a careless parser gets wrong: boundaries of i32/u32/i64, huge and
/// tiny floats, negative zero, fractions where integers are expected.
fn hostile_number() -> impl Strategy<Value = Value> {
    let ints = prop_oneof![
        Just(0i64),
        Just(-1),
        Just(1),
        Just(i64::from(i32::MAX)),
        Just(i64::from(i32::MAX) + 1),
        Just(i64::from(i32::MIN)),
        Just(i64::from(i32::MIN) - 1),
        Just(i64::from(u32::MAX)),
        Just(i64::from(u32::MAX) + 1),
        Just(i64::MAX),
        Just(i64::MIN),
        Just(49_151),
        Just(49_152),
        any::<i64>(),
        -100i64..100_000,
    ]
    .prop_map(Value::from);
    let uints = prop_oneof![Just(u64::MAX), any::<u64>()].prop_map(Value::from);
    let floats = prop_oneof![
        Just(-0.0f64),
        Just(0.5),
        Just(1e300),
        Just(-1e300),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        Just(1.0000001),
        Just(2.5),
        any::<f64>(),
        -10.0f64..10.0,
    ]
    .prop_filter_map("JSON numbers are finite", |f| Number::from_f64(f).map(Value::Number));
    prop_oneof![ints, uints, floats]
}

fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("\u{0}".to_owned()),
        Just("\u{FFFD}\u{FEFF}".to_owned()),
        Just("root ::= \"a\"".to_owned()),
        Just("root ::= root".to_owned()),
        Just("root ::= [".to_owned()),
        Just("auto".to_owned()),
        Just("ngram+draft".to_owned()),
        Just("x".repeat(5000)),
        ".{0,40}",
        "\\PC{0,20}",
    ]
}

/// Any JSON value, nested up to a few levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf =
        prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::Bool), hostile_number(), hostile_string().prop_map(Value::String),];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((hostile_key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn hostile_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(names(REQUEST_FIELDS)).prop_map(str::to_owned),
        prop::sample::select(names(SPECULATIVE_FIELDS)).prop_map(str::to_owned),
        "[0-9]{1,6}",
        ".{0,8}",
    ]
}

/// Values shaped like what a field expects, but often out of range.
fn plausible(field: &'static str) -> BoxedStrategy<Value> {
    match field {
        "prompt" => prop_oneof![
            hostile_string().prop_map(Value::String),
            prop::collection::vec(prop_oneof![hostile_number(), hostile_string().prop_map(Value::String), any_json()], 0..20)
                .prop_map(Value::Array),
        ]
        .boxed(),
        "stop" => prop::collection::vec(hostile_string().prop_map(Value::String), 0..80).prop_map(Value::Array).boxed(),
        "messages" => prop_oneof![
            any_json(),
            prop::collection::vec(
                (
                    prop_oneof![Just(json!("user")), Just(json!("system")), hostile_string().prop_map(Value::String), any_json()],
                    prop_oneof![
                        hostile_string().prop_map(Value::String),
                        prop::collection::vec(
                            prop_oneof![hostile_string().prop_map(|t| json!({ "type": "text", "text": t })), any_json()],
                            0..4
                        )
                        .prop_map(Value::Array),
                        any_json(),
                    ],
                )
                    .prop_map(|(role, content)| json!({ "role": role, "content": content })),
                0..6
            )
            .prop_map(Value::Array),
        ]
        .boxed(),
        "logit_bias" => prop_oneof![
            prop::collection::vec(
                (hostile_number(), prop_oneof![hostile_number(), any::<bool>().prop_map(Value::Bool)]).prop_map(|(t, b)| json!([t, b])),
                0..10
            )
            .prop_map(Value::Array),
            prop::collection::vec(("-?[0-9]{1,12}", hostile_number()), 0..10).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
        .boxed(),
        "speculative" => {
            prop::collection::vec((prop::sample::select(names(SPECULATIVE_FIELDS)), prop_oneof![hostile_number(), any_json()]), 0..7)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
                .boxed()
        }
        "grammar" | "json_schema" => prop_oneof![hostile_string().prop_map(Value::String), any_json()].boxed(),
        _ => prop_oneof![3 => hostile_number(), 1 => any_json()].boxed(),
    }
}

fn request() -> impl Strategy<Value = Value> {
    prop::collection::vec(prop::sample::select(names(REQUEST_FIELDS)).prop_flat_map(|f| (Just(f), plausible(f))), 0..12)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
}

/// What the engine relies on once a request has been accepted.
fn check_invariants(r: &CompletionRequest) -> Result<(), String> {
    let in_vocab = |t: i32| (0..LIMITS.n_vocab).contains(&t);
    for part in &r.prompt {
        if let PromptPart::Token(t) = part {
            if !in_vocab(*t) {
                return Err(format!("prompt token {t} out of range"));
            }
        }
    }
    for (t, bias) in &r.sampling.logit_bias {
        if !in_vocab(*t) {
            return Err(format!("logit_bias token {t} out of range"));
        }
        if let Some(b) = bias {
            if !b.is_finite() {
                return Err(format!("logit_bias {b} not finite"));
            }
        }
    }
    let s = &r.sampling;
    let unit = |x: f32| (0.0..=1.0).contains(&x);
    if !(unit(s.top_p) && unit(s.min_p) && unit(s.typical_p)) {
        return Err("a probability outside [0, 1]".into());
    }
    for (name, x) in [
        ("temperature", s.temperature),
        ("repeat_penalty", s.repeat_penalty),
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
        ("mirostat_tau", s.mirostat_tau),
        ("mirostat_eta", s.mirostat_eta),
    ] {
        if x.is_nan() {
            return Err(format!("{name} is NaN"));
        }
    }
    if s.repeat_penalty < 0.0 || s.mirostat_tau < 0.0 || s.mirostat_eta < 0.0 {
        return Err("a negative non-negative field".into());
    }
    if !(0..=2).contains(&s.mirostat) || s.repeat_last_n < -1 {
        return Err("mirostat / repeat_last_n out of range".into());
    }
    if r.n_predict < -1 || r.n_keep < -1 || !(0..=256).contains(&r.n_probs) {
        return Err("n_predict / n_keep / n_probs out of range".into());
    }
    if r.stop.len() > 64 || r.stop.iter().any(|s| s.is_empty() || s.len() > 1024) {
        return Err("stop strings not bounded".into());
    }
    if r.grammar.is_some() && r.json_schema.is_some() {
        return Err("grammar and json_schema both set".into());
    }
    let sp = &r.speculative;
    if sp.n_max > 64 || sp.n_min > sp.n_max || !(1..=8).contains(&sp.n_parallel) {
        return Err("speculative counts out of range".into());
    }
    if !(unit(sp.p_min) && unit(sp.p_split)) {
        return Err("speculative probabilities out of range".into());
    }
    Ok(())
}

fn check(value: &Value) -> Result<(), TestCaseError> {
    match parse_request(value, &LIMITS) {
        Ok(r) => {
            check_invariants(&r).map_err(|why| TestCaseError::fail(format!("{why}: accepted {value}")))?;
        }
        Err(e) => {
            prop_assert_eq!(e.code, ErrorCode::InvalidRequest, "{}", e.message);
            // The message starts with the field path ("request", "prompt[3]",
            // "speculative.n_max", …) so a client can tell what was wrong.
            let field = e.message.split(':').next().unwrap_or_default();
            let root = field.split(['.', '[']).next().unwrap_or_default();
            prop_assert!(root == "request" || names(REQUEST_FIELDS).contains(&root), "error does not name a field: {}", e.message);
        }
    }
    // The JSON text form of an object parses to the same verdict.
    if !value.is_object() {
        return Ok(());
    }
    let text = serde_json::to_string(value).expect("serialisable");
    let a = parse_request(value, &LIMITS).map_err(|e| e.message);
    let b = parse_request_json(&text, &LIMITS).map_err(|e| e.message);
    prop_assert_eq!(a.is_ok(), b.is_ok(), "{} vs {:?}", text, b);
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 4000, failure_persistence: None, ..Config::default() })]

    #[test]
    fn requests_with_hostile_fields_are_served_or_rejected(value in request()) {
        check(&value)?;
    }

    #[test]
    fn arbitrary_json_is_served_or_rejected(value in any_json()) {
        check(&value)?;
    }

    #[test]
    fn arbitrary_text_is_a_prompt_or_rejected(text in prop_oneof![".{0,200}", "\\{.{0,200}", "\\{\"[a-z_]{1,12}\":.{0,40}\\}"]) {
        match parse_request_json(&text, &LIMITS) {
            Ok(r) => check_invariants(&r).map_err(TestCaseError::fail)?,
            Err(e) => prop_assert_eq!(e.code, ErrorCode::InvalidRequest),
        }
    }

    #[test]
    fn any_vocab_size_bounds_token_ids(n_vocab in prop_oneof![Just(i32::MIN), Just(0), Just(1), any::<i32>()], t in any::<i64>()) {
        let limits = RequestLimits { n_vocab, n_ctx: 16 };
        let req = json!({ "prompt": [t], "logit_bias": [[t, 1.0]] });
        if let Ok(r) = parse_request(&req, &limits) {
            prop_assert!(n_vocab > 0 && t >= 0 && t < i64::from(n_vocab));
            prop_assert_eq!(&r.prompt, &vec![PromptPart::Token(t as i32)]);
        }
    }
}

#[test]
fn deep_nesting_is_rejected_without_overflowing_the_stack() {
    for depth in [127, 128, 129, 10_000, 200_000] {
        for field in ["prompt", "json_schema", "speculative", "logit_bias", "stop"] {
            let text = format!("{{\"prompt\": \"x\", \"{field}\": {}1{}}}", "[".repeat(depth), "]".repeat(depth));
            let err = parse_request_json(&text, &LIMITS).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{field} depth {depth}: {}", err.message);
        }
    }
    // A deep schema that serde_json accepts is still bounded by our own limit.
    let mut schema = json!({ "type": "string" });
    for _ in 0..120 {
        schema = json!({ "type": "array", "items": schema });
    }
    let err = parse_request(&json!({ "prompt": "x", "json_schema": schema }), &LIMITS).unwrap_err();
    assert!(err.message.starts_with("json_schema"), "{}", err.message);
}

#[test]
fn huge_inputs_are_bounded() {
    // 1 MB prompt: served (truncated later against the context).
    let big = "a".repeat(1 << 20);
    assert!(parse_request(&json!({ "prompt": big }), &LIMITS).is_ok());
    // Past the byte limit: rejected, not allocated further.
    let huge = "a".repeat(9 << 20);
    assert_eq!(parse_request(&json!({ "prompt": huge }), &LIMITS).unwrap_err().code, ErrorCode::InvalidRequest);
    // A million token ids is the item limit; one more is rejected.
    let ids: Vec<Value> = (0..1_000_001).map(|i| Value::from(i % 1000)).collect();
    let err = parse_request(&json!({ "prompt": ids }), &LIMITS).unwrap_err();
    assert!(err.message.starts_with("prompt"), "{}", err.message);
    // Huge stop and logit_bias arrays.
    let stops: Vec<Value> = (0..100_000).map(|i| Value::from(i.to_string())).collect();
    assert!(parse_request(&json!({ "prompt": "x", "stop": stops }), &LIMITS).unwrap_err().message.starts_with("stop"));
    let bias: Vec<Value> = (0..200_000).map(|i| json!([i % 49_152, 1.0])).collect();
    assert!(parse_request(&json!({ "prompt": "x", "logit_bias": bias }), &LIMITS).unwrap_err().message.starts_with("logit_bias"));
}

#[test]
fn lone_surrogates_in_json_text_are_rejected() {
    for text in [r#"{"prompt": "\ud800"}"#, r#"{"prompt": "\udc00x"}"#, r#"{"stop": ["\ud83d"]}"#] {
        let err = parse_request_json(text, &LIMITS).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{text}");
    }
    // A well-formed pair is fine.
    assert!(parse_request_json(r#"{"prompt": "\ud83d\ude00"}"#, &LIMITS).is_ok());
}
