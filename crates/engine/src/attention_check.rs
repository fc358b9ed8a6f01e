//! The self-check's long-context part: the flash-attention kernel alone,
//! with this model's head shapes, over caches past 512 and 4,096 cells
//! (where ggml's own kernel splits the cells between threads), each query
//! row computed alone and inside batches of several rows and with other
//! thread counts, compared bit for bit. A model-level check that long would
//! have to evaluate thousands of prompt tokens at every load; the kernel is
//! the only part of a step whose work grows with the cache, and what it
//! reads there (K and V) can be any values, so random ones do.
//!
//! Runs on the CPU back end through ggml's back-end API, which both the
//! static (source) and the dynamic (prebuilt) builds export.

use std::ffi::c_void;
use std::ptr;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_sys_2 as sys;

use llama_engine_core::speculation::invariance::first_difference;

/// Cache lengths checked: past one 512-cell block, past 4,096 cells.
pub const CELLS: [usize; 2] = [600, 4200];
/// Query rows (positions); each is compared alone and in batches of these sizes.
const ROWS: usize = 40;
const BATCHES: [usize; 3] = [2, 9, ROWS];
/// Masked cells after the last visible one, as llama.cpp pads its cache view.
const PADDING: usize = 37;

/// The attention shape of a model's layers.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub head_k: usize,
    pub head_v: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
}

impl Shape {
    pub fn of(model: &LlamaModel) -> Option<Shape> {
        let n_head = model.n_head() as usize;
        let n_head_kv = model.n_head_kv() as usize;
        if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return None;
        }
        let meta = |key: &str| {
            let arch = model.meta_val_str("general.architecture").ok()?;
            model.meta_val_str(&format!("{arch}.{key}")).ok()?.trim().parse::<usize>().ok()
        };
        let fallback = model.n_embd().max(0) as usize / n_head;
        let head_k = meta("attention.key_length").unwrap_or(fallback);
        let head_v = meta("attention.value_length").unwrap_or(head_k);
        (head_k > 0 && head_v > 0 && head_k <= 1024 && head_v <= 1024).then_some(Shape { head_k, head_v, n_head, n_head_kv })
    }
}

/// Where a row differed.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionMismatch {
    pub cells: usize,
    pub batch: usize,
    pub threads: usize,
    pub row: usize,
}

/// Compares, for every cache length of [`CELLS`]: each row alone (with
/// `threads`) against the same row in batches of [`BATCHES`] with `threads`,
/// with 1 thread and with `threads + 1`. `Err` says why it could not run.
pub fn check(shape: Shape, threads: usize) -> Result<Option<AttentionMismatch>, String> {
    let backend = Backend::cpu()?;
    for cells in CELLS {
        let case = Case::new(&backend, shape, cells)?;
        backend.set_threads(threads);
        let alone = case.run(&backend, &case.alone)?;
        for (threads, outs) in [(threads, &case.batched), (1, &case.batched), (threads + 1, &case.batched)] {
            backend.set_threads(threads);
            let got = case.run(&backend, outs)?;
            for (b, out) in got.iter().enumerate() {
                let n = BATCHES[b];
                let row_len = shape.head_v * shape.n_head;
                for row in 0..n {
                    if first_difference(&alone[row], &out[row * row_len..(row + 1) * row_len]).is_some() {
                        return Ok(Some(AttentionMismatch { cells, batch: n, threads, row }));
                    }
                }
            }
        }
        backend.set_threads(threads);
    }
    Ok(None)
}

pub(super) struct Backend {
    pub(super) raw: sys::ggml_backend_t,
    set_n_threads: Option<unsafe extern "C" fn(sys::ggml_backend_t, i32)>,
}

impl Backend {
    /// The portable kernels (patch 0012) for this back end's graphs.
    pub(super) fn set_portable(&self) -> Result<(), String> {
        let Some((_, _, f)) = crate::ggml_setup::cpu_proc(c"ggml_backend_cpu_set_portable") else {
            return Err("this ggml has no portable kernels".into());
        };
        // SAFETY: patch 0012's `ggml_backend_cpu_set_portable(ggml_backend_t, bool)`
        // on this CPU back end, which is alive.
        unsafe {
            let set: unsafe extern "C" fn(sys::ggml_backend_t, bool) = std::mem::transmute(f);
            set(self.raw, true);
        }
        Ok(())
    }

    pub(super) fn cpu() -> Result<Backend, String> {
        // SAFETY: ggml registry calls on the CPU device ggml always registers;
        // the proc address, when present, has the signature of
        // `ggml_backend_set_n_threads_t`.
        unsafe {
            let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
            if dev.is_null() {
                return Err("no CPU back end".into());
            }
            let raw = sys::ggml_backend_dev_init(dev, ptr::null());
            if raw.is_null() {
                return Err("the CPU back end did not start".into());
            }
            let reg = sys::ggml_backend_dev_backend_reg(dev);
            let f = if reg.is_null() {
                ptr::null_mut()
            } else {
                sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_set_n_threads".as_ptr())
            };
            let set_n_threads =
                (!f.is_null()).then(|| std::mem::transmute::<*mut c_void, unsafe extern "C" fn(sys::ggml_backend_t, i32)>(f));
            Ok(Backend { raw, set_n_threads })
        }
    }

    pub(super) fn set_threads(&self, n: usize) {
        if let Some(f) = self.set_n_threads {
            // SAFETY: a live CPU backend and its own setter.
            unsafe { f(self.raw, n as i32) };
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: created by ggml_backend_dev_init, freed once.
        unsafe { sys::ggml_backend_free(self.raw) };
    }
}

/// One cache length: K, V, every row's query and mask, and two graphs (each
/// row alone; the batches), in one ggml context whose tensors live in one
/// CPU buffer.
struct Case {
    ctx: *mut sys::ggml_context,
    buffer: sys::ggml_backend_buffer_t,
    alone: Graph,
    batched: Graph,
}

/// A graph and its outputs (also `matmul_check`'s).
pub(super) struct Graph {
    pub(super) graph: *mut sys::ggml_cgraph,
    pub(super) outs: Vec<*mut sys::ggml_tensor>,
}

/// Computes a graph on the back end; each output's values, in order.
pub(super) fn compute(backend: &Backend, graph: &Graph, what: &str) -> Result<Vec<Vec<f32>>, String> {
    // SAFETY: the graph and its outputs belong to a live context whose
    // tensors are allocated (the caller's); reads are of each output's full size.
    unsafe {
        if sys::ggml_backend_graph_compute(backend.raw, graph.graph) != sys::GGML_STATUS_SUCCESS {
            return Err(format!("the {what} check's graph failed"));
        }
        Ok(graph
            .outs
            .iter()
            .map(|&t| {
                let n = sys::ggml_nelements(t) as usize;
                let mut out = vec![0f32; n];
                sys::ggml_backend_tensor_get(t, out.as_mut_ptr().cast(), 0, n * 4);
                out
            })
            .collect())
    }
}

/// Frees a check's buffer (if allocated), then the context that describes it.
///
/// # Safety
/// Each pointer from ggml, freed only here and once.
pub(super) unsafe fn free(ctx: *mut sys::ggml_context, buffer: sys::ggml_backend_buffer_t) {
    if !buffer.is_null() {
        sys::ggml_backend_buffer_free(buffer);
    }
    sys::ggml_free(ctx);
}

/// A small deterministic generator: the values only need to be varied.
pub(super) fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f16(v: &[f32]) -> Vec<u16> {
    let mut out = vec![0u16; v.len()];
    // SAFETY: both slices hold v.len() elements; ggml_fp16_t is a u16.
    unsafe { sys::ggml_fp32_to_fp16_row(v.as_ptr(), out.as_mut_ptr().cast(), v.len() as i64) };
    out
}

impl Case {
    fn new(backend: &Backend, s: Shape, cells: usize) -> Result<Case, String> {
        let n_tensors = 8 + 3 * (ROWS + BATCHES.len());
        // SAFETY: ggml graph construction on a context sized for these
        // tensors and two graphs, with no_alloc (the data go in a back-end
        // buffer); every pointer used is one ggml just returned, checked.
        unsafe {
            let params = sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * n_tensors + 2 * sys::ggml_graph_overhead(),
                mem_buffer: ptr::null_mut(),
                no_alloc: true,
            };
            let ctx = sys::ggml_init(params);
            if ctx.is_null() {
                return Err("ggml_init failed".into());
            }
            let mut case = Case {
                ctx,
                buffer: ptr::null_mut(),
                alone: Graph { graph: ptr::null_mut(), outs: Vec::new() },
                batched: Graph { graph: ptr::null_mut(), outs: Vec::new() },
            };
            let (dk, dv, h, hkv) = (s.head_k as i64, s.head_v as i64, s.n_head as i64, s.n_head_kv as i64);
            let q = sys::ggml_new_tensor_4d(ctx, sys::GGML_TYPE_F32, dk, ROWS as i64, h, 1);
            let k = sys::ggml_new_tensor_4d(ctx, sys::GGML_TYPE_F16, dk, cells as i64, hkv, 1);
            let v = sys::ggml_new_tensor_4d(ctx, sys::GGML_TYPE_F16, dv, cells as i64, hkv, 1);
            let mask = sys::ggml_new_tensor_4d(ctx, sys::GGML_TYPE_F16, cells as i64, ROWS as i64, 1, 1);
            if [q, k, v, mask].iter().any(|t| t.is_null()) {
                return Err("ggml_new_tensor failed".into());
            }
            let scale = 1.0 / (s.head_k as f32).sqrt();
            let attend = |rows: usize, first: usize| -> *mut sys::ggml_tensor {
                let qv = sys::ggml_view_4d(ctx, q, dk, rows as i64, h, 1, (*q).nb[1], (*q).nb[2], (*q).nb[3], first * (*q).nb[1]);
                let mv = sys::ggml_view_2d(ctx, mask, cells as i64, rows as i64, (*mask).nb[1], first * (*mask).nb[1]);
                let out = sys::ggml_flash_attn_ext(ctx, qv, k, v, mv, scale, 0.0, 0.0);
                sys::ggml_flash_attn_ext_set_prec(out, sys::GGML_PREC_F32);
                out
            };
            for (graph, firsts) in [
                (&mut case.alone, (0..ROWS).map(|r| (1, r)).collect::<Vec<_>>()),
                (&mut case.batched, BATCHES.iter().map(|&n| (n, 0)).collect()),
            ] {
                graph.graph = sys::ggml_new_graph(ctx);
                for (rows, first) in firsts {
                    let out = attend(rows, first);
                    if out.is_null() {
                        return Err("ggml_flash_attn_ext failed".into());
                    }
                    sys::ggml_build_forward_expand(graph.graph, out);
                    graph.outs.push(out);
                }
            }
            case.buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend.raw);
            if case.buffer.is_null() {
                return Err("no buffer for the attention check".into());
            }
            let set = |t: *mut sys::ggml_tensor, data: *const c_void, bytes: usize| sys::ggml_backend_tensor_set(t, data, 0, bytes);
            let qd = values(s.head_k * ROWS * s.n_head, 1, 1.0);
            set(q, qd.as_ptr().cast(), qd.len() * 4);
            let kd = f16(&values(s.head_k * cells * s.n_head_kv, 2, 1.0));
            set(k, kd.as_ptr().cast(), kd.len() * 2);
            let vd = f16(&values(s.head_v * cells * s.n_head_kv, 3, 1.0));
            set(v, vd.as_ptr().cast(), vd.len() * 2);
            // Row r sees the cells up to its position; the last PADDING
            // cells are nobody's, as in a padded cache view.
            let visible = cells - PADDING;
            let mut m = vec![f32::NEG_INFINITY; cells * ROWS];
            for r in 0..ROWS {
                m[r * cells..r * cells + visible - ROWS + r + 1].fill(0.0);
            }
            let md = f16(&m);
            set(mask, md.as_ptr().cast(), md.len() * 2);
            Ok(case)
        }
    }

    /// Computes one of the graphs; each output's values, row by row (dst
    /// is [head_v, n_head, rows]: a row is contiguous).
    fn run(&self, backend: &Backend, graph: &Graph) -> Result<Vec<Vec<f32>>, String> {
        compute(backend, graph, "attention")
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        // SAFETY: created in Case::new, freed once.
        unsafe { free(self.ctx, self.buffer) }
    }
}
