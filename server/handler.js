'use strict'
// The server's core, whatever carries the requests: routing (to the
// protocols of protocols.js), the API key, CORS, readiness, the admission
// queue, metrics, errors in each protocol's shape, and shutdown.
// createHandler and createFetchHandler (index.js) wrap it for node:http and
// for fetch-style frameworks.

const { performance } = require('node:perf_hooks')
const { ApiError, toApiError, openaiErrorBody } = require('./errors.js')
const { readJson, readJsonValue, authorized, digest, corsHeaders, preflightHeaders } = require('./http.js')
const { AdmissionQueue } = require('./queue.js')
const { Metrics } = require('./metrics.js')
const { findRoute, protocolOf } = require('./protocols.js')
const { ResponseStore } = require('./response-store.js')
const { anySignal } = require('./util.js')
const { serverMedia } = require('./media.js')

const DEFAULTS = {
  apiKey: undefined,
  modelName: undefined,
  maxQueue: 64,
  cors: false,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  maxBodyBytes: 16 * 1024 * 1024,
  shutdownGraceMs: 10_000,
  responsesMax: 1000,
  responsesMaxBytes: 64 * 1024 * 1024,
  responsesFile: undefined,
  allowRemoteMedia: false,
  onError: undefined,
}

/** The options with their defaults, checked. */
function serverOptions(options = {}) {
  if (options === null || typeof options !== 'object') throw new TypeError('options: expected an object')
  const o = { ...DEFAULTS }
  for (const [k, v] of Object.entries(options)) if (v !== undefined) o[k] = v
  for (const name of ['maxQueue', 'headersTimeoutMs', 'requestTimeoutMs', 'maxBodyBytes', 'shutdownGraceMs', 'responsesMax', 'responsesMaxBytes']) {
    if (!Number.isInteger(o[name]) || o[name] < 0) throw new TypeError(`${name}: expected a non-negative integer, got ${JSON.stringify(o[name])}`)
  }
  if (o.apiKey != null && (typeof o.apiKey !== 'string' || o.apiKey === '')) throw new TypeError('apiKey: expected a non-empty string')
  if (o.onError != null && typeof o.onError !== 'function') throw new TypeError('onError: expected a function')
  if (o.responsesFile != null && (typeof o.responsesFile !== 'string' || o.responsesFile === '')) throw new TypeError('responsesFile: expected a path')
  return o
}

const OWN_PATHS = new Set(['/health', '/metrics'])

const LIST_SLICE = 1 << 15

const sseHeaders = { 'Content-Type': 'text/event-stream; charset=utf-8', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no' }

/**
 * The core over one engine (or a promise of one: until it resolves,
 * /health says "loading" and the other endpoints answer 503).
 */
function createCore(engineOrPromise, options) {
  const opts = serverOptions(options)
  const keyDigest = opts.apiKey ? digest(opts.apiKey) : null
  const limits = { maxBodyBytes: opts.maxBodyBytes, requestTimeoutMs: opts.requestTimeoutMs }
  const metrics = new Metrics()
  const started = Math.floor(Date.now() / 1000)
  let engine = engineOrPromise && typeof engineOrPromise.then === 'function' ? null : engineOrPromise
  let loadError = null
  if (!engine) {
    Promise.resolve(engineOrPromise).then(
      (e) => (engine = e),
      (e) => (loadError = e),
    )
  }
  const queue = new AdmissionQueue({ concurrency: () => engine?.status().parallel || 1, maxQueue: opts.maxQueue })
  const running = new Map() // AbortController -> the generation's promise
  let closing = false
  let shutdown = null

  const modelName = () => opts.modelName ?? engine?.status().model ?? 'unknown'

  // The LoRA scales of POST /lora-adapters (id -> scale, every adapter),
  // given to each generation without its own `lora`; null until then (the
  // engine's load scales apply).
  let loraScales = null
  const server = {
    /** The Responses API's kept responses (`store`). */
    responses: new ResponseStore({ max: opts.responsesMax, maxBytes: opts.responsesMaxBytes, file: opts.responsesFile }),
    /** The engine's LoRA adapters, `[{ id, path, scale }]`, with the scales POST /lora-adapters set. */
    loras() {
      const loras = engine.status().loras
      if (!Array.isArray(loras)) return []
      return loras.map(({ id, path, scale }) => ({ id, path, scale: loraScales?.has(id) ? loraScales.get(id) : scale }))
    },
    /** Sets the scales requests without `lora` get (a Map id -> scale naming every adapter). */
    setLoraScales(scales) {
      loraScales = scales
    },
  }

  /** The request as the engine gets it: the scales of POST /lora-adapters when it names none. */
  function withLoraDefaults(request) {
    if (!loraScales || loraScales.size === 0 || request === null || typeof request !== 'object' || request.lora != null) return request
    return { ...request, lora: [...loraScales].map(([id, scale]) => ({ id, scale })) }
  }

  /** Runs one engine request through the queue, with the client's signal, measured. */
  async function generate(exchange, t0, request, onEvent) {
    request = await serverMedia(request, { allowRemote: opts.allowRemoteMedia === true, signal: exchange.signal })
    const release = await queue.acquire(exchange.signal)
    const ac = new AbortController()
    const signal = anySignal([exchange.signal, ac.signal])
    let last = null
    const promise = engine.complete(
      withLoraDefaults(request),
      (event) => {
        const n = event.type === 'token' ? event.tokens.length : 0
        if (n > 0) {
          const now = performance.now()
          if (last === null) metrics.ttft.observe((now - t0) / 1000)
          else metrics.perToken.observe((now - last) / 1000 / n, n)
          last = now
        }
        if (onEvent) onEvent(event)
      },
      signal,
    )
    running.set(ac, promise)
    try {
      const result = await promise
      metrics.generation(result)
      if (ac.signal.aborted) {
        throw new ApiError(503, 'the server shut down before this request finished', { code: 'SHUTTING_DOWN', type: 'server_error', close: true })
      }
      return result
    } finally {
      running.delete(ac)
      release()
    }
  }

  /** Runs an embedding request through the same queue. */
  async function embed(exchange, input, embedOptions) {
    const release = await queue.acquire(exchange.signal)
    try {
      const result = await engine.embed(input, embedOptions)
      metrics.embeddingTokens += result.tokens ?? 0
      return result
    } finally {
      release()
    }
  }

  function health(exchange, cors) {
    const send = (status, body) => exchange.send(status, { 'Content-Type': 'application/json; charset=utf-8', ...cors }, JSON.stringify(body))
    if (loadError) return send(500, { status: 'error', error: openaiErrorBody(toApiError(loadError)).error })
    if (!engine) return send(503, { status: 'loading' })
    const st = engine.status()
    if (closing || st.disposed) return send(503, { status: 'unavailable' })
    // An isolated engine whose process died: a new one is loading.
    if (st.isolation?.restarting) return send(503, { status: 'restarting', restarts: st.isolation.restarts })
    return send(200, { status: 'ok' })
  }

  /** Serves one exchange. `next`, when given, gets what this server does not serve. */
  async function handle(exchange, next) {
    const t0 = performance.now()
    const cors = corsHeaders(opts.cors, exchange)
    const key = `${exchange.method} ${exchange.path}`
    const found = findRoute(exchange.method, exchange.path)
    const route = found.route
    const known = found.known || OWN_PATHS.has(exchange.path)
    // Metrics name a route with parameters by its pattern, never by the id.
    let endpoint = known ? found.pattern : 'other'
    // The protocol shapes the errors: the route's, else the one claiming the path.
    const protocol = route?.protocol ?? protocolOf(exchange.path)
    const ctx = {
      engine: null,
      started,
      paramOf: undefined,
      onStreamError: null,
      modelName,
      server,
      params: found.params,
      query: exchange.query ?? new URLSearchParams(),
      body: () => readJson(exchange),
      /** The body as JSON, whatever its value (POST /lora-adapters takes an array). */
      bodyValue: () => readJsonValue(exchange),
      json(status, body, headers = {}) {
        exchange.send(status, { 'Content-Type': 'application/json; charset=utf-8', ...cors, ...headers }, JSON.stringify(body))
      },
      /**
       * `{ "<key>": [...items] }`, written a slice at a time with the event
       * loop free in between: a million tokens are megabytes of JSON.
       */
      async jsonList(status, key, items) {
        exchange.open(status, { 'Content-Type': 'application/json; charset=utf-8', ...cors })
        exchange.write(`{${JSON.stringify(key)}:[`)
        for (let i = 0; i < items.length && !exchange.finished; i += LIST_SLICE) {
          if (i > 0) await new Promise((r) => setImmediate(r))
          exchange.write((i > 0 ? ',' : '') + items.slice(i, i + LIST_SLICE).map((x) => JSON.stringify(x)).join(','))
        }
        exchange.write(']}')
        exchange.end()
      },
      sse() {
        // Headers wait for the first event, so a request the engine refuses
        // before generating still gets its HTTP error.
        const open = () => {
          if (!exchange.headersSent) exchange.open(200, { ...sseHeaders, ...cors })
        }
        return {
          send(data, event) {
            open()
            exchange.write(`${event ? `event: ${event}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`)
          },
          end() {
            open()
            exchange.end()
          },
        }
      },
      generate: (request, onEvent) => generate(exchange, t0, request, onEvent),
      embed: (input, embedOptions) => embed(exchange, input, embedOptions),
    }
    let status = 200
    try {
      if (exchange.method === 'OPTIONS' && exchange.header('access-control-request-method')) {
        const headers = preflightHeaders(opts.cors, exchange)
        if (headers) {
          endpoint = 'preflight'
          status = 204
          return exchange.send(204, headers, '')
        }
      }
      if (!route && !(known && (key === 'GET /health' || key === 'GET /metrics'))) {
        if (typeof next === 'function') {
          endpoint = null // not ours: not counted
          return next()
        }
        throw known
          ? new ApiError(405, `${exchange.method} is not allowed on ${exchange.path}`, { code: 'METHOD_NOT_ALLOWED' })
          : new ApiError(404, `no endpoint ${exchange.path}`, { code: 'NOT_FOUND', type: 'not_found_error' })
      }
      if (key === 'GET /health') return health(exchange, cors)
      if (keyDigest && !authorized(exchange, keyDigest)) {
        throw new ApiError(401, 'a valid API key is required: Authorization: Bearer <key>, or x-api-key: <key>', {
          code: 'INVALID_API_KEY',
          type: 'authentication_error',
        })
      }
      if (key === 'GET /metrics') {
        const text = metrics.render(engine && !engine.status().disposed ? engine.status() : null, queue)
        return exchange.send(200, { 'Content-Type': 'text/plain; version=0.0.4; charset=utf-8', ...cors }, text)
      }
      if (loadError) throw loadError
      if (!engine) throw new ApiError(503, 'the model is still loading', { code: 'LOADING', type: 'server_error' })
      if (closing) throw new ApiError(503, 'the server is shutting down', { code: 'SHUTTING_DOWN', type: 'server_error', close: true })
      ctx.engine = engine
      await route.run(ctx)
    } catch (err) {
      const e = toApiError(err, ctx.paramOf)
      status = e.status
      // The server's fault (or the engine's): the host's log says which and why.
      if (e.status >= 500 && opts.onError) {
        try {
          opts.onError(e, { method: exchange.method, path: exchange.path, status: e.status, streaming: exchange.headersSent })
        } catch {}
      }
      if (e.status === 499 || exchange.finished) return // the client left: nobody to answer
      if (exchange.headersSent) {
        // Mid-stream: the status is already 200; the protocol says it as an event.
        try {
          ctx.onStreamError?.(e)
        } finally {
          exchange.end()
        }
        return
      }
      const body = protocol.errorBody(e)
      const headers = { 'Content-Type': 'application/json; charset=utf-8', ...cors, ...e.headers }
      // Clients retry 5xx, 408 and 429 on their own; a mistake in the request will not get better.
      if (e.status < 500 && e.status !== 408 && e.status !== 429) headers['x-should-retry'] = 'false'
      exchange.send(e.status, headers, JSON.stringify(body), { close: e.close })
    } finally {
      if (endpoint !== null) metrics.request(endpoint, status)
    }
  }

  /**
   * Stops serving: new requests and those waiting in the queue get 503;
   * running generations may finish for `graceMs`, then are aborted (they
   * end as a generation cut short does). Resolves when none runs.
   */
  function close({ graceMs = opts.shutdownGraceMs } = {}) {
    if (shutdown) return shutdown
    closing = true
    queue.close()
    shutdown = (async () => {
      const settled = () => Promise.allSettled([...running.values()])
      let timer
      await Promise.race([settled(), new Promise((r) => (timer = setTimeout(r, graceMs)))])
      clearTimeout(timer)
      for (const ac of running.keys()) ac.abort()
      await settled()
      // What the Responses API keeps, on disk before the process may end.
      await server.responses.close().catch(() => {})
    })()
    return shutdown
  }

  return {
    handle,
    close,
    limits,
    options: opts,
    metrics,
    responses: server.responses,
    get engine() {
      return engine
    },
  }
}

module.exports = { createCore, serverOptions }
