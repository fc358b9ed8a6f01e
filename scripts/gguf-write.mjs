// A small GGUF writer (version 3): metadata, tensor infos, tensor data, laid
// out as ggml reads them (little-endian; the data section and every tensor
// aligned to `general.alignment`, 32 by default). Used by scripts/models.mjs
// to make the test LoRA adapters; no dependencies.
//
//   ggufBytes({ kv, tensors, alignment? })  -> Buffer
//   writeGguf(file, spec)                   the same, written atomically
//   loraAdapter({ ... })                    the spec of a llama.cpp LoRA adapter
//
// kv: [key, type, value] with type one of GGUF_TYPE's names ('STRING',
// 'F32', 'U32', …), or ['ARRAY', elementType] for an array. tensors:
// { name, ne: [ne0, ne1, …] (ggml's order: ne0 varies fastest), type:
// 'F32' | 'F16', data: Buffer | Float32Array }.
import fs from 'node:fs';

export const GGUF_TYPE = { U8: 0, I8: 1, U16: 2, I16: 3, U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9, U64: 10, I64: 11, F64: 12 };
export const GGML_TYPE = { F32: 0, F16: 1 };
const GGML_TYPE_SIZE = { 0: 4, 1: 2 };

/** Little-endian bytes of one metadata value of `type` (a GGUF_TYPE name). */
function valueBytes(type, value) {
  const scalar = (size, write) => {
    const b = Buffer.alloc(size);
    write(b);
    return b;
  };
  switch (type) {
    case 'U8': return scalar(1, (b) => b.writeUInt8(value));
    case 'I8': return scalar(1, (b) => b.writeInt8(value));
    case 'U16': return scalar(2, (b) => b.writeUInt16LE(value));
    case 'I16': return scalar(2, (b) => b.writeInt16LE(value));
    case 'U32': return scalar(4, (b) => b.writeUInt32LE(value));
    case 'I32': return scalar(4, (b) => b.writeInt32LE(value));
    case 'F32': return scalar(4, (b) => b.writeFloatLE(value));
    case 'BOOL': return scalar(1, (b) => b.writeUInt8(value ? 1 : 0));
    case 'U64': return scalar(8, (b) => b.writeBigUInt64LE(BigInt(value)));
    case 'I64': return scalar(8, (b) => b.writeBigInt64LE(BigInt(value)));
    case 'F64': return scalar(8, (b) => b.writeDoubleLE(value));
    case 'STRING': return gstring(value);
    default: throw new TypeError(`GGUF value type ${type}: not one of ${Object.keys(GGUF_TYPE).join(', ')}`);
  }
}

const u32 = (v) => valueBytes('U32', v);
const u64 = (v) => valueBytes('U64', v);
function gstring(s) {
  if (typeof s !== 'string') throw new TypeError(`expected a string, got ${typeof s}`);
  const b = Buffer.from(s, 'utf8');
  return Buffer.concat([u64(b.length), b]);
}

function kvBytes([key, type, value]) {
  if (Array.isArray(type)) {
    const [, elem] = type;
    if (!Array.isArray(value)) throw new TypeError(`${key}: an array type needs an array value`);
    return Buffer.concat([gstring(key), u32(GGUF_TYPE.ARRAY), u32(GGUF_TYPE[elem]), u64(value.length), ...value.map((v) => valueBytes(elem, v))]);
  }
  if (!(type in GGUF_TYPE) || type === 'ARRAY') throw new TypeError(`${key}: GGUF value type ${type}`);
  return Buffer.concat([gstring(key), u32(GGUF_TYPE[type]), valueBytes(type, value)]);
}

const pad = (n, alignment) => (alignment - (n % alignment)) % alignment;

function tensorData(t) {
  const type = GGML_TYPE[t.type];
  if (type === undefined) throw new TypeError(`${t.name}: tensor type ${t.type} (F32 or F16)`);
  const elements = t.ne.reduce((a, b) => a * b, 1);
  const data = t.data instanceof Float32Array || t.data instanceof Uint16Array ? Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength) : t.data;
  if (!Buffer.isBuffer(data) || data.length !== elements * GGML_TYPE_SIZE[type]) {
    throw new Error(`${t.name}: ${data?.length} bytes of data, expected ${elements * GGML_TYPE_SIZE[type]} (ne ${t.ne.join('x')}, ${t.type})`);
  }
  return { type, data };
}

/** The bytes of a GGUF v3 file. */
export function ggufBytes({ kv = [], tensors = [], alignment = 32 }) {
  if (!Number.isInteger(alignment) || alignment <= 0 || alignment % 8 !== 0) throw new TypeError(`alignment: a positive multiple of 8, got ${alignment}`);
  const entries = alignment === 32 ? kv : [...kv, ['general.alignment', 'U32', alignment]];
  const names = new Set();
  const header = [Buffer.from('GGUF', 'latin1'), u32(3), u64(tensors.length), u64(entries.length), ...entries.map(kvBytes)];
  const data = [];
  let offset = 0;
  for (const t of tensors) {
    if (names.has(t.name)) throw new Error(`tensor ${t.name} twice`);
    names.add(t.name);
    const { type, data: bytes } = tensorData(t);
    header.push(gstring(t.name), u32(t.ne.length), ...t.ne.map(u64), u32(type), u64(offset));
    data.push(bytes, Buffer.alloc(pad(bytes.length, alignment)));
    offset += bytes.length + pad(bytes.length, alignment);
  }
  const head = Buffer.concat(header);
  return Buffer.concat([head, Buffer.alloc(pad(head.length, alignment)), ...data]);
}

/** Writes a GGUF file (to a temporary name, then renamed into place). */
export function writeGguf(file, spec) {
  const bytes = Buffer.isBuffer(spec) ? spec : ggufBytes(spec);
  const tmp = `${file}.tmp`;
  try {
    fs.writeFileSync(tmp, bytes);
    fs.renameSync(tmp, file);
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  return bytes.length;
}

/** A 32-bit seed from a string (FNV-1a). */
export function seedOf(text) {
  let h = 0x811c9dc5;
  for (const c of Buffer.from(text, 'utf8')) h = Math.imul(h ^ c, 0x01000193) >>> 0;
  return h;
}

/**
 * Deterministic draws near N(0, 1) from a 32-bit seed: the sum of 12
 * uniforms minus 6 (Irwin–Hall), the uniforms from mulberry32. Integer and
 * exact float arithmetic only, so every machine and Node version draws the
 * same numbers.
 */
export function normals(seed) {
  let s = seed >>> 0;
  const uniform = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return () => {
    let sum = 0;
    for (let i = 0; i < 12; i++) sum += uniform();
    return sum - 6;
  };
}

/**
 * A LoRA adapter as llama.cpp loads it (llama_adapter_lora_init): metadata
 * `general.type` = adapter, `general.architecture` = the base model's,
 * `adapter.type` = lora, `adapter.lora.alpha`; for each adapted weight W
 * (ggml ne = [n_in, n_out]) the F32 pair `W.lora_a` (ne [n_in, rank]) and
 * `W.lora_b` (ne [rank, n_out]), values ~N(0, std) from `seed`.
 *
 * targets: [{ name: 'blk.0.attn_q.weight', nIn, nOut }]
 */
export function loraAdapter({ architecture, name, targets, rank = 8, alpha = 16, std = 0.05, seed = 1 }) {
  const draw = normals(seed);
  const random = (n) => {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = draw() * std;
    return a;
  };
  const tensors = [];
  for (const { name: weight, nIn, nOut } of targets) {
    tensors.push({ name: `${weight}.lora_a`, ne: [nIn, rank], type: 'F32', data: random(nIn * rank) });
    tensors.push({ name: `${weight}.lora_b`, ne: [rank, nOut], type: 'F32', data: random(rank * nOut) });
  }
  const kv = [
    ['general.architecture', 'STRING', architecture],
    ['general.type', 'STRING', 'adapter'],
    ...(name ? [['general.name', 'STRING', name]] : []),
    ['adapter.type', 'STRING', 'lora'],
    ['adapter.lora.alpha', 'F32', alpha],
  ];
  return { kv, tensors };
}

/**
 * The metadata every text-model fixture starts with, in this order:
 * `general.*` and `<arch>.{context_length, embedding_length, block_count,
 * feed_forward_length, attention.head_count}`; each fixture adds its own.
 */
export function textModelKv({ arch, name, fileType, nCtx, nEmbd, nLayer, nFf, nHead }) {
  return [
    ['general.architecture', 'STRING', arch],
    ['general.type', 'STRING', 'model'],
    ['general.name', 'STRING', name],
    ['general.file_type', 'U32', fileType],
    [`${arch}.context_length`, 'U32', nCtx],
    [`${arch}.embedding_length`, 'U32', nEmbd],
    [`${arch}.block_count`, 'U32', nLayer],
    [`${arch}.feed_forward_length`, 'U32', nFf],
    [`${arch}.attention.head_count`, 'U32', nHead],
  ];
}

/** GGUF types of the tokenizer keys copied from a source model (the reader gives values only). */
export function tokenizerKvType(k, v) {
  if (Array.isArray(v)) {
    if (k.endsWith('.token_type')) return ['ARRAY', 'I32'];
    if (k.endsWith('.scores')) return ['ARRAY', 'F32'];
    if (v.every((s) => typeof s === 'string')) return ['ARRAY', 'STRING'];
  } else if (typeof v === 'string') return 'STRING';
  else if (typeof v === 'boolean') return 'BOOL';
  else if (Number.isInteger(v) && /_id$/.test(k)) return 'U32';
  throw new Error(`${k}: no GGUF type known for this tokenizer key`);
}
