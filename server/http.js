'use strict'
// HTTP plumbing shared by every endpoint: a request as the endpoints see it
// (an "exchange"), made from node:http's (req, res) or from a Web Request;
// the body read with a size limit and a deadline; the API key check; CORS.

const { createHash, timingSafeEqual } = require('node:crypto')
const { ApiError } = require('./errors.js')

/**
 * What an endpoint sees of a request and how it answers, whatever carried it:
 *
 *   method, path            the path without the query string
 *   query                   the query string's parameters (URLSearchParams)
 *   header(name)            a request header (lower-case name), or undefined
 *   signal                  aborts when the client goes away
 *   readBody()              the body as a Buffer (size limit, deadline)
 *   send(status, headers, text)
 *   open(status, headers)   starts a streamed answer; then write(text), end()
 *   headersSent, finished
 *
 * @typedef {object} Exchange
 */

/** The body of a node:http request. */
function readNodeBody(req, { maxBodyBytes, requestTimeoutMs }) {
  // A framework's body parser may have read it already (Express's express.json()).
  if (req.readableEnded && req.body !== undefined) {
    const b = req.body
    return Promise.resolve(Buffer.isBuffer(b) ? b : typeof b === 'string' ? Buffer.from(b) : { parsed: b })
  }
  return new Promise((resolve, reject) => {
    const chunks = []
    let size = 0
    const finish = (fn, value) => {
      clearTimeout(timer)
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
      req.off('close', onClose)
      fn(value)
    }
    const onData = (chunk) => {
      size += chunk.length
      if (size > maxBodyBytes) {
        finish(reject, new ApiError(413, `body: larger than ${maxBodyBytes} bytes`, { code: 'BODY_TOO_LARGE', close: true }))
        return
      }
      chunks.push(chunk)
    }
    const onEnd = () => finish(resolve, Buffer.concat(chunks))
    const onError = (e) => finish(reject, new ApiError(400, `body: ${e.message}`, { close: true }))
    const onClose = () => {
      if (!req.readableEnded) finish(reject, new ApiError(400, 'body: the client closed the connection before sending all of it', { close: true }))
    }
    // The deadline is for reading the body, not for answering it: a client
    // that sends half a body and stalls is dropped, a long generation is not.
    const timer = setTimeout(() => {
      finish(reject, new ApiError(408, `body: not received within ${requestTimeoutMs} ms`, { code: 'REQUEST_TIMEOUT', close: true }))
    }, requestTimeoutMs)
    req.on('data', onData)
    req.on('end', onEnd)
    req.on('error', onError)
    req.on('close', onClose)
  })
}

/** An Exchange over node:http's request and response. */
function nodeExchange(req, res, limits) {
  const ac = new AbortController()
  // The response closed without having ended: the client went away.
  res.on('close', () => {
    if (!res.writableEnded) ac.abort()
  })
  const url = req.url || '/'
  const q = url.indexOf('?')
  return {
    method: req.method,
    path: q < 0 ? url : url.slice(0, q),
    get query() {
      return new URLSearchParams(q < 0 ? '' : url.slice(q + 1))
    },
    header(name) {
      const v = req.headers[name]
      return Array.isArray(v) ? v.join(', ') : v
    },
    signal: ac.signal,
    readBody: () => readNodeBody(req, limits),
    get headersSent() {
      return res.headersSent
    },
    get finished() {
      return res.writableEnded || res.destroyed
    },
    send(status, headers, text, { close = false } = {}) {
      if (this.finished) return
      if (close) headers = { ...headers, Connection: 'close' }
      res.writeHead(status, { ...headers, 'Content-Length': Buffer.byteLength(text) })
      res.end(text)
      // The rest of an unread body would be parsed as the next request: drop the connection.
      if (close) res.once('finish', () => req.socket?.destroy())
    },
    open(status, headers) {
      if (this.finished) return
      res.writeHead(status, headers)
      res.flushHeaders()
    },
    write(text) {
      if (!this.finished) res.write(text)
    },
    end() {
      if (!res.writableEnded && !res.destroyed) res.end()
    },
  }
}

/** The body of a Web Request, read the same way. */
async function readFetchBody(request, { maxBodyBytes, requestTimeoutMs }) {
  if (!request.body) return Buffer.alloc(0)
  const reader = request.body.getReader()
  const chunks = []
  let size = 0
  let timer
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => {
      reject(new ApiError(408, `body: not received within ${requestTimeoutMs} ms`, { code: 'REQUEST_TIMEOUT', close: true }))
    }, requestTimeoutMs)
  })
  try {
    for (;;) {
      const { value, done } = await Promise.race([reader.read(), deadline])
      if (done) break
      size += value.byteLength
      if (size > maxBodyBytes) throw new ApiError(413, `body: larger than ${maxBodyBytes} bytes`, { code: 'BODY_TOO_LARGE', close: true })
      chunks.push(Buffer.from(value.buffer, value.byteOffset, value.byteLength))
    }
    return Buffer.concat(chunks)
  } catch (e) {
    reader.cancel().catch(() => {})
    throw e instanceof ApiError ? e : new ApiError(400, `body: ${e.message}`)
  } finally {
    clearTimeout(timer)
  }
}

/**
 * An Exchange over a Web Request; `response` resolves with the Response as
 * soon as the endpoint answers or starts streaming.
 */
function fetchExchange(request, limits) {
  const url = new URL(request.url)
  const ac = new AbortController()
  const abort = () => ac.abort()
  if (request.signal) {
    if (request.signal.aborted) abort()
    else request.signal.addEventListener('abort', abort, { once: true })
  }
  const encoder = new TextEncoder()
  let respond
  const response = new Promise((resolve) => (respond = resolve))
  let controller = null
  let headersSent = false
  let finished = false
  const exchange = {
    method: request.method,
    path: url.pathname,
    query: url.searchParams,
    header: (name) => request.headers.get(name) ?? undefined,
    signal: ac.signal,
    readBody: () => readFetchBody(request, limits),
    get headersSent() {
      return headersSent
    },
    get finished() {
      return finished
    },
    send(status, headers, text) {
      if (headersSent) return
      headersSent = finished = true
      // 204 and 304 carry no body.
      respond(new Response(status === 204 || status === 304 ? null : text, { status, headers }))
    },
    open(status, headers) {
      if (headersSent) return
      headersSent = true
      const body = new ReadableStream({
        start(c) {
          controller = c
        },
        cancel() {
          finished = true
          abort()
        },
      })
      respond(new Response(body, { status, headers }))
    },
    write(text) {
      if (!finished && controller) controller.enqueue(typeof text === 'string' ? encoder.encode(text) : new Uint8Array(text))
    },
    end() {
      if (finished) return
      finished = true
      if (controller) controller.close()
      request.signal?.removeEventListener('abort', abort)
    },
  }
  return { exchange, response }
}

/** The body parsed as JSON, whatever its value. */
async function readJsonValue(exchange) {
  const body = await exchange.readBody()
  if (body && body.parsed !== undefined) return body.parsed
  try {
    return JSON.parse(body.toString('utf8'))
  } catch (e) {
    throw new ApiError(400, `body: invalid JSON (${e.message})`)
  }
}

/** The body parsed as a JSON object. */
async function readJson(exchange) {
  return jsonObject(await readJsonValue(exchange))
}

/** A body's JSON value when it is an object; else a 400. */
function jsonObject(value) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new ApiError(400, 'body: expected a JSON object')
  return value
}

const digest = (text) => createHash('sha256').update(text).digest()

/**
 * Whether the request carries the key, as `Authorization: Bearer <key>`
 * (OpenAI's clients, Anthropic's ANTHROPIC_AUTH_TOKEN) or `x-api-key: <key>`
 * (Anthropic's ANTHROPIC_API_KEY). Compared in constant time: both sides
 * are hashed first, so neither the key's content nor its length shows in
 * the time taken.
 */
function authorized(exchange, keyDigests) {
  const bearer = /^Bearer\s+(.+)$/i.exec(exchange.header('authorization') || '')?.[1]?.trim()
  const given = [bearer, exchange.header('x-api-key')?.trim()]
  let ok = false
  for (const g of given) {
    if (typeof g !== 'string' || g === '') continue
    const d = digest(g)
    for (const k of [].concat(keyDigests)) if (timingSafeEqual(d, k)) ok = true
  }
  return ok
}

// An origin on this machine: http(s)://localhost, 127.0.0.1 or [::1], any port.
const LOCALHOST_ORIGIN = /^https?:\/\/(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$/i

/**
 * The Access-Control-Allow-Origin a request gets, or null. `cors`: true or
 * "*" any origin (echoed when credentials are allowed, as llama-server
 * does; else "*"); "localhost" origins on this machine only; a string (or
 * comma-separated list) those origins; false or absent none.
 */
function allowedOrigin({ cors, corsCredentials = true }, origin) {
  if (!cors) return null
  const list = cors === true ? ['*'] : String(cors).split(',').map((s) => s.trim())
  if (list.includes('*')) return corsCredentials && origin ? origin : '*'
  if (!origin) return null
  if (list.includes('localhost') && LOCALHOST_ORIGIN.test(origin)) return origin
  return list.includes(origin) ? origin : null
}

/** CORS headers for a request (the server's options `cors`, `corsCredentials`). */
function corsHeaders(opts, exchange) {
  const allow = allowedOrigin(opts, exchange.header('origin'))
  if (!allow) return {}
  const headers = { 'Access-Control-Allow-Origin': allow, 'Access-Control-Expose-Headers': 'Retry-After' }
  if (allow !== '*') {
    headers.Vary = 'Origin'
    if (opts.corsCredentials !== false) headers['Access-Control-Allow-Credentials'] = 'true'
  }
  return headers
}

/**
 * The answer to a CORS preflight (any OPTIONS request when `cors` is on):
 * the origin when it is allowed (a browser refuses the call without it),
 * credentials, `corsMethods`, and `corsHeaders` (default: whatever headers
 * the browser asks for, the SDKs' x-stainless-* and anthropic-* among them).
 */
function preflightHeaders(opts, exchange) {
  if (!opts.cors) return null
  return {
    ...corsHeaders(opts, exchange),
    'Access-Control-Allow-Credentials': opts.corsCredentials === false ? 'false' : 'true',
    'Access-Control-Allow-Methods': opts.corsMethods ?? 'GET, POST, DELETE, OPTIONS',
    'Access-Control-Allow-Headers': opts.corsHeaders ?? (exchange.header('access-control-request-headers') || 'authorization, content-type, x-api-key'),
    'Access-Control-Max-Age': '86400',
  }
}

module.exports = { nodeExchange, fetchExchange, readJson, readJsonValue, jsonObject, authorized, digest, corsHeaders, preflightHeaders }
