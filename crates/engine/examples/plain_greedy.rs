//! The baseline for `npm run bench`: plain greedy decoding with llama-cpp-2
//! and nothing of llama-engine (no engine thread, no events, no N-API), on
//! the same model, prompt and threads. Prints one JSON line per prompt.
//!
//! cargo run --release --example plain_greedy -- MODEL THREADS N_PREDICT PROMPT...
//!
//! With PLAIN_BATCH_COSTS=1 it prints instead what a batch of 1, 2, 4, 8, 16
//! tokens costs after each prompt (to compare llama.cpp builds).

use std::num::NonZeroU32;
use std::time::Instant;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model_path, threads, n_predict, prompts @ ..] = args.as_slice() else {
        eprintln!("usage: plain_greedy MODEL THREADS N_PREDICT PROMPT...");
        std::process::exit(2);
    };
    let threads: i32 = threads.parse().expect("threads");
    let n_predict: usize = n_predict.parse().expect("n_predict");
    let mut backend = LlamaBackend::init().expect("backend");
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, model_path, &LlamaModelParams::default()).expect("model");
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(2048))
        .with_n_batch(512)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    // The engine's setting (crates/engine/src/model.rs) unless PLAIN_FLASH_ATTN=auto:
    // the binding cost is measured on the same llama.cpp configuration.
    let params = if std::env::var("PLAIN_FLASH_ATTN").is_ok_and(|v| v == "auto") {
        params
    } else {
        params.with_flash_attention_policy(llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED)
    };
    let mut ctx = model.new_context(&backend, params).expect("context");
    let mut batch = LlamaBatch::new(512, 1);
    for prompt in prompts {
        ctx.clear_kv_cache();
        let tokens = model.vocab().tokenize(prompt.as_bytes(), true, true);
        batch.clear();
        for (i, &t) in tokens.iter().enumerate() {
            batch.add(t, i as i32, &[0], i + 1 == tokens.len()).expect("batch");
        }
        ctx.decode(&mut batch).expect("decode prompt");
        if std::env::var("PLAIN_BATCH_COSTS").is_ok() {
            // What a verification batch of n tokens costs after this prompt
            // (median of 7), as the engine measures at load.
            let base = tokens.len() as i32;
            let t = tokens[tokens.len() - 1];
            let mut out = Vec::new();
            for n in [1usize, 2, 4, 8, 16] {
                let mut ms: Vec<f64> = (0..7)
                    .map(|_| {
                        batch.clear();
                        for i in 0..n {
                            batch.add(t, base + i as i32, &[0], true).expect("batch");
                        }
                        let start = Instant::now();
                        ctx.decode(&mut batch).expect("decode");
                        let ms = start.elapsed().as_secs_f64() * 1000.0;
                        ctx.clear_kv_cache_seq(Some(0), Some(base as u32), None).expect("kv");
                        ms
                    })
                    .collect();
                ms.sort_by(f64::total_cmp);
                out.push(format!("\"t{n}\":{:.2}", ms[3]));
            }
            println!("{{{}}}", out.join(","));
            continue;
        }
        let mut sampler = LlamaSampler::greedy();
        let mut pos = tokens.len() as i32;
        let start = Instant::now();
        let mut n = 0;
        while n < n_predict {
            let token = sampler.sample(&ctx, batch.n_tokens() - 1);
            n += 1;
            if n == n_predict {
                break;
            }
            batch.clear();
            batch.add(token, pos, &[0], true).expect("batch");
            ctx.decode(&mut batch).expect("decode");
            pos += 1;
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        println!("{{\"tokens\":{n},\"ms\":{ms:.3},\"tok_s\":{:.3}}}", n as f64 * 1000.0 / ms);
    }
}
