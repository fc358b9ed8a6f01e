//! Images and audio in prompts, through llama.cpp's multimodal library
//! (`tools/mtmd`): the projector (`mmprojPath`) loaded beside the target,
//! a rendered chat prompt with its media markers split into text tokens and
//! media chunks, each media chunk encoded into embeddings (once per content:
//! kept by its SHA-256), and decoded into a slot's cells on the engine thread.
//!
//! In a prompt's token list a media chunk stands as `n_tokens` copies of a
//! negative id made from its hash (`media_token`): the slots' prefix
//! matching, the prompt cache and sessions then tell two images apart as they
//! tell two texts apart, and nothing that takes token ids (the batch, the
//! sampler, the drafters) may ever see one (they are filtered where they could).
//!
//! Threads: tokenizing and encoding run on the preparing thread, under one
//! lock; the engine thread only reads the projector's settings and the
//! chunk it decodes (`decode`).

use std::ffi::CString;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llama_cpp_2::token::LlamaToken;
use llama_cpp_sys_2 as sys;

use super::llama_log;
use llama_engine_core::error::{EngineError, ErrorCode, Result};
use llama_engine_core::gguf;
use llama_engine_core::request::media::{MediaInput, MediaKind, MEDIA_MARKER};

/// Encoded media kept for the next requests that send the same file.
const KEPT_BYTES: usize = 256 << 20;

/// A loaded projector.
pub struct Projector {
    ctx: *mut sys::mtmd_context,
    pub vision: bool,
    pub audio: bool,
    /// The text model takes M-RoPE positions (Qwen2-VL): a media chunk
    /// spans fewer positions than tokens.
    pub mrope: bool,
    /// Floats per embedding row (the text model's input width).
    n_embd: usize,
    /// Rows one decode of the target takes (its n_ubatch): an image with
    /// non-causal attention must fit in one.
    n_ubatch: usize,
    /// Tokenizing and encoding, one at a time; encoded chunks, newest last.
    work: Mutex<Vec<Arc<MediaChunk>>>,
    pub path: String,
}

// SAFETY: the context is used under `work`'s lock, except for the settings
// `decode` reads (fixed at load) — llama.cpp's server shares it the same way.
unsafe impl Send for Projector {}
unsafe impl Sync for Projector {}

impl Drop for Projector {
    fn drop(&mut self) {
        // SAFETY: made by mtmd_init_from_file, freed once.
        unsafe { sys::mtmd_free(self.ctx) }
    }
}

/// One encoded image or audio clip.
pub struct MediaChunk {
    /// SHA-256 of the file's bytes (hex), as llama.cpp names the chunk.
    pub id: String,
    pub kind: MediaKind,
    chunk: *mut sys::mtmd_input_chunk,
    embd: Vec<f32>,
    pub n_tokens: usize,
    /// Positions it takes (fewer than its tokens with M-RoPE).
    pub n_pos: usize,
    pub encode_ms: f64,
}

// SAFETY: an owned copy, never changed after it is made.
unsafe impl Send for MediaChunk {}
unsafe impl Sync for MediaChunk {}

impl Drop for MediaChunk {
    fn drop(&mut self) {
        // SAFETY: made by mtmd_input_chunk_copy, freed once.
        unsafe { sys::mtmd_input_chunk_free(self.chunk) }
    }
}

impl MediaChunk {
    /// The id its tokens have in a prompt's token list.
    pub fn token(&self) -> LlamaToken {
        media_token(&self.id)
    }
}

/// A media chunk's place in a prompt: tokens `start..start + n_tokens`.
#[derive(Clone)]
pub struct MediaSpan {
    pub start: usize,
    pub chunk: Arc<MediaChunk>,
}

impl MediaSpan {
    pub fn end(&self) -> usize {
        self.start + self.chunk.n_tokens
    }
}

impl std::fmt::Debug for MediaSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MediaSpan({}..{} {})", self.start, self.end(), &self.chunk.id[..12.min(self.chunk.id.len())])
    }
}

pub use llama_engine_core::cache::positions::Positions;
use llama_engine_core::cache::positions::Span;

/// Where a prompt's tokens sit, given its media chunks (`Positions`).
pub fn positions_of(spans: &[MediaSpan]) -> Positions {
    let spans =
        spans.iter().map(|s| Span { start: s.start, n_tokens: s.chunk.n_tokens, n_pos: s.chunk.n_pos.clamp(1, s.chunk.n_tokens.max(1)) });
    // Spans come from mtmd's chunks in order: always well formed.
    Positions::new(spans).unwrap_or_default()
}

/// A prompt with media: its tokens (media as their ids) and where each media is.
pub struct MediaPrompt {
    pub tokens: Vec<LlamaToken>,
    pub spans: Vec<MediaSpan>,
    /// Time spent encoding media this request sent (0 when all were kept).
    pub encode_ms: f64,
}

/// The (negative) id the tokens of the media with SHA-256 `id` have in a
/// prompt's token list: 30 bits of the hash, never a vocabulary id.
pub fn media_token(id: &str) -> LlamaToken {
    LlamaToken(llama_engine_core::request::media::media_token_id(id))
}

/// Whether `t` stands for a media chunk's token.
pub fn is_media_token(t: LlamaToken) -> bool {
    llama_engine_core::request::media::is_media_token(t.0)
}

impl Projector {
    /// Loads the projector at `path` for the text model `model` (the
    /// target, right after its context was made). The file is read and
    /// checked first (untrusted input); llama.cpp's own refusal (another
    /// model's projector, an unknown type) comes back with its reason.
    ///
    /// # Safety
    /// `model` must be a live llama.cpp model that outlives the projector.
    pub unsafe fn load(path: &str, model: *const sys::llama_model, threads: i32, n_ubatch: usize) -> Result<Projector> {
        let fail = |why: String| EngineError::new(ErrorCode::ModelLoadFailed, format!("mmprojPath {path}: {why}"));
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        if !meta.is_file() {
            return Err(fail("not a file".into()));
        }
        let file = gguf::read_gguf(Path::new(path)).map_err(|e| fail(e.0))?;
        gguf::check_projector(&file).map_err(fail)?;
        let c_path = CString::new(path).map_err(|_| fail("the path contains NUL".into()))?;
        let marker = CString::new(MEDIA_MARKER).expect("no NUL");
        // SAFETY: plain data; the strings outlive the call (mtmd copies them).
        let mut params = unsafe { sys::mtmd_context_params_default() };
        params.use_gpu = false;
        params.print_timings = false;
        params.n_threads = threads.max(1);
        params.media_marker = marker.as_ptr();
        params.warmup = false;
        let (ctx, log) = llama_log::capture(|| unsafe { sys::mtmd_init_from_file(c_path.as_ptr(), model, params) });
        if ctx.is_null() {
            let why = llama_log::reason(&log).unwrap_or_else(|| "llama.cpp could not load it and logged no reason".into());
            return Err(fail(format!("llama.cpp refused it: {why}")));
        }
        // SAFETY: ctx is a live context; model the live text model.
        let (vision, audio, mrope, n_embd) = unsafe {
            (
                sys::mtmd_support_vision(ctx),
                sys::mtmd_support_audio(ctx),
                sys::mtmd_decode_use_mrope(ctx),
                sys::llama_model_n_embd_inp(model),
            )
        };
        Ok(Projector {
            ctx,
            vision,
            audio,
            mrope,
            n_embd: n_embd.max(0) as usize,
            n_ubatch,
            work: Mutex::new(Vec::new()),
            path: path.to_string(),
        })
    }

    /// The rendered prompt `text` (one media marker per item of `media`, in
    /// order) as tokens and encoded media chunks. `add_bos`: the model
    /// wants a BOS and the text does not begin with one.
    pub fn prepare(&self, text: &str, media: &[&MediaInput], add_bos: bool) -> Result<MediaPrompt> {
        let mut kept = self.work.lock().unwrap_or_else(|p| p.into_inner());
        let n_markers = text.matches(MEDIA_MARKER).count();
        if n_markers != media.len() {
            let at = media.first().map_or("messages", |m| m.at.as_str());
            return Err(EngineError::invalid(
                at,
                format!("the chat template kept {n_markers} of the {} images and audio files the messages carry", media.len()),
            ));
        }
        let mut bitmaps = Vec::with_capacity(media.len());
        for m in media {
            if m.kind == MediaKind::Image && !self.vision || m.kind == MediaKind::Audio && !self.audio {
                return Err(EngineError::invalid(&m.at, format!("this model's projector reads no {}", m.kind.as_str())));
            }
            // SAFETY: the bytes outlive the call; the helper copies what it decodes.
            let w = unsafe {
                sys::mtmd_helper_bitmap_init_from_buf(self.ctx, m.bytes.as_ptr(), m.bytes.len(), false, sys::mtmd_helper_init_opt_default())
            };
            if !w.video_ctx.is_null() {
                // SAFETY: made by the helper, freed once.
                unsafe { sys::mtmd_helper_video_free(w.video_ctx) };
            }
            if w.bitmap.is_null() {
                return Err(EngineError::invalid(&m.at, format!("cannot decode this {} (damaged or truncated?)", m.format)));
            }
            bitmaps.push(Bitmap(w.bitmap));
        }
        let c_text = CString::new(text).map_err(|_| EngineError::invalid("messages", "contains NUL"))?;
        let input = sys::mtmd_input_text { text: c_text.as_ptr(), text_len: text.len(), add_special: add_bos, parse_special: true };
        let ptrs: Vec<*const sys::mtmd_bitmap> = bitmaps.iter().map(|b| b.0 as *const _).collect();
        let chunks = Chunks(unsafe { sys::mtmd_input_chunks_init() });
        // SAFETY: every pointer is live for the call.
        let rc = unsafe { sys::mtmd_tokenize(self.ctx, chunks.0, &input, ptrs.as_ptr().cast_mut(), ptrs.len()) };
        if rc != 0 {
            let at = media.first().map_or("messages", |m| m.at.as_str());
            let why = if rc == 1 {
                "the media markers and files do not match".to_string()
            } else {
                format!("the projector could not preprocess it ({rc})")
            };
            return Err(EngineError::invalid(at, why));
        }
        let mut out = MediaPrompt { tokens: Vec::new(), spans: Vec::new(), encode_ms: 0.0 };
        let n = unsafe { sys::mtmd_input_chunks_size(chunks.0) };
        let mut k = 0;
        for i in 0..n {
            // SAFETY: i < size; the chunk lives as long as `chunks`.
            let chunk = unsafe { sys::mtmd_input_chunks_get(chunks.0, i) };
            let ty = unsafe { sys::mtmd_input_chunk_get_type(chunk) };
            if ty == sys::MTMD_INPUT_CHUNK_TYPE_TEXT {
                let mut n_tok = 0usize;
                let p = unsafe { sys::mtmd_input_chunk_get_tokens_text(chunk, &mut n_tok) };
                if !p.is_null() {
                    // SAFETY: n_tok tokens at p.
                    out.tokens.extend(unsafe { std::slice::from_raw_parts(p, n_tok) }.iter().map(|&t| LlamaToken(t)));
                }
                continue;
            }
            let m = media.get(k).copied();
            k += 1;
            let at = m.map_or("messages", |m| m.at.as_str());
            let (encoded, fresh) = self.encoded(&mut kept, chunk, at)?;
            if encoded.n_tokens > self.n_ubatch && unsafe { sys::mtmd_decode_use_non_causal(self.ctx, chunk) } {
                return Err(EngineError::invalid(
                    at,
                    format!(
                        "takes {} tokens, which this model reads at once: load the engine with batchSize {} or more",
                        encoded.n_tokens, encoded.n_tokens
                    ),
                ));
            }
            if fresh {
                out.encode_ms += encoded.encode_ms;
            }
            out.tokens.extend(std::iter::repeat_n(encoded.token(), encoded.n_tokens));
            out.spans.push(MediaSpan { start: out.tokens.len() - encoded.n_tokens, chunk: encoded });
        }
        if out.spans.last().is_some_and(|s| s.end() == out.tokens.len()) {
            return Err(EngineError::invalid("messages", "the prompt ends with an image or audio: text must follow it"));
        }
        Ok(out)
    }

    /// The encoded chunk for `chunk`: kept from an earlier request with the
    /// same file, or encoded now (`true`).
    fn encoded(&self, kept: &mut Vec<Arc<MediaChunk>>, chunk: *const sys::mtmd_input_chunk, at: &str) -> Result<(Arc<MediaChunk>, bool)> {
        // SAFETY: a live media chunk.
        let id = unsafe {
            let p = sys::mtmd_input_chunk_get_id(chunk);
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        if let Some(i) = kept.iter().position(|c| !id.is_empty() && c.id == id) {
            let c = kept.remove(i);
            kept.push(c.clone());
            return Ok((c, false));
        }
        let n_tokens = unsafe { sys::mtmd_input_chunk_get_n_tokens(chunk) };
        let n_pos = unsafe { sys::mtmd_input_chunk_get_n_pos(chunk) }.max(0) as usize;
        let kind = if unsafe { sys::mtmd_input_chunk_get_type(chunk) } == sys::MTMD_INPUT_CHUNK_TYPE_AUDIO {
            MediaKind::Audio
        } else {
            MediaKind::Image
        };
        let t = Instant::now();
        let (rc, log) = llama_log::capture(|| unsafe { sys::mtmd_encode_chunk(self.ctx, chunk) });
        if rc != 0 {
            let why = llama_log::reason(&log).unwrap_or_else(|| format!("error {rc}"));
            return Err(EngineError::invalid(at, format!("the projector could not encode it: {why}")));
        }
        let encode_ms = t.elapsed().as_secs_f64() * 1e3;
        let len = n_tokens * self.n_embd;
        // SAFETY: after a successful encode the output holds n_tokens rows of n_embd floats.
        let embd = unsafe {
            let p = sys::mtmd_get_output_embd(self.ctx);
            if p.is_null() {
                return Err(EngineError::internal("the projector gave no embeddings"));
            }
            std::slice::from_raw_parts(p, len).to_vec()
        };
        let copy = unsafe { sys::mtmd_input_chunk_copy(chunk) };
        let c = Arc::new(MediaChunk { id, kind, chunk: copy, embd, n_tokens, n_pos, encode_ms });
        if !c.id.is_empty() {
            kept.push(c.clone());
            let mut bytes: usize = kept.iter().map(|c| c.embd.len() * 4).sum();
            while bytes > KEPT_BYTES && kept.len() > 1 {
                bytes -= kept[0].embd.len() * 4;
                kept.remove(0);
            }
        }
        Ok((c, true))
    }

    /// Decodes `span`'s embeddings into sequence `seq` of the target context
    /// `lctx` at position `n_past` (its non-causal attention, its positions,
    /// as llama.cpp's helper sets them).
    ///
    /// # Safety
    /// `lctx` must be the live context of the projector's text model.
    pub unsafe fn decode(&self, lctx: *mut sys::llama_context, span: &MediaSpan, n_past: usize, seq: i32) -> Result<()> {
        let c = &span.chunk;
        let mut new_n_past: sys::llama_pos = 0;
        // SAFETY: the chunk and its embeddings are live and sized for the
        // model; the helper only reads the embeddings.
        let rc = unsafe {
            sys::mtmd_helper_decode_image_chunk(
                self.ctx,
                lctx,
                c.chunk,
                c.embd.as_ptr().cast_mut(),
                n_past as sys::llama_pos,
                seq,
                self.n_ubatch as i32,
                &mut new_n_past,
                None,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(EngineError::internal(format!("decoding a {} failed ({rc})", c.kind.as_str())));
        }
        Ok(())
    }

    /// What `status().media` says.
    pub fn reads(&self) -> (bool, bool) {
        (self.vision, self.audio)
    }
}

struct Bitmap(*mut sys::mtmd_bitmap);

impl Drop for Bitmap {
    fn drop(&mut self) {
        // SAFETY: made by the helper, freed once.
        unsafe { sys::mtmd_bitmap_free(self.0) }
    }
}

struct Chunks(*mut sys::mtmd_input_chunks);

impl Drop for Chunks {
    fn drop(&mut self) {
        // SAFETY: made by mtmd_input_chunks_init, freed once.
        unsafe { sys::mtmd_input_chunks_free(self.0) }
    }
}
