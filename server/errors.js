'use strict'
// Errors as every endpoint answers them: one ApiError (an HTTP status, a
// type, a stable code and the request field at fault), written by the
// endpoint's protocol in its own shape (its `errorBody`); OpenAI's shape is
// here, the one every protocol but Anthropic's uses.

class ApiError extends Error {
  /**
   * @param {number} status HTTP status
   * @param {string} message what went wrong; for a request field, starts with its name
   * @param {{ type?: string, code?: string, param?: string|null, headers?: object, close?: boolean }} [details]
   *   `param`: the request field at fault (OpenAI's `param`); `headers`: sent with
   *   the answer (Retry-After); `close`: drop the connection after answering
   *   (a body that was not read to its end).
   */
  constructor(status, message, { type, code = 'INVALID_REQUEST', param = null, headers = {}, close = false, extra = null } = {}) {
    super(message)
    this.status = status
    this.type = type ?? (status < 500 ? 'invalid_request_error' : 'server_error')
    this.code = code
    this.param = param
    this.headers = headers
    this.close = close
    /** Fields the error body carries beside the protocol's own (llama-server's `n_prompt_tokens`, `n_ctx`). */
    this.extra = extra
  }
}

/** A client's mistake in field `param`: 400, the message starting with the field. */
const invalid = (param, message) => new ApiError(400, `${param}: ${message}`, { param })

/**
 * The ApiError for anything thrown while serving. The engine's errors carry
 * their `code` and, for INVALID_REQUEST, the offending `field` as data;
 * `paramOf` turns the engine's field name into the endpoint's own (the
 * Responses API calls `response_format.json_schema.schema`
 * `text.format.schema`). Without a field, `param` is null.
 */
function toApiError(err, paramOf = (field) => field) {
  if (err instanceof ApiError) return err
  const message = (err && err.message) || String(err)
  const code = err && typeof err.code === 'string' ? err.code : 'INTERNAL'
  if (code === 'INVALID_REQUEST') {
    const field = typeof err.field === 'string' && err.field !== '' ? err.field : null
    const param = field === null ? null : paramOf(field) ?? field
    // The engine's message starts with its own name for the field: say the endpoint's.
    const text = field !== null && param !== field && message.startsWith(`${field}:`) ? `${param}:${message.slice(field.length + 1)}` : message
    return new ApiError(400, text, { param })
  }
  // A prompt the context cannot hold (context_shift: false): llama-server's answer.
  if (code === 'CONTEXT_EXCEEDED') {
    return new ApiError(400, message, { code, type: 'exceed_context_size_error', extra: { n_prompt_tokens: err.promptTokens, n_ctx: err.contextSize } })
  }
  if (code === 'DISPOSED') return new ApiError(503, message, { code })
  // The isolated engine's process died under this request; a new one is starting.
  if (code === 'ENGINE_CRASHED') return new ApiError(503, message, { code, headers: { 'Retry-After': '1' } })
  // It is restarting after a crash, later than a request should wait.
  if (code === 'ENGINE_RESTARTING') {
    const seconds = Math.max(1, Math.ceil((Number(err.retryAfterMs) || 1000) / 1000))
    return new ApiError(503, message, { code, headers: { 'Retry-After': String(seconds) } })
  }
  return new ApiError(500, message, { code })
}

/** `{ error: { message, type, param, code } }` */
function openaiErrorBody(e) {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code, ...e.extra } }
}

module.exports = { ApiError, invalid, toApiError, openaiErrorBody }
