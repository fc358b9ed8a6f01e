//! Unit tests of request parsing and validation.

use super::media::MEDIA_MARKER;
use super::parse::*;
use super::*;
use crate::error::ErrorCode;
use crate::error::Result;
use serde_json::json;
use serde_json::Value;

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
                         "adaptive": false, "n_parallel": 4, "p_split": 0.3, "namespace": "agent-7" },
    }));
    assert_eq!(r.prompt, vec![PromptPart::Text("a".into()), PromptPart::Token(1), PromptPart::Text("b".into()), PromptPart::Token(999)]);
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
        SpeculativeParams {
            mode: SpecMode::parse("ngram+draft").unwrap(),
            n_max: 8,
            n_min: 2,
            p_min: 0.5,
            adaptive: false,
            n_parallel: 4,
            p_split: 0.3,
            namespace: Some("agent-7".into()),
        }
    );
}

#[test]
fn spec_modes() {
    assert_eq!(SpecMode::all().count(), 9);
    for mode in SpecMode::all() {
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
    rejects(with(json!({ "speculative": { "namespace": 1 } })), "speculative.namespace");
    rejects(with(json!({ "speculative": { "namespace": "x".repeat(129) } })), "speculative.namespace");
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
        (json!({ "prompt": { "text": "x" } }), "prompt.prompt_string"),
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
    let gs = r.generation_settings(2048, "model.gguf", &[2]);
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
    // ignore_eos bans the end-of-generation tokens: shown after the request's own biases.
    let ignoring = ok(json!({ "prompt": "x", "logit_bias": [[3, 0.5]], "ignore_eos": true }));
    assert_eq!(ignoring.generation_settings(1, "m", &[2, 7])["logit_bias"], json!([[3, 0.5], [2, false], [7, false]]));
    assert_eq!(gs["n_probs"], 2);
    assert_eq!(gs["grammar"], "");
    assert_eq!(gs["json_schema"], json!({ "type": "string" }));
    assert_eq!(gs["cache_prompt"], true);
    assert_eq!(gs["context_shift"], true);
    assert_eq!(gs["return_progress"], false);
    assert_eq!(
        gs["speculative"],
        json!({ "mode": "ngram", "n_max": 16, "n_min": 0, "p_min": 0.6, "adaptive": true,
                "n_parallel": 1, "p_split": 0.1 })
    );
    assert_eq!(gs["tool_choice"], "auto");
    assert_eq!(gs["parallel_tool_calls"], true);
    assert_eq!(gs["reasoning_format"], "auto");
    assert_eq!(gs["reasoning_budget"], -1);
    assert_eq!(gs["lora"], Value::Null);
    assert_eq!(gs["id_slot"], -1);
    assert_eq!(gs.as_object().unwrap().len(), 34);

    let gs = ok(json!({ "prompt": "x", "grammar": "root ::= \"a\"" })).generation_settings(1, "m", &[]);
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

#[test]
fn chat_fields_need_messages_and_do_not_mix_with_grammars() {
    let tools = json!([{ "type": "function", "function": { "name": "f" } }]);
    rejects(json!({ "prompt": "x", "tools": tools }), "tools");
    rejects(json!({ "prompt": "x", "tool_choice": "none" }), "tool_choice");
    rejects(json!({ "prompt": "x", "chat_template_kwargs": { "a": 1 } }), "chat_template_kwargs");
    let msgs = json!([{ "role": "user", "content": "hi" }]);
    // With tools it depends on the model's family (the engine says when it prepares the chat).
    assert!(ok(json!({ "messages": msgs, "tools": tools, "grammar": "root ::= \"a\"" })).grammar.is_some());
    rejects(json!({ "messages": msgs, "response_format": { "type": "json_object" }, "grammar": "root ::= \"a\"" }), "grammar");
    rejects(
        json!({ "messages": msgs, "response_format": { "type": "json_object" }, "json_schema": { "type": "object" } }),
        "response_format",
    );
    let r = ok(json!({ "messages": msgs, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false }));
    assert_eq!(r.chat.tools.len(), 1);
    assert!(r.chat.calls_tools() && !r.chat.parallel_tool_calls);
    // A JSON answer works for plain prompts too.
    assert!(ok(json!({ "prompt": "x", "response_format": { "type": "json_object" } })).chat.response_format.is_some());
    // tool_choice none with a grammar: no calls, so the grammar stands.
    ok(json!({ "messages": msgs, "tools": tools, "tool_choice": "none", "grammar": "root ::= \"a\"" }));
}

#[test]
fn a_multimodal_prompt_as_llama_server_takes_it() {
    // A 1x1 PNG, in base64 and in a data: URL.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let r = ok(
        json!({ "prompt": { "prompt_string": "A <__media__> and <__media__>.", "multimodal_data": [png, format!("data:image/png;base64,{png}")] } }),
    );
    assert_eq!(r.prompt, vec![PromptPart::Chat(format!("A {MEDIA_MARKER} and {MEDIA_MARKER}."))]);
    assert_eq!(r.media().len(), 2);
    assert_eq!(r.media()[1].at, "prompt.multimodal_data[1]");
    // Without files it is plain text.
    assert_eq!(ok(json!({ "prompt": { "prompt_string": "Hi" } })).prompt, vec![PromptPart::Text("Hi".into())]);
    rejects(json!({ "prompt": { "prompt_string": "No marker", "multimodal_data": [png] } }), "prompt.multimodal_data");
    rejects(json!({ "prompt": { "prompt_string": "<__media__>", "multimodal_data": ["bm90IGFuIGltYWdl"] } }), "prompt.multimodal_data[0]");
    rejects(json!({ "prompt": { "prompt_string": "<__media__>", "multimodal_data": [5] } }), "prompt.multimodal_data[0]");
    rejects(json!({ "prompt": { "multimodal_data": [] } }), "prompt.prompt_string");
    rejects(json!({ "prompt": { "prompt_string": MEDIA_MARKER } }), "prompt.prompt_string");
}
