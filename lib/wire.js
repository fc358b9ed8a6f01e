'use strict'
// What crosses into the addon: requests and options as JSON (checked
// first, so a bad argument is an INVALID_REQUEST naming it), and what comes
// back (vectors, token lists) as JavaScript values.

const { engineError } = require('./errors.js')

// The request fields that reach a chat template besides `messages`.
const TEMPLATE_FIELDS = ['tools', 'tool_choice', 'parallel_tool_calls', 'chat_template_kwargs']

function floats(base64) {
  const bytes = Buffer.from(base64, 'base64')
  const v = new Float32Array(bytes.length / 4)
  new Uint8Array(v.buffer).set(bytes)
  return v
}

// JSON cannot carry NaN/Infinity (JSON.stringify turns them into null, which
// would silently mean "default"); send them as strings so validation rejects
// them by name.
// Bytes (a media part's `data`: Buffer, Uint8Array, ArrayBuffer) travel as
// base64; `this[key]` is the value before its own toJSON (a Buffer's).
function replacer(key, value) {
  const raw = this && typeof this === 'object' ? this[key] : value
  if (raw instanceof Uint8Array) return Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString('base64')
  if (raw instanceof ArrayBuffer) return Buffer.from(raw).toString('base64')
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value)
  if (typeof value === 'bigint') return value.toString()
  return value
}

// The largest media file a part may name by `path` (as the engine's limit).
const MAX_MEDIA_FILE = 20 * 1024 * 1024

// A request whose messages name media files by `path` (`{ type: 'image',
// path }`: the host's own files; the server never passes such parts on),
// with their bytes read in.
function withMediaFiles(request) {
  if (!request || typeof request !== 'object' || !Array.isArray(request.messages)) return request
  if (!request.messages.some((m) => m && Array.isArray(m.content) && m.content.some(namedFile))) return request
  const messages = request.messages.map((m, i) =>
    m && Array.isArray(m.content) && m.content.some(namedFile) ? { ...m, content: readPartFiles(m.content, `messages[${i}].content`) } : m,
  )
  return { ...request, messages }
}

const namedFile = (p) => p && typeof p === 'object' && (p.type === 'image' || p.type === 'audio') && p.path != null && p.data == null

// Content parts with the files their `path`s name read into `data`.
function readPartFiles(content, at) {
  const fs = require('node:fs')
  return content.map((p, j) => {
    if (!namedFile(p)) return p
    const here = `${at}[${j}].path`
    if (typeof p.path !== 'string' || p.path === '') throw engineError('INVALID_REQUEST', `${here}: expected a file path`)
    let size
    try {
      size = fs.statSync(p.path).size
    } catch (e) {
      throw engineError('INVALID_REQUEST', `${here}: cannot read ${p.path} (${e.code || e.message})`)
    }
    if (size > MAX_MEDIA_FILE) throw engineError('INVALID_REQUEST', `${here}: ${size} bytes; at most 20 MiB per media file`)
    const { path, ...rest } = p
    return { ...rest, data: fs.readFileSync(path) }
  })
}

// An embed() input (content parts, or a list with some) with its parts'
// files read in, as for messages.
function embedInputWithFiles(input) {
  if (!Array.isArray(input)) return input
  if (input.some(namedFile)) return readPartFiles(input, 'input')
  return input.map((x, i) => (Array.isArray(x) && x.some(namedFile) ? readPartFiles(x, `input[${i}]`) : x))
}

function requestJson(request) {
  if (typeof request === 'string') return request
  request = withMediaFiles(request)
  if (request === null || typeof request !== 'object' || Array.isArray(request)) {
    throw engineError('INVALID_REQUEST', 'request: expected an object or a string')
  }
  try {
    return JSON.stringify(request, replacer)
  } catch (e) {
    throw engineError('INVALID_REQUEST', `request: cannot be serialised (${e.message})`)
  }
}

function checkSignal(signal) {
  if (signal == null) return null
  if (typeof signal !== 'object' || typeof signal.addEventListener !== 'function' || !('aborted' in signal)) {
    throw engineError('INVALID_REQUEST', 'signal: expected an AbortSignal')
  }
  return signal
}

/**
 * An array of `n` elements made by `at(i)`, a slice at a time with the
 * event loop free in between: a million tokens become JavaScript values
 * without holding other work for the tens of milliseconds that takes.
 */
async function sliced(n, at) {
  const out = new Array(n)
  for (let start = 0; start < n; start += SLICE) {
    if (start > 0) await new Promise((r) => setImmediate(r))
    const end = Math.min(n, start + SLICE)
    for (let i = start; i < end; i++) out[i] = at(i)
  }
  return out
}
const SLICE = 1 << 16

const I32_MIN = -2147483648
const I32_MAX = 2147483647
// Taken once: in a vm context (Jest's), every read of a global such as
// `Number` goes through the context's interceptors — half a million of
// them held the event loop ~0.3 s.
const { isInteger } = Number

/** Token ids as the addon takes them: 32-bit integers. */
function checkTokens(tokens) {
  let ok = Array.isArray(tokens)
  for (let i = 0; ok && i < tokens.length; i++) {
    const t = tokens[i]
    ok = isInteger(t) && t >= I32_MIN && t <= I32_MAX
  }
  if (!ok) throw engineError('INVALID_REQUEST', 'tokens: expected an array of integer token ids')
}

/** An applyChatTemplate call's messages and options, checked, as the JSON request the addon renders. */
function templateRequest(messages, options) {
  if (options === null || typeof options !== 'object') throw engineError('INVALID_REQUEST', 'options: expected an object')
  const { addGenerationPrompt = true, ...fields } = options
  if (typeof addGenerationPrompt !== 'boolean') throw engineError('INVALID_REQUEST', 'addGenerationPrompt: expected a boolean')
  const unknown = Object.keys(fields).find((k) => !TEMPLATE_FIELDS.includes(k))
  if (unknown !== undefined) {
    throw engineError('INVALID_REQUEST', `options.${unknown}: not an option of applyChatTemplate (addGenerationPrompt, ${TEMPLATE_FIELDS.join(', ')})`)
  }
  if (!Array.isArray(messages)) throw engineError('INVALID_REQUEST', 'messages: expected an array of messages')
  try {
    return { json: JSON.stringify({ ...fields, messages }, replacer), addGenerationPrompt }
  } catch (e) {
    throw engineError('INVALID_REQUEST', `messages: cannot be serialised (${e.message})`)
  }
}

module.exports = { floats, replacer, requestJson, embedInputWithFiles, checkSignal, sliced, checkTokens, templateRequest }
