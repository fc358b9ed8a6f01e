//! LoRA adapters: loaded with the target model's context, applied per
//! sequence (llama.cpp with patch 0007), so each slot's request decodes with
//! its own adapters and scales in the shared batch. A token whose request
//! uses no adapter gets no product (or an exact zero one): base output bit
//! for bit.

use std::ffi::CString;
use std::path::Path;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_sys_2 as sys;

use super::llama_log;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::gguf;
use llama_engine_core::request::options::LoraOption;

/// The adapters of one target context, and the scales last given to it.
pub struct Adapters {
    ctx: *mut sys::llama_context,
    ptrs: Vec<*mut sys::llama_adapter_lora>,
    /// The load scales (a request without `lora` uses these).
    pub defaults: Vec<f32>,
    /// Adapter-major, `[adapter][seq]`, as last set.
    applied: Vec<f32>,
}

impl Adapters {
    /// None loaded.
    pub fn none() -> Self {
        Adapters { ctx: std::ptr::null_mut(), ptrs: Vec::new(), defaults: Vec::new(), applied: Vec::new() }
    }

    /// Loads `loras` for the target context just made on this thread
    /// (`ctx`), each checked against the model file at `model_path` first
    /// (the files are untrusted input).
    pub fn load(ctx: &LlamaContext<'_>, model_path: &str, loras: &[LoraOption]) -> Result<Self> {
        if loras.is_empty() {
            return Ok(Adapters::none());
        }
        let _ = ctx; // the pointer comes from llama.cpp: llama-cpp-2 keeps its own private
        let raw = unsafe { sys::llama_last_context_created() };
        if raw.is_null() {
            return Err(EngineError::internal("no context to load LoRA adapters into"));
        }
        let model = unsafe { sys::llama_get_model(raw) } as *mut sys::llama_model;
        let base = gguf::read_gguf(Path::new(model_path))
            .map_err(|e| EngineError::new(ErrorCode::ModelLoadFailed, format!("{model_path}: {}", e.0)))?;
        let mut ptrs = Vec::with_capacity(loras.len());
        for (i, l) in loras.iter().enumerate() {
            let fail = |why: String| EngineError::new(ErrorCode::ModelLoadFailed, format!("loras[{i}] {}: {why}", l.path));
            let file = gguf::read_gguf(Path::new(&l.path)).map_err(|e| fail(e.0))?;
            gguf::check_adapter(&file, &base).map_err(fail)?;
            let path = CString::new(l.path.as_str()).map_err(|_| fail("the path contains NUL".into()))?;
            let (ptr, log) = llama_log::capture(|| unsafe { sys::llama_adapter_lora_init(model, path.as_ptr()) });
            if ptr.is_null() {
                let why = llama_log::reason(&log).unwrap_or_else(|| "llama.cpp could not load it and logged no reason".into());
                return Err(fail(format!("llama.cpp refused it: {why}")));
            }
            ptrs.push(ptr);
        }
        Ok(Adapters { ctx: raw, ptrs, defaults: loras.iter().map(|l| l.scale).collect(), applied: Vec::new() })
    }

    pub fn len(&self) -> usize {
        self.ptrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ptrs.is_empty()
    }

    /// A request's scale of every adapter: its `lora` list (adapters not
    /// listed: 0), else the load scales.
    pub fn scales_for(&self, lora: Option<&[(u32, f32)]>) -> Result<Vec<f32>> {
        let Some(list) = lora else { return Ok(self.defaults.clone()) };
        let mut scales = vec![0.0; self.len()];
        for (i, &(id, scale)) in list.iter().enumerate() {
            let slot = scales.get_mut(id as usize).ok_or_else(|| {
                EngineError::invalid(
                    &format!("lora[{i}].id"),
                    format!("{id} is not a loaded adapter ({} loaded: EngineOptions.loras)", self.len()),
                )
            })?;
            *slot = scale;
        }
        Ok(scales)
    }

    /// Gives the context each sequence's scales (`per_seq[seq]`, one scale
    /// per adapter; an empty entry: no adapter), when they changed.
    pub fn apply(&mut self, per_seq: &[&[f32]]) -> Result<()> {
        if self.ptrs.is_empty() {
            return Ok(());
        }
        let n_seq = per_seq.len();
        let mut m = vec![0.0f32; self.ptrs.len() * n_seq];
        for (seq, scales) in per_seq.iter().enumerate() {
            for (a, &s) in scales.iter().enumerate().take(self.ptrs.len()) {
                m[a * n_seq + seq] = s;
            }
        }
        if m == self.applied {
            return Ok(());
        }
        let rc = unsafe { sys::llama_set_adapters_lora_seq(self.ctx, self.ptrs.as_mut_ptr(), self.ptrs.len(), m.as_ptr(), n_seq as i32) };
        if rc != 0 {
            return Err(EngineError::internal("llama.cpp refused the LoRA scales"));
        }
        self.applied = m;
        Ok(())
    }
}
