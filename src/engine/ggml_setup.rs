//! Process-wide settings of the llama.cpp/ggml CPU back end that exact
//! speculation depends on, applied once before llama.cpp computes anything.
//!
//! Greedy speculative output is bit-identical to plain decoding only if a
//! position's logits do not depend on how many rows share its batch. Three
//! ggml CPU paths break that and are switched off at build time
//! (`.cargo/config.toml`: llamafile's tinyBLAS and repacked weights) or per
//! context (flash attention, `model::context_params`). The two here can only
//! be switched off at run time:
//!
//! - the tiled K-quant mat-mul (`ggml-cpu/tiled/tiled.cpp`) takes over Q2_K…
//!   Q6_K and IQ products from 8 activation rows and sums in another order
//!   than `vec_dot`. ggml reads `GGML_CPU_TILED_MM` once, with `getenv`, the
//!   first time it plans a mat-mul;
//! - "extra" weight buffer types: on a CPU with AMX, ggml keeps Q4_0/Q4_1/
//!   Q8_0/K-quant weights in an AMX buffer whose kernel uses VNNI for one row
//!   and AMX tiles for more (and crashes in this ggml version). llama.cpp's
//!   `use_extra_bufts = false` turns these off but llama-cpp-2 0.1.160 does
//!   not expose it, so the CPU device's list is emptied instead.
//!
//! Whatever these leave, the engine measures: `Session::calibrate` decodes
//! the same tokens alone and in batches and compares the logits bit for bit
//! (`status().batchInvariant`).

use std::ffi::CStr;

/// The environment variable ggml's tiled mat-mul reads; "0" turns it off.
pub const TILED_MM_ENV: &str = "GGML_CPU_TILED_MM";

/// Sets `GGML_CPU_TILED_MM=0` unless the process already has the variable,
/// so a user who sets it (`=1`, for speed) keeps that choice and the
/// self-check reports what it costs. Must run before llama.cpp's first
/// computation: ggml reads the variable once per process. The engine calls
/// it while initialising the llama.cpp back end, which every model load and
/// quantization goes through, on whichever thread (a worker's included) gets
/// there first; ggml in this addon is private to it (statically linked), so
/// no other library can have read the variable before.
pub fn turn_off_tiled_matmul() {
    if std::env::var_os(TILED_MM_ENV).is_none() {
        std::env::set_var(TILED_MM_ENV, "0");
    }
}

/// Empties the CPU device's list of extra weight buffer types (AMX, repacked
/// layouts, KleidiAI), so every weight lives in the plain CPU buffer and each
/// product is one `vec_dot` per output. Returns the names of the types that
/// were listed. Call after the back end is initialised and before any model
/// is loaded; the list is a static of ggml's, read at every model load.
pub fn disable_extra_buffer_types() -> Vec<String> {
    use llama_cpp_sys_2 as sys;
    let mut names = Vec::new();
    // SAFETY: plain ggml registry calls; the function returned by name has
    // the signature of `ggml_backend_dev_get_extra_bufts_t` and returns a
    // null-terminated array owned by ggml for the life of the process, which
    // ggml reads only while loading a model (never concurrently with this:
    // it runs once, before the first load).
    unsafe {
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        if dev.is_null() {
            return names;
        }
        let reg = sys::ggml_backend_dev_backend_reg(dev);
        if reg.is_null() {
            return names;
        }
        let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr());
        if f.is_null() {
            return names;
        }
        let get: unsafe extern "C" fn(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type_t = std::mem::transmute(f);
        let list = get(dev);
        if list.is_null() {
            return names;
        }
        let mut p = list;
        while !(*p).is_null() {
            let name = sys::ggml_backend_buft_name(*p);
            if !name.is_null() {
                names.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
            p = p.add(1);
        }
        *list = std::ptr::null_mut();
    }
    names
}
