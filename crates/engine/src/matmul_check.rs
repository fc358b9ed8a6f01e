//! The self-check's mat-mul part: each weight type's product kernels alone,
//! on random weights, one activation row against the same row inside
//! batches of 2, 9 and 40 rows (where llama.cpp's fast paths take over:
//! tinyBLAS and the tile kernels from 2 rows, the tiled K-quant path from 8,
//! its narrow path up to 16 rows and its wide one past), with the engine's
//! thread count, one thread and one more, compared bit for bit.
//!
//! A type ggml repacks (an interleaved layout with a gemv kernel for one row
//! and a gemm kernel for several: Q4_K on x86, patch 0009) is checked twice,
//! in the plain buffer and in the repacked one, as a model holds both (a
//! weight whose row count is not a multiple of 8 stays plain).
//!
//! The model-level check sees only the types of the model at hand; this one
//! covers every type a user may bring, so `status().batchInvariance` can say
//! which kernels were proven on this machine. Values are random: a product's
//! summation order is what is checked, and any weights show it.

use std::ptr;
use std::sync::Mutex;

use llama_cpp_sys_2 as sys;

use crate::attention_check::{compute, free, values, Backend, Graph};
use llama_engine_core::speculation::invariance::first_difference;

/// Weight types checked: the float types, every type with a fast path here
/// (tinyBLAS, the Q4_1 tile kernel, the tiled K-quant kernels) and the
/// K-quants that keep `vec_dot`.
pub const TYPES: [(sys::ggml_type, &str); 13] = [
    (sys::GGML_TYPE_F16, "F16"),
    (sys::GGML_TYPE_BF16, "BF16"),
    (sys::GGML_TYPE_Q8_0, "Q8_0"),
    (sys::GGML_TYPE_Q4_0, "Q4_0"),
    (sys::GGML_TYPE_Q4_1, "Q4_1"),
    (sys::GGML_TYPE_Q5_0, "Q5_0"),
    (sys::GGML_TYPE_Q5_1, "Q5_1"),
    (sys::GGML_TYPE_IQ4_NL, "IQ4_NL"),
    (sys::GGML_TYPE_Q2_K, "Q2_K"),
    (sys::GGML_TYPE_Q3_K, "Q3_K"),
    (sys::GGML_TYPE_Q4_K, "Q4_K"),
    (sys::GGML_TYPE_Q5_K, "Q5_K"),
    (sys::GGML_TYPE_Q6_K, "Q6_K"),
];

/// Row length: six K-quant superblocks, so the tiled path's narrow walk
/// takes several slabs per step.
const K: usize = 1536;
/// Output rows: a ragged 16-row micro-tile at the end, several chunks per thread.
const N: usize = 144;
/// Activation rows; each is compared alone and in batches of these sizes:
/// 2 and 9 rows take a repacked weight's several-row gemv (9: two passes of
/// 4 and one row), 9 the tiled path of a plain K-quant, 56 the tiled path
/// of a repacked one (on its de-interleaved copy, from 48 rows).
const ROWS: usize = 56;
const BATCHES: [usize; 3] = [2, 9, ROWS];

/// Where a row differed.
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulMismatch {
    pub kind: &'static str,
    /// In the repacked layout (else the plain one).
    pub repacked: bool,
    pub batch: usize,
    pub threads: usize,
    pub row: usize,
}

/// What [`check`] found for each type: its name, whether its repacked layout
/// was checked too, and where a row first differed (`None`: identical
/// everywhere).
pub type Found = Vec<(&'static str, bool, Option<MatmulMismatch>)>;

/// Checks every type of [`TYPES`]. The kernels are the process's, so the
/// answer for a thread count is kept and later loads reuse it (about 0.1 s
/// saved per load). `Err` says why it could not run.
///
/// With `portable`, the portable kernels (patch 0012) of the types they
/// cover ([`PORTABLE_TYPES`]), in the plain layout (the only one they read).
pub fn check(threads: usize, portable: bool) -> Result<Found, String> {
    static DONE: Mutex<Vec<(usize, bool, Found)>> = Mutex::new(Vec::new());
    if let Some((_, _, found)) = DONE.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(n, p, _)| *n == threads && *p == portable) {
        return Ok(found.clone());
    }
    let found = run_check(threads, portable)?;
    DONE.lock().unwrap_or_else(|e| e.into_inner()).push((threads, portable, found.clone()));
    Ok(found)
}

/// The weight types the portable kernels compute (the others have no
/// portable kernel: a model holding one does not load in portable mode).
pub const PORTABLE_TYPES: [&str; 10] = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"];

fn run_check(threads: usize, portable: bool) -> Result<Found, String> {
    let backend = Backend::cpu()?;
    if portable {
        backend.set_portable()?;
    }
    let repack = if portable { None } else { crate::ggml_setup::repack_buffer_type() };
    let mut found = Vec::with_capacity(TYPES.len());
    for (ty, kind) in TYPES {
        if portable && !PORTABLE_TYPES.contains(&kind) {
            continue;
        }
        let repacked = repack.filter(|_| repack_supports(ty));
        let mut mismatch = check_case(&backend, ty, kind, None, threads)?;
        if mismatch.is_none() {
            if let Some(buft) = repacked {
                mismatch = check_case(&backend, ty, kind, Some(buft), threads)?;
            }
        }
        found.push((kind, repacked.is_some(), mismatch));
    }
    Ok(found)
}

/// One type in one layout: each row alone against the batches, with the
/// engine's thread count, one thread and one more.
fn check_case(
    backend: &Backend,
    ty: sys::ggml_type,
    kind: &'static str,
    repack: Option<sys::ggml_backend_buffer_type_t>,
    threads: usize,
) -> Result<Option<MatmulMismatch>, String> {
    let case = Case::new(backend, ty, repack)?;
    backend.set_threads(threads);
    let alone = case.run(backend, &case.alone)?;
    let mut mismatch = None;
    'threads: for threads in [threads, 1, threads + 1] {
        backend.set_threads(threads);
        let got = case.run(backend, &case.batched)?;
        for (b, out) in got.iter().enumerate() {
            for row in 0..BATCHES[b] {
                if first_difference(&alone[row], &out[row * N..(row + 1) * N]).is_some() {
                    mismatch = Some(MatmulMismatch { kind, repacked: repack.is_some(), batch: BATCHES[b], threads, row });
                    break 'threads;
                }
            }
        }
    }
    backend.set_threads(threads);
    Ok(mismatch)
}

/// Whether ggml repacks a weight of this type and the check's shape.
fn repack_supports(ty: sys::ggml_type) -> bool {
    crate::ggml_setup::repack_supports(ty, K as i64, N as i64)
}

/// One weight type: the weights, the activations and two graphs (each row
/// alone; the batches), in one ggml context whose tensors live in one CPU
/// buffer.
struct Case {
    ctx: *mut sys::ggml_context,
    buffer: sys::ggml_backend_buffer_t,
    /// The weights' own context and buffer when they are repacked.
    weights: Option<(*mut sys::ggml_context, sys::ggml_backend_buffer_t)>,
    alone: Graph,
    batched: Graph,
}

impl Case {
    fn new(backend: &Backend, ty: sys::ggml_type, repack: Option<sys::ggml_backend_buffer_type_t>) -> Result<Case, String> {
        let n_tensors = 4 + 2 * (ROWS + BATCHES.len());
        // SAFETY: ggml graph construction on a context sized for these
        // tensors and two graphs, with no_alloc (the data go in a back-end
        // buffer); every pointer used is one ggml just returned, checked;
        // the quantized buffer is sized by ggml_row_size for all N rows.
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
                weights: None,
                alone: Graph { graph: ptr::null_mut(), outs: Vec::new() },
                batched: Graph { graph: ptr::null_mut(), outs: Vec::new() },
            };
            // Repacked weights live in a buffer of that type, so in a context
            // of their own (a context's tensors share one buffer).
            let wctx = match repack {
                None => ctx,
                Some(_) => {
                    let wctx = sys::ggml_init(sys::ggml_init_params {
                        mem_size: sys::ggml_tensor_overhead(),
                        mem_buffer: ptr::null_mut(),
                        no_alloc: true,
                    });
                    if wctx.is_null() {
                        return Err("ggml_init failed".into());
                    }
                    case.weights = Some((wctx, ptr::null_mut()));
                    wctx
                }
            };
            let w = sys::ggml_new_tensor_2d(wctx, ty, K as i64, N as i64);
            let x = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K as i64, ROWS as i64);
            if w.is_null() || x.is_null() {
                return Err("ggml_new_tensor failed".into());
            }
            let product = |rows: usize, first: usize| -> *mut sys::ggml_tensor {
                let xv = sys::ggml_view_2d(ctx, x, K as i64, rows as i64, (*x).nb[1], first * (*x).nb[1]);
                sys::ggml_mul_mat(ctx, w, xv)
            };
            for (graph, firsts) in [
                (&mut case.alone, (0..ROWS).map(|r| (1, r)).collect::<Vec<_>>()),
                (&mut case.batched, BATCHES.iter().map(|&n| (n, 0)).collect()),
            ] {
                graph.graph = sys::ggml_new_graph(ctx);
                for (rows, first) in firsts {
                    let out = product(rows, first);
                    if out.is_null() {
                        return Err("ggml_mul_mat failed".into());
                    }
                    sys::ggml_build_forward_expand(graph.graph, out);
                    graph.outs.push(out);
                }
            }
            case.buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend.raw);
            if case.buffer.is_null() {
                return Err("no buffer for the mat-mul check".into());
            }
            if let (Some(buft), Some((wctx, wbuf))) = (repack, case.weights.as_mut()) {
                *wbuf = sys::ggml_backend_alloc_ctx_tensors_from_buft(*wctx, buft);
                if wbuf.is_null() {
                    return Err("no repacked buffer for the mat-mul check".into());
                }
            }
            let weights = values(K * N, 11 + ty as u64, 1.0);
            let bytes = sys::ggml_row_size(ty, K as i64) * N;
            let mut packed = vec![0u8; bytes];
            if ty == sys::GGML_TYPE_F16 {
                sys::ggml_fp32_to_fp16_row(weights.as_ptr(), packed.as_mut_ptr().cast(), (K * N) as i64);
            } else if ty == sys::GGML_TYPE_BF16 {
                sys::ggml_fp32_to_bf16_row(weights.as_ptr(), packed.as_mut_ptr().cast(), (K * N) as i64);
            } else {
                let written =
                    sys::ggml_quantize_chunk(ty, weights.as_ptr(), packed.as_mut_ptr().cast(), 0, N as i64, K as i64, ptr::null());
                if written != bytes {
                    return Err(format!("quantizing the mat-mul check's weights wrote {written} of {bytes} bytes"));
                }
            }
            sys::ggml_backend_tensor_set(w, packed.as_ptr().cast(), 0, bytes);
            let xd = values(K * ROWS, 7, 1.0);
            sys::ggml_backend_tensor_set(x, xd.as_ptr().cast(), 0, xd.len() * 4);
            Ok(case)
        }
    }

    /// Computes one of the graphs; each output's values (dst is [N, rows]:
    /// a row's N outputs are contiguous).
    fn run(&self, backend: &Backend, graph: &Graph) -> Result<Vec<Vec<f32>>, String> {
        compute(backend, graph, "mat-mul")
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        // SAFETY: created in Case::new, freed once (the graphs' context
        // before the weights' it refers to).
        unsafe {
            free(self.ctx, self.buffer);
            if let Some((wctx, wbuf)) = self.weights {
                free(wctx, wbuf);
            }
        }
    }
}
