//! Loading models on the engine thread, and what the rest of the engine needs
//! to know about them.

use llama_engine_core::speculation::suffix::VocabId;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::{ggml_setup, llama_log};
use llama_engine_core::chat::ChatTemplate;
use llama_engine_core::embed::Pooling;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::gguf;
use llama_engine_core::request::infill::{infill_tokens, FimTokens, Infill, InfillBudget};
pub use llama_engine_core::request::options::EngineOptions;
use llama_engine_core::request::{CompletionRequest, PromptPart};

/// Reports model loading progress, 0..1.
pub type Progress = Box<dyn FnMut(f32) + Send>;

/// llama.cpp's backend initialises once per process; every engine shares it.
/// The settings exactness needs (`ggml_setup`) are applied first, so they
/// hold for every model and computation of the process.
pub fn backend() -> Result<&'static LlamaBackend> {
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_log::install();
            #[cfg(feature = "prebuilt")]
            ggml_setup::load_cpu_backend()?;
            super::gpu::start();
            let backend = LlamaBackend::init().map_err(|e| e.to_string())?;
            ggml_setup::keep_invariant_buffer_types();
            Ok(backend)
        })
        .as_ref()
        .map_err(|e| EngineError::internal(format!("llama.cpp backend: {e}")))
}

/// Facts about the loaded target model, shared with the JS thread.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    /// The model file's path, as loaded.
    pub path: String,
    pub n_vocab: i32,
    pub n_ctx: u32,
    pub n_ctx_train: u32,
    pub n_batch: u32,
    pub threads: i32,
    pub add_bos: bool,
    pub eog: Vec<i32>,
    pub draft_name: Option<String>,
    /// Requests decoded together (slots).
    pub parallel: usize,
    /// The load-time self-check (`core::speculation::invariance`): logits bit-identical
    /// alone and inside a batch, and what it found.
    pub batch_invariant: bool,
    pub batch_invariance: String,
    /// The GGUF's identity (`core::cache::session::fingerprint`), for session files.
    pub fingerprint: String,
    /// The vocabulary's identity (every token's text), for suffix cache
    /// files: they hold token ids, valid for any model of this tokenizer.
    pub vocab_id: VocabId,
    /// Layers of the target and the draft model on a GPU (`engine::gpu`).
    pub gpu_layers: u32,
    pub draft_gpu_layers: u32,
    /// What computes this engine's cells, as session files record it: the
    /// CPU back end, and the GPU device when layers are offloaded.
    pub compute_id: String,
    /// No session file of this model and context is larger: a bound on what
    /// `loadSession` reads.
    pub session_bytes_max: u64,
    /// How `embed()` pools: `pooling`, else the GGUF's, else mean.
    pub pooling: Pooling,
    /// Whether the model attends causally (decoders): its embeddings are then
    /// computed in chunks; a bidirectional encoder needs an input in one pass.
    pub causal: bool,
    /// Width of an embedding.
    pub n_embd: usize,
    /// LoRA adapters loaded (path, default scale), ids in this order.
    pub loras: Vec<(String, f32)>,
    /// The RPC workers the target's layers are on (`rpc`), in order.
    pub rpc: Vec<String>,
    /// `determinism: 'portable'` (the portable kernels) or the default.
    pub portable: bool,
    /// What the projector (`mmprojPath`) lets the model read: images, audio.
    pub media: Option<(bool, bool)>,
}

/// A model as loaded, with the weight types its file holds (ggml's names:
/// the self-check proves their kernels).
pub struct Loaded {
    pub model: Arc<LlamaModel>,
    pub weight_types: Vec<String>,
}

/// Loads the model at `path`: `gpu_layers` of its layers on the GPU back
/// end, or, with `rpc` (ggml device indices of RPC workers,
/// `engine::rpc::devices`), every layer spread over those workers. With
/// `portable`, every weight in the plain layout the portable kernels read
/// (none repacked).
pub fn load_model(path: &str, gpu_layers: u32, rpc: &[usize], portable: bool, progress: Option<Progress>) -> Result<Loaded> {
    let fail = |why: String| EngineError::new(ErrorCode::ModelLoadFailed, format!("{path}: {why}"));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a file".into()));
    }
    // The file is untrusted: read and checked before llama.cpp sees it,
    // whose asserts on a bad header or hyperparameter abort the process.
    let file = gguf::read_gguf(Path::new(path)).map_err(|e| fail(e.0))?;
    // A model split over several files: llama.cpp reads the others too.
    let parts = gguf::split_parts(path, &file).map_err(fail)?;
    gguf::check_model(&file).map_err(fail)?;
    let mut weight_types: Vec<String> = file.tensors.iter().map(|t| t.kind.name.to_string()).collect();
    for (k, part) in parts.iter().enumerate() {
        let no = k + 2;
        let part_file = gguf::read_gguf(Path::new(part)).map_err(|e| fail(format!("part {no} of {}, {part}: {}", parts.len() + 1, e.0)))?;
        gguf::check_split_part(&part_file, no, parts.len() + 1).map_err(|why| fail(format!("{part}: {why}")))?;
        weight_types.extend(part_file.tensors.iter().map(|t| t.kind.name.to_string()));
    }
    weight_types.sort();
    weight_types.dedup();
    let backend = backend()?;
    let mut params = LlamaModelParams::default().with_n_gpu_layers(gpu_layers);
    if !rpc.is_empty() {
        // Every layer (and the output) on the workers, split by the memory
        // each reports; the token embeddings stay here, as llama.cpp keeps them.
        params = params.with_n_gpu_layers(u32::MAX / 2).with_devices(rpc).map_err(|e| fail(e.to_string()))?;
    } else if gpu_layers == 0 || !super::gpu::has_device() {
        // No GPU device at all (an empty list, not the default "all"): not
        // even ggml's offload of large CPU batches, which would compute them
        // in another order than the CPU does.
        params = params.with_devices(&[]).map_err(|e| fail(e.to_string()))?;
    }
    if let Some(mut cb) = progress {
        params = params.with_progress_callback(move |f| {
            cb(f);
            true
        });
    }
    // SAFETY: a thread-local flag of patch 0012, read by this thread's load.
    unsafe { llama_cpp_sys_2::llama_rs_set_extra_bufts(!portable) };
    let (loaded, log) = llama_log::capture(|| LlamaModel::load_from_file(backend, path, &params));
    // SAFETY: as above.
    unsafe { llama_cpp_sys_2::llama_rs_set_extra_bufts(true) };
    let model = loaded.map_err(|e| {
        fail(match llama_log::reason(&log) {
            Some(why) => format!("llama.cpp refused it: {why}"),
            None => format!("llama.cpp could not load it ({e}) and logged no reason"),
        })
    })?;
    check_loaded(&model).map_err(fail)?;
    Ok(Loaded { model: Arc::new(model), weight_types })
}

/// What llama.cpp asserts on later, when the model is used, checked once it
/// is loaded: a vocabulary whose BOS or EOS the model adds must have them.
fn check_loaded(model: &LlamaModel) -> std::result::Result<(), String> {
    let vocab = model.vocab();
    let n_vocab = model.n_vocab();
    if n_vocab <= 0 {
        return Err(format!("its vocabulary has {n_vocab} tokens"));
    }
    let valid = |t: LlamaToken| (0..n_vocab).contains(&t.0);
    if vocab.should_add_bos() && !valid(vocab.bos()) {
        return Err(format!("it asks for a BOS token before every prompt but has none (id {})", vocab.bos().0));
    }
    if vocab.should_add_eos() && !valid(vocab.eos()) {
        return Err(format!("it asks for an EOS token after every prompt but has none (id {})", vocab.eos().0));
    }
    if model.n_embd() <= 0 || model.n_layer() == 0 {
        return Err("it has no layers".into());
    }
    Ok(())
}

/// Tokens of a prompt a chat template rendered: special tokens parsed, and
/// the model's BOS added unless the template already wrote it (many do, as
/// `{{ bos_token }}`), so there is never a second one.
pub fn tokenize_chat(model: &LlamaModel, text: &str) -> Vec<LlamaToken> {
    let vocab = model.vocab();
    let mut tokens = vocab.tokenize(text.as_bytes(), false, true);
    if vocab.should_add_bos() && tokens.first() != Some(&vocab.bos()) {
        tokens.insert(0, vocab.bos());
    }
    tokens
}

/// A request's prompt as tokens. Like the legacy server: BOS (when the
/// model wants one) only before a leading string; token ids are taken as
/// given; a rendered chat prompt through `tokenize_chat`; a fill-in-the-
/// middle request as llama.cpp's `/infill` builds it (`core::request::infill`).
pub fn tokenize_prompt(model: &LlamaModel, req: &CompletionRequest, info: &ModelInfo) -> Result<Vec<LlamaToken>> {
    if let Some(infill) = &req.infill {
        return infill_prompt(model, req, infill, info);
    }
    let vocab = model.vocab();
    let mut tokens = Vec::new();
    for (i, part) in req.prompt.iter().enumerate() {
        match part {
            PromptPart::Text(s) => tokens.extend(vocab.tokenize(s.as_bytes(), i == 0, true)),
            PromptPart::Token(t) => tokens.push(LlamaToken(*t)),
            PromptPart::Chat(s) => tokens.extend(tokenize_chat(model, s)),
        }
    }
    if tokens.is_empty() {
        return Err(EngineError::invalid("prompt", "is empty and the model adds no BOS token: give at least one token"));
    }
    Ok(tokens)
}

/// The model's fill-in-the-middle tokens, when its vocabulary has the
/// prefix, suffix and middle ones (llama.cpp finds them in the GGUF's
/// metadata or by their usual texts: `<|fim_prefix|>`, `<fim_prefix>`, `<PRE>`…).
pub fn fim_tokens(model: &LlamaModel) -> Option<FimTokens> {
    let vocab = model.vocab();
    let some = |t: LlamaToken| (t.0 >= 0 && t.0 < model.n_vocab()).then_some(t.0);
    Some(FimTokens {
        pre: some(vocab.fim_pre())?,
        suf: some(vocab.fim_suf())?,
        mid: some(vocab.fim_mid())?,
        rep: some(vocab.fim_rep()),
        sep: some(vocab.fim_sep()),
        bos: if vocab.should_add_bos() { some(vocab.bos()) } else { None },
    })
}

fn infill_prompt(model: &LlamaModel, req: &CompletionRequest, infill: &Infill, info: &ModelInfo) -> Result<Vec<LlamaToken>> {
    let fim = fim_tokens(model).ok_or_else(|| {
        EngineError::invalid(
            "input_prefix",
            format!("{} has no fill-in-the-middle tokens (prefix, suffix and middle): use a code model trained for it", info.name),
        )
    })?;
    let vocab = model.vocab();
    let tokenize =
        |text: &str, special: bool| -> Vec<i32> { vocab.tokenize(text.as_bytes(), false, special).into_iter().map(|t| t.0).collect() };
    let budget = InfillBudget { n_ctx: info.n_ctx as usize, n_batch: info.n_batch as usize, n_predict: req.n_predict };
    Ok(infill_tokens(&fim, infill, &req.prompt, budget, &tokenize).into_iter().map(LlamaToken).collect())
}

/// The texts of the model's BOS and EOS tokens.
pub fn bos_eos_text(model: &LlamaModel) -> (String, String) {
    let vocab = model.vocab();
    let piece = |t: LlamaToken| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
    (piece(vocab.bos()), piece(vocab.eos()))
}

/// The chat template `messages` are rendered with, and its source:
/// `chatTemplate` when given, else the GGUF's `tokenizer.chat_template`;
/// `None` when neither exists; `Err` when the GGUF's does not compile
/// (requests with `messages` then say so; `prompt` requests are unaffected).
pub fn chat_template(model: &LlamaModel, over: Option<&str>) -> Result<Option<std::result::Result<(ChatTemplate, String), String>>> {
    let vocab = model.vocab();
    let piece = |t: LlamaToken| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
    let (bos, eos) = (piece(vocab.bos()), piece(vocab.eos()));
    if let Some(source) = over {
        return ChatTemplate::new(source, &bos, &eos)
            .map(|t| Some(Ok((t, source.to_string()))))
            .map_err(|e| EngineError::invalid("chatTemplate", format!("not a usable Jinja template: {e}")));
    }
    let Some(source) = model.chat_template(None).ok().and_then(|t| t.to_string().ok()) else { return Ok(None) };
    Ok(Some(ChatTemplate::new(&source, &bos, &eos).map(|t| (t, source)).map_err(|e| e.to_string())))
}

/// The id of `text` when it is one special token of the model (a control
/// token, whose text the model does not print), as llguidance sees them.
pub fn special_token(model: &LlamaModel, text: &str) -> Option<u32> {
    let vocab = model.vocab();
    match vocab.tokenize(text.as_bytes(), false, true).as_slice() {
        [t] if vocab.token_to_piece(*t, false, None).is_empty() && vocab.token_to_piece(*t, true, None) == text.as_bytes() => {
            u32::try_from(t.0).ok()
        }
        _ => None,
    }
}

/// A context of `n_ctx` cells in all for `n_seq` sequences: with
/// `unified`, one cache they share; without, one KV stream per sequence.
pub fn context_params(opts: &EngineOptions, n_ctx: u32, n_seq: u32, unified: bool) -> LlamaContextParams {
    LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(opts.batch_size)
        .with_n_ubatch(opts.batch_size)
        .with_n_seq_max(n_seq)
        .with_n_threads(opts.threads)
        .with_n_threads_batch(opts.threads)
        .with_kv_unified(unified)
        // Flash attention from the patched ggml (patches/llama-cpp-sys-2):
        // a query row's result does not depend on how many rows share its
        // batch or how the threads split the work, so verification rows
        // score exactly as plain decoding does (docs/exactness.md). In
        // portable mode attention is a product, a softmax and a product,
        // each with a portable kernel (patch 0012).
        .with_flash_attention_policy(if opts.portable {
            llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED
        } else {
            llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED
        })
}

pub fn model_info(model: &LlamaModel, opts: &EngineOptions) -> ModelInfo {
    let vocab = model.vocab();
    let n_vocab = model.n_vocab();
    let n_ctx_train = model.n_ctx_train();
    let n_ctx = if n_ctx_train > 0 { opts.context_size.min(n_ctx_train) } else { opts.context_size };
    let eog = (0..n_vocab).filter(|&t| vocab.is_eog(llama_cpp_2::token::LlamaToken(t))).collect();
    let vocab_id = VocabId::of((0..n_vocab).map(|t| vocab.text(llama_cpp_2::token::LlamaToken(t)).map_or(&[][..], |c| c.to_bytes())));
    ModelInfo {
        path: opts.model_path.clone(),
        name: file_name(&opts.model_path),
        n_vocab,
        n_ctx,
        n_ctx_train,
        n_batch: opts.batch_size.min(n_ctx),
        threads: opts.threads,
        add_bos: vocab.should_add_bos(),
        eog,
        draft_name: opts.draft_model_path.as_deref().map(file_name),
        parallel: opts.parallel,
        batch_invariant: false,
        batch_invariance: "not checked yet".into(),
        fingerprint: String::new(),
        vocab_id,
        gpu_layers: super::gpu::offloaded_layers(opts.gpu_layers, model.n_layer()),
        draft_gpu_layers: 0,
        compute_id: ggml_setup::backend_id(),
        // K and V rows of at most 4 × n_embd f16 values, in at most two
        // caches per layer, plus the header and the tokens.
        session_bytes_max: (65 << 20) + u64::from(n_ctx) * (32 * u64::from(model.n_layer()) * model.n_embd().max(1) as u64 + 64),
        pooling: opts.pooling.or_else(|| Pooling::from_gguf(arch_meta(model, "pooling_type").as_deref())).unwrap_or(Pooling::Mean),
        causal: arch_meta(model, "attention.causal").is_none_or(|v| v.trim() != "false"),
        n_embd: model.n_embd_out().max(0) as usize,
        loras: Vec::new(),
        rpc: opts.rpc.clone(),
        portable: opts.portable,
        media: None,
    }
}

/// A GGUF key of the model's architecture (`<general.architecture>.<key>`).
fn arch_meta(model: &LlamaModel, key: &str) -> Option<String> {
    let arch = model.meta_val_str("general.architecture").ok()?;
    model.meta_val_str(&format!("{arch}.{key}")).ok()
}

fn file_name(path: &str) -> String {
    Path::new(path).file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| path.to_string())
}

/// The quantization types `quantize` makes (llama.cpp's names).
const QUANT_TYPES: [(&str, llama_cpp_sys_2::llama_ftype); 10] = [
    ("Q2_K", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q2_K),
    ("Q3_K_M", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q3_K_M),
    ("Q4_0", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q4_0),
    ("Q4_1", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q4_1),
    ("Q4_K_M", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q4_K_M),
    ("Q5_K_M", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q5_K_M),
    ("Q6_K", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q6_K),
    ("Q8_0", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_Q8_0),
    ("F16", llama_cpp_sys_2::LLAMA_FTYPE_MOSTLY_F16),
    ("F32", llama_cpp_sys_2::LLAMA_FTYPE_ALL_F32),
];

/// Re-quantizes a GGUF file with llama.cpp's own quantizer.
pub fn quantize(input: &str, output: &str, ftype: &str) -> Result<()> {
    use llama_cpp_sys_2 as sys;
    let Some(&(_, ftype)) = QUANT_TYPES.iter().find(|(name, _)| *name == ftype) else {
        let names: Vec<&str> = QUANT_TYPES.iter().map(|(n, _)| *n).collect();
        return Err(EngineError::invalid("ftype", format!("unsupported: {ftype} ({})", names.join(", "))));
    };
    let fail = |why: String| EngineError::new(ErrorCode::ModelLoadFailed, format!("{input}: {why}"));
    let file = gguf::read_gguf(Path::new(input)).map_err(|e| fail(e.0))?;
    gguf::check_model(&file).map_err(fail)?;
    backend()?;
    let cin = std::ffi::CString::new(input).map_err(|_| EngineError::invalid("input", "contains NUL"))?;
    let cout = std::ffi::CString::new(output).map_err(|_| EngineError::invalid("output", "contains NUL"))?;
    let rc = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.allow_requantize = true;
        params.nthread = llama_engine_core::request::options::default_threads();
        sys::llama_model_quantize(cin.as_ptr(), cout.as_ptr(), &params)
    };
    if rc != 0 {
        return Err(fail(format!("llama_model_quantize failed ({rc})")));
    }
    Ok(())
}

/// The checks of llama.cpp's `common_speculative_are_compatible`: a draft
/// model must speak the target's vocabulary, or its drafts mean nothing.
pub fn check_compatible(target: &LlamaModel, draft: &LlamaModel) -> Result<()> {
    let fail = |why: String| EngineError::new(ErrorCode::IncompatibleDraft, format!("the draft model cannot draft for this target: {why}"));
    let (tv, dv) = (target.vocab(), draft.vocab());
    if tv.vocab_type() != dv.vocab_type() {
        return Err(fail(format!("vocabulary types differ ({:?} vs {:?})", tv.vocab_type(), dv.vocab_type())));
    }
    if tv.should_add_bos() != dv.should_add_bos() || tv.should_add_eos() != dv.should_add_eos() {
        return Err(fail("add-BOS/add-EOS flags differ".into()));
    }
    if tv.bos() != dv.bos() || tv.eos() != dv.eos() {
        return Err(fail(format!("BOS/EOS tokens differ (target {}/{}, draft {}/{})", tv.bos().0, tv.eos().0, dv.bos().0, dv.eos().0)));
    }
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if (nt - nd).abs() > 128 {
        return Err(fail(format!("vocabulary sizes differ by more than 128 (target {nt}, draft {nd})")));
    }
    for id in 5..nt.min(nd) {
        let t = llama_cpp_2::token::LlamaToken(id);
        if tv.text(t) != dv.text(t) {
            let show = |v: Option<&std::ffi::CStr>| v.map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
            return Err(fail(format!("token {id} differs (target {:?}, draft {:?})", show(tv.text(t)), show(dv.text(t)))));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use llama_engine_core::gguf::TensorType;

    /// The core's table of tensor types is ggml's, type by type.
    #[test]
    fn tensor_types_match_the_linked_ggml() {
        for id in 0..llama_cpp_sys_2::GGML_TYPE_COUNT {
            // SAFETY: plain lookups in ggml's static type table.
            let (block, size) = unsafe { (llama_cpp_sys_2::ggml_blck_size(id) as u64, llama_cpp_sys_2::ggml_type_size(id) as u64) };
            match TensorType::from_id(id) {
                Some(t) => assert_eq!((t.block_size, t.block_bytes), (block, size), "type {id} ({})", t.name),
                None => assert_eq!(block, 0, "ggml has type {id}; the core's table does not"),
            }
        }
    }
}
