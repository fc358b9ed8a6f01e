'use strict'
// Helpers more than one server module uses.

const { randomBytes } = require('node:crypto')
const { requestFields } = require('../index.js')

/** A plain object: not null, not an array. */
const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v)

/** An id as Anthropic's and the Responses API's are: `<prefix>_` and 24 hex digits. */
const newId = (prefix) => `${prefix}_${randomBytes(12).toString('hex')}`

/**
 * Engine fields a client may send beside an API's own, as llama.cpp's
 * server allows: every request field of the engine (its own list) but
 * `except`, those the API sets itself. The engine checks them.
 */
function passthrough(except) {
  const skip = new Set(except)
  return requestFields.map((f) => f.name).filter((name) => !skip.has(name))
}

/**
 * Chat messages built from a request, each with where it came from in that
 * request (`messages.2`, `input[3]`), so an engine error naming
 * `messages[i]` can name the client's field instead.
 */
function sourcedMessages() {
  const messages = []
  const origins = []
  const push = (message, origin) => {
    messages.push(message)
    origins.push(origin)
    return message
  }
  return { messages, origins, push }
}

/**
 * The chat-template options of a request (`engine.applyChatTemplate`'s):
 * its tools, tool_choice, parallel_tool_calls and chat_template_kwargs (an
 * empty tools list is none, as llama-server reads it) and whether the
 * generation prompt is added.
 */
function templateOptions(request, addGenerationPrompt = true) {
  const options = { addGenerationPrompt }
  for (const f of ['tools', 'tool_choice', 'parallel_tool_calls', 'chat_template_kwargs']) {
    const v = request[f]
    if (v != null && !(f === 'tools' && Array.isArray(v) && v.length === 0)) options[f] = v
  }
  return options
}

/**
 * Prompt tokens of a request: its messages rendered with the chat template
 * (and tool preamble), tokenised — off the event loop, whatever their size.
 */
async function promptTokens(engine, request) {
  const text = await engine.applyChatTemplateAsync(request.messages, templateOptions(request))
  return (await engine.tokenizeAsync(text, { special: true })).length
}

/** `AbortSignal.any` (Node >= 20.3), or the same made by hand on Node 18. */
function anySignal(signals) {
  if (typeof AbortSignal.any === 'function') return AbortSignal.any(signals)
  const ac = new AbortController()
  for (const s of signals) {
    if (s.aborted) {
      ac.abort(s.reason)
      break
    }
    s.addEventListener('abort', () => ac.abort(s.reason), { once: true })
  }
  return ac.signal
}

module.exports = { isObject, newId, passthrough, sourcedMessages, templateOptions, promptTokens, anySignal }
