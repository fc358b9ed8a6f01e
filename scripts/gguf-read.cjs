'use strict'
// A GGUF file's header read in JS: its metadata and, when asked, its tensor
// infos. scripts/models.mjs reads a base model's tensor shapes with it to
// make a LoRA adapter for it (scripts/gguf-write.mjs).

const fs = require('node:fs')
const path = require('node:path')

/** GGUF metadata value types. */
const GGUF_TYPE = { U8: 0, I8: 1, U16: 2, I16: 3, U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9, U64: 10, I64: 11, F64: 12 }
const SCALAR_BYTES = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 }

/** Thrown by the parser when the bytes read so far end inside the header. */
class Short extends Error {}

/**
 * Parses a header from `buf` (the file's first bytes; `complete` when it is
 * the whole file). `keep(key)` says which values to keep (arrays included:
 * a vocabulary is megabytes); the others are skipped.
 */
function parseHeader(buf, complete, { keep = () => true, tensors: withTensors = false } = {}) {
  let pos = 0
  const need = (n) => {
    if (pos + n > buf.length) {
      if (complete) throw new Error(`not a GGUF file: truncated header at byte ${pos}`)
      throw new Short()
    }
  }
  const u32 = () => (need(4), (pos += 4), buf.readUInt32LE(pos - 4))
  const u64 = () => {
    need(8)
    pos += 8
    const v = buf.readBigUInt64LE(pos - 8)
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`not a GGUF file: count ${v} at byte ${pos - 8}`)
    return Number(v)
  }
  const str = () => {
    const n = u64()
    need(n)
    pos += n
    return buf.toString('utf8', pos - n, pos)
  }
  const scalar = (type) => {
    const n = SCALAR_BYTES[type]
    if (n === undefined) throw new Error(`not a GGUF file: value type ${type} at byte ${pos}`)
    need(n)
    const at = pos
    pos += n
    switch (type) {
      case 0: return buf.readUInt8(at)
      case 1: return buf.readInt8(at)
      case 2: return buf.readUInt16LE(at)
      case 3: return buf.readInt16LE(at)
      case 4: return buf.readUInt32LE(at)
      case 5: return buf.readInt32LE(at)
      case 6: return buf.readFloatLE(at)
      case 7: return buf.readUInt8(at) !== 0
      case 10: return Number(buf.readBigUInt64LE(at))
      case 11: return Number(buf.readBigInt64LE(at))
      case 12: return buf.readDoubleLE(at)
    }
  }
  const value = (type, kept) => {
    if (type === GGUF_TYPE.STRING) return str()
    if (type !== GGUF_TYPE.ARRAY) return scalar(type)
    const elem = u32()
    const n = u64()
    if (!kept && elem !== GGUF_TYPE.STRING && elem !== GGUF_TYPE.ARRAY) {
      const size = SCALAR_BYTES[elem]
      if (size === undefined) throw new Error(`not a GGUF file: array of type ${elem}`)
      need(n * size)
      pos += n * size
      return undefined
    }
    if (!kept && elem === GGUF_TYPE.STRING) {
      for (let i = 0; i < n; i++) {
        const len = u64()
        need(len)
        pos += len
      }
      return undefined
    }
    const items = kept ? new Array(n) : null
    for (let i = 0; i < n; i++) {
      const v = value(elem, kept)
      if (kept) items[i] = v
    }
    return items ?? undefined
  }

  need(4)
  if (buf.toString('latin1', 0, 4) !== 'GGUF') throw new Error('not a GGUF file (no GGUF magic)')
  pos = 4
  const version = u32()
  if (version < 2 || version > 3) throw new Error(`GGUF version ${version} is not supported`)
  const nTensors = u64()
  const nKv = u64()
  const kv = Object.create(null)
  for (let i = 0; i < nKv; i++) {
    const key = str()
    const type = u32()
    const kept = keep(key)
    const v = value(type, kept)
    if (kept) kv[key] = v
  }
  const alignment = Number.isInteger(kv['general.alignment']) && kv['general.alignment'] > 0 ? kv['general.alignment'] : 32
  let tensors
  if (withTensors) {
    tensors = []
    for (let i = 0; i < nTensors; i++) {
      const name = str()
      const nd = u32()
      const ne = []
      for (let d = 0; d < nd; d++) ne.push(u64())
      const type = u32()
      const offset = u64()
      tensors.push({ name, ne, type, offset })
    }
  }
  const end = pos
  return { version, nTensors, kv, tensors, alignment, headerEnd: withTensors ? end : undefined, dataOffset: withTensors ? Math.ceil(end / alignment) * alignment : undefined }
}

/**
 * The header of the GGUF file at `file`: `{ version, nTensors, kv, tensors?,
 * alignment, dataOffset? }`. Read asynchronously, a few MiB at a time (a
 * vocabulary of 262,144 tokens is a 5 MiB header); parsed in one go.
 * Options: `keep(key)` (which values to keep; default all), `tensors`
 * (also the tensor infos: `{ name, ne, type, offset }`).
 */
async function readGgufHeader(file, options = {}) {
  const fh = await fs.promises.open(file, 'r')
  try {
    const { size } = await fh.stat()
    let length = Math.min(size, 8 << 20)
    for (;;) {
      const buf = Buffer.alloc(length)
      const { bytesRead } = await fh.read(buf, 0, length, 0)
      try {
        return parseHeader(buf.subarray(0, bytesRead), bytesRead >= size, options)
      } catch (e) {
        if (!(e instanceof Short)) throw e
        length = Math.min(size, length * 2)
      }
    }
  } finally {
    await fh.close()
  }
}

module.exports = { GGUF_TYPE, readGgufHeader, parseHeader }
