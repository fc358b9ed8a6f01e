'use strict'
// llama-engine/server: an HTTP server over one LlamaEngine that speaks
// OpenAI's Chat Completions, Completions, Responses and embeddings APIs,
// Anthropic's Messages API, llama.cpp's endpoints and Prometheus metrics.
//
//   createServer(options)              a node:http server (it can load the model itself)
//   createHandler(engine, options)     (req, res, next?) for node:http, Express, Fastify, Connect
//   createFetchHandler(engine, opts)   (Request) => Promise<Response> for Hono, Next.js, Bun, Deno

const http = require('node:http')
const { createCore } = require('./handler.js')
const { nodeExchange, fetchExchange } = require('./http.js')

function serve(core, exchange, next) {
  core.handle(exchange, next).catch((e) => {
    // handle() answers every error itself; this is a bug, said once, not a crash.
    process.emitWarning(`llama-engine/server: ${e && e.stack ? e.stack : e}`)
    exchange.end()
  })
}

/**
 * A handler for node:http's (req, res), mountable in Express
 * (`app.use('/llm', handler)`), Connect, Fastify (`reply.hijack()`, then
 * `handler(request.raw, reply.raw)`) or a plain server. With `next`, routes
 * it does not serve go on to `next()`; without it they answer 404.
 * `handler.close({ graceMs })` stops it as shutdown does (see createServer).
 */
function createHandler(engine, options = {}) {
  if (!engine) throw new TypeError('createHandler(engine, options): engine is required')
  const core = createCore(engine, options)
  const handler = (req, res, next) => serve(core, nodeExchange(req, res, core.limits), next)
  handler.close = core.close
  return handler
}

/**
 * A Web-standard handler: `(request: Request) => Promise<Response>`, for
 * fetch-style frameworks (Hono: `app.all('/v1/*', (c) => handler(c.req.raw))`;
 * Next.js route handlers: `export const POST = handler`). Streams are
 * ReadableStreams; cancelling one aborts its generation.
 */
function createFetchHandler(engine, options = {}) {
  if (!engine) throw new TypeError('createFetchHandler(engine, options): engine is required')
  const core = createCore(engine, options)
  const handler = (request) => {
    const { exchange, response } = fetchExchange(request, core.limits)
    serve(core, exchange)
    return response
  }
  handler.close = core.close
  return handler
}

const SIGNAL_NUMBERS = { SIGINT: 2, SIGTERM: 15 }
/** The body deadline of the endpoint that reads it answers 408 first; this one drops the rest. */
const BODY_GRACE_MS = 1000

/**
 * A timer per connection, whatever the other connections do: a client
 * whose headers are not complete `headersMs` after it connected (or after
 * the previous answer on a kept-alive connection) is dropped, and so is
 * one whose body is not complete `bodyMs` after its headers (plus a grace,
 * so that an endpoint reading the body answers 408 first).
 */
function socketDeadlines(headersMs, bodyMs) {
  const timers = new WeakMap()
  const arm = (socket, ms, unless = () => false) => {
    clearTimeout(timers.get(socket))
    if (!ms || socket.destroyed) return
    const t = setTimeout(() => unless() || socket.destroy(), ms)
    t.unref()
    timers.set(socket, t)
  }
  return {
    connection(socket) {
      arm(socket, headersMs)
      socket.once('close', () => clearTimeout(timers.get(socket)))
    },
    request(req, res) {
      const socket = req.socket
      // Complete: the whole body arrived, read by the endpoint or not.
      arm(socket, bodyMs && bodyMs + BODY_GRACE_MS, () => req.complete)
      // The next request on a kept-alive connection has its own headers deadline.
      res.once('finish', () => arm(socket, headersMs))
    },
  }
}

/**
 * A node:http server (not yet listening) over `options.engine` (a
 * LlamaEngine, or a promise of one), or over the model at `options.model`,
 * loaded with `options.engineOptions` (then the server owns the engine and
 * disposes of it when it closes). Header and body-read deadlines are set on
 * the server (`headersTimeoutMs`, `requestTimeoutMs`).
 *
 * `server.shutdown({ graceMs })`: stops accepting, answers queued requests
 * 503, lets running ones finish for `graceMs` (`shutdownGraceMs`, 10 s),
 * aborts the rest, closes every connection and disposes of the engine.
 * While listening, SIGTERM and SIGINT run it (unless `signals: false`) and
 * then end the process as the signal would have; a second signal ends it at once.
 */
function createServer(options = {}) {
  if (options === null || typeof options !== 'object') throw new TypeError('createServer(options): expected an object')
  const { engine, model, models, modelsMax, memoryMax, idleUnloadMs, modelsAutoload, reloadModels, downloadModel, removeModel, engineOptions, signals = true, ...serverOptions } = options
  let owned = false
  let engineOrPromise = engine
  if (models != null) {
    if (engine != null || model != null) throw new TypeError('createServer(options): options.models goes without options.engine and options.model')
    serverOptions.router = routerOptions({ models, modelsMax, memoryMax, idleUnloadMs, modelsAutoload, reloadModels, downloadModel, removeModel, engineOptions })
    engineOrPromise = null
  } else if (engine == null) {
    if (typeof model !== 'string') throw new TypeError('createServer(options): options.engine or options.model (a path) is required')
    const { LlamaEngine } = require('../index.js')
    const load = () => LlamaEngine.load({ ...engineOptions, modelPath: model })
    engineOrPromise = load()
    engineOrPromise.catch(() => {}) // reported by /health and each request
    owned = true
    // What sleepIdleMs loads again.
    serverOptions.reloadEngine ??= load
  }
  const core = createCore(engineOrPromise, serverOptions)
  const { headersTimeoutMs, requestTimeoutMs } = core.options
  const deadlines = socketDeadlines(headersTimeoutMs, requestTimeoutMs)
  const server = http.createServer(
    {
      // Node's own deadlines, as a second line: its sweep (every
      // connectionsCheckingInterval ms) left a lone stalled connection open
      // for 25–60 s in 22 of 26 tries here; the socket timers below do not
      // depend on it.
      headersTimeout: headersTimeoutMs && requestTimeoutMs ? Math.min(headersTimeoutMs, requestTimeoutMs) : headersTimeoutMs,
      requestTimeout: requestTimeoutMs,
      connectionsCheckingInterval: Math.max(100, Math.min(1000, headersTimeoutMs || 1000, requestTimeoutMs || 1000)),
    },
    (req, res) => {
      deadlines.request(req, res)
      serve(core, nodeExchange(req, res, core.limits))
    },
  )
  server.on('connection', deadlines.connection)
  /** The Responses API's kept responses: `size`, `bytes`, `file`, `loadError`, `flush()`. */
  server.responses = core.responses
  server.on('close', () => core.responses.flush().catch(() => {}))

  // The engine now: the one loaded at start, or (sleepIdleMs) the one a request woke.
  const current = async () => core.engine ?? (await Promise.resolve(engineOrPromise).catch(() => null))
  const disposeOwned = async () => {
    if (core.router) return core.close({ graceMs: 0 })
    if (!owned) return
    owned = false
    await (await current())?.dispose().catch(() => {})
  }
  server.on('close', disposeOwned)

  let stopping = null
  /** With many models: the router (`list()`, `load(name)`, `unload(name)`). */
  server.router = core.router
  server.shutdown = ({ graceMs, dispose = owned } = {}) => {
    if (stopping) return stopping
    stopping = (async () => {
      server.close()
      server.closeIdleConnections()
      await core.close({ graceMs })
      server.closeAllConnections()
      if (dispose) {
        owned = false
        await (await current())?.dispose().catch(() => {})
      }
    })()
    return stopping
  }

  if (signals) {
    const onSignal = (signal) => {
      if (stopping) process.exit(128 + SIGNAL_NUMBERS[signal]) // a second signal: now
      server.shutdown({ dispose: true }).finally(() => {
        remove()
        // As the signal would have: when nobody else listens for it, raise it again.
        if (process.listenerCount(signal) === 0) process.kill(process.pid, signal)
      })
    }
    const handlers = Object.keys(SIGNAL_NUMBERS).map((signal) => [signal, () => onSignal(signal)])
    const remove = () => handlers.forEach(([signal, fn]) => process.off(signal, fn))
    server.on('listening', () => handlers.forEach(([signal, fn]) => process.on(signal, fn)))
    server.on('close', remove)
  }
  return server
}

/**
 * The router's options from createServer's: `models` (`[{ name, uri, options?,
 * pinned? }]`, `uri` a path or hf: URI, `options` EngineOptions of its own
 * over `engineOptions`), the caps, and how a model loads (an isolated
 * engine unless its options say otherwise) and what it is estimated to take
 * (inspectModel's `memory.total` for its context and slots).
 */
function routerOptions({ models, modelsMax, memoryMax, idleUnloadMs, modelsAutoload, reloadModels, downloadModel, removeModel, engineOptions = {} }) {
  if (!Array.isArray(models)) throw new TypeError('createServer(options): options.models: expected an array')
  for (const [name, v] of Object.entries({ modelsMax, memoryMax, idleUnloadMs })) {
    if (v != null && !(Number.isInteger(v) && v > 0)) throw new TypeError(`createServer(options): options.${name}: expected a positive integer, got ${JSON.stringify(v)}`)
  }
  if (modelsAutoload != null && typeof modelsAutoload !== 'boolean') throw new TypeError('createServer(options): options.modelsAutoload: expected true or false')
  for (const [name, fn] of Object.entries({ reloadModels, downloadModel, removeModel })) {
    if (fn != null && typeof fn !== 'function') throw new TypeError(`createServer(options): options.${name}: expected a function`)
  }
  const { LlamaEngine, inspectModel } = require('../index.js')
  const optionsOf = (m) => ({ isolation: 'process', ...engineOptions, ...(m.options ?? {}), modelPath: m.uri })
  const shaped = (list) =>
    list.map((m) => {
      if (!m || typeof m.name !== 'string' || m.name === '' || typeof m.uri !== 'string' || m.uri === '') {
        throw new TypeError('createServer(options): options.models: each is { name, uri, options?, pinned?, hidden? }')
      }
      return { name: m.name, uri: m.uri, options: m.options, pinned: m.pinned === true, hidden: m.hidden === true, bytes: m.bytes }
    })
  return {
    models: shaped(models),
    modelsMax: modelsMax ?? Infinity,
    memoryMax: memoryMax ?? Infinity,
    idleUnloadMs: idleUnloadMs ?? 0,
    autoload: modelsAutoload ?? true,
    reload: reloadModels ? async () => shaped(await reloadModels()) : undefined,
    download: downloadModel,
    remove: removeModel,
    load: (m) => LlamaEngine.load(optionsOf(m)),
    async estimate(m) {
      const o = optionsOf(m)
      const info = await inspectModel(o.modelPath, { contextSize: o.contextSize ?? 4096, parallel: o.parallel ?? 4, batchSize: o.batchSize })
      if (info.memory && typeof info.memory.total === 'number') return info.memory.total
      return info.fileBytes ?? 0
    },
  }
}

module.exports = { createServer, createHandler, createFetchHandler }
