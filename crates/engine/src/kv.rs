//! A slot's KV cells moved between slots, host memory and files, through
//! llama.cpp's sequence API — with the checks that keep its asserts (which
//! abort the process) out of reach: sequence ids in range, full ranges for
//! copies, states checked before they are read back.
//!
//! How this llama.cpp copies a sequence between slots: with one KV stream
//! per slot, `llama_memory_seq_cp` copies the source stream's cell metadata
//! at once and its whole K/V buffers (every cell of the stream, used or not:
//! n_ctx per slot × bytes per cell) at the start of the next
//! `llama_decode`; a partial range aborts. So a prefix is copied as the
//! whole stream, then cut with `seq_rm`, and the copied stream is not read
//! (its bytes are stale) until a decode has run.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::LlamaStateSeqFlags;

use llama_engine_core::cache::positions::Positions;
use llama_engine_core::cache::state::Cells;
use llama_engine_core::error::{EngineError, Result};

/// The KV settings cells depend on, as session files record them.
pub const KV_SETTINGS: &str = "K and V f16, flash attention (V not transposed), full-size sliding-window caches";

/// The same in portable mode: other kernels computed the cells (and V is
/// transposed), so a session of one mode is refused by the other.
pub const KV_SETTINGS_PORTABLE: &str = "K and V f16, portable kernels, no flash attention (V transposed), full-size sliding-window caches";

/// The KV settings of an engine in portable mode or not.
pub fn kv_settings(portable: bool) -> &'static str {
    if portable {
        KV_SETTINGS_PORTABLE
    } else {
        KV_SETTINGS
    }
}

fn kv_err(what: &str) -> impl Fn(llama_cpp_2::context::kv_cache::KvCacheConversionError) -> EngineError + '_ {
    move |e| EngineError::internal(format!("{what}: {e}"))
}

/// Forgets every cell of `seq` (all of its stream).
pub fn clear(ctx: &mut LlamaContext, seq: i32) -> Result<()> {
    ctx.kv_cache_seq_rm(seq, None, None).map(|_| ()).map_err(kv_err("clearing a slot"))
}

/// Keeps the cells of `seq` at positions below `n`.
pub fn keep(ctx: &mut LlamaContext, seq: i32, n: usize) -> Result<()> {
    ctx.kv_cache_seq_rm(seq, Some(n as u32), None).map(|_| ()).map_err(kv_err("cutting a slot"))
}

/// Copies stream `src` into stream `dst` (both in `0..n_seq`); applied at
/// the next decode.
pub fn copy(ctx: &mut LlamaContext, src: i32, dst: i32, n_seq: i32) -> Result<()> {
    if !(0..n_seq).contains(&src) || !(0..n_seq).contains(&dst) || src == dst {
        return Err(EngineError::internal(format!("copying slot {src} to {dst} of {n_seq}")));
    }
    clear(ctx, dst)?;
    ctx.copy_kv_cache_seq(src, dst, None, None).map_err(kv_err("copying a slot"))
}

/// The cells of `seq` as llama.cpp serialises them. Only right after a
/// decode (no copy into `seq` pending).
pub fn save(ctx: &LlamaContext, seq: i32) -> Result<Cells> {
    let flags = LlamaStateSeqFlags::empty();
    let size = ctx.state_seq_get_size_ext(seq, flags);
    if size == 0 {
        return Err(EngineError::internal(format!("slot {seq} has no state")));
    }
    let mut blob = vec![0u8; size];
    // SAFETY: `blob` holds the `size` bytes llama.cpp said this state takes;
    // nothing runs on the context in between (the engine thread owns it).
    let n = unsafe { ctx.state_seq_get_data_ext(blob.as_mut_ptr(), seq, flags) };
    if n != size {
        return Err(EngineError::internal(format!("slot {seq}: the state took {n} bytes, not {size}")));
    }
    Cells::from_blob(&blob).map_err(|e| EngineError::internal(format!("slot {seq}: an unreadable state ({e})")))
}

/// Restores `cells` (checked: the cells of `n_tokens` tokens at `at`'s
/// positions, 0..n_tokens without M-RoPE media; a sliding window padded to
/// all of them, see `Cells::padded`) into `seq` of a context with `n_seq`
/// slots, emptied first: each cell at its position, as computing them
/// placed them. On failure the slot is empty and the error says why.
pub fn restore(
    ctx: &mut LlamaContext,
    seq: i32,
    n_seq: i32,
    cells: &Cells,
    n_tokens: usize,
    at: &Positions,
) -> std::result::Result<(), String> {
    if !(0..n_seq).contains(&seq) || n_tokens == 0 {
        return Err(format!("no slot {seq} or no tokens"));
    }
    let blob = cells.padded(n_tokens, at)?.blob(n_seq as u32);
    let _ = ctx.kv_cache_seq_rm(seq, None, None);
    // SAFETY: the blob is a well-formed state (checked above), read within
    // its length; the sequence id is in range and the flags are 0.
    let ok = unsafe { ctx.state_seq_set_data_ext(&blob, seq, LlamaStateSeqFlags::empty()) };
    let (min, max) = (ctx.kv_cache_seq_pos_min(seq), ctx.kv_cache_seq_pos_max(seq));
    let (lo, hi) = at.cell_range(n_tokens - 1);
    if !ok || min != 0 || !(lo as i32..=hi as i32).contains(&max) {
        let _ = ctx.kv_cache_seq_rm(seq, None, None);
        return Err(if ok {
            format!("its cells landed at positions {min}..={max}, not 0..={hi}")
        } else {
            "llama.cpp refused its cells (another layer count, head size or cache type)".into()
        });
    }
    Ok(())
}
