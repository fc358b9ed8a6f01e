//! What a GGUF model is, and what a context of it would take, without
//! loading its weights (`inspectModel`, `llama-engine inspect`). The file is
//! read and checked as a load checks it; llama.cpp then loads it with
//! `no_alloc` (metadata only, every buffer sized and none allocated) and
//! makes a context of the engine's settings the same way, so the sizes are
//! llama.cpp's own for this build.

use std::collections::BTreeMap;
use std::path::Path;

use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_sys_2 as sys;
use serde_json::{json, Value};

use super::llama_log;
use super::model;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::gguf::{self, GgufFile};
use llama_engine_core::request::options::EngineOptions;

/// The description of the model at `opts.model_path`, and the memory a
/// context of `opts.context_size` tokens per slot (`opts.parallel` slots)
/// takes.
pub fn inspect(opts: &EngineOptions) -> Result<Value> {
    let path = &opts.model_path;
    let fail = |why: String| EngineError::new(ErrorCode::ModelLoadFailed, format!("{path}: {why}"));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a file".into()));
    }
    let file = gguf::read_gguf(Path::new(path)).map_err(|e| fail(e.0))?;
    let general_type = text(&file, "general.type");
    if general_type.as_deref() == Some("adapter") {
        return Ok(describe_adapter(&file, path, meta.len()));
    }
    if text(&file, "general.architecture").as_deref() == Some("clip") {
        gguf::check_projector(&file).map_err(fail)?;
        return Ok(describe_projector(&file, path, meta.len()));
    }
    gguf::check_model(&file).map_err(fail)?;
    let arch = text(&file, "general.architecture").unwrap_or_default();
    let int = |key: &str| file.get(&format!("{arch}.{key}")).and_then(|v| v.as_int()).map(|v| v as i64);

    let mut types: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for t in &file.tensors {
        let e = types.entry(t.kind.name).or_default();
        e.0 += 1;
        e.1 += t.bytes;
    }
    let parameters: u64 = file.tensors.iter().map(|t| t.elements()).sum();
    // The type holding most of the bytes among the 2-D weights names the quantization.
    let file_type = file.get("general.file_type").and_then(|v| v.as_int());
    let main_type = file_type.and_then(|t| ftype_name(t as i64)).map(str::to_string).or_else(|| {
        file.tensors
            .iter()
            .filter(|t| t.dims.len() >= 2 && t.name != "token_embd.weight")
            .fold(BTreeMap::<&str, u64>::new(), |mut m, t| {
                *m.entry(t.kind.name).or_default() += t.bytes;
                m
            })
            .into_iter()
            .max_by_key(|&(_, b)| b)
            .map(|(n, _)| n.to_string())
    });

    // llama.cpp's own reading and sizes, without the weights.
    let backend = model::backend()?;
    let params = LlamaModelParams::default().with_no_alloc(true).with_devices(&[]).map_err(|e| fail(e.to_string()))?;
    let (loaded, log) = llama_log::capture(|| LlamaModel::load_from_file(backend, path, &params));
    let llm = loaded.map_err(|e| fail(llama_log::reason(&log).map_or_else(|| e.to_string(), |w| format!("llama.cpp refused it: {w}"))))?;
    let (bos, eos) = model::bos_eos_text(&llm);
    let (has_template, template_error, family) = match model::chat_template(&llm, None).ok().flatten() {
        Some(Ok((template, source))) => {
            (true, None, Some(super::chat::Chat::new(template, &source, None, &bos, &eos).family().to_string()))
        }
        Some(Err(e)) => (false, Some(e), None),
        None => (false, None, None),
    };
    let n_ctx_train = llm.n_ctx_train();
    let n_ctx = if opts.context_size == 0 { n_ctx_train } else { opts.context_size };
    let parallel = opts.parallel.max(1) as u32;
    let memory = memory(&llm, opts, n_ctx, parallel).unwrap_or_else(|why| json!({ "error": why }));

    Ok(json!({
        "kind": "model",
        "path": path,
        "fileBytes": meta.len(),
        "architecture": arch,
        "name": text(&file, "general.name"),
        "parameters": parameters,
        "quantization": main_type,
        "fileType": file_type.map(|v| v as i64),
        "tensorTypes": types.iter().map(|(n, (count, bytes))| json!({ "type": n, "tensors": count, "bytes": bytes })).collect::<Vec<_>>(),
        "contextLength": n_ctx_train,
        "layers": int("block_count"),
        "embeddingLength": int("embedding_length"),
        "heads": int("attention.head_count"),
        "kvHeads": int("attention.head_count_kv"),
        "slidingWindow": int("attention.sliding_window"),
        "experts": int("expert_count"),
        "vocabSize": llm.n_vocab(),
        "chatTemplate": has_template,
        "chatTemplateError": template_error,
        "toolCallFormat": family,
        "memory": memory,
    }))
}

/// What llama.cpp would allocate for a context of the engine's settings.
fn memory(llm: &LlamaModel, opts: &EngineOptions, n_ctx: u32, parallel: u32) -> std::result::Result<Value, String> {
    let params = model::context_params(opts, n_ctx.saturating_mul(parallel), parallel, false);
    let backend = model::backend().map_err(|e| e.message)?;
    let (ctx, log) = llama_log::capture(|| llm.new_context(backend, params));
    let ctx = ctx.map_err(|e| llama_log::reason(&log).unwrap_or_else(|| e.to_string()))?;
    let raw = unsafe { sys::llama_last_context_created() };
    let (mut weights, mut context, mut compute) = (0usize, 0usize, 0usize);
    if !raw.is_null() {
        unsafe { sys::llama_rs_memory_breakdown_sum(raw, &mut weights, &mut context, &mut compute) };
    }
    drop(ctx);
    Ok(json!({
        "contextSize": n_ctx,
        "parallel": parallel,
        "weights": weights,
        "kvCache": context,
        "compute": compute,
        "total": weights + context + compute,
    }))
}

/// llama.cpp's names of its file types (`general.file_type`, `llama_ftype`).
fn ftype_name(t: i64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

fn text(file: &GgufFile, key: &str) -> Option<String> {
    file.get(key).and_then(|v| v.as_str()).map(str::to_owned)
}

/// A multimodal projector (`mmproj`): what it reads, its image geometry and
/// the tokens an image takes where that is fixed (resizing projectors:
/// gemma3, idefics3, llava…); those that keep an image's aspect (Qwen2-VL…)
/// take about (width / patch / merge) × (height / patch / merge).
fn describe_projector(file: &GgufFile, path: &str, bytes: u64) -> Value {
    let int = |key: &str| file.get(key).and_then(|v| v.as_int()).map(|v| v as u64);
    let flag = |key: &str| matches!(file.get(key), Some(gguf::Value::Bool(true)));
    let vision = flag("clip.has_vision_encoder");
    let projector = text(file, "clip.projector_type").or_else(|| text(file, "clip.vision.projector_type"));
    let (image, patch) = (int("clip.vision.image_size"), int("clip.vision.patch_size"));
    let merge = int("clip.vision.projector.scale_factor").or(match projector.as_deref() {
        Some("gemma3") => Some(4),
        _ => None,
    });
    let tokens_per_image = match (projector.as_deref(), image, patch) {
        (Some("gemma3"), Some(i), Some(p)) if p > 0 => {
            let side = i / p / merge.unwrap_or(1).max(1);
            Some(side * side)
        }
        _ => None,
    };
    let weight_bytes: u64 = file.tensors.iter().map(|t| t.bytes).sum();
    json!({
        "kind": "projector",
        "path": path,
        "fileBytes": bytes,
        "name": text(file, "general.name"),
        "projectorType": projector,
        "vision": vision,
        "audio": flag("clip.has_audio_encoder"),
        "imageSize": if vision { image } else { None },
        "patchSize": if vision { patch } else { None },
        "tokensPerImage": tokens_per_image,
        "embeddingLength": int("clip.vision.projection_dim").or_else(|| int("clip.audio.projection_dim")),
        "tensors": file.tensors.len(),
        "parameters": file.tensors.iter().map(|t| t.elements()).sum::<u64>(),
        "weightBytes": weight_bytes,
    })
}

fn describe_adapter(file: &GgufFile, path: &str, bytes: u64) -> Value {
    let rank = file.tensors.iter().find(|t| t.name.ends_with(".lora_a")).and_then(|t| t.dims.get(1).copied());
    let alpha = file.get("adapter.lora.alpha").and_then(|v| match v {
        gguf::Value::Float(_, f) => Some(*f),
        gguf::Value::Int(_, i) => Some(*i as f64),
        _ => None,
    });
    json!({
        "kind": "adapter",
        "path": path,
        "fileBytes": bytes,
        "architecture": text(file, "general.architecture"),
        "name": text(file, "general.name"),
        "adapterType": text(file, "adapter.type"),
        "alpha": alpha,
        "rank": rank,
        "tensors": file.tensors.len(),
        "parameters": file.tensors.iter().map(|t| t.elements()).sum::<u64>(),
    })
}
