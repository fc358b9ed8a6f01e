//! The ceiling for `npm run bench` section `prefill`: llama.cpp alone (no
//! engine), timed like `llama-bench -p N -n M` but on a real prompt: the
//! prompt decoded in 512-token batches, then M greedy tokens after it.
//! The bench builds it twice: with this repository's settings and against
//! the unpatched registry crate with llama.cpp's default build options
//! (flash attention auto, llamafile, repacked weights, the tiled K-quant
//! path), which is the fastest this llama.cpp gets here. One JSON line per
//! prompt file:
//!
//! cargo run --release --example prefill_ceiling -- MODEL THREADS N_GEN PROMPT_FILE...

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
    let [model_path, threads, n_gen, files @ ..] = args.as_slice() else {
        eprintln!("usage: prefill_ceiling MODEL THREADS N_GEN PROMPT_FILE...");
        std::process::exit(2);
    };
    let threads: i32 = threads.parse().expect("threads");
    let n_gen: usize = n_gen.parse().expect("n_gen");
    let mut backend = LlamaBackend::init().expect("backend");
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, model_path, &LlamaModelParams::default()).expect("model");
    let n_batch = 512;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(8192))
        .with_n_batch(n_batch)
        .with_n_ubatch(n_batch)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model.new_context(&backend, params).expect("context");
    let mut batch = LlamaBatch::new(n_batch as usize, 1);
    for file in files {
        let prompt = std::fs::read_to_string(file).expect("prompt file");
        ctx.clear_kv_cache();
        let tokens = model.vocab().tokenize(prompt.as_bytes(), true, false);
        let start = Instant::now();
        for (c, chunk) in tokens.chunks(n_batch as usize).enumerate() {
            batch.clear();
            let base = c * n_batch as usize;
            for (i, &t) in chunk.iter().enumerate() {
                batch.add(t, (base + i) as i32, &[0], base + i + 1 == tokens.len()).expect("batch");
            }
            ctx.decode(&mut batch).expect("decode prompt");
        }
        let mut sampler = LlamaSampler::greedy();
        let mut token = sampler.sample(&ctx, batch.n_tokens() - 1);
        let prefill_ms = start.elapsed().as_secs_f64() * 1000.0;
        let start = Instant::now();
        for pos in tokens.len()..tokens.len() + n_gen.saturating_sub(1) {
            batch.clear();
            batch.add(token, pos as i32, &[0], true).expect("batch");
            ctx.decode(&mut batch).expect("decode");
            token = sampler.sample(&ctx, 0);
        }
        let decode_ms = start.elapsed().as_secs_f64() * 1000.0;
        println!(
            "{{\"prompt_tokens\":{},\"ttft_ms\":{prefill_ms:.1},\"prefill_tps\":{:.2},\"decode_tps\":{:.2}}}",
            tokens.len(),
            tokens.len() as f64 * 1000.0 / prefill_ms,
            (n_gen - 1) as f64 * 1000.0 / decode_ms
        );
    }
}
