#!/usr/bin/env node
// Tiny deterministic multimodal test fixtures for llama.cpp's mtmd (the
// vision projector "mmproj" files it loads next to a text model), written
// with scripts/gguf-write.mjs; seeded random weights, so the same bytes on
// every run and every machine. No dependencies.
//
//   makeMultimodalFixtures(modelsDir)  writes (atomically) into modelsDir:
//     gemma-3-270m.mmproj-test.gguf   projector `gemma3` for the existing text
//         model gemma-3-270m-q4_k_m.gguf (n_embd 640): a 2-block SigLIP ViT
//         (64x64 image, 8x8 patches, n_embd 64), 2x2 average pool, RMS norm,
//         input projection to 640. 16 image tokens per image.
//     qwen2vl-tiny.gguf               a random-weight Qwen2-VL text model
//         (arch qwen2vl, M-RoPE, 2 layers, n_embd 64) with the tokenizer and
//         chat template of Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf (read from
//         modelsDir; skipped when that file is missing)
//     qwen2vl-tiny.mmproj-test.gguf   projector `qwen2vl_merger` for it: a
//         2-block ViT with 2-D M-RoPE (8x8 patches, n_embd 64), 2x2 patch
//         merger MLP to 64. A 64x64 image gives 16 image tokens (the size is
//         dynamic: (w/16)*(h/16) tokens, w and h rounded to multiples of 16).
//     gemma-3-270m.mmproj-audio-test.gguf   audio projector `gemma4ua` for
//         gemma-3-270m (n_embd 640): encoder-free, the 16 kHz waveform cut
//         into 640-sample frames (40 ms; the last one zero-padded), each RMS
//         normed and projected to 640 by one linear map. 25 audio tokens per
//         second: ceil(samples / 640) tokens per clip, any length, no chunks.
//   pngBytes(width, height, seed)      a deterministic RGB test image (PNG)
//   wavBytes(seconds, sampleRate, seed) a deterministic test clip (16-bit PCM
//         mono WAV): seeded tones, a chirp and noise
//
// CLI: node scripts/mm-fixtures.mjs [modelsDir]   (default models/)
//
// The shapes follow llama.cpp's tools/mtmd/clip.cpp (load_hparams,
// load_tensors) and models/siglip.cpp / models/qwen2vl.cpp; ne lists are in
// ggml's order (ne0 varies fastest: a Linear(in, out) weight is [in, out]).
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { writeGguf, seedOf, normals, textModelKv, tokenizerKvType } from './gguf-write.mjs';

const { readGgufHeader } = createRequire(import.meta.url)('./gguf-read.cjs');

export const GEMMA_TEXT = 'gemma-3-270m-q4_k_m.gguf';
export const GEMMA_MMPROJ = 'gemma-3-270m.mmproj-test.gguf';
export const QWEN_TOKENIZER_SOURCE = 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf';
export const QWEN2VL_TEXT = 'qwen2vl-tiny.gguf';
export const QWEN2VL_MMPROJ = 'qwen2vl-tiny.mmproj-test.gguf';
export const GEMMA_AUDIO_MMPROJ = 'gemma-3-270m.mmproj-audio-test.gguf';

/** The fixtures' shapes, for tests (tokens per 64x64 image etc.). */
export const GEMMA_VISION = Object.freeze({ imageSize: 64, patchSize: 8, nEmbd: 64, nFf: 128, nHead: 4, nLayer: 2, nMerge: 2, projectionDim: 640, tokensPerImage: 16 });
export const QWEN2VL_VISION = Object.freeze({ imageSize: 64, patchSize: 8, nEmbd: 64, nFf: 128, nHead: 4, nLayer: 2, nMerge: 2, projectionDim: 64, tokensPer64x64Image: 16 });
/**
 * The audio fixture: mtmd resamples any clip to `sampleRate` (mono) and makes
 * one token of every `frameSize` samples (the last frame zero-padded), so a
 * clip of n samples at 16 kHz is ceil(n / 640) tokens (25 a second), all in
 * one chunk, between the text markers `<|audio>` and `<audio|>` that mtmd
 * adds (plain text to gemma-3's tokenizer).
 */
export const GEMMA_AUDIO = Object.freeze({ projectorType: 'gemma4ua', sampleRate: 16000, frameSize: 640, tokensPerSecond: 25, projectionDim: 640, begin: '<|audio>', end: '<audio|>' });
/** Audio tokens of a clip of `nSamples` samples at GEMMA_AUDIO.sampleRate. */
export const gemmaAudioTokens = (nSamples) => Math.ceil(nSamples / GEMMA_AUDIO.frameSize);
export const QWEN2VL_TEXT_HPARAMS = Object.freeze({ nEmbd: 64, nFf: 128, nHead: 4, nHeadKv: 2, nLayer: 2, nCtx: 4096, ropeSections: [2, 3, 3, 0] });

// ---------------------------------------------------------------------------
// Deterministic numbers

/** Float32 -> IEEE half bits, round to nearest even (exact integer arithmetic). */
const f32 = new Float32Array(1);
const u32v = new Uint32Array(f32.buffer);
function toHalf(x) {
  f32[0] = x;
  const b = u32v[0];
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let h = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && (h & 1))) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++; // may carry into the exponent: still correct
  return sign | h;
}

/** A tensor of `ne` with values mean + std * N(0,1), seeded by `key`. */
function randomTensor(key, name, ne, { std, mean = 0, type = 'F32' }) {
  const n = ne.reduce((a, b) => a * b, 1);
  const draw = normals(seedOf(`${key}:${name}`));
  if (type === 'F16') {
    const data = new Uint16Array(n);
    for (let i = 0; i < n; i++) data[i] = toHalf(mean + std * draw());
    return { name, ne, type, data };
  }
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = mean + std * draw();
  return { name, ne, type, data };
}

/** Weights of a Linear(nIn, nOut): ggml ne [nIn, nOut], ~N(0, 1/sqrt(nIn)). */
const linear = (key, name, nIn, nOut, type = 'F16', gain = 1) => randomTensor(key, name, [nIn, nOut], { std: gain / Math.sqrt(nIn), type });
const bias = (key, name, n, std = 0.02) => randomTensor(key, name, [n], { std });
const normWeight = (key, name, n) => randomTensor(key, name, [n], { mean: 1, std: 0.05 });

/** mulberry32: uniform [0, 1) from a 32-bit seed. */
function mulberry32(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// ---------------------------------------------------------------------------
// gemma3 projector (SigLIP + avg pool + RMS norm + input projection)

/** The GGUF spec ({ kv, tensors }) of the gemma3 test projector for a text model of width `textEmbd`. */
export function gemma3MmprojSpec(textEmbd = GEMMA_VISION.projectionDim) {
  const { imageSize, patchSize, nEmbd, nFf, nHead, nLayer, nMerge } = GEMMA_VISION;
  const key = 'gemma3-mmproj-test';
  const nPatches = (imageSize / patchSize) ** 2;
  const kv = [
    ['general.architecture', 'STRING', 'clip'],
    ['general.type', 'STRING', 'mmproj'],
    ['general.name', 'STRING', 'gemma-3-270m mmproj-test (random weights)'],
    ['general.file_type', 'U32', 1],
    ['clip.projector_type', 'STRING', 'gemma3'],
    ['clip.has_vision_encoder', 'BOOL', true],
    ['clip.has_audio_encoder', 'BOOL', false],
    ['clip.use_gelu', 'BOOL', true],
    ['clip.vision.image_size', 'U32', imageSize],
    ['clip.vision.patch_size', 'U32', patchSize],
    ['clip.vision.embedding_length', 'U32', nEmbd],
    ['clip.vision.feed_forward_length', 'U32', nFf],
    ['clip.vision.block_count', 'U32', nLayer],
    ['clip.vision.projection_dim', 'U32', textEmbd],
    ['clip.vision.attention.head_count', 'U32', nHead],
    ['clip.vision.attention.layer_norm_epsilon', 'F32', 1e-6],
    ['clip.vision.image_mean', ['ARRAY', 'F32'], [0.5, 0.5, 0.5]],
    ['clip.vision.image_std', ['ARRAY', 'F32'], [0.5, 0.5, 0.5]],
    ['clip.vision.projector.scale_factor', 'U32', nMerge],
  ];
  const tensors = [
    // conv2d kernel [KW, KH, C_in, C_out]
    randomTensor(key, 'v.patch_embd.weight', [patchSize, patchSize, 3, nEmbd], { std: 1 / Math.sqrt(3 * patchSize * patchSize), type: 'F16' }),
    bias(key, 'v.patch_embd.bias', nEmbd),
    randomTensor(key, 'v.position_embd.weight', [nEmbd, nPatches], { std: 0.1 }),
  ];
  for (let i = 0; i < nLayer; i++) {
    const b = `v.blk.${i}`;
    tensors.push(
      normWeight(key, `${b}.ln1.weight`, nEmbd), bias(key, `${b}.ln1.bias`, nEmbd),
      linear(key, `${b}.attn_q.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_q.bias`, nEmbd),
      linear(key, `${b}.attn_k.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_k.bias`, nEmbd),
      linear(key, `${b}.attn_v.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_v.bias`, nEmbd),
      linear(key, `${b}.attn_out.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_out.bias`, nEmbd),
      normWeight(key, `${b}.ln2.weight`, nEmbd), bias(key, `${b}.ln2.bias`, nEmbd),
      linear(key, `${b}.ffn_up.weight`, nEmbd, nFf), bias(key, `${b}.ffn_up.bias`, nFf),
      linear(key, `${b}.ffn_down.weight`, nFf, nEmbd), bias(key, `${b}.ffn_down.bias`, nEmbd),
    );
  }
  tensors.push(
    normWeight(key, 'v.post_ln.weight', nEmbd), bias(key, 'v.post_ln.bias', nEmbd),
    normWeight(key, 'mm.soft_emb_norm.weight', nEmbd),
    // used as ggml_transpose(W): ne [textEmbd, nEmbd]. Output ~N(0, 4^2) per
    // element: at unit scale the (text-only) 270m model falls into the same
    // newline loop for most images; at 4 its greedy output follows the image.
    randomTensor(key, 'mm.input_projection.weight', [textEmbd, nEmbd], { std: 4 / Math.sqrt(nEmbd), type: 'F16' }),
  );
  return { kv, tensors };
}

// ---------------------------------------------------------------------------
// gemma4ua audio projector (encoder-free: waveform frames, RMS norm, linear)

/**
 * The GGUF spec of the gemma4ua test audio projector for a text model of
 * width `textEmbd`. clip.cpp (load_hparams, models/gemma4ua.cpp) reads the
 * common audio keys (embedding_length etc. are required but unused: no
 * encoder blocks), fixes 16 kHz and 640-sample frames itself, and loads one
 * tensor: mm.a.input_projection.weight, a Linear(640, textEmbd) used as
 * mul_mat(W, rms_norm(frame)): ne [640, textEmbd].
 */
export function gemma4uaMmprojSpec(textEmbd = GEMMA_AUDIO.projectionDim) {
  const { frameSize } = GEMMA_AUDIO;
  const key = 'gemma4ua-mmproj-test';
  const kv = [
    ['general.architecture', 'STRING', 'clip'],
    ['general.type', 'STRING', 'mmproj'],
    ['general.name', 'STRING', 'gemma-3-270m mmproj-audio-test (random weights)'],
    ['general.file_type', 'U32', 1],
    ['clip.projector_type', 'STRING', 'gemma4ua'],
    ['clip.has_vision_encoder', 'BOOL', false],
    ['clip.has_audio_encoder', 'BOOL', true],
    ['clip.audio.num_mel_bins', 'U32', frameSize], // gemma4ua: samples a frame (clip.cpp sets 640 anyway)
    ['clip.audio.embedding_length', 'U32', frameSize],
    ['clip.audio.feed_forward_length', 'U32', frameSize],
    ['clip.audio.block_count', 'U32', 0],
    ['clip.audio.projection_dim', 'U32', textEmbd],
    ['clip.audio.attention.head_count', 'U32', 1],
    ['clip.audio.attention.layer_norm_epsilon', 'F32', 1e-6],
  ];
  // Output ~N(0, 4^2) per element, as the gemma3 image fixture's: the frame
  // is RMS normed (unit RMS), so std 4/sqrt(640) per weight. At unit scale
  // the 270m model mostly ignores the clip.
  const tensors = [linear(key, 'mm.a.input_projection.weight', frameSize, textEmbd, 'F16', 4)];
  return { kv, tensors };
}

// ---------------------------------------------------------------------------
// Qwen2-VL: text model + qwen2vl_merger projector

/** The GGUF spec of the qwen2vl_merger test projector for a text model of width `textEmbd`. */
export function qwen2vlMmprojSpec(textEmbd = QWEN2VL_VISION.projectionDim) {
  const { imageSize, patchSize, nEmbd, nFf, nHead, nLayer, nMerge } = QWEN2VL_VISION;
  const key = 'qwen2vl-mmproj-test';
  const nMerged = nEmbd * nMerge * nMerge;
  const kv = [
    ['general.architecture', 'STRING', 'clip'],
    ['general.type', 'STRING', 'mmproj'],
    ['general.name', 'STRING', 'qwen2vl-tiny mmproj-test (random weights)'],
    ['general.file_type', 'U32', 1],
    ['clip.projector_type', 'STRING', 'qwen2vl_merger'],
    ['clip.has_vision_encoder', 'BOOL', true],
    ['clip.has_audio_encoder', 'BOOL', false],
    ['clip.vision.image_size', 'U32', imageSize],
    ['clip.vision.patch_size', 'U32', patchSize],
    ['clip.vision.embedding_length', 'U32', nEmbd],
    ['clip.vision.feed_forward_length', 'U32', nFf],
    ['clip.vision.block_count', 'U32', nLayer],
    ['clip.vision.projection_dim', 'U32', textEmbd],
    ['clip.vision.attention.head_count', 'U32', nHead],
    ['clip.vision.attention.layer_norm_epsilon', 'F32', 1e-6],
    ['clip.vision.image_mean', ['ARRAY', 'F32'], [0.48145466, 0.4578275, 0.40821073]],
    ['clip.vision.image_std', ['ARRAY', 'F32'], [0.26862954, 0.26130258, 0.27577711]],
    ['clip.vision.spatial_merge_size', 'U32', nMerge],
  ];
  const convStd = 1 / Math.sqrt(2 * 3 * patchSize * patchSize); // two kernels are summed
  const tensors = [
    randomTensor(key, 'v.patch_embd.weight', [patchSize, patchSize, 3, nEmbd], { std: convStd, type: 'F16' }),
    randomTensor(key, 'v.patch_embd.weight.1', [patchSize, patchSize, 3, nEmbd], { std: convStd, type: 'F16' }),
  ];
  for (let i = 0; i < nLayer; i++) {
    const b = `v.blk.${i}`;
    tensors.push(
      normWeight(key, `${b}.ln1.weight`, nEmbd), bias(key, `${b}.ln1.bias`, nEmbd),
      linear(key, `${b}.attn_q.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_q.bias`, nEmbd),
      linear(key, `${b}.attn_k.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_k.bias`, nEmbd),
      linear(key, `${b}.attn_v.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_v.bias`, nEmbd),
      linear(key, `${b}.attn_out.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_out.bias`, nEmbd),
      normWeight(key, `${b}.ln2.weight`, nEmbd), bias(key, `${b}.ln2.bias`, nEmbd),
      linear(key, `${b}.ffn_up.weight`, nEmbd, nFf), bias(key, `${b}.ffn_up.bias`, nFf),
      linear(key, `${b}.ffn_down.weight`, nFf, nEmbd), bias(key, `${b}.ffn_down.bias`, nEmbd),
    );
  }
  tensors.push(
    normWeight(key, 'v.post_ln.weight', nEmbd), bias(key, 'v.post_ln.bias', nEmbd),
    linear(key, 'mm.0.weight', nMerged, nMerged), bias(key, 'mm.0.bias', nMerged),
    linear(key, 'mm.2.weight', nMerged, textEmbd), bias(key, 'mm.2.bias', textEmbd),
  );
  return { kv, tensors };
}

/** The GGUF spec of the tiny Qwen2-VL text model, given the tokenizer kv of a Qwen2 model. */
export function qwen2vlTextSpec(tokenizerKv) {
  const { nEmbd, nFf, nHead, nHeadKv, nLayer, nCtx, ropeSections } = QWEN2VL_TEXT_HPARAMS;
  const key = 'qwen2vl-tiny';
  const nVocab = tokenizerKv['tokenizer.ggml.tokens']?.length;
  if (!nVocab) throw new Error('tokenizer.ggml.tokens missing from the tokenizer source');
  const headDim = nEmbd / nHead;
  const kvDim = headDim * nHeadKv;
  const arch = 'qwen2vl';
  const kv = [
    ...textModelKv({ arch, name: 'qwen2vl-tiny (random weights, test fixture)', fileType: 1, nCtx, nEmbd, nLayer, nFf, nHead }),
    [`${arch}.attention.head_count_kv`, 'U32', nHeadKv],
    [`${arch}.attention.layer_norm_rms_epsilon`, 'F32', 1e-6],
    [`${arch}.rope.freq_base`, 'F32', 1000000],
    [`${arch}.rope.dimension_sections`, ['ARRAY', 'I32'], ropeSections],
  ];
  for (const k of Object.keys(tokenizerKv).sort()) kv.push([k, tokenizerKvType(k, tokenizerKv[k]), tokenizerKv[k]]);
  // token_embd is also the (tied) output: std 1 matches the projector's output scale.
  // The layers' output projections get a gain of 2 so that what they add
  // outweighs the last token's own embedding (with gain 1 a tied random model
  // mostly repeats its last token, whatever the image).
  const OUT_GAIN = 2;
  const tensors = [randomTensor(key, 'token_embd.weight', [nEmbd, nVocab], { std: 1, type: 'F16' }), normWeight(key, 'output_norm.weight', nEmbd)];
  for (let i = 0; i < nLayer; i++) {
    const b = `blk.${i}`;
    tensors.push(
      normWeight(key, `${b}.attn_norm.weight`, nEmbd),
      linear(key, `${b}.attn_q.weight`, nEmbd, nEmbd), bias(key, `${b}.attn_q.bias`, nEmbd),
      linear(key, `${b}.attn_k.weight`, nEmbd, kvDim), bias(key, `${b}.attn_k.bias`, kvDim),
      linear(key, `${b}.attn_v.weight`, nEmbd, kvDim), bias(key, `${b}.attn_v.bias`, kvDim),
      linear(key, `${b}.attn_output.weight`, nEmbd, nEmbd, 'F16', OUT_GAIN),
      normWeight(key, `${b}.ffn_norm.weight`, nEmbd),
      linear(key, `${b}.ffn_gate.weight`, nEmbd, nFf),
      linear(key, `${b}.ffn_up.weight`, nEmbd, nFf),
      linear(key, `${b}.ffn_down.weight`, nFf, nEmbd, 'F16', OUT_GAIN),
    );
  }
  return { kv, tensors };
}

// ---------------------------------------------------------------------------

/**
 * Writes the fixtures into `modelsDir` (byte-identical every run; each file
 * written atomically). Returns `{ written: [file, …], skipped: [{ file, reason }] }`.
 */
export async function makeMultimodalFixtures(modelsDir) {
  const written = [];
  const skipped = [];
  fs.mkdirSync(modelsDir, { recursive: true });

  // gemma3: the projection width is the text model's n_embd (640) when it is there
  let gemmaEmbd = GEMMA_VISION.projectionDim;
  const gemmaText = path.join(modelsDir, GEMMA_TEXT);
  if (fs.existsSync(gemmaText)) {
    const { kv } = await readGgufHeader(gemmaText, { keep: (k) => !k.startsWith('tokenizer.') });
    const n = kv[`${kv['general.architecture']}.embedding_length`];
    if (n !== gemmaEmbd) throw new Error(`${GEMMA_TEXT}: embedding_length ${n}, the fixture expects ${gemmaEmbd}`);
  }
  const gemmaOut = path.join(modelsDir, GEMMA_MMPROJ);
  writeGguf(gemmaOut, gemma3MmprojSpec(gemmaEmbd));
  written.push(gemmaOut);
  const gemmaAudioOut = path.join(modelsDir, GEMMA_AUDIO_MMPROJ);
  writeGguf(gemmaAudioOut, gemma4uaMmprojSpec(gemmaEmbd));
  written.push(gemmaAudioOut);

  // qwen2vl: needs the Qwen2 tokenizer from the (real) coder model
  const source = path.join(modelsDir, QWEN_TOKENIZER_SOURCE);
  if (!fs.existsSync(source)) {
    for (const f of [QWEN2VL_TEXT, QWEN2VL_MMPROJ]) skipped.push({ file: path.join(modelsDir, f), reason: `${QWEN_TOKENIZER_SOURCE} (tokenizer source) is missing` });
  } else {
    const { kv } = await readGgufHeader(source, { keep: (k) => k.startsWith('tokenizer.') });
    const textOut = path.join(modelsDir, QWEN2VL_TEXT);
    writeGguf(textOut, qwen2vlTextSpec(kv));
    written.push(textOut);
    const projOut = path.join(modelsDir, QWEN2VL_MMPROJ);
    writeGguf(projOut, qwen2vlMmprojSpec(QWEN2VL_TEXT_HPARAMS.nEmbd));
    written.push(projOut);
  }
  return { written, skipped };
}

// ---------------------------------------------------------------------------
// Test images

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();
function crc32(buf) {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC_TABLE[(c ^ buf[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function pngChunk(type, data) {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, 'latin1');
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, crc]);
}

/**
 * The RGB pixels (Uint8Array, row-major, 3 bytes a pixel) of a seeded test
 * pattern: a two-colour linear gradient at a random angle, a few filled
 * rectangles and a disc, light noise. Different seeds look clearly different.
 */
export function testPixels(width, height, seed) {
  const rand = mulberry32(seed ^ 0x9e3779b9);
  const color = () => [0, 1, 2].map(() => Math.floor(rand() * 256));
  const c0 = color(), c1 = color();
  const angle = rand() * 2 * Math.PI;
  const dx = Math.cos(angle), dy = Math.sin(angle);
  const rects = Array.from({ length: 3 }, () => {
    const x0 = Math.floor(rand() * width), y0 = Math.floor(rand() * height);
    return { x0, y0, x1: x0 + 1 + Math.floor(rand() * width / 2), y1: y0 + 1 + Math.floor(rand() * height / 2), c: color() };
  });
  const disc = { cx: rand() * width, cy: rand() * height, r: (0.1 + rand() * 0.25) * Math.min(width, height), c: color() };
  const px = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      let t = ((x / Math.max(1, width - 1) - 0.5) * dx + (y / Math.max(1, height - 1) - 0.5) * dy) + 0.5;
      t = Math.min(1, Math.max(0, t));
      let c = [0, 1, 2].map((i) => c0[i] + (c1[i] - c0[i]) * t);
      for (const r of rects) if (x >= r.x0 && x < r.x1 && y >= r.y0 && y < r.y1) c = r.c;
      if ((x + 0.5 - disc.cx) ** 2 + (y + 0.5 - disc.cy) ** 2 < disc.r ** 2) c = disc.c;
      const o = (y * width + x) * 3;
      for (let i = 0; i < 3; i++) px[o + i] = Math.min(255, Math.max(0, Math.round(c[i] + (rand() - 0.5) * 16)));
    }
  }
  return px;
}

/** A valid 8-bit RGB PNG (Buffer) of `testPixels(width, height, seed)`. */
export function pngBytes(width, height, seed = 1) {
  if (!Number.isInteger(width) || !Number.isInteger(height) || width <= 0 || height <= 0) throw new TypeError(`png size ${width}x${height}`);
  const px = testPixels(width, height, seed >>> 0);
  const raw = Buffer.alloc((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) {
    raw[y * (width * 3 + 1)] = 0; // filter: none
    Buffer.from(px.buffer, y * width * 3, width * 3).copy(raw, y * (width * 3 + 1) + 1);
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type RGB
  ihdr[10] = 0; ihdr[11] = 0; ihdr[12] = 0;
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    pngChunk('IHDR', ihdr),
    pngChunk('IDAT', zlib.deflateSync(raw, { level: 9 })),
    pngChunk('IEND', Buffer.alloc(0)),
  ]);
}

// Baseline JPEG: YCbCr 4:4:4, one quantization table, and Huffman tables of
// our own (any prefix code is valid baseline JPEG): the 12 DC categories
// as 4-bit codes, the 162 AC symbols (EOB, ZRL, run/size 0-15/1-10) as
// 8-bit codes. Larger than an optimised file, simpler to write exactly.
const ZIGZAG = [
  0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
  35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];
const AC_SYMBOLS = [0x00, 0xf0];
for (let run = 0; run < 16; run++) for (let size = 1; size <= 10; size++) AC_SYMBOLS.push((run << 4) | size);
const JPEG_Q = 6;

function jpegSegment(marker, data) {
  const head = Buffer.from([0xff, marker, 0, 0]);
  head.writeUInt16BE(data.length + 2, 2);
  return Buffer.concat([head, data]);
}

/** A valid baseline JPEG (Buffer) of `testPixels(width, height, seed)`. */
export function jpegBytes(width, height, seed = 1) {
  if (!Number.isInteger(width) || !Number.isInteger(height) || width <= 0 || height <= 0 || width > 65535 || height > 65535) {
    throw new TypeError(`jpeg size ${width}x${height}`);
  }
  const px = testPixels(width, height, seed >>> 0);
  const plane = (c) => {
    const out = new Float32Array(width * height);
    for (let i = 0; i < width * height; i++) {
      const [r, g, b] = [px[3 * i], px[3 * i + 1], px[3 * i + 2]];
      out[i] = c === 0 ? 0.299 * r + 0.587 * g + 0.114 * b : c === 1 ? -0.168736 * r - 0.331264 * g + 0.5 * b + 128 : 0.5 * r - 0.418688 * g - 0.081312 * b + 128;
    }
    return out;
  };
  const planes = [plane(0), plane(1), plane(2)];
  const cos = Array.from({ length: 64 }, (_, k) => Math.cos(((2 * (k % 8) + 1) * Math.floor(k / 8) * Math.PI) / 16));
  let acc = 0, nbits = 0;
  const bytes = [];
  const put = (code, len) => {
    for (let i = len - 1; i >= 0; i--) {
      acc = (acc << 1) | ((code >>> i) & 1);
      if (++nbits === 8) {
        bytes.push(acc);
        if (acc === 0xff) bytes.push(0); // stuffing
        acc = 0;
        nbits = 0;
      }
    }
  };
  const category = (v) => (v === 0 ? 0 : 32 - Math.clz32(Math.abs(v)));
  const bitsOf = (v, n) => (v >= 0 ? v : v + (1 << n) - 1);
  const pred = [0, 0, 0];
  for (let by = 0; by < height; by += 8) {
    for (let bx = 0; bx < width; bx += 8) {
      for (let c = 0; c < 3; c++) {
        const block = new Float32Array(64);
        for (let y = 0; y < 8; y++) {
          for (let x = 0; x < 8; x++) block[y * 8 + x] = planes[c][Math.min(height - 1, by + y) * width + Math.min(width - 1, bx + x)] - 128;
        }
        const q = new Int32Array(64);
        for (let v = 0; v < 8; v++) {
          for (let u = 0; u < 8; u++) {
            let s = 0;
            for (let y = 0; y < 8; y++) for (let x = 0; x < 8; x++) s += block[y * 8 + x] * cos[u * 8 + x] * cos[v * 8 + y];
            const f = 0.25 * (u ? 1 : Math.SQRT1_2) * (v ? 1 : Math.SQRT1_2) * s;
            q[v * 8 + u] = Math.round(f / JPEG_Q);
          }
        }
        const diff = q[0] - pred[c];
        pred[c] = q[0];
        const dc = category(diff);
        put(dc, 4);
        if (dc) put(bitsOf(diff, dc), dc);
        let run = 0;
        for (let k = 1; k < 64; k++) {
          const v = q[ZIGZAG[k]];
          if (v === 0) {
            run++;
            continue;
          }
          for (; run >= 16; run -= 16) put(AC_SYMBOLS.indexOf(0xf0), 8);
          const size = category(v);
          put(AC_SYMBOLS.indexOf((run << 4) | size), 8);
          put(bitsOf(v, size), size);
          run = 0;
        }
        if (run) put(0, 8); // EOB
      }
    }
  }
  if (nbits) put((1 << (8 - nbits)) - 1, 8 - nbits);
  const sof = Buffer.alloc(15);
  sof[0] = 8;
  sof.writeUInt16BE(height, 1);
  sof.writeUInt16BE(width, 3);
  sof[5] = 3;
  for (let c = 0; c < 3; c++) sof.set([c + 1, 0x11, 0], 6 + 3 * c);
  const dcBits = new Array(16).fill(0);
  dcBits[3] = 12;
  const acBits = new Array(16).fill(0);
  acBits[7] = AC_SYMBOLS.length;
  return Buffer.concat([
    Buffer.from([0xff, 0xd8]),
    jpegSegment(0xe0, Buffer.from([0x4a, 0x46, 0x49, 0x46, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0])),
    jpegSegment(0xdb, Buffer.from([0, ...new Array(64).fill(JPEG_Q)])),
    jpegSegment(0xc0, sof),
    jpegSegment(0xc4, Buffer.from([0x00, ...dcBits, ...Array.from({ length: 12 }, (_, i) => i)])),
    jpegSegment(0xc4, Buffer.from([0x10, ...acBits, ...AC_SYMBOLS])),
    jpegSegment(0xda, Buffer.from([3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0])),
    Buffer.from(bytes),
    Buffer.from([0xff, 0xd9]),
  ]);
}

// ---------------------------------------------------------------------------
// Test audio

/**
 * The samples (Float32Array in [-1, 1]) of a seeded test clip: three tones
 * (80-2000 Hz, random phases and amplitudes, each with its own slow tremolo),
 * a linear chirp and white noise, faded in and out over 10 ms. Different
 * seeds sound (and encode) clearly different.
 */
export function testSamples(seconds, sampleRate, seed) {
  const n = Math.round(seconds * sampleRate);
  const rand = mulberry32(seed ^ 0x85ebca6b);
  const tones = Array.from({ length: 3 }, () => ({
    f: 80 + rand() * 1920, phase: rand() * 2 * Math.PI, a: 0.1 + rand() * 0.2,
    tf: 0.5 + rand() * 6, tphase: rand() * 2 * Math.PI,
  }));
  const chirp = { f0: 100 + rand() * 1900, f1: 100 + rand() * 3900, a: 0.05 + rand() * 0.15 };
  const noise = 0.02 + rand() * 0.08;
  const fade = Math.max(1, Math.round(0.01 * sampleRate));
  const dur = Math.max(n, 1) / sampleRate;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const t = i / sampleRate;
    let v = 0;
    for (const o of tones) v += o.a * (0.6 + 0.4 * Math.sin(2 * Math.PI * o.tf * t + o.tphase)) * Math.sin(2 * Math.PI * o.f * t + o.phase);
    v += chirp.a * Math.sin(2 * Math.PI * (chirp.f0 * t + 0.5 * (chirp.f1 - chirp.f0) * t * t / dur));
    v += noise * (rand() * 2 - 1);
    v *= Math.min(1, i / fade, (n - 1 - i) / fade);
    out[i] = Math.max(-1, Math.min(1, v));
  }
  return out;
}

/** A valid 16-bit PCM mono WAV (Buffer) of `testSamples(seconds, sampleRate, seed)`. */
export function wavBytes(seconds, sampleRate = GEMMA_AUDIO.sampleRate, seed = 1) {
  if (!(seconds > 0) || !Number.isFinite(seconds)) throw new TypeError(`wav length ${seconds} s`);
  if (!Number.isInteger(sampleRate) || sampleRate < 1000 || sampleRate > 384000) throw new TypeError(`wav sample rate ${sampleRate}`);
  const x = testSamples(seconds, sampleRate, seed >>> 0);
  const data = Buffer.alloc(x.length * 2);
  for (let i = 0; i < x.length; i++) data.writeInt16LE(Math.max(-32768, Math.min(32767, Math.round(x[i] * 32767))), i * 2);
  const head = Buffer.alloc(44);
  head.write('RIFF', 0, 'latin1');
  head.writeUInt32LE(36 + data.length, 4);
  head.write('WAVE', 8, 'latin1');
  head.write('fmt ', 12, 'latin1');
  head.writeUInt32LE(16, 16); // fmt chunk size
  head.writeUInt16LE(1, 20); // PCM
  head.writeUInt16LE(1, 22); // mono
  head.writeUInt32LE(sampleRate, 24);
  head.writeUInt32LE(sampleRate * 2, 28); // byte rate
  head.writeUInt16LE(2, 32); // block align
  head.writeUInt16LE(16, 34); // bits per sample
  head.write('data', 36, 'latin1');
  head.writeUInt32LE(data.length, 40);
  return Buffer.concat([head, data]);
}

// ---------------------------------------------------------------------------

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const dir = path.resolve(process.argv[2] || path.join(root, 'models'));
  try {
    const { written, skipped } = await makeMultimodalFixtures(dir);
    const show = (f) => (path.relative(process.cwd(), f).startsWith('..') ? f : path.relative(process.cwd(), f));
    for (const f of written) console.log(`${show(f)}: ${(fs.statSync(f).size / 1048576).toFixed(1)} MiB`);
    for (const s of skipped) console.error(`${show(s.file)}: skipped (${s.reason})`);
  } catch (e) {
    console.error(`mm-fixtures: ${e.message}`);
    process.exit(1);
  }
}
