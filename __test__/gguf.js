// GGUF files for tests: a reader of the header (with where each value
// lies, so a case can damage exactly one), a writer, small real models
// made from a fixture's vocabulary, and the damaged files of the fuzz
// corpus (truncations, bit flips, hostile counts and lengths, every integer
// hyperparameter at 0, -1, 2^31 and 2^63).

const fs = require('node:fs')

const T = { U8: 0, I8: 1, U16: 2, I16: 3, U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9, U64: 10, I64: 11, F64: 12 }
const SIZE = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 }

/** Reads the header of a GGUF file: metadata (with each value's raw bytes and offsets) and tensor infos. */
function readGguf(file) {
  const fd = fs.openSync(file, 'r')
  const size = fs.fstatSync(fd).size
  let buf = Buffer.alloc(Math.min(size, 16 << 20))
  fs.readSync(fd, buf, 0, buf.length, 0)
  fs.closeSync(fd)
  let pos = 0
  const u32 = () => ((pos += 4), buf.readUInt32LE(pos - 4))
  const u64 = () => ((pos += 8), Number(buf.readBigUInt64LE(pos - 8)))
  const str = () => {
    const n = u64()
    pos += n
    return buf.toString('utf8', pos - n, pos)
  }
  const skipValue = (type) => {
    if (type === T.STRING) return void str()
    if (type === T.ARRAY) {
      const elem = u32()
      const n = u64()
      for (let i = 0; i < n; i++) skipValue(elem)
      return
    }
    pos += SIZE[type]
  }
  if (buf.toString('latin1', 0, 4) !== 'GGUF') throw new Error(`${file}: not GGUF`)
  pos = 4
  const version = u32()
  const nTensors = u64()
  const nKv = u64()
  const kvs = []
  for (let i = 0; i < nKv; i++) {
    const at = pos
    const key = str()
    const typeAt = pos
    const type = u32()
    const valueAt = pos
    let value
    if (type === T.STRING) value = str()
    else if (type === T.ARRAY) {
      const elem = u32()
      const n = u64()
      value = { elem, n }
      if (elem !== T.STRING && elem !== T.ARRAY && n <= 4096) {
        value.items = []
        for (let j = 0; j < n; j++) value.items.push(readScalar(buf, pos, elem)), (pos += SIZE[elem])
      } else for (let j = 0; j < n; j++) skipValue(elem)
    } else {
      value = readScalar(buf, pos, type)
      pos += SIZE[type]
    }
    kvs.push({ key, type, value, at, typeAt, valueAt, raw: buf.subarray(typeAt, pos) })
  }
  const tensors = []
  for (let i = 0; i < nTensors; i++) {
    const at = pos
    const name = str()
    const nd = u32()
    const dims = []
    for (let d = 0; d < nd; d++) dims.push(u64())
    const type = u32()
    const offset = u64()
    tensors.push({ name, dims, type, offset, at })
  }
  const align = kvs.find((k) => k.key === 'general.alignment')?.value ?? 32
  const dataOffset = Math.ceil(pos / align) * align
  return { file, size, version, kvs, tensors, headerEnd: pos, dataOffset, align, header: buf.subarray(0, dataOffset) }
}

function readScalar(buf, at, type) {
  switch (type) {
    case T.U8: return buf.readUInt8(at)
    case T.I8: return buf.readInt8(at)
    case T.U16: return buf.readUInt16LE(at)
    case T.I16: return buf.readInt16LE(at)
    case T.U32: return buf.readUInt32LE(at)
    case T.I32: return buf.readInt32LE(at)
    case T.F32: return buf.readFloatLE(at)
    case T.BOOL: return buf.readUInt8(at) !== 0
    case T.U64: return Number(buf.readBigUInt64LE(at))
    case T.I64: return Number(buf.readBigInt64LE(at))
    case T.F64: return buf.readDoubleLE(at)
  }
}

const le = {
  u32: (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0); return b },
  i32: (v) => { const b = Buffer.alloc(4); b.writeInt32LE(v); return b },
  u64: (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt.asUintN(64, BigInt(v))); return b },
  f32: (v) => { const b = Buffer.alloc(4); b.writeFloatLE(v); return b },
}
const gstr = (s) => { const b = Buffer.from(s, 'utf8'); return Buffer.concat([le.u64(b.length), b]) }

/** Metadata entry bytes: type id and value. */
const value = {
  u32: (v) => Buffer.concat([le.u32(T.U32), le.u32(v)]),
  i32: (v) => Buffer.concat([le.u32(T.I32), le.i32(v)]),
  u64: (v) => Buffer.concat([le.u32(T.U64), le.u64(v)]),
  i64: (v) => Buffer.concat([le.u32(T.I64), le.u64(v)]),
  f32: (v) => Buffer.concat([le.u32(T.F32), le.f32(v)]),
  bool: (v) => Buffer.concat([le.u32(T.BOOL), Buffer.from([v ? 1 : 0])]),
  str: (s) => Buffer.concat([le.u32(T.STRING), gstr(s)]),
}

const TYPE_BYTES = { 0: [1, 4], 1: [1, 2] } // F32, F16: elements per block, bytes per block

/**
 * Writes a GGUF file: `kvs` as [key, raw type+value bytes], `tensors` as
 * { name, dims, type, data: Buffer }, laid out as ggml expects.
 */
function writeGguf(file, kvs, tensors, { align = 32 } = {}) {
  const parts = [Buffer.from('GGUF'), le.u32(3), le.u64(tensors.length), le.u64(kvs.length)]
  for (const [k, raw] of kvs) parts.push(gstr(k), raw)
  let offset = 0
  const datas = []
  for (const t of tensors) {
    parts.push(gstr(t.name), le.u32(t.dims.length), ...t.dims.map(le.u64), le.u32(t.type), le.u64(offset))
    const [blk, bytes] = TYPE_BYTES[t.type]
    const n = (t.dims.reduce((a, b) => a * b, 1) / blk) * bytes
    if (t.data.length !== n) throw new Error(`${t.name}: ${t.data.length} bytes, expected ${n}`)
    datas.push(t.data)
    const padded = Math.ceil(n / align) * align
    if (padded > n) datas.push(Buffer.alloc(padded - n))
    offset += padded
  }
  let header = Buffer.concat(parts)
  const pad = Math.ceil(header.length / align) * align - header.length
  fs.writeFileSync(file, Buffer.concat([header, Buffer.alloc(pad), ...datas]))
}

/** Deterministic small random numbers (xorshift). */
function rng(seed) {
  let s = BigInt(seed) | 1n
  return () => {
    s ^= (s << 13n) & 0xffffffffffffffffn
    s ^= s >> 7n
    s ^= (s << 17n) & 0xffffffffffffffffn
    return Number(s & 0xffffffffn) / 0x100000000
  }
}

function weights(n, random, type, scale = 0.08) {
  if (type === 0) {
    const b = Buffer.alloc(n * 4)
    for (let i = 0; i < n; i++) b.writeFloatLE((random() * 2 - 1) * scale, i * 4)
    return b
  }
  // F16: small values, built from their bits (sign, exponent 8..13, mantissa).
  const b = Buffer.alloc(n * 2)
  for (let i = 0; i < n; i++) {
    const bits = (random() < 0.5 ? 0x8000 : 0) | ((8 + Math.floor(random() * 6)) << 10) | Math.floor(random() * 1024)
    b.writeUInt16LE(bits, i * 2)
  }
  return b
}

const ones = (n) => { const b = Buffer.alloc(n * 4); for (let i = 0; i < n; i++) b.writeFloatLE(1, i * 4); return b }

/**
 * A small real model with a fixture's vocabulary and random weights: a
 * 2-layer `llama` (from SmolLM2's BPE vocabulary) or `gemma3` (from
 * gemma's SentencePiece vocabulary, its first 8,192 tokens). It loads,
 * passes the engine's checks and generates (nonsense): the damaged files
 * of the fuzz corpus are made from it.
 */
function tinyModel(file, source, arch) {
  const src = readGguf(source)
  let kvs = src.kvs.filter((k) => k.key.startsWith('tokenizer.') && k.key !== 'tokenizer.chat_template').map((k) => [k.key, k.raw])
  let nVocab = src.kvs.find((k) => k.key === 'tokenizer.ggml.tokens').value.n
  if (arch === 'gemma3') {
    nVocab = 8192
    kvs = kvs.map(([key, raw]) => {
      if (!['tokenizer.ggml.tokens', 'tokenizer.ggml.scores', 'tokenizer.ggml.token_type'].includes(key)) return [key, raw]
      // The first nVocab elements of the array.
      const elem = raw.readUInt32LE(4)
      let at = 16
      for (let i = 0; i < nVocab; i++) at += elem === T.STRING ? 8 + Number(raw.readBigUInt64LE(at)) : SIZE[elem]
      return [key, Buffer.concat([raw.subarray(0, 8), le.u64(nVocab), raw.subarray(16, at)])]
    })
  }
  const E = 64, H = 4, KV = 2, FF = 128, L = 2, HD = 16
  const random = rng(arch === 'llama' ? 7 : 11)
  const p = arch
  const hp = [
    ['general.architecture', value.str(arch)],
    ['general.name', value.str(`tiny ${arch}`)],
    [`${p}.block_count`, value.u32(L)],
    [`${p}.context_length`, value.u32(512)],
    [`${p}.embedding_length`, value.u32(E)],
    [`${p}.feed_forward_length`, value.u32(FF)],
    [`${p}.attention.head_count`, value.u32(H)],
    [`${p}.attention.head_count_kv`, value.u32(KV)],
    [`${p}.rope.freq_base`, value.f32(10000)],
    [`${p}.attention.layer_norm_rms_epsilon`, value.f32(1e-6)],
  ]
  if (arch === 'llama') hp.push([`${p}.rope.dimension_count`, value.u32(HD)], [`${p}.vocab_size`, value.u32(nVocab)])
  if (arch === 'gemma3') {
    hp.push([`${p}.attention.key_length`, value.u32(HD)], [`${p}.attention.value_length`, value.u32(HD)], [`${p}.attention.sliding_window`, value.u32(64)])
  }
  const W = (name, dims, type = 1) => ({ name, dims, type, data: weights(dims.reduce((a, b) => a * b, 1), random, type) })
  const N = (name, n) => ({ name, dims: [n], type: 0, data: ones(n) })
  const tensors = [W('token_embd.weight', [E, nVocab]), N('output_norm.weight', E)]
  for (let i = 0; i < L; i++) {
    tensors.push(
      N(`blk.${i}.attn_norm.weight`, E),
      W(`blk.${i}.attn_q.weight`, [E, H * HD]),
      W(`blk.${i}.attn_k.weight`, [E, KV * HD]),
      W(`blk.${i}.attn_v.weight`, [E, KV * HD]),
      W(`blk.${i}.attn_output.weight`, [H * HD, E]),
      N(`blk.${i}.ffn_norm.weight`, E),
      W(`blk.${i}.ffn_gate.weight`, [E, FF]),
      W(`blk.${i}.ffn_up.weight`, [E, FF]),
      W(`blk.${i}.ffn_down.weight`, [FF, E]),
    )
    if (arch === 'gemma3') {
      tensors.push(N(`blk.${i}.attn_q_norm.weight`, HD), N(`blk.${i}.attn_k_norm.weight`, HD), N(`blk.${i}.post_attention_norm.weight`, E), N(`blk.${i}.post_ffw_norm.weight`, E))
    }
  }
  writeGguf(file, [...hp, ...kvs], tensors)
  return file
}

/**
 * The fuzz corpus made from `base` (a GGUF file): [{ name, write(path) }].
 * `size` scales the random parts (truncations, bit flips).
 */
function damagedFiles(base, { truncations = 24, flips = 24, seed = 1 } = {}) {
  const g = readGguf(base)
  const whole = fs.readFileSync(base)
  const random = rng(seed)
  const cases = []
  const add = (name, make) => cases.push({ name, write: (file) => fs.writeFileSync(file, make()) })
  const patched = (at, bytes) => () => {
    const b = Buffer.from(whole)
    bytes.copy(b, at)
    return b
  }
  // Truncations: dense in the header, a few in the data, one byte short.
  const cuts = new Set([0, 3, 4, 8, 16, 24, 25, g.headerEnd - 1, g.dataOffset, whole.length - 1])
  while (cuts.size < truncations) {
    cuts.add(random() < 0.75 ? Math.floor(random() * g.headerEnd) : g.dataOffset + Math.floor(random() * (whole.length - g.dataOffset)))
  }
  for (const cut of [...cuts].sort((a, b) => a - b)) add(`truncated at ${cut}`, () => whole.subarray(0, cut))
  // Bit flips: across the whole header, in the metadata before the
  // vocabulary (the hyperparameters), and in the tensor table.
  const vocabAt = g.kvs.find((k) => k.key === 'tokenizer.ggml.tokens')?.at ?? g.headerEnd
  const tableAt = g.tensors.length ? g.tensors[0].at : g.headerEnd
  const regions = [[0, g.headerEnd], [24, vocabAt], [tableAt, g.headerEnd]]
  for (let i = 0; i < flips; i++) {
    const [lo, hi] = regions[i % regions.length]
    const at = lo + Math.floor(random() * (hi - lo))
    const bit = Math.floor(random() * 8)
    add(`bit ${bit} of byte ${at} flipped`, () => {
      const b = Buffer.from(whole)
      b[at] ^= 1 << bit
      return b
    })
  }
  // Hostile header counts.
  for (const [name, at] of [['tensor count', 8], ['metadata count', 16]]) {
    for (const v of [2n ** 31n, 2n ** 63n, 2n ** 64n - 1n]) add(`${name} = ${v}`, patched(at, le.u64(v)))
  }
  // Every integer hyperparameter (and special-token id) at 0, -1, 2^31 and 2^63.
  const arch = g.kvs.find((k) => k.key === 'general.architecture').value
  for (const kv of g.kvs) {
    const scalar = [T.U8, T.I8, T.U16, T.I16, T.U32, T.I32, T.U64, T.I64].includes(kv.type)
    const ints = kv.type === T.ARRAY && [T.U32, T.I32].includes(kv.value.elem)
    if (!(scalar || ints) || !(kv.key.startsWith(`${arch}.`) || kv.key.startsWith('tokenizer.') || kv.key.startsWith('general.'))) continue
    if (ints) {
      add(`${kv.key}[0] = -1`, patched(kv.valueAt + 12, le.i32(-1)))
      continue
    }
    for (const [label, v] of [['0', 0n], ['-1', -1n], ['2^31', 2n ** 31n], ['2^63', 2n ** 63n]]) {
      // In the value's own type where it fits (-1 as all ones), else as a
      // 64-bit integer of the same signedness (the file grows by the
      // difference: the rest is moved, not damaged).
      const signed = [T.I8, T.I16, T.I32, T.I64].includes(kv.type)
      const bits = SIZE[kv.type] * 8
      const fits = signed ? v >= -(2n ** BigInt(bits - 1)) && v < 2n ** BigInt(bits - 1) : v === -1n || v < 2n ** BigInt(bits)
      add(`${kv.key} = ${label}`, () => {
        let raw
        if (fits) {
          const b = Buffer.alloc(4 + SIZE[kv.type])
          b.writeUInt32LE(kv.type)
          const u = BigInt.asUintN(bits, v)
          for (let i = 0; i < SIZE[kv.type]; i++) b[4 + i] = Number((u >> BigInt(8 * i)) & 0xffn)
          raw = b
        } else raw = Buffer.concat([le.u32(signed ? T.I64 : T.U64), le.u64(v)])
        return rewrite(g, whole, (key) => (key === kv.key ? raw : undefined))
      })
    }
  }
  // String and array lengths past the end of the file.
  for (const kv of g.kvs.filter((k) => k.type === T.STRING || k.type === T.ARRAY).slice(0, 6)) {
    const lenAt = kv.type === T.STRING ? kv.valueAt : kv.valueAt + 4
    add(`${kv.key}: length past the file`, patched(lenAt, le.u64(whole.length)))
    add(`${kv.key}: length 2^63`, patched(lenAt, le.u64(2n ** 63n)))
  }
  add('first key length past the file', patched(24, le.u64(whole.length)))
  // The tensor table: a name's length, a dimension, a type and an offset.
  const t = g.tensors[1]
  add(`tensor ${t.name}: name length past the file`, patched(t.at, le.u64(whole.length)))
  const dimAt = t.at + 8 + Buffer.byteLength(t.name) + 4
  add(`tensor ${t.name}: dimension 0`, patched(dimAt, le.u64(0)))
  add(`tensor ${t.name}: dimension 2^62`, patched(dimAt, le.u64(2n ** 62n)))
  const typeAt = dimAt + 8 * t.dims.length
  add(`tensor ${t.name}: type 4 (removed)`, patched(typeAt, le.u32(4)))
  add(`tensor ${t.name}: type 1000`, patched(typeAt, le.u32(1000)))
  add(`tensor ${t.name}: offset past the file`, patched(typeAt + 4, le.u64(whole.length)))
  add('5 dimensions', patched(t.at + 8 + Buffer.byteLength(t.name), le.u32(5)))
  // The vocabulary: two tokens with the same text (llama.cpp asserts that
  // each text has one id), and BOS required but out of range.
  const tokens = g.kvs.find((k) => k.key === 'tokenizer.ggml.tokens')
  if (tokens) {
    const strings = []
    let at = tokens.valueAt + 12
    for (let i = 0; i < Math.min(tokens.value.n, 4000); i++) {
      const n = Number(whole.readBigUInt64LE(at))
      strings.push({ at: at + 8, n, text: whole.toString('latin1', at + 8, at + 8 + n) })
      at += 8 + n
    }
    const byLength = new Map()
    for (const s of strings.slice(300)) {
      const other = byLength.get(s.n)
      if (other && other.text !== s.text) {
        add(`token '${s.text}' renamed '${other.text}' (a duplicate)`, patched(s.at, Buffer.from(other.text, 'latin1')))
        break
      }
      byLength.set(s.n, s)
    }
    const byteTokens = strings.filter((s) => /^<0x[0-9A-F]{2}>$/.test(s.text))
    if (byteTokens.length === 256) {
      add('every <0xNN> byte token renamed', () => {
        const b = Buffer.from(whole)
        for (const s of byteTokens) b[s.at + 1] = 0x31 // <1xNN>
        return b
      })
    }
    const n = tokens.value.n
    add('add_bos_token with BOS out of range', () =>
      rewrite(g, whole, (key) => (key === 'tokenizer.ggml.add_bos_token' ? value.bool(true) : key === 'tokenizer.ggml.bos_token_id' ? value.u32(n + 5) : undefined)),
    )
  }
  return cases
}

/** The file with some metadata values replaced (`replace(key)` → raw type+value bytes, or undefined to keep). */
function rewrite(g, whole, replace) {
  const parts = [whole.subarray(0, 24)]
  for (const kv of g.kvs) {
    parts.push(whole.subarray(kv.at, kv.typeAt), replace(kv.key) ?? kv.raw)
  }
  const tableStart = g.tensors.length ? g.tensors[0].at : g.headerEnd
  parts.push(whole.subarray(tableStart, g.headerEnd))
  const header = Buffer.concat(parts)
  const pad = Math.ceil(header.length / g.align) * g.align - header.length
  return Buffer.concat([header, Buffer.alloc(pad), whole.subarray(g.dataOffset)])
}

/**
 * Splits a GGUF as llama.cpp's gguf-split does: `n` files
 * `<prefix>-0000i-of-0000n.gguf`, the tensors in order spread over them,
 * the first with every metadata entry, each with `split.no`, `split.count`
 * and `split.tensors.count`. The paths, first one first.
 */
function splitGguf(src, prefix, n) {
  const g = readGguf(src)
  const fd = fs.openSync(src, 'r')
  const ends = g.tensors.map((t, i) => (i + 1 < g.tensors.length ? g.tensors[i + 1].offset : g.size - g.dataOffset))
  const per = Math.ceil(g.tensors.length / n)
  const u16 = (v) => Buffer.concat([le.u32(T.U16), Buffer.from([v & 0xff, v >> 8])])
  const files = []
  for (let i = 0; i < n; i++) {
    const picked = g.tensors.map((t, j) => ({ t, j })).slice(i * per, (i + 1) * per)
    const kvs = [...(i === 0 ? g.kvs.map((k) => [k.key, k.raw]) : []), ['split.no', u16(i)], ['split.count', u16(n)], ['split.tensors.count', value.i32(g.tensors.length)]]
    const parts = [Buffer.from('GGUF'), le.u32(3), le.u64(picked.length), le.u64(kvs.length)]
    for (const [k, raw] of kvs) parts.push(gstr(k), raw)
    let offset = 0
    const datas = []
    for (const { t, j } of picked) {
      parts.push(gstr(t.name), le.u32(t.dims.length), ...t.dims.map(le.u64), le.u32(t.type), le.u64(offset))
      const bytes = ends[j] - t.offset
      const data = Buffer.alloc(bytes)
      fs.readSync(fd, data, 0, bytes, g.dataOffset + t.offset)
      const padded = Math.ceil(bytes / g.align) * g.align
      datas.push(data, Buffer.alloc(padded - bytes))
      offset += padded
    }
    const header = Buffer.concat(parts)
    const file = `${prefix}-${String(i + 1).padStart(5, '0')}-of-${String(n).padStart(5, '0')}.gguf`
    fs.writeFileSync(file, Buffer.concat([header, Buffer.alloc(Math.ceil(header.length / g.align) * g.align - header.length), ...datas]))
    files.push(file)
  }
  fs.closeSync(fd)
  return files
}

module.exports = { readGguf, writeGguf, splitGguf, tinyModel, damagedFiles, value, T }
