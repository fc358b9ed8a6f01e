// A tiny deterministic reranker GGUF for the rerank tests: llama.cpp's
// `bert` architecture with a classification head (pooling `rank`), random
// weights from seeds (scripts/gguf-write.mjs: the same bytes on every run
// and machine), a WordPiece vocabulary of a few hundred words. Its scores
// mean nothing; what the tests check is that they are the ones this model
// computes (`bertReference`, a plain forward pass in double precision) and
// that the engine and the server treat them as llama.cpp's server does.
//
//   bertRerankerSpec()            { kv, tensors } for writeGguf
//   bertReference(spec, tokens)   the score of one input (token ids)
//   RERANKER                      its file name in models/
//
// Shapes as llama.cpp's src/models/bert.cpp reads them (ne in ggml's order:
// a Linear(in, out) weight is [in, out]); the head as its build_pooling
// (rank): cls (tanh) then cls.output, over the first token's vector.
import { createRequire } from 'node:module';
import path from 'node:path';
import { normals, seedOf, textModelKv, tokenizerKvType } from './gguf-write.mjs';

const { readGgufHeader } = createRequire(import.meta.url)('./gguf-read.cjs');

export const RERANKER = 'bert-reranker-tiny.gguf';
export const RERANKER_HPARAMS = { nEmbd: 32, nHead: 2, nLayer: 2, nFf: 64, nCtx: 512, eps: 1e-12 };

const SPECIAL = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'];
const WORDS = (
  'a about acquiring action all also an and animals apply are art artificial as be by can capital capitale city concerned control culture data de ' +
  'development devices does du en engines est et evidence field for forces france from generalize grande has humans in instructions intelligence ' +
  'is it jumps knowledge la lazy le learn learning les machine machines many may model models motors movement new not of on or over paris perform ' +
  'physical plants power process quick study system systems that the there this to uses values ville what which with without'
).split(' ');
const LETTERS = 'abcdefghijklmnopqrstuvwxyz0123456789'.split('');
const PUNCT = '.,?!\'"-:;()'.split('');

/** The vocabulary, as llama.cpp's WPM tokenizer reads it: a word start is `▁` + the piece, a continuation the piece alone. */
export function rerankerVocab() {
  const all = [...SPECIAL, ...WORDS.map((w) => `▁${w}`), ...LETTERS.map((c) => `▁${c}`), ...LETTERS, ...PUNCT.map((c) => `▁${c}`), ...['s', 'ing', 'ed', 'er', 'ly', 'es']];
  return [...new Set(all)];
}

function tensor(name, ne, std, key = 'bert-reranker-tiny') {
  const draw = normals(seedOf(`${key}/${name}`));
  const n = ne.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = draw() * std;
  return { name, ne, type: 'F32', data };
}
const ones = (name, n) => ({ name, ne: [n], type: 'F32', data: new Float32Array(n).fill(1) });
const zeros = (name, n) => ({ name, ne: [n], type: 'F32', data: new Float32Array(n) });

export function bertRerankerSpec() {
  const { nEmbd, nHead, nLayer, nFf, nCtx, eps } = RERANKER_HPARAMS;
  const tokens = rerankerVocab();
  const arch = 'bert';
  const kv = [
    ...textModelKv({ arch, name: 'bert-reranker-tiny (random weights, test fixture)', fileType: 0, nCtx, nEmbd, nLayer, nFf, nHead }),
    [`${arch}.attention.layer_norm_epsilon`, 'F32', eps],
    [`${arch}.attention.causal`, 'BOOL', false],
    [`${arch}.pooling_type`, 'U32', 4],
    ['tokenizer.ggml.model', 'STRING', 'bert'],
    ['tokenizer.ggml.tokens', ['ARRAY', 'STRING'], tokens],
    ['tokenizer.ggml.token_type', ['ARRAY', 'I32'], tokens.map((t) => (SPECIAL.includes(t) ? 3 : 1))],
    ['tokenizer.ggml.token_type_count', 'U32', 2],
    ['tokenizer.ggml.padding_token_id', 'U32', 0],
    ['tokenizer.ggml.unknown_token_id', 'U32', 1],
    ['tokenizer.ggml.bos_token_id', 'U32', 2],
    ['tokenizer.ggml.seperator_token_id', 'U32', 3],
    ['tokenizer.ggml.eos_token_id', 'U32', 3],
    ['tokenizer.ggml.mask_token_id', 'U32', 4],
    ['tokenizer.ggml.add_bos_token', 'BOOL', true],
    ['tokenizer.ggml.add_eos_token', 'BOOL', true],
    ['tokenizer.ggml.add_sep_token', 'BOOL', false],
  ];
  const tensors = [
    tensor('token_embd.weight', [nEmbd, tokens.length], 0.5),
    tensor('token_types.weight', [nEmbd, 2], 0.1),
    tensor('position_embd.weight', [nEmbd, nCtx], 0.1),
    ones('token_embd_norm.weight', nEmbd),
    zeros('token_embd_norm.bias', nEmbd),
  ];
  const w = 1 / Math.sqrt(nEmbd);
  for (let i = 0; i < nLayer; i++) {
    const b = `blk.${i}`;
    tensors.push(
      tensor(`${b}.attn_q.weight`, [nEmbd, nEmbd], w), tensor(`${b}.attn_q.bias`, [nEmbd], 0.02),
      tensor(`${b}.attn_k.weight`, [nEmbd, nEmbd], w), tensor(`${b}.attn_k.bias`, [nEmbd], 0.02),
      tensor(`${b}.attn_v.weight`, [nEmbd, nEmbd], w), tensor(`${b}.attn_v.bias`, [nEmbd], 0.02),
      tensor(`${b}.attn_output.weight`, [nEmbd, nEmbd], w), tensor(`${b}.attn_output.bias`, [nEmbd], 0.02),
      ones(`${b}.attn_output_norm.weight`, nEmbd), zeros(`${b}.attn_output_norm.bias`, nEmbd),
      tensor(`${b}.ffn_up.weight`, [nEmbd, nFf], w), tensor(`${b}.ffn_up.bias`, [nFf], 0.02),
      tensor(`${b}.ffn_down.weight`, [nFf, nEmbd], 1 / Math.sqrt(nFf)), tensor(`${b}.ffn_down.bias`, [nEmbd], 0.02),
      ones(`${b}.layer_output_norm.weight`, nEmbd), zeros(`${b}.layer_output_norm.bias`, nEmbd),
    );
  }
  tensors.push(tensor('cls.weight', [nEmbd, nEmbd], w), tensor('cls.bias', [nEmbd], 0.02), tensor('cls.output.weight', [nEmbd, 1], 1), tensor('cls.output.bias', [1], 0.1));
  return { kv, tensors };
}

/**
 * The score of one input (token ids) by this model, in double precision:
 * BERT's encoder (token + type 0 + position embeddings, layer norms after
 * attention and after the GELU feed-forward), then the head over the first
 * token. GELU as ggml computes it (the tanh approximation).
 */
export function bertReference(spec, ids) {
  const { nEmbd, nHead, nLayer, eps } = RERANKER_HPARAMS;
  const T = new Map(spec.tensors.map((t) => [t.name, t]));
  const get = (name) => T.get(name).data;
  // y = W x + b for W of ne [nIn, nOut] (row o at o * nIn).
  const linear = (x, name, nIn, nOut) => {
    const W = get(`${name}.weight`);
    const b = T.has(`${name}.bias`) ? get(`${name}.bias`) : null;
    const y = new Float64Array(nOut);
    for (let o = 0; o < nOut; o++) {
      let s = b ? b[o] : 0;
      for (let i = 0; i < nIn; i++) s += W[o * nIn + i] * x[i];
      y[o] = s;
    }
    return y;
  };
  const norm = (x, name) => {
    const n = x.length;
    const mean = x.reduce((a, b) => a + b, 0) / n;
    const v = x.reduce((a, b) => a + (b - mean) ** 2, 0) / n;
    const g = get(`${name}.weight`);
    const bb = get(`${name}.bias`);
    return x.map((a, i) => ((a - mean) / Math.sqrt(v + eps)) * g[i] + bb[i]);
  };
  const gelu = (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
  const emb = get('token_embd.weight');
  const typ = get('token_types.weight');
  const pos = get('position_embd.weight');
  let h = ids.map((id, p) => norm(Float64Array.from({ length: nEmbd }, (_, i) => emb[id * nEmbd + i] + typ[i] + pos[p * nEmbd + i]), 'token_embd_norm'));
  const nFf = RERANKER_HPARAMS.nFf;
  const d = nEmbd / nHead;
  for (let l = 0; l < nLayer; l++) {
    const b = `blk.${l}`;
    const q = h.map((x) => linear(x, `${b}.attn_q`, nEmbd, nEmbd));
    const k = h.map((x) => linear(x, `${b}.attn_k`, nEmbd, nEmbd));
    const v = h.map((x) => linear(x, `${b}.attn_v`, nEmbd, nEmbd));
    const att = h.map(() => new Float64Array(nEmbd));
    for (let hd = 0; hd < nHead; hd++) {
      for (let i = 0; i < h.length; i++) {
        const s = k.map((kj) => {
          let dot = 0;
          for (let c = 0; c < d; c++) dot += q[i][hd * d + c] * kj[hd * d + c];
          return dot / Math.sqrt(d);
        });
        const m = Math.max(...s);
        const e = s.map((x) => Math.exp(x - m));
        const z = e.reduce((a, c) => a + c, 0);
        for (let j = 0; j < h.length; j++) for (let c = 0; c < d; c++) att[i][hd * d + c] += (e[j] / z) * v[j][hd * d + c];
      }
    }
    h = h.map((x, i) => {
      const o = linear(att[i], `${b}.attn_output`, nEmbd, nEmbd)
      const a = norm(x.map((xv, c) => xv + o[c]), `${b}.attn_output_norm`)
      const f = linear(linear(a, `${b}.ffn_up`, nEmbd, nFf).map(gelu), `${b}.ffn_down`, nFf, nEmbd)
      return norm(a.map((av, c) => av + f[c]), `${b}.layer_output_norm`)
    });
  }
  const pooled = linear(h[0], 'cls', nEmbd, nEmbd).map(Math.tanh);
  return linear(pooled, 'cls.output', nEmbd, 1)[0];
}

// ---------------------------------------------------------------------------
// A Qwen3-Reranker-style decoder: llama.cpp's `qwen3` architecture with a
// rank head (`cls.output`, one row per label, softmax over them: the score
// is the first label's probability), the tokenizer of SmolLM2-135M (a
// byte-level BPE with ChatML's tokens; read from that model file, a fixture
// every test run has) and a rerank template (`tokenizer.chat_template.rerank`)
// as llama.cpp's converter writes one for Qwen3-Reranker.

export const QWEN3_RERANKER = 'qwen3-reranker-tiny.gguf';
export const QWEN3_RERANKER_HPARAMS = { nEmbd: 32, nHead: 4, nHeadKv: 2, headDim: 8, nLayer: 2, nFf: 64, nCtx: 1024, eps: 1e-6, ropeBase: 1000000 };
export const QWEN3_RERANK_TEMPLATE =
  '<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n';

export const QWEN3_TOKENIZER_SOURCE = 'SmolLM2-135M-Instruct.Q4_1.gguf';

/** The spec, given the tokenizer's metadata (`tokenizer.*` of QWEN3_TOKENIZER_SOURCE). */
export function qwen3RerankerSpec(tokenizerKv) {
  const { nEmbd, nHead, nHeadKv, headDim, nLayer, nFf, nCtx, eps, ropeBase } = QWEN3_RERANKER_HPARAMS;
  const nVocab = tokenizerKv['tokenizer.ggml.tokens']?.length;
  if (!nVocab) throw new Error('tokenizer.ggml.tokens missing from the tokenizer source');
  const arch = 'qwen3';
  // (The source's own template, and its chat-template variants, are not this model's.)
  const kv = [
    ...textModelKv({ arch, name: 'qwen3-reranker-tiny (random weights, test fixture)', fileType: 0, nCtx, nEmbd, nLayer, nFf, nHead }),
    [`${arch}.attention.head_count_kv`, 'U32', nHeadKv],
    [`${arch}.attention.key_length`, 'U32', headDim],
    [`${arch}.attention.value_length`, 'U32', headDim],
    [`${arch}.attention.layer_norm_rms_epsilon`, 'F32', eps],
    [`${arch}.rope.freq_base`, 'F32', ropeBase],
    [`${arch}.pooling_type`, 'U32', 4],
    [`${arch}.classifier.output_labels`, ['ARRAY', 'STRING'], ['yes', 'no']],
  ];
  for (const k of Object.keys(tokenizerKv).sort()) {
    if (!k.startsWith('tokenizer.chat_template')) kv.push([k, tokenizerKvType(k, tokenizerKv[k]), tokenizerKv[k]]);
  }
  kv.push(['tokenizer.chat_template.rerank', 'STRING', QWEN3_RERANK_TEMPLATE]);
  const key = 'qwen3-reranker-tiny';
  const w = 1 / Math.sqrt(nEmbd);
  const tensors = [tensor('token_embd.weight', [nEmbd, nVocab], 1, key), ones('output_norm.weight', nEmbd)];
  for (let i = 0; i < nLayer; i++) {
    const b = `blk.${i}`;
    tensors.push(
      ones(`${b}.attn_norm.weight`, nEmbd),
      tensor(`${b}.attn_q.weight`, [nEmbd, nHead * headDim], w, key),
      tensor(`${b}.attn_k.weight`, [nEmbd, nHeadKv * headDim], w, key),
      tensor(`${b}.attn_v.weight`, [nEmbd, nHeadKv * headDim], w, key),
      tensor(`${b}.attn_output.weight`, [nHead * headDim, nEmbd], 2 / Math.sqrt(nHead * headDim), key),
      ones(`${b}.attn_q_norm.weight`, headDim),
      ones(`${b}.attn_k_norm.weight`, headDim),
      ones(`${b}.ffn_norm.weight`, nEmbd),
      tensor(`${b}.ffn_gate.weight`, [nEmbd, nFf], w, key),
      tensor(`${b}.ffn_up.weight`, [nEmbd, nFf], w, key),
      tensor(`${b}.ffn_down.weight`, [nFf, nEmbd], 2 / Math.sqrt(nFf), key),
    );
  }
  tensors.push(tensor('cls.output.weight', [nEmbd, 2], 0.1, key));
  return { kv, tensors };
}

/**
 * The score of one input (token ids) by the Qwen3 fixture, in double
 * precision: pre-norm decoder layers (RMS norms, q/k norms per head, NeoX
 * RoPE, grouped-query causal attention, SwiGLU), the output norm, the last
 * token's vector through the rank head, softmax: the first label's probability.
 */
export function qwen3Reference(spec, ids) {
  const { nEmbd, nHead, nHeadKv, headDim, nLayer, nFf, eps, ropeBase } = QWEN3_RERANKER_HPARAMS;
  const T = new Map(spec.tensors.map((t) => [t.name, t.data]));
  const mat = (x, name, nIn, nOut) => {
    const W = T.get(name);
    const y = new Float64Array(nOut);
    for (let o = 0; o < nOut; o++) {
      let s = 0;
      for (let i = 0; i < nIn; i++) s += W[o * nIn + i] * x[i];
      y[o] = s;
    }
    return y;
  };
  const rms = (x, g) => {
    const ms = x.reduce((a, b) => a + b * b, 0) / x.length;
    return x.map((v, i) => (v / Math.sqrt(ms + eps)) * g[i]);
  };
  const rope = (v, pos) => {
    // NeoX: pairs (i, i + d/2).
    const half = headDim / 2;
    const out = Float64Array.from(v);
    for (let i = 0; i < half; i++) {
      const theta = pos * Math.pow(ropeBase, (-2 * i) / headDim);
      const [c, s] = [Math.cos(theta), Math.sin(theta)];
      out[i] = v[i] * c - v[i + half] * s;
      out[i + half] = v[i] * s + v[i + half] * c;
    }
    return out;
  };
  const emb = T.get('token_embd.weight');
  let h = ids.map((id) => Float64Array.from({ length: nEmbd }, (_, i) => emb[id * nEmbd + i]));
  const group = nHead / nHeadKv;
  for (let l = 0; l < nLayer; l++) {
    const b = `blk.${l}`;
    const x = h.map((v) => rms(v, T.get(`${b}.attn_norm.weight`)));
    const heads = (v, n, norm, pos) => Array.from({ length: n }, (_, hd) => rope(rms(v.slice(hd * headDim, (hd + 1) * headDim), T.get(norm)), pos));
    const q = x.map((v, p) => heads(mat(v, `${b}.attn_q.weight`, nEmbd, nHead * headDim), nHead, `${b}.attn_q_norm.weight`, p));
    const k = x.map((v, p) => heads(mat(v, `${b}.attn_k.weight`, nEmbd, nHeadKv * headDim), nHeadKv, `${b}.attn_k_norm.weight`, p));
    const vv = x.map((v) => mat(v, `${b}.attn_v.weight`, nEmbd, nHeadKv * headDim));
    h = h.map((res, i) => {
      const att = new Float64Array(nHead * headDim);
      for (let hd = 0; hd < nHead; hd++) {
        const kvh = Math.floor(hd / group);
        const s = [];
        for (let j = 0; j <= i; j++) s.push(q[i][hd].reduce((a, qv, c) => a + qv * k[j][kvh][c], 0) / Math.sqrt(headDim));
        const m = Math.max(...s);
        const e = s.map((z) => Math.exp(z - m));
        const zsum = e.reduce((a, c) => a + c, 0);
        for (let j = 0; j <= i; j++) for (let c = 0; c < headDim; c++) att[hd * headDim + c] += (e[j] / zsum) * vv[j][kvh * headDim + c];
      }
      const o = mat(att, `${b}.attn_output.weight`, nHead * headDim, nEmbd);
      const mid = res.map((r, c) => r + o[c]);
      const f = rms(mid, T.get(`${b}.ffn_norm.weight`));
      const g = mat(f, `${b}.ffn_gate.weight`, nEmbd, nFf);
      const u = mat(f, `${b}.ffn_up.weight`, nEmbd, nFf);
      const act = g.map((gv, c) => (gv / (1 + Math.exp(-gv))) * u[c]);
      const d = mat(act, `${b}.ffn_down.weight`, nFf, nEmbd);
      return mid.map((m2, c) => m2 + d[c]);
    });
  }
  const last = rms(h[h.length - 1], T.get('output_norm.weight'));
  const logits = mat(last, 'cls.output.weight', nEmbd, 2);
  const m = Math.max(...logits);
  const e = logits.map((z) => Math.exp(z - m));
  return e[0] / (e[0] + e[1]);
}

/** The Qwen3 fixture's spec, its tokenizer read from `modelsDir`'s QWEN3_TOKENIZER_SOURCE. */
export async function qwen3RerankerSpecFrom(modelsDir) {
  const { kv } = await readGgufHeader(path.join(modelsDir, QWEN3_TOKENIZER_SOURCE), { keep: (k) => k.startsWith('tokenizer.') });
  return qwen3RerankerSpec(kv);
}
