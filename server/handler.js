'use strict'
// The server's core, whatever carries the requests: routing (to the
// protocols of protocols.js), the API key, CORS, readiness, the admission
// queue, metrics, errors in each protocol's shape, and shutdown.
// createHandler and createFetchHandler (index.js) wrap it for node:http and
// for fetch-style frameworks.

const { performance } = require('node:perf_hooks')
const { ApiError, toApiError, openaiErrorBody } = require('./errors.js')
const { readJsonValue, jsonObject, authorized, digest, corsHeaders, preflightHeaders } = require('./http.js')
const { Lane } = require('./lane.js')
const { Router } = require('./router.js')
const { Metrics } = require('./metrics.js')
const { findRoute, protocolOf } = require('./protocols.js')
const { ResponseStore } = require('./response-store.js')
const { serverMedia } = require('./media.js')
const { Sleep } = require('./sleep.js')
const { templateOptions } = require('./util.js')
const { systemFingerprint } = require('./llama.js')
const { StreamSessions, STREAM_ROUTES } = require('./streams.js')
const { RouterAdmin } = require('./router-admin.js')

const DEFAULTS = {
  apiKey: undefined,
  modelName: undefined,
  modelAliases: undefined,
  modelTags: undefined,
  maxQueue: 64,
  cors: false,
  corsMethods: 'GET, POST, DELETE, OPTIONS',
  corsHeaders: undefined,
  corsCredentials: true,
  slots: true,
  metrics: true,
  verbose: false,
  requestDefaults: undefined,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  maxBodyBytes: 16 * 1024 * 1024,
  shutdownGraceMs: 10_000,
  responsesMax: 1000,
  responsesMaxBytes: 64 * 1024 * 1024,
  responsesFile: undefined,
  allowRemoteMedia: false,
  mediaPath: undefined,
  slotSavePath: undefined,
  onError: undefined,
  router: undefined,
}

/** The options with their defaults, checked. */
function serverOptions(options = {}) {
  if (options === null || typeof options !== 'object') throw new TypeError('options: expected an object')
  const o = { ...DEFAULTS }
  for (const [k, v] of Object.entries(options)) if (v !== undefined) o[k] = v
  for (const name of ['maxQueue', 'headersTimeoutMs', 'requestTimeoutMs', 'maxBodyBytes', 'shutdownGraceMs', 'responsesMax', 'responsesMaxBytes']) {
    if (!Number.isInteger(o[name]) || o[name] < 0) throw new TypeError(`${name}: expected a non-negative integer, got ${JSON.stringify(o[name])}`)
  }
  const keys = o.apiKey == null ? [] : [].concat(o.apiKey)
  if (o.apiKey != null && (keys.length === 0 || keys.some((k) => typeof k !== 'string' || k === ''))) throw new TypeError('apiKey: expected a non-empty string, or an array of them')
  if (o.requestDefaults != null && (typeof o.requestDefaults !== 'object' || Array.isArray(o.requestDefaults))) throw new TypeError('requestDefaults: expected an object of request fields')
  for (const name of ['corsMethods', 'corsHeaders']) if (o[name] != null && typeof o[name] !== 'string') throw new TypeError(`${name}: expected a string`)
  if (o.sleepIdleMs != null) {
    if (!Number.isInteger(o.sleepIdleMs) || o.sleepIdleMs < 0) throw new TypeError(`sleepIdleMs: expected a non-negative integer, got ${JSON.stringify(o.sleepIdleMs)}`)
    if (o.sleepIdleMs > 0 && typeof o.reloadEngine !== 'function') throw new TypeError('sleepIdleMs: needs reloadEngine (how the engine is loaded again), or a server that loads its own model (model)')
  }
  for (const name of ['mediaPath', 'slotSavePath']) {
    if (o[name] == null) continue
    if (typeof o[name] !== 'string' || o[name] === '') throw new TypeError(`${name}: expected a directory`)
    let dir
    try {
      dir = require('node:fs').statSync(o[name]).isDirectory()
    } catch {
      dir = false
    }
    if (!dir) throw new TypeError(`${name}: ${o[name]} is not a directory`)
  }
  for (const name of ['modelAliases', 'modelTags']) {
    if (o[name] != null && !(Array.isArray(o[name]) && o[name].every((x) => typeof x === 'string' && x !== ''))) throw new TypeError(`${name}: expected an array of names`)
  }
  if (o.onError != null && typeof o.onError !== 'function') throw new TypeError('onError: expected a function')
  if (o.responsesFile != null && (typeof o.responsesFile !== 'string' || o.responsesFile === '')) throw new TypeError('responsesFile: expected a path')
  return o
}

const OWN_PATHS = new Set(['/health', '/v1/health', '/metrics'])

const LIST_SLICE = 1 << 15

const sseHeaders = { 'Content-Type': 'text/event-stream; charset=utf-8', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no' }

/** Routes that read no engine and pick no model: the Responses API's kept responses, the resumable streams. */
const NO_ENGINE_ROUTES = new Set(['GET /v1/responses/:id', 'DELETE /v1/responses/:id', 'GET /v1/responses/:id/input_items', ...STREAM_ROUTES])

/**
 * The core over one engine (or a promise of one: until it resolves,
 * /health says "loading" and the other endpoints answer 503), or over many
 * models (`options.router`: router.js loads them on demand, the request's
 * `model` picks).
 */
function createCore(engineOrPromise, options) {
  const opts = serverOptions(options)
  const keyDigests = opts.apiKey ? [].concat(opts.apiKey).map(digest) : null
  const limits = { maxBodyBytes: opts.maxBodyBytes, requestTimeoutMs: opts.requestTimeoutMs }
  const metrics = new Metrics()
  const started = Math.floor(Date.now() / 1000)
  let admin = null
  const onState = (name, status, error) => admin?.events.send(name, 'status_change', error ? { status, error: error.message } : { status })
  const router = opts.router
    ? new Router(opts.router.models, { ...opts.router, maxQueue: opts.maxQueue, graceMs: opts.shutdownGraceMs, metrics, onState })
    : null
  // POST and DELETE /models, GET /models/sse (router-admin.js).
  admin = router ? new RouterAdmin(router, { download: opts.router.download, remove: opts.router.remove, reload: () => reloadModels(router, opts) }) : null
  let single = router ? null : new Lane(engineOrPromise, { maxQueue: opts.maxQueue, metrics })
  let closing = false
  // llama-server's --sleep-idle-seconds (sleep.js).
  const sleep = new Sleep({
    ms: router ? 0 : opts.sleepIdleMs ?? 0,
    reloadEngine: opts.reloadEngine,
    maxQueue: opts.maxQueue,
    metrics,
    lane: () => single,
    setLane: (lane) => (single = lane),
    closing: () => closing,
  })
  /** A request under the server's defaults (serve's --temp, --reasoning…) and llama-server's date_string. */
  const serverRequest = (request) => withTemplateDate(withDefaults(request, opts.requestDefaults))
  let shutdown = null
  const responses = new ResponseStore({ max: opts.responsesMax, maxBytes: opts.responsesMaxBytes, file: opts.responsesFile })
  // Generations under an X-Conversation-Id (streams.js).
  const streams = new StreamSessions()

  /** What /metrics reads: each loaded engine's status and queue, and the requests waiting for a model to load. */
  const scrape = () => {
    const lanes = router ? router.lanes() : [single]
    return {
      lanes: lanes.map((lane) => ({ name: lane.name, status: lane.status(), queue: lane.queue, loras: lane.engine ? lane.loras() : [] })),
      loading: router ? router.waiting : 0,
      modelName: router ? null : opts.modelName ?? single.engine?.status().model ?? 'unknown',
    }
  }

  function health(exchange, cors) {
    const send = (status, body) => exchange.send(status, { 'Content-Type': 'application/json; charset=utf-8', ...cors }, JSON.stringify(body))
    if (closing) return send(503, { status: 'unavailable' })
    // Many models: ready whenever it is not closing (models load on demand).
    if (router) return send(200, { status: 'ok', models: router.list().map(({ name, state }) => ({ id: name, state })) })
    if (single.loadError) return send(500, { status: 'error', error: openaiErrorBody(toApiError(single.loadError)).error })
    if (!single.engine) return send(503, { status: 'loading' })
    const st = single.engine.status()
    if (st.disposed) return send(503, { status: 'unavailable' })
    // An isolated engine whose process died: a new one is loading.
    if (st.isolation?.restarting) return send(503, { status: 'restarting', restarts: st.isolation.restarts })
    return send(200, { status: 'ok' })
  }

  /** Serves one exchange. `next`, when given, gets what this server does not serve. */
  async function handle(exchange, next) {
    const t0 = performance.now()
    const cors = corsHeaders(opts, exchange)
    const key = `${exchange.method} ${exchange.path}`
    const found = findRoute(exchange.method, exchange.path)
    const route = found.route
    // A generation under an X-Conversation-Id: kept in a session, resumable (streams.js).
    const conversation = route?.generation && exchange.method === 'POST' ? exchange.header('x-conversation-id') : undefined
    if (conversation) exchange = streams.tee(conversation, exchange)
    const own = router && ROUTER_ROUTES.has(key)
    const known = found.known || OWN_PATHS.has(exchange.path) || own
    // Metrics name a route with parameters by its pattern, never by the id.
    let endpoint = known ? found.pattern : 'other'
    // The protocol shapes the errors: the route's, else the one claiming the path.
    const protocol = route?.protocol ?? protocolOf(exchange.path)
    // The body, read once (the router reads `model` before the route reads the rest).
    let bodyValue = null
    const readValue = () => (bodyValue ??= readJsonValue(exchange))
    const readObject = async () => jsonObject(await readValue())
    let lane = single
    let held = null
    let woke = false
    // Waiting for the router to load the model.
    let acquiring = false
    // The model the request names (the router's pick; an adapter's name picks the adapter).
    let requested
    const ctx = {
      engine: null,
      started,
      paramOf: undefined,
      onStreamError: null,
      modelName: () => requested ?? opts.modelName ?? lane?.engine?.status().model ?? 'unknown',
      /** Aborts when the client goes away (or, for a generation under an X-Conversation-Id, on its stop). */
      signal: exchange.signal,
      server: {
        /** The Responses API's kept responses (`store`). */
        responses,
        /** The resumable streams (X-Conversation-Id). */
        streams,
        /** Where POST /slots/{id}?action=save|restore reads and writes (llama-server's --slot-save-path). */
        slotSavePath: opts.slotSavePath,
        /** GET /slots answers (llama-server's --no-slots: 501). */
        slots: opts.slots !== false,
        /** Asleep (--sleep-idle-seconds): the engine is unloaded until a request wakes it. */
        get sleeping() {
          return sleep.asleep
        },
        /** Every answer carries `__verbose` (serve --verbose), as llama-server's. */
        verbose: opts.verbose === true,
        /** GET /metrics answers (serve without --metrics: 501, as llama-server). */
        metrics: opts.metrics !== false,
        /** The engine's LoRA adapters, `[{ id, name, path, scale }]`, with the scales POST /lora-adapters set. */
        loras: () => lane?.loras() ?? [],
        /** Sets the scales requests without `lora` get (a Map id -> scale naming every adapter). */
        setLoraScales: (scales) => lane.setLoraScales(scales),
        /** Every model a request may name: the router's, else this engine's and its adapters'. */
        models: () =>
          router
            ? router.list()
            : [
                {
                  name: ctx.modelName(),
                  state: 'loaded',
                  aliases: opts.modelAliases ?? [ctx.modelName()],
                  tags: opts.modelTags ?? [],
                  status: lane.engine?.status(),
                },
                ...lane.loras().map((l) => ({ name: l.name, state: 'loaded', parent: ctx.modelName() })),
              ],
      },
      params: found.params,
      query: exchange.query ?? new URLSearchParams(),
      body: readObject,
      /** The body as JSON, whatever its value (POST /lora-adapters takes an array). */
      bodyValue: readValue,
      json(status, body, headers = {}) {
        exchange.send(status, { 'Content-Type': 'application/json; charset=utf-8', ...cors, ...headers }, JSON.stringify(body))
      },
      /** An answer as it is (a 204). */
      send(status, headers, text) {
        exchange.send(status, { ...cors, ...headers }, text)
      },
      /** A streamed answer of raw text or bytes: `{ write(chunk), end() }`. */
      stream(status, headers) {
        exchange.open(status, { ...cors, ...headers })
        return { write: (chunk) => exchange.write(chunk), end: () => exchange.end() }
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
      /** The request under the server's defaults (serve's --temp, --reasoning…). */
      withDefaults: serverRequest,
      /** The text a request's prompt is (a chat's messages rendered as the engine renders them). */
      promptText(request) {
        request = serverRequest(request)
        if (Array.isArray(request.messages)) return lane.engine.applyChatTemplate(request.messages, templateOptions(request))
        if (typeof request.prompt === 'string') return request.prompt
        if (Array.isArray(request.prompt)) return request.prompt.map((x) => (typeof x === 'string' ? x : lane.engine.detokenize([x]))).join('')
        return ''
      },
      async generate(request, onEvent) {
        request = textTokens(serverRequest(request), lane.engine)
        request = await serverMedia(request, { allowRemote: opts.allowRemoteMedia === true, mediaPath: opts.mediaPath, signal: exchange.signal })
        return lane.generate(exchange, t0, lane.engineRequest(request, requested), onEvent)
      },
      embed: (input, embedOptions) => lane.embed(exchange, input, embedOptions),
    }
    let status = 200
    try {
      if (exchange.method === 'OPTIONS') {
        // Answered before the key is checked: browsers send no Authorization on a preflight.
        const headers = preflightHeaders(opts, exchange)
        if (headers) {
          endpoint = 'preflight'
          return exchange.send(200, { ...headers, 'Content-Type': 'text/plain; charset=utf-8' }, '')
        }
      }
      if (!route && !own && !(known && (key === 'GET /health' || key === 'GET /v1/health' || key === 'GET /metrics'))) {
        if (typeof next === 'function') {
          endpoint = null // not ours: not counted
          return next()
        }
        throw known
          ? new ApiError(405, `${exchange.method} is not allowed on ${exchange.path}`, { code: 'METHOD_NOT_ALLOWED' })
          : new ApiError(404, `no endpoint ${exchange.path}`, { code: 'NOT_FOUND', type: 'not_found_error' })
      }
      if (key === 'GET /health' || key === 'GET /v1/health') return health(exchange, cors)
      if (keyDigests && !authorized(exchange, keyDigests)) {
        throw new ApiError(401, 'a valid API key is required: Authorization: Bearer <key>, or x-api-key: <key>', {
          code: 'INVALID_API_KEY',
          type: 'authentication_error',
        })
      }
      if (key === 'GET /metrics') {
        if (opts.metrics === false) {
          throw new ApiError(501, 'This server does not support metrics endpoint (start it with --metrics)', { code: 'NOT_SUPPORTED', type: 'not_supported_error' })
        }
        const headers = { 'Content-Type': 'text/plain; version=0.0.4; charset=utf-8', 'Process-Start-Time-Unix': String(started), ...cors }
        // Asleep: the last scrape taken after the last generation, as it
        // was (nothing has run since); else a scrape now.
        const frozen = sleep.metricsWhileAsleep()
        if (frozen) return exchange.send(200, headers, frozen)
        const text = metrics.render(scrape())
        sleep.scraped(text)
        return exchange.send(200, headers, text)
      }
      if (closing) throw new ApiError(503, 'the server is shutting down', { code: 'SHUTTING_DOWN', type: 'server_error', close: true })
      if (own && !(key === 'GET /props' && ctx.query.get('model'))) return await routerRoute(key, ctx, router, opts, admin)
      if (router && (key === 'GET /v1/models' || key === 'GET /models') && /^(1|true)$/.test(ctx.query.get('reload') ?? '')) await reloadModels(router, opts)
      if (router && !NO_ENGINE_ROUTES.has(`${exchange.method} ${found.pattern}`) && !(key === 'GET /v1/models' || key === 'GET /models')) {
        // The model: the body's `model` (POST), else ?model=.
        let name = ctx.query.get('model') ?? undefined
        if (exchange.method === 'POST') {
          const value = await readValue()
          if (value && typeof value === 'object' && !Array.isArray(value) && value.model != null) name = value.model
        }
        requested = router.resolve(name)
        const autoload = ctx.query.get('autoload')
        // A resume while the model loads is answered "retry later".
        acquiring = true
        if (exchange.session) exchange.session.loading = true
        held = lane = await router.acquire(requested, exchange.signal, autoload === null ? {} : { autoload: /^(1|true)$/.test(autoload) })
        acquiring = false
        if (exchange.session) exchange.session.loading = false
        // llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING (its router's tests): the model stays busy 2 s more.
        if (FAKE_TIMING) await new Promise((r) => setTimeout(r, 2000))
      } else if (!router && !NO_ENGINE_ROUTES.has(`${exchange.method} ${found.pattern}`)) {
        if (sleep.wakes(key)) {
          woke = true
          await sleep.enter()
          lane = single
        }
        if (single.loadError) throw single.loadError
        if (!single.engine) throw new ApiError(503, 'the model is still loading', { code: 'LOADING', type: 'server_error' })
        if (exchange.method === 'POST' && route && !NO_ENGINE_ROUTES.has(`${exchange.method} ${found.pattern}`)) {
          // `model` naming an adapter answers with that name (and runs that adapter).
          const value = await readValue().catch(() => null)
          if (value && typeof value === 'object' && lane.isAdapter(value.model)) requested = value.model
        }
      }
      ctx.engine = lane?.engine ?? null
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
      if (exchange.session) exchange.session.loading = false
      if (exchange.session?.cancelled && !exchange.headersSent) {
        // Stopped (DELETE /v1/stream) before its answer began: the client, if still there, hears why.
        const stopped = new ApiError(400, `request cancelled by a stop${acquiring ? ' while the model was loading' : ''}`, { code: 'CANCELLED' })
        return exchange.send(400, { 'Content-Type': 'application/json; charset=utf-8', ...cors, 'x-should-retry': 'false' }, JSON.stringify(protocol.errorBody(stopped)))
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
      exchange.settle?.()
      if (held) router.release(held)
      if (woke) sleep.leave()
      if (endpoint !== null) metrics.request(endpoint, status)
    }
  }

  /**
   * Stops serving: new requests and those waiting in the queue get 503;
   * running generations may finish for `graceMs`, then are aborted (they
   * end as a generation cut short does). Resolves when none runs (and, with
   * many models, every engine is disposed).
   */
  function close({ graceMs = opts.shutdownGraceMs } = {}) {
    if (shutdown) return shutdown
    closing = true
    shutdown = (async () => {
      admin?.close()
      if (router) await router.close(graceMs)
      else await single.drain(graceMs)
      // What the Responses API keeps, on disk before the process may end.
      await responses.close().catch(() => {})
      streams.close()
    })()
    return shutdown
  }

  return {
    handle,
    close,
    limits,
    options: opts,
    metrics,
    responses,
    router,
    get engine() {
      return single?.engine ?? null
    },
  }
}

/**
 * The server's defaults (llama-server's --temp, --seed, -n, --spec-*…)
 * under a request's own fields: a field the request leaves out takes the
 * default; `speculative` and `chat_template_kwargs` merge key by key. `n_predict` is also a
 * limit, as llama-server's -n is: a request asking for more (or for no
 * limit, -1) gets the server's.
 */
function withDefaults(request, defaults) {
  if (!defaults || request === null || typeof request !== 'object') return request
  const out = { ...request }
  for (const [k, v] of Object.entries(defaults)) {
    const merge = (k === 'speculative' || k === 'chat_template_kwargs') && out[k] !== null && typeof out[k] === 'object' && !Array.isArray(out[k])
    if (merge) out[k] = { ...v, ...out[k] }
    else if (out[k] === undefined) out[k] = v
    else if (k === 'n_predict' && v >= 0 && Number.isInteger(out[k]) && (out[k] < 0 || out[k] > v)) out[k] = v
  }
  return out
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec']

/**
 * llama-server's template variable `date_string`, today as "03 Dec 2026"
 * (Llama 3.x's templates print it; they default to 26 Jul 2024 without
 * it), under a chat request's own chat_template_kwargs. (`datetime`, the
 * other, the engine sets everywhere.)
 */
function withTemplateDate(request) {
  if (request === null || typeof request !== 'object' || !Array.isArray(request.messages)) return request
  const kwargs = request.chat_template_kwargs
  if (kwargs != null && (typeof kwargs !== 'object' || Array.isArray(kwargs) || 'date_string' in kwargs)) return request
  const now = new Date()
  const date_string = `${String(now.getDate()).padStart(2, '0')} ${MONTHS[now.getMonth()]} ${now.getFullYear()}`
  return { ...request, chat_template_kwargs: { date_string, ...kwargs } }
}

/**
 * What llama-server tokenizes for the client: `logit_bias` entries keyed
 * by text (`[["hello", -1]]`, `{ "hello": -1 }`: every token of the text
 * gets the bias) and a prompt of token ids with strings among them.
 */
function textTokens(request, engine) {
  if (request === null || typeof request !== 'object' || !engine) return request
  let out = request
  const tokens = (text) => engine.tokenize(text, { addBos: false, special: false })
  const lb = request.logit_bias
  const isText = (k) => typeof k === 'string' && !/^\s*-?\d+\s*$/.test(k)
  if (Array.isArray(lb) && lb.some((e) => Array.isArray(e) && isText(e[0]))) {
    out = { ...out, logit_bias: lb.flatMap((e) => (Array.isArray(e) && isText(e[0]) ? tokens(e[0]).map((id) => [id, e[1]]) : [e])) }
  } else if (lb !== null && typeof lb === 'object' && !Array.isArray(lb) && Object.keys(lb).some(isText)) {
    out = { ...out, logit_bias: Object.entries(lb).flatMap(([k, v]) => (isText(k) ? tokens(k).map((id) => [id, v]) : [[Number(k), v]])) }
  }
  const p = request.prompt
  if (Array.isArray(p) && p.some((x) => typeof x === 'string') && p.some(Number.isInteger) && p.every((x) => typeof x === 'string' || Number.isInteger(x))) {
    out = { ...out, prompt: p.flatMap((x) => (typeof x === 'string' ? engine.tokenize(x, { addBos: false, special: true }) : [x])) }
  }
  return out
}

const FAKE_TIMING = Boolean(process.env.LLAMA_SERVER_DEBUG_FAKE_TIMING)

/** The router's own endpoints (llama.cpp's router mode names). */
const ROUTER_ROUTES = new Set(['POST /models/load', 'POST /models/unload', 'POST /models/reload', 'GET /props', 'GET /models/sse', 'POST /models', 'DELETE /models'])

async function routerRoute(key, ctx, router, opts, admin) {
  if (key === 'GET /models/sse') return admin.sse(ctx)
  if (key === 'POST /models') return admin.add(ctx)
  if (key === 'DELETE /models') return admin.delete(ctx)
  if (key === 'POST /models/reload') {
    await reloadModels(router, opts)
    return ctx.json(200, { success: true, models: router.list().map((m) => m.name) })
  }
  if (key === 'GET /props') {
    // The router's own (llama-server's), or with ?model= that model's.
    return ctx.json(200, {
      role: 'router',
      max_instances: Number.isFinite(router.modelsMax) ? router.modelsMax : 0,
      models_autoload: router.autoload,
      model_alias: 'llama-engine',
      model_path: 'none',
      default_generation_settings: { params: {}, n_ctx: 0 },
      build_info: systemFingerprint(),
      endpoint_slots: opts.slots !== false,
      endpoint_metrics: opts.metrics !== false,
    })
  }
  const body = await ctx.body()
  if (typeof body.model !== 'string' || body.model === '') throw new ApiError(400, 'model: expected the name of a model', { param: 'model' })
  const name = router.resolve(body.model)
  if (key === 'POST /models/load') {
    await router.load(name)
    return ctx.json(200, { success: true, model: name, state: 'loaded' })
  }
  const unloaded = await router.unload(name)
  return ctx.json(200, { success: true, model: name, state: 'unloaded', was_loaded: unloaded })
}

/** GET /models?reload=1, POST /models/reload: the list read again (serve: the cache, --models-dir, the preset). */
async function reloadModels(router, opts) {
  if (typeof opts.router.reload !== 'function') return
  await router.sync(await opts.router.reload())
}

module.exports = { createCore, serverOptions }
