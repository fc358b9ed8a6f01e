//! llama.cpp's RPC back end (`ggml-rpc`): a model's layers on worker
//! processes (`llama-engine rpc-worker`, this module's `serve`), here or on
//! other hosts, each computing with the same ggml CPU kernels as a local
//! run.
//!
//! The client side of ggml-rpc aborts the process when a worker cannot be
//! reached or stops answering (`GGML_ABORT`), so the engine reaches a worker
//! only after a TCP connection to it succeeded (a worker that is not there
//! is a `MODEL_LOAD_FAILED` naming it), and an engine with workers runs in a
//! child process (`isolation: 'process'`): a worker lost mid-request ends
//! that child, its requests reject `ENGINE_CRASHED`, and the parent starts
//! another.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use llama_cpp_sys_2 as sys;
use llama_engine_core::error::{EngineError, ErrorCode, Result};

/// How long a worker has to accept a connection before it counts as not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

type AddServer = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;
type StartServer = unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);

/// The RPC back end's function `name` (through its registry, in static and
/// in dynamic-back-end builds alike); `None` when this build has no RPC back end.
fn proc_address(name: &std::ffi::CStr) -> Option<*mut c_void> {
    super::ggml_setup::load_rpc_backend();
    // SAFETY: registry lookups by name; the pointers are checked.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(c"RPC".as_ptr());
        if reg.is_null() {
            return None;
        }
        let f = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        (!f.is_null()).then_some(f)
    }
}

/// Whether this build can use RPC workers.
pub fn available() -> bool {
    super::model::backend().is_ok() && proc_address(c"ggml_backend_rpc_add_server").is_some()
}

fn load_failed(endpoint: &str, why: impl std::fmt::Display) -> EngineError {
    EngineError::new(ErrorCode::ModelLoadFailed, format!("rpc worker {endpoint}: {why}"))
}

/// Connects to `endpoint` and closes the connection: whether a worker listens there.
pub fn reachable(endpoint: &str) -> std::result::Result<(), String> {
    let addrs: Vec<_> = endpoint.to_socket_addrs().map_err(|e| format!("cannot resolve it ({e})"))?.collect();
    let mut last = String::from("no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("not reachable ({last}); is `llama-engine rpc-worker` running there?"))
}

/// The ggml device indices of the workers' devices, registered once per
/// process and endpoint, in the order given (llama.cpp spreads the layers
/// over them in that order, by the memory each reports).
pub fn devices(endpoints: &[String]) -> Result<Vec<usize>> {
    // Endpoint -> its devices, as addresses (ggml's devices live as long as the process).
    static REGISTERED: Mutex<Option<HashMap<String, Vec<usize>>>> = Mutex::new(None);
    if endpoints.is_empty() {
        return Ok(Vec::new());
    }
    super::model::backend()?;
    let add = proc_address(c"ggml_backend_rpc_add_server")
        .ok_or_else(|| load_failed(&endpoints[0], "this build of llama-engine has no RPC back end (GGML_RPC)"))?;
    // SAFETY: the proc address has ggml_backend_rpc_add_server's signature.
    let add: AddServer = unsafe { std::mem::transmute::<*mut c_void, AddServer>(add) };
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let registered = registered.get_or_insert_with(HashMap::new);
    let mut wanted = Vec::new();
    for endpoint in endpoints {
        if let Some(devs) = registered.get(endpoint) {
            // Registered by an earlier load: still there? (ggml aborts on a dead one.)
            reachable(endpoint).map_err(|why| load_failed(endpoint, why))?;
            wanted.extend(devs.iter().copied());
            continue;
        }
        reachable(endpoint).map_err(|why| load_failed(endpoint, why))?;
        let c = CString::new(endpoint.as_str()).map_err(|_| load_failed(endpoint, "contains NUL"))?;
        // SAFETY: the worker accepted a connection just now; add_server
        // connects, checks the protocol version and lists its devices.
        let reg = unsafe { add(c.as_ptr()) };
        if reg.is_null() {
            return Err(load_failed(endpoint, "the worker did not answer as a ggml RPC server of this version"));
        }
        let mut devs = Vec::new();
        // SAFETY: the devices of the registry add_server returned; each is
        // registered with ggml once (llama.cpp's `--rpc` does the same).
        unsafe {
            for i in 0..sys::ggml_backend_reg_dev_count(reg) {
                let dev = sys::ggml_backend_reg_dev_get(reg, i);
                if !dev.is_null() {
                    sys::ggml_backend_device_register(dev);
                    devs.push(dev as usize);
                }
            }
        }
        if devs.is_empty() {
            return Err(load_failed(endpoint, "the worker has no device"));
        }
        wanted.extend(devs.iter().copied());
        registered.insert(endpoint.clone(), devs);
    }
    // SAFETY: ggml's device list, read to find each device's index.
    let all: Vec<usize> = unsafe { (0..sys::ggml_backend_dev_count()).map(|i| sys::ggml_backend_dev_get(i) as usize).collect() };
    wanted
        .iter()
        .map(|d| all.iter().position(|x| x == d).ok_or_else(|| load_failed(&endpoints[0], "its device is not registered with ggml")))
        .collect()
}

/// Runs a worker on `endpoint` (`host:port`) with this process's CPU back
/// end and `threads` threads; returns only when it could not start (the
/// reason is on stderr, written by ggml). `cache_dir`: where the worker
/// keeps tensors it was sent, to skip sending them again (ggml's `-c`).
pub fn serve(endpoint: &str, threads: usize, cache_dir: Option<&str>) -> Result<()> {
    super::model::backend()?;
    let start = proc_address(c"ggml_backend_rpc_start_server")
        .ok_or_else(|| EngineError::internal("this build of llama-engine has no RPC back end (GGML_RPC)"))?;
    // SAFETY: the proc address has ggml_backend_rpc_start_server's signature.
    let start: StartServer = unsafe { std::mem::transmute::<*mut c_void, StartServer>(start) };
    // SAFETY: the CPU device ggml registers.
    let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return Err(EngineError::internal("no CPU device"));
    }
    let endpoint = CString::new(endpoint).map_err(|_| EngineError::invalid("endpoint", "contains NUL"))?;
    let cache = cache_dir.map(CString::new).transpose().map_err(|_| EngineError::invalid("cacheDir", "contains NUL"))?;
    // SAFETY: valid C strings and one CPU device, alive for the call (which
    // serves until the process ends, or returns when it cannot listen).
    unsafe { start(endpoint.as_ptr(), cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()), threads.max(1), 1, &mut cpu) };
    Err(EngineError::internal(format!("the RPC worker could not listen on {} (see the message above)", endpoint.to_string_lossy())))
}
