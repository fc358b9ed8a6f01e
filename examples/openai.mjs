// The OpenAI API over a LlamaEngine: request fields mapped onto the engine's,
// results and events shaped as OpenAI's responses and stream chunks. Used by
// examples/server.mjs; no I/O here.
import { randomUUID } from 'node:crypto'
import { requestFields } from '../index.mjs'

/**
 * An error answered with its HTTP status and an OpenAI-shaped body:
 * `{ error: { message, type, param, code } }`, `code` being the engine's
 * stable error code (INVALID_REQUEST, …) or the server's own.
 */
export class ApiError extends Error {
  constructor(status, message, { type = status < 500 ? 'invalid_request_error' : 'server_error', code = 'INVALID_REQUEST', param = null } = {}) {
    super(message)
    this.status = status
    this.type = type
    this.code = code
    this.param = param
  }
}

const bad = (param, message) => new ApiError(400, message, { param })

// Engine fields a client may send beside OpenAI's, as llama.cpp's server
// allows: every request field of the engine (its own list) that OpenAI's
// names do not already map. Those OpenAI shares (temperature, top_p, seed,
// the penalties, stop) pass through the same way; the engine checks them.
const MAPPED = new Set(['prompt', 'messages', 'logit_bias'])
const PASSTHROUGH = requestFields.map((f) => f.name).filter((name) => !MAPPED.has(name))

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

/** The engine request fields shared by both endpoints. */
function commonFields(body) {
  const req = {}
  if (body.n != null && body.n !== 1) throw bad('n', `n: only 1 choice per request is supported, got ${JSON.stringify(body.n)}`)
  const max = body.max_completion_tokens ?? body.max_tokens
  if (max != null) {
    if (!Number.isInteger(max) || max < 1) throw bad('max_tokens', 'max_tokens: expected a positive integer')
    req.n_predict = max
  }
  if (body.logit_bias != null) {
    if (!isObject(body.logit_bias)) throw bad('logit_bias', 'logit_bias: expected an object mapping token ids to biases')
    req.logit_bias = body.logit_bias
  }
  for (const f of PASSTHROUGH) if (body[f] != null && req[f] == null) req[f] = body[f]
  return req
}

/**
 * POST /v1/chat/completions body -> engine request. Tools, `tool_choice`,
 * `parallel_tool_calls`, `response_format`, `chat_template_kwargs` and
 * `reasoning_format` are the engine's own fields: they pass through, and the
 * engine checks them (a bad one is a 400 naming it).
 */
export function chatRequest(body) {
  if (!Array.isArray(body.messages)) throw bad('messages', 'messages: expected an array of { role, content } messages')
  return { messages: body.messages, ...commonFields(body) }
}

/** POST /v1/completions body -> engine request. */
export function completionRequest(body) {
  let prompt = body.prompt
  if (Array.isArray(prompt) && prompt.every((p) => typeof p === 'string')) {
    if (prompt.length !== 1) throw bad('prompt', 'prompt: only one prompt per request is supported')
    prompt = prompt[0]
  }
  if (typeof prompt !== 'string' && !(Array.isArray(prompt) && prompt.every(Number.isInteger))) {
    throw bad('prompt', 'prompt: expected a string or an array of token ids')
  }
  if (body.echo === true) throw bad('echo', 'echo: not supported')
  if (body.suffix != null) throw bad('suffix', 'suffix: not supported')
  if (body.best_of != null && body.best_of !== 1) throw bad('best_of', 'best_of: only 1 is supported')
  return { prompt, ...commonFields(body) }
}

/** OpenAI's finish_reason for an engine result. */
export function finishReason(result) {
  if (result.stopped_tool_calls) return 'tool_calls'
  return result.stopped_limit ? 'length' : 'stop'
}

/** The assistant message of a chat result: `content` null when it only calls tools. */
export function chatMessage(result) {
  const message = { role: 'assistant', content: result.content }
  if (result.tool_calls) {
    message.tool_calls = result.tool_calls
    if (result.content === '') message.content = null
  }
  if (result.reasoning_content != null) message.reasoning_content = result.reasoning_content
  return message
}

/**
 * The delta of one token event: content, `reasoning_content`, and tool-call
 * deltas in the shape the official client's stream helpers assemble (the
 * first delta of a call carries its index, id, type and name; the next ones
 * fragments of its arguments). `null` when the event adds nothing.
 */
export function chatDelta(event) {
  const delta = {}
  if (event.content) delta.content = event.content
  if (event.reasoning) delta.reasoning_content = event.reasoning
  if (event.tool_calls?.length) {
    delta.tool_calls = event.tool_calls.map((t) => {
      const call = { index: t.index }
      if (t.id != null) Object.assign(call, { id: t.id, type: 'function' })
      if (t.name != null || t.arguments != null) {
        call.function = {}
        if (t.name != null) call.function.name = t.name
        call.function.arguments = t.arguments ?? ''
      }
      return call
    })
  }
  return Object.keys(delta).length ? delta : null
}

export function usage(result) {
  return {
    prompt_tokens: result.tokens_evaluated,
    completion_tokens: result.tokens_predicted,
    total_tokens: result.tokens_evaluated + result.tokens_predicted,
    // Prompt tokens whose KV cells were reused (this slot's, another
    // slot's, the prompt cache's or a loaded session's), not computed.
    prompt_tokens_details: { cached_tokens: result.tokens_cached },
  }
}

/** What one response (streamed or not) shares: its id, time and model. */
export function responseHead(kind, model) {
  return { id: `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`, created: Math.floor(Date.now() / 1000), model }
}

export function chatCompletion(head, result) {
  return {
    ...head,
    object: 'chat.completion',
    choices: [{ index: 0, message: chatMessage(result), logprobs: null, finish_reason: finishReason(result) }],
    usage: usage(result),
  }
}

export function textCompletion(head, result) {
  return {
    ...head,
    object: 'text_completion',
    choices: [{ index: 0, text: result.content, logprobs: null, finish_reason: finishReason(result) }],
    usage: usage(result),
  }
}

/** A chat stream chunk: `delta` for choice 0, or only `usage` (then no choices). */
export function chatChunk(head, { delta, finish_reason = null, usage: u } = {}) {
  const chunk = { ...head, object: 'chat.completion.chunk', choices: [] }
  if (delta) chunk.choices.push({ index: 0, delta, logprobs: null, finish_reason })
  if (u) chunk.usage = u
  return chunk
}

export function textChunk(head, { text, finish_reason = null, usage: u } = {}) {
  const chunk = { ...head, object: 'text_completion', choices: [] }
  if (text != null) chunk.choices.push({ index: 0, text, logprobs: null, finish_reason })
  if (u) chunk.usage = u
  return chunk
}

/**
 * The OpenAI error for anything thrown while serving: an ApiError as it is,
 * an engine INVALID_REQUEST as 400 naming the field (the engine's messages
 * start with it), DISPOSED as 503, the rest as 500.
 */
export function toApiError(err) {
  if (err instanceof ApiError) return err
  const message = (err && err.message) || String(err)
  if (err && err.code === 'INVALID_REQUEST') {
    const param = /^([A-Za-z_][\w.[\]]*):/.exec(message)?.[1] ?? null
    return new ApiError(400, message, { param })
  }
  if (err && err.code === 'DISPOSED') return new ApiError(503, message, { code: 'DISPOSED' })
  return new ApiError(500, message, { code: (err && typeof err.code === 'string' && err.code) || 'INTERNAL' })
}

export function errorBody(e) {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } }
}
