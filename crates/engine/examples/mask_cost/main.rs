//! What computing a constraint costs per token, for `npm run bench`
//! (section `structured`): llguidance (what the engine uses for schemas and
//! tool calls) against llama.cpp's GBNF sampler on the grammar llama.cpp
//! makes of the same schema, walking the same tokens, each masking the
//! whole vocabulary as the engine's sampler does.
//!
//! cargo run --release --example mask_cost -- MODEL SCHEMA_JSON TEXT
//!
//! Prints `{ "tokens": n, "llguidance_us": {…}, "gbnf_us": {…}, "steps": […] }`
//! with the mean, median, 90th percentile and maximum microseconds per
//! token, and the decoding steps an oracle grammar drafter would take on
//! this text (each step: the pending token and the forced tokens that
//! follow it, as the engine's grammar drafter drafts them, cut at 16) — with
//! the measured batch costs, the ceiling of grammar drafting on it.

use std::time::Instant;

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use llama_engine_core::chat::format::json_answer;
use llama_engine_core::sampling::constraint::Compiler;
use llama_engine_core::sampling::constraint::Next;
use serde_json::{json, Value};

fn stats(mut us: Vec<f64>) -> Value {
    if us.is_empty() {
        return Value::Null;
    }
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    json!({ "mean": mean, "p50": at(0.5), "p90": at(0.9), "max": at(1.0) })
}

/// A full-vocabulary candidate array, as the engine's sampler builds one.
fn candidates(n: i32) -> LlamaTokenDataArray {
    LlamaTokenDataArray::new((0..n).map(|i| LlamaTokenData::new(LlamaToken(i), (i % 97) as f32 * 0.01, 0.0)).collect(), false)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model_path, schema, text] = args.as_slice() else {
        eprintln!("usage: mask_cost MODEL SCHEMA_JSON TEXT");
        std::process::exit(2);
    };
    let schema: Value = serde_json::from_str(schema).expect("SCHEMA_JSON: a JSON schema");
    let mut backend = LlamaBackend::init().expect("backend");
    backend.void_logs();
    let model = std::sync::Arc::new(LlamaModel::load_from_file(&backend, model_path, &LlamaModelParams::default()).expect("model"));
    let n_vocab = model.n_vocab();
    let tokens = model.vocab().tokenize(text.as_bytes(), false, false);

    // llguidance, through the engine's own compiler, layout and rule (the
    // canonical token where text is forced, else the mask).
    let tokenize = {
        let model = model.clone();
        std::sync::Arc::new(move |bytes: &[u8]| model.vocab().tokenize(bytes, false, false).into_iter().map(|t| t.0).collect::<Vec<i32>>())
    };
    let env = LlamaSampler::llguidance_tok_env(&model);
    let compiler = Compiler::new(&env).expect("llguidance");
    let mut c = compiler.compile(&json_answer(&schema)).expect("the schema compiles").with_tokenizer(tokenize.clone());
    let mut llg = Vec::new();
    for &t in &tokens {
        let mut arr = candidates(n_vocab);
        let start = Instant::now();
        match c.next_token().expect("a mask") {
            Next::Forced(id) => {
                for d in arr.data.iter_mut() {
                    if d.id().0 != id {
                        d.set_logit(f32::NEG_INFINITY);
                    }
                }
            }
            Next::Mask(mask) => {
                for d in arr.data.iter_mut() {
                    if !c.is_allowed(&mask, d.id().0) {
                        d.set_logit(f32::NEG_INFINITY);
                    }
                }
            }
        }
        llg.push(start.elapsed().as_secs_f64() * 1e6);
        if c.consume(t.0).is_err() {
            break;
        }
    }

    // The oracle's steps: every forced token drafted, every draft accepted.
    let mut c = compiler.compile(&json_answer(&schema)).expect("the schema compiles").with_tokenizer(tokenize);
    let ids: Vec<i32> = tokens.iter().map(|t| t.0).collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        if c.consume(ids[i]).is_err() {
            break;
        }
        let draft = c.forced(16);
        let n = draft.iter().zip(&ids[i + 1..]).take_while(|(a, b)| a == b).count();
        for &t in &ids[i + 1..i + 1 + n] {
            if c.consume(t).is_err() {
                break;
            }
        }
        steps.push(1 + n);
        i += 1 + n;
    }

    // GBNF: llama.cpp's grammar of the same schema.
    let gbnf = llama_cpp_2::json_schema_to_grammar(&schema.to_string()).expect("json_schema_to_grammar");
    let mut grammar = LlamaSampler::grammar(&model, &gbnf, "root").expect("the grammar parses");
    let mut g = Vec::new();
    for &t in &tokens {
        let mut arr = candidates(n_vocab);
        let start = Instant::now();
        arr.apply_sampler(&mut grammar);
        g.push(start.elapsed().as_secs_f64() * 1e6);
        if !arr.data.iter().any(|d| d.id() == t && d.logit() > f32::NEG_INFINITY) {
            break; // the text leaves llama.cpp's grammar (its whitespace rules differ)
        }
        grammar.accept(t);
    }
    let gbnf_tokens = g.len();
    println!(
        "{}",
        json!({ "tokens": tokens.len(), "llguidance_us": stats(llg), "gbnf_us": stats(g), "gbnf_tokens": gbnf_tokens, "steps": steps })
    );
}
