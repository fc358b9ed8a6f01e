//! Process-wide settings of the llama.cpp/ggml CPU back end that exact
//! speculation depends on, applied once before llama.cpp computes anything,
//! and what the CPU back end says about its fast kernels.
//!
//! Greedy speculative output is bit-identical to plain decoding only if a
//! position's logits do not depend on how many rows share its batch. The
//! patched ggml makes its fast kernels so (patches/, docs/exactness.md);
//! flash attention is the patched kernel per context
//! (`model::context_params`), and one thing can only be chosen at run time:
//!
//! - "extra" weight buffer types: on a CPU with AMX, ggml keeps Q4_0/Q4_1/
//!   Q8_0/K-quant weights in an AMX buffer whose kernel uses VNNI for one row
//!   and AMX tiles for more (and crashes in this ggml version); KleidiAI
//!   (arm64) likewise. llama.cpp's `use_extra_bufts = false` would turn all
//!   of them off but llama-cpp-2 0.1.160 does not expose it, so the CPU
//!   device's list is cut to the repacked type (`CPU_REPACK`), which patch
//!   0009 makes batch-invariant for the one type it repacks (Q4_K, x86).
//!
//! The tiled K-quant mat-mul (`ggml-cpu/tiled/`) is on: patch 0006 makes the
//! one-row `vec_dot` of Q4_K, Q5_K and Q6_K do its float work in the tiled
//! kernel's order and keeps the other types off it. ggml reads
//! `GGML_CPU_TILED_MM` once per process: `0` turns the path off, `all` puts
//! every type it has on it (faster for Q2_K, Q3_K and IQ types, not
//! invariant for them).
//!
//! Whatever these leave, the engine measures: `engine::calibrate` decodes
//! the same tokens alone and in batches and compares the logits bit for bit,
//! and checks each weight type's kernels alone (`engine::matmul_check`)
//! (`status().batchInvariant`).

use std::ffi::CStr;

/// The environment variable ggml's tiled mat-mul reads: unset or `1` on for
/// Q4_K, Q5_K and Q6_K; `0` off; `all` on for every type it has.
pub const TILED_MM_ENV: &str = "GGML_CPU_TILED_MM";

/// The environment variable that turns repacked weights off (`0`); read
/// once, before the first model load.
pub const REPACK_ENV: &str = "LLAMA_ENGINE_REPACK";

/// A function the CPU back end exports by name (its registry's proc
/// address), with the CPU device and its registry; `None` where ggml has no
/// CPU device or the back end no such function. The caller transmutes the
/// pointer to the function's known signature.
pub(crate) fn cpu_proc(
    name: &CStr,
) -> Option<(llama_cpp_sys_2::ggml_backend_dev_t, llama_cpp_sys_2::ggml_backend_reg_t, *mut std::ffi::c_void)> {
    use llama_cpp_sys_2 as sys;
    // SAFETY: ggml registry lookups on the CPU device ggml registers; every
    // pointer is checked before it is used.
    unsafe {
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        if dev.is_null() {
            return None;
        }
        let reg = sys::ggml_backend_dev_backend_reg(dev);
        if reg.is_null() {
            return None;
        }
        let f = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        (!f.is_null()).then_some((dev, reg, f))
    }
}

/// The CPU back end's compiled-in features (`AVX2`, `FMA`, `AVX512_VNNI`,
/// `LLAMAFILE`…), as ggml lists them.
pub fn cpu_features() -> Vec<String> {
    use llama_cpp_sys_2 as sys;
    let mut out = Vec::new();
    let Some((_, reg, f)) = cpu_proc(c"ggml_backend_get_features") else {
        return out;
    };
    // SAFETY: the proc address has the signature of
    // `ggml_backend_get_features_t` and returns a static array ended by a
    // null name.
    unsafe {
        let get: unsafe extern "C" fn(sys::ggml_backend_reg_t) -> *const sys::ggml_backend_feature = std::mem::transmute(f);
        let mut p = get(reg);
        while !p.is_null() && !(*p).name.is_null() {
            out.push(CStr::from_ptr((*p).name).to_string_lossy().into_owned());
            p = p.add(1);
        }
    }
    out
}

/// The fast CPU kernels on in this process, as `status().batchInvariance`
/// names them; each is batch-invariant by the patches, and the self-check
/// proves it per type.
pub fn fast_kernels() -> String {
    let features = cpu_features();
    let has = |f: &str| features.iter().any(|x| x == f);
    let mut on = vec!["flash attention (one kernel for every row count)".to_string()];
    let x86 = has("SSE3") || has("AVX") || has("AVX2");
    if x86 && has("LLAMAFILE") {
        if has("AVX2") {
            // Patches 0002 and 0010: one row of these three in vec_dot's
            // arithmetic (the same as tinyBLAS's), Q8_0 four rows at a time.
            on.push("tinyBLAS (F32, F16, BF16, Q8_0, Q4_0, Q5_0, IQ4_NL) from 1 row (Q8_0, Q4_0, Q5_0 from 2; one row in the same arithmetic, Q8_0 four weight rows at a time)".into());
            on.push("weights prefetched while decoding".into());
        } else {
            on.push("tinyBLAS (F32, F16, BF16, Q8_0, Q4_0, Q5_0, IQ4_NL) from 1 row".into());
        }
        if has("AVX2") && has("FMA") {
            on.push("Q4_1 tiles from 2 rows".into());
        }
    }
    let tiled_isa = (has("AVX2") && has("FMA")) || has("AVX512_VNNI");
    // As ggml reads it: unset on, `all` every type, else C's atoi != 0.
    let setting = std::env::var(TILED_MM_ENV).ok();
    let atoi = |v: &str| {
        let v = v.trim_start();
        let sign = usize::from(v.starts_with(['-', '+']));
        v[sign..].chars().take_while(char::is_ascii_digit).any(|c| c != '0')
    };
    match setting.as_deref() {
        _ if !tiled_isa => {}
        Some("all") => on.push("tiled K-quants from 8 rows for every type (Q2_K, Q3_K and IQ types not invariant)".into()),
        Some(v) if !atoi(v) => {}
        _ => on.push("tiled K-quants (Q4_K, Q5_K, Q6_K) from 8 rows".into()),
    }
    let repacked = repacked_types();
    if !repacked.is_empty() {
        on.push(format!("repacked {} (8 rows interleaved, one kernel order for 1 row and many)", repacked.join(", ")));
    }
    on.join(", ")
}

/// The name ggml gives its repacked-weights buffer type.
pub const REPACK_BUFT: &str = "CPU_REPACK";

/// The repacked-weights buffer type when it is kept (as an address: the
/// pointer is ggml's, static for the life of the process).
static REPACK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Leaves only the repacked-weights type ([`REPACK_BUFT`]) in the CPU
/// device's list of extra weight buffer types, dropping AMX and KleidiAI
/// (whose kernels differ between one row and many). The patched ggml repacks
/// only the types whose one-row and many-row kernels compute the same bits
/// (patch 0009); `LLAMA_ENGINE_REPACK=0` in the environment drops the repacked
/// type too (every weight in the plain CPU buffer, mmapped). Returns the
/// names of the types that were listed. Call after the back end is
/// initialised and before any model is loaded; the list is a static of
/// ggml's, read at every model load.
pub fn keep_invariant_buffer_types() -> Vec<String> {
    use llama_cpp_sys_2 as sys;
    let mut names = Vec::new();
    let repack_on = std::env::var(REPACK_ENV).map(|v| v.trim() != "0").unwrap_or(true);
    let Some((dev, _, f)) = cpu_proc(c"ggml_backend_dev_get_extra_bufts") else {
        return names;
    };
    // SAFETY: the function returned by name has the signature of
    // `ggml_backend_dev_get_extra_bufts_t` and returns a null-terminated
    // array owned by ggml for the life of the process, which ggml reads only
    // while loading a model (never concurrently with this: it runs once,
    // before the first load). Entries are only moved forward within the
    // array and a null written after the last one kept.
    unsafe {
        let get: unsafe extern "C" fn(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type_t = std::mem::transmute(f);
        let list = get(dev);
        if list.is_null() {
            return names;
        }
        let (mut read, mut write) = (list, list);
        while !(*read).is_null() {
            let name = sys::ggml_backend_buft_name(*read);
            let name = if name.is_null() { String::new() } else { CStr::from_ptr(name).to_string_lossy().into_owned() };
            if repack_on && name == REPACK_BUFT {
                let _ = REPACK.set(*read as usize);
                *write = *read;
                write = write.add(1);
            }
            names.push(name);
            read = read.add(1);
        }
        *write = std::ptr::null_mut();
    }
    names
}

/// The repacked-weights buffer type, when this process keeps it.
pub fn repack_buffer_type() -> Option<llama_cpp_sys_2::ggml_backend_buffer_type_t> {
    REPACK.get().map(|&p| p as llama_cpp_sys_2::ggml_backend_buffer_type_t)
}

/// Whether the CPU back end repacks a 2-D weight of this type and shape
/// (patch 0009's `ggml_backend_cpu_repack_supports_type`; a back end without
/// it repacks nothing the engine keeps: no).
pub fn repack_supports(ty: llama_cpp_sys_2::ggml_type, ne0: i64, ne1: i64) -> bool {
    let Some((_, _, f)) = cpu_proc(c"ggml_backend_cpu_repack_supports_type") else {
        return false;
    };
    // SAFETY: the proc address is patch 0009's `ggml_cpu_repack_supports_type`,
    // a pure function of its arguments.
    unsafe {
        let supports: unsafe extern "C" fn(llama_cpp_sys_2::ggml_type, i64, i64) -> bool = std::mem::transmute(f);
        supports(ty, ne0, ne1)
    }
}

/// The weight types this process repacks (none when the repacked buffer
/// type was dropped), in ggml's type order.
pub fn repacked_types() -> Vec<&'static str> {
    use llama_cpp_sys_2 as sys;
    if repack_buffer_type().is_none() {
        return Vec::new();
    }
    let candidates = [
        (sys::GGML_TYPE_Q4_0, "Q4_0"),
        (sys::GGML_TYPE_Q8_0, "Q8_0"),
        (sys::GGML_TYPE_Q4_K, "Q4_K"),
        (sys::GGML_TYPE_Q5_K, "Q5_K"),
        (sys::GGML_TYPE_Q6_K, "Q6_K"),
    ];
    // a shape every repacked layout takes: 8 superblocks of 256, 64 rows
    candidates.iter().filter(|(ty, _)| repack_supports(*ty, 2048, 64)).map(|&(_, name)| name).collect()
}

/// Which CPU back end computes. A source build has one, compiled for the
/// machine that built it; the portable build picks one of its variants at
/// run time (`load_cpu_backend`).
pub fn cpu_backend() -> String {
    #[cfg(feature = "prebuilt")]
    {
        match CPU_VARIANT.get() {
            Some(Ok(v)) => v.clone(),
            Some(Err(e)) => format!("none ({e})"),
            None => "not loaded yet".into(),
        }
    }
    #[cfg(not(feature = "prebuilt"))]
    {
        "built in (source build)".into()
    }
}

/// ggml logs each back end it loads; the engine's logs are off unless
/// `LLAMA_ENGINE_LOG` asks for them.
pub fn quiet_logs() {
    if std::env::var_os("LLAMA_ENGINE_LOG").is_none() {
        unsafe extern "C" fn quiet(_: llama_cpp_sys_2::ggml_log_level, _: *const std::ffi::c_char, _: *mut std::ffi::c_void) {}
        // SAFETY: installs a callback that ignores its arguments.
        unsafe { llama_cpp_sys_2::ggml_log_set(Some(quiet), std::ptr::null_mut()) };
    }
}

#[cfg(feature = "prebuilt")]
static CPU_VARIANT: std::sync::OnceLock<std::result::Result<String, String>> = std::sync::OnceLock::new();

/// The portable build has no CPU back end linked in: its variants
/// (`libggml-cpu-<level>.so`, one per x86-64 or Arm level) ship beside the
/// addon. This scores each for this CPU with its own `ggml_backend_score`
/// (0 = cannot run here; higher = more features used), as ggml's loader does,
/// and registers the best. Returns the variant's name, e.g. `haswell`.
/// `LLAMA_ENGINE_CPU_VARIANT` forces one (for tests and benchmarks).
#[cfg(feature = "prebuilt")]
pub fn load_cpu_backend() -> std::result::Result<String, String> {
    CPU_VARIANT
        .get_or_init(|| {
            let dir = addon_dir().ok_or("cannot find the addon's directory")?;
            // ggml's names for back-end modules: `.so` on macOS as well; on
            // Windows `.dll`, with a `lib` prefix when built by MinGW.
            let ext = if cfg!(windows) { ".dll" } else { ".so" };
            let forced = std::env::var("LLAMA_ENGINE_CPU_VARIANT").ok();
            let mut best: Option<(i32, String, std::path::PathBuf)> = None;
            let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let stem = name.strip_prefix("lib").unwrap_or(&name);
                let Some(variant) = stem.strip_prefix("ggml-cpu-").and_then(|n| n.strip_suffix(ext)) else { continue };
                if forced.as_deref().is_some_and(|f| f != variant) {
                    continue;
                }
                if forced.is_none() && !batch_invariant_variant(variant) {
                    continue;
                }
                let score = score(&entry.path());
                if score > 0 && best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                    best = Some((score, variant.to_string(), entry.path()));
                }
            }
            let Some((_, variant, path)) = best else {
                return Err(match forced {
                    Some(f) => format!("CPU variant {f:?} is not in {} or cannot run on this CPU", dir.display()),
                    None => format!("no CPU back end in {} runs on this CPU", dir.display()),
                });
            };
            quiet_logs();
            let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
            // SAFETY: registers the library with ggml's back-end registry;
            // called once (OnceLock), before the back end is initialised.
            let reg = unsafe { llama_cpp_sys_2::ggml_backend_load(c.as_ptr()) };
            if reg.is_null() {
                return Err(format!("{}: ggml could not load it", path.display()));
            }
            let _ = VARIANT_FILE.set(path);
            Ok(variant)
        })
        .clone()
}

/// Registers the RPC back end (`engine::rpc`) where it is a module of its
/// own: the portable build ships `libggml-rpc.so` (`ggml-rpc.dll`) beside
/// the addon. Elsewhere ggml registers it at start; a build without it
/// leaves the registry without "RPC" (and `rpc` says so).
pub fn load_rpc_backend() {
    #[cfg(feature = "prebuilt")]
    {
        static LOADED: std::sync::Once = std::sync::Once::new();
        LOADED.call_once(|| {
            // SAFETY: a registry lookup by name.
            if !unsafe { llama_cpp_sys_2::ggml_backend_reg_by_name(c"RPC".as_ptr()) }.is_null() {
                return;
            }
            let Some(dir) = addon_dir() else { return };
            let names = if cfg!(windows) { ["ggml-rpc.dll", "libggml-rpc.dll"] } else { ["libggml-rpc.so", "ggml-rpc.so"] };
            for name in names {
                let path = dir.join(name);
                if !path.is_file() {
                    continue;
                }
                quiet_logs();
                if let Ok(c) = std::ffi::CString::new(path.to_string_lossy().as_bytes()) {
                    // SAFETY: registers the module with ggml's back-end registry.
                    unsafe { llama_cpp_sys_2::ggml_backend_load(c.as_ptr()) };
                }
                return;
            }
        });
    }
}

/// The file of the CPU variant loaded (`load_cpu_backend`).
#[cfg(feature = "prebuilt")]
static VARIANT_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Which build computes: the size and modification time of the addon's
/// own file and, in the portable build, of the CPU variant it loaded. A
/// verdict of the self-check kept across processes is for one build
/// (`calibrate`): rebuilt or reinstalled, the check runs again. Empty when
/// the files cannot be found.
pub fn build_id() -> String {
    fn stamp(path: &std::path::Path) -> Option<String> {
        let m = std::fs::metadata(path).ok()?;
        let t = m.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(format!("{}:{}:{}", path.display(), m.len(), t.as_nanos()))
    }
    #[cfg(any(unix, windows))]
    let addon = dl::file_of(build_id as *const std::ffi::c_void).and_then(|f| stamp(std::path::Path::new(&f)));
    #[cfg(not(any(unix, windows)))]
    let addon: Option<String> = None;
    let Some(addon) = addon else { return String::new() };
    #[cfg(feature = "prebuilt")]
    {
        match VARIANT_FILE.get().and_then(|p| stamp(p)) {
            Some(variant) => format!("{addon}|{variant}"),
            None => String::new(),
        }
    }
    #[cfg(not(feature = "prebuilt"))]
    addon
}

/// Whether a CPU variant's kernels give a row the same result whatever its
/// batch. ggml's Arm variants with the int8 matrix-multiply extension
/// (`MATMUL_INT8`: `armv8.6_*`, `armv9.2_*`, per ggml's CMake list) compute
/// Q4_0/Q4_1/Q8_0 and K-quant products two rows at a time (`smmla`) when the
/// batch has an even number of rows, in another order than one row alone,
/// so a token's logits would depend on how many drafts share its batch. The
/// engine picks the best variant without it (dotprod, fp16 and SVE kept);
/// `LLAMA_ENGINE_CPU_VARIANT=armv8.6_1` opts in, and the self-check then
/// reports `batchInvariant: false`.
#[cfg(feature = "prebuilt")]
fn batch_invariant_variant(variant: &str) -> bool {
    !(variant.starts_with("armv8.6") || variant.starts_with("armv9"))
}

/// `ggml_backend_score()` of a back-end library: 0 when it cannot run on
/// this CPU (or is not a back end).
#[cfg(feature = "prebuilt")]
fn score(path: &std::path::Path) -> i32 {
    // SAFETY: loads a ggml back-end library and calls its score function,
    // exactly what ggml's own loader does to choose a variant: loading runs
    // no code that needs the variant's instructions, and
    // `ggml_backend_score` is written to run on any CPU of the architecture.
    unsafe {
        let Some(lib) = dl::open(path) else { return 0 };
        let f = dl::symbol(lib, c"ggml_backend_score");
        let s = if f.is_null() {
            0
        } else {
            let f: unsafe extern "C" fn() -> i32 = std::mem::transmute(f);
            f()
        };
        dl::close(lib);
        s
    }
}

/// The directory the addon (this shared object or DLL) was loaded from.
#[cfg(feature = "prebuilt")]
fn addon_dir() -> Option<std::path::PathBuf> {
    let file = dl::file_of(addon_dir as *const std::ffi::c_void)?;
    std::path::Path::new(&file).canonicalize().ok()?.parent().map(|p| p.to_path_buf())
}

/// The dynamic loader, on POSIX (`dlopen`, `dladdr`) and on Windows
/// (`LoadLibraryW`, `GetModuleHandleExW`): only what choosing a CPU variant
/// needs.
#[cfg(unix)]
pub(super) mod dl {
    use std::ffi::{c_void, CStr};
    #[cfg(feature = "prebuilt")]
    use std::{ffi::CString, path::Path};

    #[cfg(feature = "prebuilt")]
    pub unsafe fn open(path: &Path) -> Option<*mut c_void> {
        let c = CString::new(path.to_string_lossy().as_bytes()).ok()?;
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        (!h.is_null()).then_some(h)
    }
    #[cfg(feature = "prebuilt")]
    pub unsafe fn symbol(lib: *mut c_void, name: &CStr) -> *mut c_void {
        libc::dlsym(lib, name.as_ptr())
    }
    /// Whether the library and everything it needs load here; `Err` is the
    /// loader's message (e.g. `libvulkan.so.1: cannot open shared object
    /// file`). The library stays loaded (ggml loads it next).
    #[cfg(feature = "prebuilt")]
    pub fn check_loadable(path: &Path) -> Result<(), String> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen of a path, then dlerror's thread-local message.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if h.is_null() {
                let e = libc::dlerror();
                let why = if e.is_null() { "cannot be loaded".into() } else { CStr::from_ptr(e).to_string_lossy().into_owned() };
                return Err(why);
            }
        }
        Ok(())
    }
    #[cfg(feature = "prebuilt")]
    pub unsafe fn close(lib: *mut c_void) {
        libc::dlclose(lib);
    }
    /// The file of the loaded object that holds `addr`.
    pub fn file_of(addr: *const c_void) -> Option<String> {
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables for an address inside
        // a loaded object; dli_fname points into them.
        let ok = unsafe { libc::dladdr(addr, &mut info) };
        if ok == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
    }
}

#[cfg(windows)]
pub(super) mod dl {
    #[cfg(feature = "prebuilt")]
    use std::ffi::CStr;
    use std::ffi::{c_void, OsString};
    use std::os::windows::ffi::OsStringExt;
    #[cfg(feature = "prebuilt")]
    use std::{os::windows::ffi::OsStrExt, path::Path};

    const GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS: u32 = 0x4;
    const GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT: u32 = 0x2;
    #[link(name = "kernel32")]
    extern "system" {
        fn LoadLibraryW(name: *const u16) -> *mut c_void;
        fn GetProcAddress(module: *mut c_void, name: *const std::ffi::c_char) -> *mut c_void;
        fn FreeLibrary(module: *mut c_void) -> i32;
        fn GetModuleHandleExW(flags: u32, addr: *const c_void, module: *mut *mut c_void) -> i32;
        fn GetModuleFileNameW(module: *mut c_void, name: *mut u16, size: u32) -> u32;
    }

    #[cfg(feature = "prebuilt")]
    pub unsafe fn open(path: &Path) -> Option<*mut c_void> {
        let wide: Vec<u16> = path.as_os_str().encode_wide().chain(Some(0)).collect();
        let h = LoadLibraryW(wide.as_ptr());
        (!h.is_null()).then_some(h)
    }
    #[cfg(feature = "prebuilt")]
    pub unsafe fn symbol(lib: *mut c_void, name: &CStr) -> *mut c_void {
        GetProcAddress(lib, name.as_ptr())
    }
    #[cfg(feature = "prebuilt")]
    pub unsafe fn close(lib: *mut c_void) {
        FreeLibrary(lib);
    }
    /// The file of the loaded module (DLL) that holds `addr`.
    pub fn file_of(addr: *const c_void) -> Option<String> {
        let mut module = std::ptr::null_mut();
        // SAFETY: asks the loader which module contains `addr`, without
        // taking a reference, then that module's file name into a buffer of
        // the size passed.
        unsafe {
            let flags = GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT;
            if GetModuleHandleExW(flags, addr, &mut module) == 0 {
                return None;
            }
            let mut buf = vec![0u16; 32768];
            let n = GetModuleFileNameW(module, buf.as_mut_ptr(), buf.len() as u32) as usize;
            if n == 0 || n >= buf.len() {
                return None;
            }
            Some(OsString::from_wide(&buf[..n]).to_string_lossy().into_owned())
        }
    }
}

/// What computed a KV cell here, as session files record it: the CPU back
/// end and the vector extensions of this CPU (a source build compiles
/// ggml for the machine it is built on). Cells from another back end are
/// valid here, but not bit-identical to what this one computes.
pub fn backend_id() -> String {
    let mut features: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! detect {
            ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { features.push($f); } )* };
        }
        detect!("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avx512bf16", "avxvnni");
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! detect {
            ($($f:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($f) { features.push($f); } )* };
        }
        detect!("neon", "dotprod", "i8mm", "sve", "sve2", "fp16");
    }
    format!("{} ({}; {})", cpu_backend(), std::env::consts::ARCH, features.join(" "))
}
