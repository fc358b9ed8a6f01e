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
function replacer(_key, value) {
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value)
  if (typeof value === 'bigint') return value.toString()
  return value
}

function requestJson(request) {
  if (typeof request === 'string') return request
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

module.exports = { floats, replacer, requestJson, checkSignal, sliced, checkTokens, templateRequest }
