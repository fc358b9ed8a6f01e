//! GPU back ends: which one computes, on which device, and why none does.
//!
//! A source build links the GPU back end it was built with (`--features
//! vulkan`, `cuda`, `metal`); ggml registers it when the process starts. The
//! portable build links none: the Vulkan back end is a ggml module
//! (`libggml-vulkan.so`) in an optional package. Loading a driver can crash
//! the process that loads it (a broken ICD, a driver built for another
//! kernel), so `index.js` first runs [`probe`] in a child process; only when
//! the child loaded the module, found a device and computed on it does the
//! engine's own process [`configure`] it, before llama.cpp's back end starts
//! (`model::backend`). Whatever happens, the engine computes on the CPU and
//! `status().gpu.reason` says why.
//!
//! A model whose `gpuLayers` is 0 gets no GPU device at all (not even for
//! ggml's "op offload" of large batches), so a CPU engine computes exactly as
//! it does without a GPU back end installed.

use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use llama_cpp_sys_2 as sys;
use serde_json::{json, Value};

/// A GPU (or integrated GPU) device in ggml's registry.
#[derive(Debug, Clone)]
pub struct GpuDevice {
    /// ggml's back end, e.g. `Vulkan`.
    pub backend: String,
    /// ggml's name, e.g. `Vulkan0`.
    pub name: String,
    /// The driver's, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub description: String,
    pub memory_total: u64,
}

impl GpuDevice {
    pub fn to_json(&self) -> Value {
        json!({
            "backend": self.backend,
            "name": self.name,
            "description": self.description,
            "memoryMB": self.memory_total / (1 << 20),
        })
    }
}

/// What `index.js` decided before the first load: a module to load, or why
/// there is none.
static CONFIGURED: Mutex<Option<Configured>> = Mutex::new(None);
/// The outcome, fixed when llama.cpp's back end starts.
static STATE: OnceLock<GpuState> = OnceLock::new();

#[derive(Debug, Clone)]
enum Configured {
    Module(std::path::PathBuf),
    None(String),
}

#[derive(Debug, Clone)]
pub struct GpuState {
    pub devices: Vec<GpuDevice>,
    /// Why no device computes, when none does.
    pub reason: Option<String>,
}

/// Records, before the first engine loads, the GPU module the process should
/// load (`Ok(path)`, after a successful [`probe`]) or why it loads none.
/// Returns false when llama.cpp's back end has already started: the first
/// decision of a process stands.
pub fn configure(decision: Result<String, String>) -> bool {
    let mut c = CONFIGURED.lock().unwrap_or_else(|p| p.into_inner());
    if STATE.get().is_some() {
        return false;
    }
    *c = Some(match decision {
        Ok(path) => Configured::Module(path.into()),
        Err(reason) => Configured::None(reason),
    });
    true
}

/// Runs once, while llama.cpp's back end starts (`model::backend`), after the
/// CPU back end is registered.
pub fn start() -> &'static GpuState {
    // Held while the state is decided, so `configure` is either before or
    // after (and then told so).
    let configured = CONFIGURED.lock().unwrap_or_else(|p| p.into_inner());
    STATE.get_or_init(|| {
        let loaded = match configured.clone() {
            Some(Configured::Module(path)) => load_module(&path).err(),
            Some(Configured::None(reason)) => Some(reason),
            None => None,
        };
        let devices = registered_devices();
        let reason = if devices.is_empty() {
            Some(loaded.unwrap_or_else(|| {
                if cfg!(feature = "prebuilt") {
                    "no GPU back end was configured".to_string()
                } else if cfg!(any(feature = "vulkan", feature = "cuda", feature = "metal")) {
                    "the GPU back end this addon was built with found no device".to_string()
                } else {
                    "this addon was built without a GPU back end (a source build: npm run build -- --features vulkan)".to_string()
                }
            }))
        } else {
            None
        };
        GpuState { devices, reason }
    })
}

/// The state, once llama.cpp's back end has started.
pub fn state() -> Option<&'static GpuState> {
    STATE.get()
}

/// GPU and integrated-GPU devices in ggml's registry.
pub fn registered_devices() -> Vec<GpuDevice> {
    let mut out = Vec::new();
    // SAFETY: reads ggml's device registry; names are static strings owned
    // by the back ends, copied here.
    unsafe {
        for i in 0..sys::ggml_backend_dev_count() {
            let dev = sys::ggml_backend_dev_get(i);
            if dev.is_null() || !is_gpu(dev) {
                continue;
            }
            out.push(describe(dev));
        }
    }
    out
}

unsafe fn is_gpu(dev: sys::ggml_backend_dev_t) -> bool {
    let t = sys::ggml_backend_dev_type(dev);
    t == sys::GGML_BACKEND_DEVICE_TYPE_GPU || t == sys::GGML_BACKEND_DEVICE_TYPE_IGPU
}

unsafe fn describe(dev: sys::ggml_backend_dev_t) -> GpuDevice {
    let text = |p: *const std::ffi::c_char| if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() };
    let reg = sys::ggml_backend_dev_backend_reg(dev);
    let (mut free, mut total) = (0usize, 0usize);
    sys::ggml_backend_dev_memory(dev, &mut free, &mut total);
    GpuDevice {
        backend: if reg.is_null() { String::new() } else { text(sys::ggml_backend_reg_name(reg)) },
        name: text(sys::ggml_backend_dev_name(dev)),
        description: text(sys::ggml_backend_dev_description(dev)),
        memory_total: total as u64,
    }
}

/// Registers a GPU back-end module with ggml. `Err` says why it could not:
/// the library or what it needs (the Vulkan loader) is missing, the back end
/// found no driver, or no usable device.
fn load_module(path: &std::path::Path) -> Result<(), String> {
    if !path.is_file() {
        return Err(format!("{}: no such file", path.display()));
    }
    super::ggml_setup::quiet_logs();
    #[cfg(all(feature = "prebuilt", unix))]
    {
        // dlopen first, for the loader's own message (say, libvulkan.so.1
        // missing), which ggml does not pass on.
        super::ggml_setup::dl::check_loadable(path).map_err(|why| format!("{}: {why}", path.display()))?;
    }
    let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: registers the library with ggml's back-end registry; called
    // before llama.cpp's back end starts (or in the probe process).
    let reg = unsafe { sys::ggml_backend_load(c.as_ptr()) };
    if reg.is_null() {
        return Err(format!(
            "{}: the back end did not start (no Vulkan driver, or the driver failed to create an instance)",
            path.display()
        ));
    }
    // SAFETY: a registered back end's device count.
    if unsafe { sys::ggml_backend_reg_dev_count(reg) } == 0 {
        return Err("no usable Vulkan device (ggml uses discrete and integrated GPUs; a software device such as \
                    lavapipe only when GGML_VK_VISIBLE_DEVICES names it)"
            .into());
    }
    Ok(())
}

/// What the probe process does: loads the module, and on each of its
/// devices allocates memory and adds two vectors, checking the sum. `Ok`
/// lists the devices; a crash of the driver kills only the probe.
pub fn probe(path: &str) -> Result<Vec<GpuDevice>, String> {
    let path = std::path::Path::new(path);
    load_module(path)?;
    let mut devices = Vec::new();
    // SAFETY: ggml registry and graph calls on a back end this process just
    // registered, with tensors sized by this function; everything created
    // is freed before returning.
    unsafe {
        for i in 0..sys::ggml_backend_dev_count() {
            let dev = sys::ggml_backend_dev_get(i);
            if dev.is_null() || !is_gpu(dev) {
                continue;
            }
            let d = describe(dev);
            compute_check(dev).map_err(|e| format!("{} ({}): {e}", d.name, d.description))?;
            devices.push(d);
        }
    }
    if devices.is_empty() {
        return Err("the back end registered no GPU device".into());
    }
    Ok(devices)
}

unsafe fn compute_check(dev: sys::ggml_backend_dev_t) -> Result<(), String> {
    const N: usize = 256;
    let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
    if backend.is_null() {
        return Err("cannot start the device".into());
    }
    let params = sys::ggml_init_params {
        mem_size: sys::ggml_tensor_overhead() * 8 + sys::ggml_graph_overhead(),
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    let ctx = sys::ggml_init(params);
    if ctx.is_null() {
        sys::ggml_backend_free(backend);
        return Err("cannot create a ggml context".into());
    }
    let a = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
    let b = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
    let sum = sys::ggml_add(ctx, a, b);
    let graph = sys::ggml_new_graph(ctx);
    sys::ggml_build_forward_expand(graph, sum);
    let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
    let result = if buffer.is_null() {
        Err("cannot allocate device memory".to_string())
    } else {
        let xs: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let ys: Vec<f32> = (0..N).map(|i| (3 * i) as f32 + 0.5).collect();
        sys::ggml_backend_tensor_set(a, xs.as_ptr().cast(), 0, N * 4);
        sys::ggml_backend_tensor_set(b, ys.as_ptr().cast(), 0, N * 4);
        let status = sys::ggml_backend_graph_compute(backend, graph);
        let mut out = vec![0f32; N];
        if status != sys::GGML_STATUS_SUCCESS {
            Err(format!("computing failed (ggml status {status})"))
        } else {
            sys::ggml_backend_tensor_get(sum, out.as_mut_ptr().cast(), 0, N * 4);
            if out.iter().enumerate().all(|(i, &v)| v == xs[i] + ys[i]) {
                Ok(())
            } else {
                Err("the device computed a wrong sum".to_string())
            }
        }
    };
    if !buffer.is_null() {
        sys::ggml_backend_buffer_free(buffer);
    }
    sys::ggml_free(ctx);
    sys::ggml_backend_free(backend);
    result
}

/// How many of a model's layers go to the GPU: llama.cpp offloads the last
/// `gpu_layers` repeating layers, and the output layer too when `gpu_layers`
/// exceeds their count. 0 without a device.
pub fn offloaded_layers(gpu_layers: u32, n_layer: u32) -> u32 {
    if has_device() {
        gpu_layers.min(n_layer + 1)
    } else {
        0
    }
}

/// Whether a GPU device computes in this process (after the back end started).
pub fn has_device() -> bool {
    state().is_some_and(|s| !s.devices.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_layers_without_a_started_back_end() {
        // The unit tests never start llama.cpp's back end with a GPU.
        assert_eq!(offloaded_layers(99, 30), 0);
    }
}
