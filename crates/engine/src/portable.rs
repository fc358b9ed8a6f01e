//! Portable mode (`determinism: 'portable'`): the CPU back end's portable
//! kernels of patch 0012 (`ggml-cpu/portable.c`), which compute the same
//! bits on every CPU — switched on per context, the ops they do not cover
//! (gaps), and a digest of each kernel on fixed inputs compared with the
//! reference machine's (docs/testing.md).

use std::ffi::CStr;

use crate::ggml_setup::cpu_proc;

/// What `status().batchInvariance.kernels` says in portable mode.
pub const PORTABLE_KERNELS: &str = "portable kernels (patch 0012: the same bits on every CPU; 8-lane block and 16-lane element sums added in one tree, no fused multiply-add, integer block products, our own exp/tanh/sin/cos; attention as product, softmax, product)";

/// Puts a llama.cpp context's CPU back end on the portable kernels (patch
/// 0012) or back on the fast ones. `Err` when portable kernels were asked
/// for and this ggml or context has none.
pub(crate) fn set_portable(ctx: *mut llama_cpp_sys_2::llama_context, on: bool) -> Result<(), String> {
    if ctx.is_null() {
        return if on { Err("no context to make portable".into()) } else { Ok(()) };
    }
    // SAFETY: `ctx` is a live context the caller just made.
    let done = unsafe { llama_cpp_sys_2::llama_rs_set_portable(ctx, on) };
    if on && !done {
        return Err("determinism 'portable': this build's CPU back end has no portable kernels".into());
    }
    Ok(())
}

/// The first op a portable graph computed without a portable kernel (and
/// whose default kernel is not exact everywhere), since the last reset.
pub fn portable_first_gap() -> Option<String> {
    let (_, _, f) = cpu_proc(c"ggml_backend_cpu_portable_first_gap")?;
    // SAFETY: patch 0012's `const char * ggml_portable_first_gap(void)`: NULL or
    // a static op name of ggml's.
    unsafe {
        let get: unsafe extern "C" fn() -> *const std::ffi::c_char = std::mem::transmute(f);
        let p = get();
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

/// Every portable kernel's digest on fixed inputs (patch 0012's
/// `ggml_portable_digest`): op name and a 64-bit hash of its output bits.
/// Empty when this ggml has no portable kernels.
pub fn portable_digest() -> Vec<(String, u64)> {
    const MAX: usize = 64;
    let Some((_, _, f)) = cpu_proc(c"ggml_backend_cpu_portable_digest") else {
        return Vec::new();
    };
    let mut names = [std::ptr::null::<std::ffi::c_char>(); MAX];
    let mut hashes = [0u64; MAX];
    // SAFETY: patch 0012's `int ggml_portable_digest(const char **, uint64_t *, int)`
    // fills at most `max` entries with static names and returns how many ops it has.
    unsafe {
        let digest: unsafe extern "C" fn(*mut *const std::ffi::c_char, *mut u64, i32) -> i32 = std::mem::transmute(f);
        let n = (digest(names.as_mut_ptr(), hashes.as_mut_ptr(), MAX as i32).max(0) as usize).min(MAX);
        (0..n).filter(|&i| !names[i].is_null()).map(|i| (CStr::from_ptr(names[i]).to_string_lossy().into_owned(), hashes[i])).collect()
    }
}

/// The portable kernels' digests as the reference machine computed them
/// (`npm run test:variant` checks every x86 variant against them, and the
/// same on arm64 and Windows is what portable means).
pub const PORTABLE_REFERENCE: &[(&str, u64)] = &[
    ("mul_mat f32", 0x5fa5_f58e_a153_b40b),
    ("mul_mat f16", 0x2dff_bd52_9293_06bb),
    ("mul_mat bf16", 0x2af8_94e3_8f94_beca),
    ("mul_mat q4_0", 0xbe3d_7815_cebc_d127),
    ("mul_mat q4_1", 0x9e1d_500d_f3f7_6ba5),
    ("mul_mat q5_0", 0x04ff_913b_d4e0_8e36),
    ("mul_mat q5_1", 0x7227_d3e2_70a0_eca9),
    ("mul_mat q8_0", 0x355f_d6e7_a99b_e59f),
    ("mul_mat q4_K", 0xabf7_13f5_9402_d1cb),
    ("mul_mat q5_K", 0xbc3c_ca63_ebc9_e696),
    ("mul_mat q6_K", 0x77d0_325a_f577_d516),
    ("exp", 0xe6fa_c45b_ebb2_93a6),
    ("silu", 0x7b99_4035_65d9_e529),
    ("gelu", 0x91f0_b0d9_7c81_97dc),
    ("gelu_quick", 0x040b_20c2_e19d_98af),
    ("sigmoid", 0xef63_c4f8_113a_733d),
    ("tanh", 0x9bed_0eeb_18d7_d826),
    ("swiglu", 0x20dd_4b20_a65c_fec4),
    ("geglu", 0x005c_ce8b_ada9_cd1f),
    ("soft_max", 0x6252_c920_4431_712d),
    ("rms_norm", 0x6edd_39a5_9a45_26ae),
    ("rope neox", 0x0ded_5025_dce6_84e2),
    ("rope normal", 0x59fe_37a2_caa1_0326),
    ("rope yarn", 0x833f_ea3d_dd14_dd53),
    ("scale", 0x0143_a06c_876f_4803),
];

/// The ops whose portable kernel computes other bits here than on the
/// reference machine (or is missing), by name; empty when all agree.
pub fn portable_mismatches() -> Vec<String> {
    let here = portable_digest();
    let mut out = Vec::new();
    for (name, want) in PORTABLE_REFERENCE {
        match here.iter().find(|(n, _)| n == name) {
            Some((_, got)) if got == want => {}
            Some(_) => out.push(name.to_string()),
            None => out.push(format!("{name} (missing)")),
        }
    }
    out
}

/// Forgets the gaps seen so far (`portable_first_gap`).
pub fn portable_reset_gaps() {
    if let Some((_, _, f)) = cpu_proc(c"ggml_backend_cpu_portable_reset_gaps") {
        // SAFETY: patch 0012's `void ggml_portable_reset_gaps(void)`.
        unsafe {
            let reset: unsafe extern "C" fn() = std::mem::transmute(f);
            reset();
        }
    }
}
