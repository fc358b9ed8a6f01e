//! A model file's hyperparameters checked where llama.cpp asserts on them
//! (an assert aborts the whole process): layer and expert counts, the
//! sizes that become tensor shapes before llama.cpp compares them with the
//! file's (a shape of 0, or a product that wraps in 32 bits, is an assert),
//! head counts and their ratio, rope dimensions, the rope scaling type.
//! Shapes that are merely wrong are left to llama.cpp, which refuses them
//! with a message of its own.

use super::read::{GgufFile, Value, ValueType};

/// llama.cpp's limits (llama-hparams.h).
const MAX_LAYERS: i128 = 512;
const MAX_EXPERTS: i128 = 1024;
/// Sizes that become tensor dimensions: above this, products of two of
/// them (head size × heads) could wrap in llama.cpp's 32-bit arithmetic.
/// Real models stay far below (the largest embedding is 2^15, the largest
/// vocabulary under 2^20).
const MAX_SIZE: i128 = 1 << 24;
/// Lengths in tokens (context, sliding window): stored as u32 by
/// llama.cpp, used as signed 32-bit counts.
const MAX_TOKENS: i128 = i32::MAX as i128;
const ROPE_SCALING: [&str; 4] = ["none", "linear", "yarn", "longrope"];

/// Architectures that are not language models a context can run.
const NOT_GENERATIVE: [&str; 2] = ["clip", "mmproj"];

/// What is wrong with the model in `file`, if anything llama.cpp would
/// assert on.
pub fn check_model(file: &GgufFile) -> Result<(), String> {
    let arch = match file.get("general.architecture") {
        Some(Value::Str(a)) if !a.is_empty() => a.as_str(),
        Some(v) => return Err(format!("general.architecture is a {}, not a name", v.type_of().name())),
        None => return Err("no general.architecture: not a model file (an adapter or a projector?)".into()),
    };
    if NOT_GENERATIVE.contains(&arch) {
        return Err(format!("a '{arch}' file (a vision projector), not a language model"));
    }
    let h = Hparams { file, arch };

    let n_layer = h.int("block_count")?.ok_or_else(|| format!("{arch}.block_count is missing"))?;
    if !(1..=MAX_LAYERS).contains(&n_layer) {
        return Err(format!("{arch}.block_count is {n_layer}; llama.cpp loads 1 to {MAX_LAYERS} layers"));
    }
    if let Some(nextn) = h.int("nextn_predict_layers")? {
        if !(0..=n_layer).contains(&nextn) {
            return Err(format!("{arch}.nextn_predict_layers is {nextn}, not within the {n_layer} layers"));
        }
    }
    for key in ["context_length", "rope.scaling.original_context_length", "attention.sliding_window"] {
        h.within(key, 0, MAX_TOKENS)?;
    }
    let n_embd = h.int("embedding_length")?.ok_or_else(|| format!("{arch}.embedding_length is missing"))?;
    if !(1..=MAX_SIZE).contains(&n_embd) {
        return Err(format!("{arch}.embedding_length is {n_embd}; expected 1 to {MAX_SIZE}"));
    }
    // Every other integer of the architecture is a size or a count: none
    // may be negative or large enough to overflow a shape.
    for (key, value) in &file.metadata {
        let Some(name) = key.strip_prefix(arch).and_then(|k| k.strip_prefix('.')) else { continue };
        if ["context_length", "rope.scaling.original_context_length", "attention.sliding_window"].contains(&name) {
            continue;
        }
        let values: Vec<i128> = match value {
            Value::Int(_, v) => vec![*v],
            Value::Array { ints: Some(v), .. } => v.clone(),
            _ => continue,
        };
        if let Some(v) = values.iter().find(|&&v| !((0..=MAX_SIZE).contains(&v) || v == -1 && signed(value))) {
            return Err(format!("{key} is {v}; expected 0 to {MAX_SIZE}"));
        }
    }

    check_experts(&h, n_layer)?;

    let per_layer = |key: &str| -> Result<Option<Vec<i128>>, String> {
        match file.get(&format!("{arch}.{key}")) {
            None => Ok(None),
            Some(Value::Int(_, v)) => Ok(Some(vec![*v; n_layer as usize])),
            Some(Value::Array { ints: Some(v), len, .. }) => {
                if *len != n_layer as u64 {
                    return Err(format!("{arch}.{key} has {len} values for {n_layer} layers"));
                }
                Ok(Some(v.clone()))
            }
            Some(v) => Err(format!("{arch}.{key} is a {}, not a number or one per layer", v.type_of().name())),
        }
    };
    let heads = per_layer("attention.head_count")?.unwrap_or_else(|| vec![0; n_layer as usize]);
    let heads_kv = per_layer("attention.head_count_kv")?.unwrap_or_else(|| heads.clone());
    let scalar_kv = matches!(file.get(&format!("{arch}.attention.head_count_kv")), Some(Value::Int(..)));
    for (il, (&nh, &nkv)) in heads.iter().zip(&heads_kv).enumerate() {
        if nh > 0 && nkv == 0 && scalar_kv {
            return Err(format!("{arch}.attention.head_count_kv is 0 while layers have {nh} query heads"));
        }
        if nkv > nh && nh > 0 {
            return Err(format!("layer {il}: more key/value heads ({nkv}) than query heads ({nh})"));
        }
        if nh > 0 && nkv > 0 && nh % nkv != 0 {
            return Err(format!("layer {il}: {nh} query heads cannot share {nkv} key/value heads (not a divisor)"));
        }
    }
    let n_head = heads.iter().copied().max().unwrap_or(0);
    let attention = has_tensor(file, &["attn_q", "attn_qkv", "attn_k", "attn_v", "attn_output"]);
    if n_head == 0 && attention {
        return Err(format!("{arch}.attention.head_count is 0 (or missing) but the layers have attention weights"));
    }
    if n_head > 0 {
        let head_k = h.int("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_v = h.int("attention.value_length")?.unwrap_or(n_embd / n_head);
        for (what, size) in [("key", head_k), ("value", head_v)] {
            if size < 1 {
                return Err(format!(
                    "the attention {what} size is {size} ({arch}.attention.{what}_length, or embedding_length / head_count = {n_embd} / {n_head})"
                ));
            }
            if size * n_head > MAX_SIZE {
                return Err(format!("attention {what} size {size} × {n_head} heads overflows"));
            }
        }
        if let Some(n_rot) = h.int("rope.dimension_count")? {
            if n_rot > head_k || n_rot % 2 != 0 {
                return Err(format!(
                    "{arch}.rope.dimension_count is {n_rot}; rope rotates an even number of dimensions, at most the head size {head_k}"
                ));
            }
        }
    }
    if let Some(ff) = per_layer("feed_forward_length")? {
        if ff.iter().all(|&f| f == 0) && has_tensor(file, &["ffn_up", "ffn_down", "ffn_gate"]) {
            return Err(format!("{arch}.feed_forward_length is 0 but the layers have feed-forward weights"));
        }
    }
    if let Some(Value::Str(s)) = file.get(&format!("{arch}.rope.scaling.type")) {
        if !ROPE_SCALING.contains(&s.as_str()) {
            return Err(format!("{arch}.rope.scaling.type is '{s}'; llama.cpp knows {}", ROPE_SCALING.join(", ")));
        }
    }
    check_vocabulary(file)
}

/// Whether a value of a signed type (where -1 may mean "unset").
fn signed(v: &Value) -> bool {
    matches!(v, Value::Int(ValueType::I8 | ValueType::I16 | ValueType::I32 | ValueType::I64, _))
        || matches!(v, Value::Array { elem: ValueType::I8 | ValueType::I16 | ValueType::I32 | ValueType::I64, .. })
}

/// Mixture-of-experts counts, as llama.cpp asserts them.
fn check_experts(h: &Hparams, n_layer: i128) -> Result<(), String> {
    let arch = h.arch;
    let n_expert = h.int("expert_count")?.unwrap_or(0);
    if !(0..=MAX_EXPERTS).contains(&n_expert) {
        return Err(format!("{arch}.expert_count is {n_expert}; llama.cpp loads at most {MAX_EXPERTS}"));
    }
    let used = match h.file.get(&format!("{arch}.expert_used_count")) {
        None => 0,
        Some(Value::Int(_, v)) => *v,
        Some(Value::Array { ints: Some(v), len, .. }) if *len == n_layer as u64 => v.iter().copied().max().unwrap_or(0),
        Some(Value::Array { len, .. }) => return Err(format!("{arch}.expert_used_count has {len} values for {n_layer} layers")),
        Some(v) => return Err(format!("{arch}.expert_used_count is a {}", v.type_of().name())),
    };
    let groups = h.int("expert_group_count")?.unwrap_or(0);
    let groups_used = h.int("expert_group_used_count")?.unwrap_or(0);
    if used > n_expert {
        return Err(format!("{arch}.expert_used_count ({used}) is more than expert_count ({n_expert})"));
    }
    if n_expert > 0 {
        if used == 0 {
            return Err(format!("{arch}.expert_count is {n_expert} but expert_used_count is 0"));
        }
        if groups >= n_expert {
            return Err(format!("{arch}.expert_group_count ({groups}) must be below expert_count ({n_expert})"));
        }
        if groups > 1 && (n_expert % groups != 0 || groups_used < 1 || groups_used >= groups) {
            return Err(format!("{arch}: {n_expert} experts in {groups} groups with {groups_used} used is not a valid grouping"));
        }
    } else if used != 0 || groups != 0 {
        return Err(format!("{arch}: expert_used_count / expert_group_count set without experts"));
    }
    Ok(())
}

/// The vocabulary's arrays and ids, where llama.cpp reads them raw.
fn check_vocabulary(file: &GgufFile) -> Result<(), String> {
    let n_tokens = match file.get("tokenizer.ggml.tokens") {
        Some(Value::Array { elem: ValueType::String, len, .. }) => *len,
        Some(v) => return Err(format!("tokenizer.ggml.tokens is a {}, not a list of strings", v.type_of().name())),
        None => return Err("no vocabulary (tokenizer.ggml.tokens)".into()),
    };
    if n_tokens == 0 || n_tokens > i32::MAX as u64 {
        return Err(format!("tokenizer.ggml.tokens has {n_tokens} tokens"));
    }
    for (key, elems) in
        [("tokenizer.ggml.scores", &[ValueType::F32, ValueType::I32][..]), ("tokenizer.ggml.token_type", &[ValueType::I32][..])]
    {
        match file.get(key) {
            None => {}
            Some(Value::Array { elem, len, .. }) if elems.contains(elem) && *len < n_tokens => {
                return Err(format!("{key} has {len} entries for {n_tokens} tokens"));
            }
            Some(Value::Array { elem, .. }) if elems.contains(elem) => {}
            Some(v) => return Err(format!("{key} has the wrong type ({})", v.type_of().name())),
        }
    }
    match file.get("tokenizer.ggml.model") {
        // SentencePiece spells what it cannot split byte by byte.
        Some(Value::Str(m)) if m == "llama" => {
            if let Some(b) = (0..256).find(|&b| !file.byte_tokens[b]) {
                return Err(format!(
                    "the SentencePiece vocabulary has no token for byte 0x{b:02X} (<0x{b:02X}>): llama.cpp cannot tokenize text it does not cover"
                ));
            }
        }
        Some(Value::Str(_)) | None => {}
        Some(v) => return Err(format!("tokenizer.ggml.model is a {}, not a name", v.type_of().name())),
    }
    Ok(())
}

fn has_tensor(file: &GgufFile, kinds: &[&str]) -> bool {
    file.tensors.iter().any(|t| {
        t.name.strip_prefix("blk.").and_then(|rest| rest.split_once('.')).is_some_and(|(_, name)| kinds.iter().any(|k| name.starts_with(k)))
    })
}

/// The architecture's own keys (`<arch>.<key>`).
struct Hparams<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Hparams<'_> {
    /// An integer key, if present; another type is an error (llama.cpp
    /// would refuse it too, but with the key's name this is clearer).
    fn int(&self, key: &str) -> Result<Option<i128>, String> {
        let full = format!("{}.{key}", self.arch);
        match self.file.get(&full) {
            None => Ok(None),
            Some(Value::Int(_, v)) => Ok(Some(*v)),
            Some(Value::Array { ints: Some(v), .. }) => Ok(v.iter().copied().max()),
            Some(v) => Err(format!("{full} is a {}, not an integer", v.type_of().name())),
        }
    }

    fn within(&self, key: &str, lo: i128, hi: i128) -> Result<(), String> {
        match self.int(key)? {
            Some(v) if !(lo..=hi).contains(&v) => Err(format!("{}.{key} is {v}; expected {lo} to {hi}", self.arch)),
            _ => Ok(()),
        }
    }
}

/// Most rank a LoRA adapter's products may have.
const MAX_LORA_RANK: u64 = 4096;

/// The scalar keys llama.cpp's projector loader (tools/mtmd/clip.cpp) reads,
/// with the one type it reads each as: another type is an assert there.
const PROJECTOR_KEYS: &[(&str, ValueType)] = &[
    ("clip.audio.attention.head_count", ValueType::U32),
    ("clip.audio.attention.head_count_kv", ValueType::U32),
    ("clip.audio.attention.head_dim", ValueType::U32),
    ("clip.audio.attention.layer_norm_epsilon", ValueType::F32),
    ("clip.audio.block_count", ValueType::U32),
    ("clip.audio.chunk_size", ValueType::U32),
    ("clip.audio.conv_kernel_size", ValueType::U32),
    ("clip.audio.embedding_length", ValueType::U32),
    ("clip.audio.feed_forward_length", ValueType::U32),
    ("clip.audio.local_block_count", ValueType::U32),
    ("clip.audio.local_group_size", ValueType::U32),
    ("clip.audio.max_pos_emb", ValueType::U32),
    ("clip.audio.num_mel_bins", ValueType::U32),
    ("clip.audio.projection_dim", ValueType::U32),
    ("clip.audio.projector.downsample_rate", ValueType::U32),
    ("clip.audio.projector.head_count", ValueType::U32),
    ("clip.audio.projector.stack_factor", ValueType::U32),
    ("clip.audio.projector.window_size", ValueType::U32),
    ("clip.audio.projector_type", ValueType::String),
    ("clip.audio.rvq.num_quantizers", ValueType::U32),
    ("clip.audio.subsampling_factor", ValueType::U32),
    ("clip.audio.window_size", ValueType::U32),
    ("clip.gen.audio.attention.head_count", ValueType::U32),
    ("clip.gen.audio.attention.head_count_kv", ValueType::U32),
    ("clip.gen.audio.attention.head_dim", ValueType::U32),
    ("clip.gen.audio.attention.layer_norm_epsilon", ValueType::F32),
    ("clip.gen.audio.block_count", ValueType::U32),
    ("clip.gen.audio.embedding_length", ValueType::U32),
    ("clip.gen.audio.feed_forward_length", ValueType::U32),
    ("clip.gen.audio.model_variant", ValueType::String),
    ("clip.gen.audio.projection_dim", ValueType::U32),
    ("clip.gen.audio.projector_type", ValueType::String),
    ("clip.has_audio_encoder", ValueType::Bool),
    ("clip.has_gen_audio_encoder", ValueType::Bool),
    ("clip.has_vision_encoder", ValueType::Bool),
    ("clip.minicpmv_query_num", ValueType::U32),
    ("clip.minicpmv_version", ValueType::I32),
    ("clip.projector_type", ValueType::String),
    ("clip.use_gelu", ValueType::Bool),
    ("clip.use_silu", ValueType::Bool),
    ("clip.vision.attention.head_count", ValueType::U32),
    ("clip.vision.attention.head_count_kv", ValueType::U32),
    ("clip.vision.attention.head_dim", ValueType::U32),
    ("clip.vision.attention.layer_norm_epsilon", ValueType::F32),
    ("clip.vision.block_count", ValueType::U32),
    ("clip.vision.embedding_length", ValueType::U32),
    ("clip.vision.expert_used_count", ValueType::U32),
    ("clip.vision.feed_forward_length", ValueType::U32),
    ("clip.vision.image_max_pixels", ValueType::U32),
    ("clip.vision.image_min_pixels", ValueType::U32),
    ("clip.vision.image_size", ValueType::U32),
    ("clip.vision.mm_patch_merge_type", ValueType::String),
    ("clip.vision.n_wa_pattern", ValueType::U32),
    ("clip.vision.patch_size", ValueType::U32),
    ("clip.vision.preproc_image_size", ValueType::U32),
    ("clip.vision.preproc_max_tiles", ValueType::U32),
    ("clip.vision.preproc_min_tiles", ValueType::U32),
    ("clip.vision.projection_dim", ValueType::U32),
    ("clip.vision.projector.query_side", ValueType::U32),
    ("clip.vision.projector.scale_factor", ValueType::U32),
    ("clip.vision.projector.window_side", ValueType::U32),
    ("clip.vision.projector_type", ValueType::String),
    ("clip.vision.sam.block_count", ValueType::U32),
    ("clip.vision.sam.embedding_length", ValueType::U32),
    ("clip.vision.sam.head_count", ValueType::U32),
    ("clip.vision.spatial_merge_size", ValueType::U32),
    ("clip.vision.swiglu_clamp", ValueType::F32),
    ("clip.vision.window_size", ValueType::U32),
    ("general.description", ValueType::String),
    ("general.name", ValueType::String),
];

/// A projector's tensors as its loader trusts them: llama.cpp's projector
/// graphs take the shapes as they are (a weight of another shape is a
/// shape assert or a read out of bounds) and skip a weight they do not find
/// where it is optional (a renamed one is then a null pointer). So: the
/// tensors tile the data section in order, each where the one before it
/// ends (how every GGUF writer lays them out; a size changed by damage
/// leaves a gap or an overlap), and every encoder block up to the block
/// count has its attention and feed-forward weights.
fn check_projector_tensors(file: &GgufFile) -> Result<(), String> {
    let align = file.alignment.max(1);
    let mut sorted: Vec<&super::read::TensorInfo> = file.tensors.iter().collect();
    sorted.sort_by_key(|t| t.offset);
    let mut end = 0u64;
    for t in &sorted {
        if t.offset != end.div_ceil(align) * align {
            return Err(format!("tensor {} starts at {} of the data, not where the one before it ends ({end}): damaged", t.name, t.offset));
        }
        end = t.offset + t.bytes;
    }
    let names: std::collections::HashSet<&str> = file.tensors.iter().map(|t| t.name.as_str()).collect();
    for (prefix, modality) in [("v", "vision"), ("a", "audio")] {
        let has_blocks = names.contains(format!("{prefix}.blk.0.attn_q.weight").as_str())
            || names.contains(format!("{prefix}.blk.0.attn_qkv.weight").as_str());
        if !has_blocks {
            continue;
        }
        let n_layer = file.get(&format!("clip.{modality}.block_count")).and_then(Value::as_int).unwrap_or(0);
        for i in 0..n_layer {
            let w = |name: &str| format!("{prefix}.blk.{i}.{name}.weight");
            let qkv = names.contains(w("attn_qkv").as_str());
            let needed: &[&str] = if qkv { &["attn_out", "ffn_down"] } else { &["attn_q", "attn_k", "attn_v", "attn_out", "ffn_down"] };
            if let Some(missing) = needed.iter().map(|n| w(n)).find(|n| !names.contains(n.as_str())) {
                return Err(format!("no tensor {missing} ({modality} block {i} of {n_layer}): damaged or not a projector llama.cpp reads"));
            }
        }
    }
    Ok(())
}

/// What is wrong with the multimodal projector in `file` (an `mmproj`
/// GGUF), if anything its loader would assert on: a key of the wrong type,
/// sizes out of range. What it merely refuses (an unknown projector type, a
/// missing tensor, the wrong text model) it refuses with a message of its own.
pub fn check_projector(file: &GgufFile) -> Result<(), String> {
    match file.get("general.architecture") {
        Some(Value::Str(a)) if a == "clip" => {}
        Some(Value::Str(a)) => return Err(format!("a '{a}' file, not a multimodal projector (general.architecture 'clip')")),
        _ => return Err("no general.architecture 'clip': not a multimodal projector".into()),
    }
    for (key, ty) in PROJECTOR_KEYS {
        let Some(v) = file.get(key) else { continue };
        if v.type_of() != *ty {
            return Err(format!("{key} is a {}, not a {}", v.type_of().name(), ty.name()));
        }
        if let Value::Int(_, n) = v {
            if !(0..=MAX_SIZE).contains(n) {
                return Err(format!("{key} is {n}; expected 0 to {MAX_SIZE}"));
            }
        }
    }
    // The sizes that become tensor shapes and divisors in the encoder's graph
    // (a zero there, or a head count that does not divide the width, is a
    // shape assert in ggml).
    let int = |key: &str| file.get(key).and_then(Value::as_int);
    for modality in ["vision", "audio"] {
        let key = |name: &str| format!("clip.{modality}.{name}");
        let Some(n_embd) = int(&key("embedding_length")) else { continue };
        let positive = |name: &str| -> Result<Option<i128>, String> {
            match int(&key(name)) {
                Some(v) if v <= 0 => Err(format!("{} is {v}; it must be at least 1", key(name))),
                v => Ok(v),
            }
        };
        positive("embedding_length")?;
        positive("feed_forward_length")?;
        positive("projection_dim")?;
        let n_head = positive("attention.head_count")?.unwrap_or(1);
        let n_head_kv = positive("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = positive("attention.head_dim")?;
        if head_dim.is_none() && n_embd % n_head != 0 {
            return Err(format!("{} ({n_embd}) is not a multiple of {} ({n_head})", key("embedding_length"), key("attention.head_count")));
        }
        if n_head % n_head_kv != 0 {
            return Err(format!(
                "{} ({n_head}) is not a multiple of {} ({n_head_kv})",
                key("attention.head_count"),
                key("attention.head_count_kv")
            ));
        }
        if modality == "vision" {
            let patch = positive("patch_size")?.unwrap_or(1);
            let image = positive("image_size")?.unwrap_or(patch);
            if image < patch {
                return Err(format!("{} ({image}) is smaller than its patch ({patch})", key("image_size")));
            }
            positive("projector.scale_factor")?;
        }
    }
    check_projector_tensors(file)?;
    let has = |key: &str| matches!(file.get(key), Some(Value::Bool(true)));
    if !has("clip.has_vision_encoder") && !has("clip.has_audio_encoder") {
        return Err("neither clip.has_vision_encoder nor clip.has_audio_encoder: a projector of nothing this engine reads".into());
    }
    for key in ["clip.vision.image_mean", "clip.vision.image_std"] {
        if let Some(Value::Array { len, .. }) = file.get(key) {
            if *len < 3 {
                return Err(format!("{key} has {len} values; an RGB image needs 3"));
            }
        }
    }
    Ok(())
}

/// What makes `adapter` unusable with the model in `base`, if anything:
/// it must be a LoRA adapter (`general.type = adapter`, `adapter.type =
/// lora`) of the same architecture, and each `<weight>.lora_a` /
/// `.lora_b` pair must fit a weight of the base (`a`: [n_in, r], `b`:
/// [r, n_out] against the weight's [n_in, n_out]).
pub fn check_adapter(adapter: &GgufFile, base: &GgufFile) -> Result<(), String> {
    let text = |f: &GgufFile, key: &str| f.get(key).and_then(Value::as_str).map(str::to_owned);
    match text(adapter, "general.type").as_deref() {
        Some("adapter") => {}
        Some(t) => return Err(format!("general.type is {t:?}, not \"adapter\": not a LoRA adapter")),
        None => return Err("no general.type: not a LoRA adapter (a model file?)".into()),
    }
    match text(adapter, "adapter.type").as_deref() {
        Some("lora") => {}
        other => return Err(format!("adapter.type is {other:?}, not \"lora\"")),
    }
    let (arch, base_arch) = (text(adapter, "general.architecture"), text(base, "general.architecture"));
    if arch != base_arch {
        return Err(format!(
            "an adapter for a {} model, not for this {} model",
            arch.as_deref().unwrap_or("(no architecture)"),
            base_arch.as_deref().unwrap_or("(no architecture)")
        ));
    }
    if adapter.tensors.is_empty() {
        return Err("it holds no tensors".into());
    }
    for t in &adapter.tensors {
        let Some(weight) = t.name.strip_suffix(".lora_a").or_else(|| t.name.strip_suffix(".lora_b")) else {
            return Err(format!("tensor {:?} is neither a .lora_a nor a .lora_b", t.name));
        };
        let other = if t.name.ends_with(".lora_a") { format!("{weight}.lora_b") } else { format!("{weight}.lora_a") };
        if adapter.tensor(&other).is_none() {
            return Err(format!("tensor {:?} has no {other:?}", t.name));
        }
        if !["F32", "F16", "BF16", "Q8_0"].contains(&t.kind.name) {
            return Err(format!("tensor {:?} is {}: adapters of F32, F16, BF16 or Q8_0 are read", t.name, t.kind.name));
        }
        let w = base.tensor(weight).ok_or_else(|| format!("it adapts {weight:?}, which this model does not have (another base model?)"))?;
        if t.dims.len() != 2 || w.dims.len() != 2 {
            return Err(format!("tensor {:?} or its weight is not a matrix", t.name));
        }
        let (a, b) = if t.name.ends_with(".lora_a") { (t, adapter.tensor(&other)) } else { (adapter.tensor(&other).unwrap_or(t), Some(t)) };
        let Some(b) = b else { continue };
        if weight == "token_embd.weight" {
            continue; // laid out the other way round; llama.cpp checks it
        }
        let rank = a.dims[1];
        let fits = a.dims[0] == w.dims[0] && b.dims[1] == w.dims[1] && b.dims[0] == rank;
        if !fits {
            return Err(format!(
                "{weight}: lora_a {:?} and lora_b {:?} do not fit the weight's {:?} (an adapter for another base model?)",
                a.dims, b.dims, w.dims
            ));
        }
        if rank == 0 || rank > MAX_LORA_RANK {
            return Err(format!("{weight}: rank {rank} (1 to {MAX_LORA_RANK} are read)"));
        }
    }
    Ok(())
}

/// Most files a split model may have (gguf-split's numbering: 5 digits).
const MAX_SPLITS: i128 = 99_999;

/// The paths of the other files of a model split over several (a
/// `split.count` above 1, as llama.cpp's gguf-split writes it), found as
/// llama.cpp finds them from the first one's name,
/// `<prefix>-00001-of-0000N.gguf`; none for a model in one file.
pub fn split_parts(path: &str, file: &GgufFile) -> Result<Vec<String>, String> {
    let count = match file.get("split.count") {
        None => return Ok(Vec::new()),
        Some(Value::Int(_, n)) if (1..=MAX_SPLITS).contains(n) => *n as usize,
        Some(Value::Int(_, n)) => return Err(format!("split.count is {n}; expected 1 to {MAX_SPLITS} files")),
        Some(v) => return Err(format!("split.count is a {}, not a number", v.type_of().name())),
    };
    if count == 1 {
        return Ok(Vec::new());
    }
    match file.get("split.no") {
        Some(Value::Int(_, 0)) | None => {}
        Some(Value::Int(_, n)) => {
            return Err(format!(
                "this is part {} of a split model of {count} files: load its first file (-00001-of-{count:05}.gguf)",
                n + 1
            ))
        }
        Some(v) => return Err(format!("split.no is a {}, not a number", v.type_of().name())),
    }
    let suffix = format!("-00001-of-{count:05}.gguf");
    let prefix = path.strip_suffix(&suffix).ok_or_else(|| {
        format!("a model split over {count} files, whose first file's name does not end in {suffix} (llama.cpp finds the others by it)")
    })?;
    Ok((2..=count).map(|i| format!("{prefix}-{i:05}-of-{count:05}.gguf")).collect())
}

/// Checks part `no` (1-based) of a split model of `count` files: its own
/// `split.no` and `split.count` say so.
pub fn check_split_part(file: &GgufFile, no: usize, count: usize) -> Result<(), String> {
    let int = |key: &str| match file.get(key) {
        Some(Value::Int(_, n)) => Some(*n),
        _ => None,
    };
    if int("split.count") != Some(count as i128) || int("split.no") != Some(no as i128 - 1) {
        return Err(format!("not part {no} of these {count} files (its split.no and split.count say otherwise)"));
    }
    Ok(())
}
