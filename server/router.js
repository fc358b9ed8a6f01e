'use strict'
// Many models behind one server (`serve --models DIR`, `--model ALIAS=URI`):
// the request's `model` picks one; a model not loaded is loaded on demand
// (each engine isolated in its own child process), at most `modelsMax` at
// once and at most `memoryMax` bytes by inspectModel's estimate, the least
// recently used idle one unloaded first; `idleUnloadMs` unloads a model no
// request used for that long; pinned models load at start and stay.
// Requests for a model that is loading wait (at most `maxQueue` of them),
// and count as queued in /metrics; a load that no request waits for any
// more (its clients left) is given up before it unloads anything. With
// `autoload: false` only POST /models/load loads (llama-server's
// --no-models-autoload). `sync` replaces the list (GET /models?reload=1).
// `hidden` models are left out of the list and still served.

const { ApiError } = require('./errors.js')
const { Lane } = require('./lane.js')

class Router {
  #entries = new Map() // name -> entry
  #lock = Promise.resolve() // room is made for one load at a time
  #changed = [] // resolvers woken when a lane is released or unloaded
  #closed = false
  /** Requests waiting for their model to load (or for room to load it). */
  waiting = 0

  /**
   * @param {{ name: string, uri: string, options?: object, pinned?: boolean }[]} models
   * @param {{ modelsMax?: number, memoryMax?: number, idleUnloadMs?: number, maxQueue: number, graceMs?: number,
   *   metrics: object, load: (model) => Promise<object>, estimate: (model) => Promise<number> }} options
   *   `load` makes the engine of a model (`{ name, uri, options }`); `estimate` its bytes.
   */
  constructor(models, { modelsMax = Infinity, memoryMax = Infinity, idleUnloadMs = 0, autoload = true, maxQueue, graceMs = 10_000, metrics, load, estimate, onState }) {
    if (!Array.isArray(models)) throw new TypeError('models: expected an array of models')
    for (const m of checked(models)) this.#entries.set(m.name, newEntry(m))
    Object.assign(this, { modelsMax, memoryMax, idleUnloadMs, autoload, maxQueue, graceMs, metrics, loadEngine: load, estimate, onState })
    for (const e of this.#entries.values()) if (e.pinned) this.#ensureLoaded(e).catch(() => {})
  }

  /**
   * Replaces the list of models: new ones are added, gone ones unloaded
   * (their requests finish for the grace period) and removed, the others
   * kept as they are (loaded or not), their listing (`hidden`) updated.
   */
  async sync(models) {
    const next = new Map(checked(models).map((m) => [m.name, m]))
    const gone = [...this.#entries.values()].filter((e) => !next.has(e.name))
    for (const [name, m] of next) {
      const e = this.#entries.get(name)
      if (!e) {
        this.#entries.set(name, newEntry(m))
        if (m.pinned) this.#ensureLoaded(this.#entries.get(name)).catch(() => {})
      } else {
        e.hidden = m.hidden === true
        if (e.state === 'unloaded' || e.state === 'failed') Object.assign(e, { uri: m.uri, options: m.options, bytes: Number.isFinite(m.bytes) ? m.bytes : null })
      }
    }
    for (const e of gone) this.#entries.delete(e.name)
    this.#wake()
    await Promise.allSettled(
      gone.map(async (e) => {
        if (e.state === 'loading') await e.loading.catch(() => {})
        if (e.state === 'loaded') await this.#unload(e, this.graceMs)
      }),
    )
  }

  /** Names of every model, in order. */
  names() {
    return [...this.#entries.keys()]
  }

  has(name) {
    return this.#entries.has(name)
  }

  /** The loaded lanes (for /metrics). */
  lanes() {
    return [...this.#entries.values()].filter((e) => e.state === 'loaded').map((e) => e.lane)
  }

  /** Every model with its state, as GET /v1/models lists them (hidden ones left out). */
  list() {
    return [...this.#entries.values()].filter((e) => !e.hidden).map((e) => ({
      name: e.name,
      uri: e.uri,
      state: e.state,
      pinned: e.pinned,
      bytes: e.bytes,
      error: e.state === 'failed' && e.error ? { code: e.error.code ?? 'INTERNAL', message: e.error.message } : null,
      lastUsed: e.lane ? e.lane.lastUsed : null,
      requests: e.lane ? e.lane.holds : 0,
      // A loaded model's engine status (its sizes and media, for /v1/models).
      status: e.state === 'loaded' ? safeStatus(e.lane.engine) : undefined,
    }))
  }

  #entry(name) {
    if (typeof name !== 'string' || name === '') {
      if (this.#entries.size === 1) return this.#entries.values().next().value
      throw new ApiError(400, `model: name one of the models (${this.names().join(', ')})`, { param: 'model' })
    }
    const entry = this.#entries.get(name)
    if (!entry) {
      throw new ApiError(404, `the model ${JSON.stringify(name)} does not exist (this server has: ${this.names().join(', ')})`, {
        // OpenAI's type and code for it; Anthropic's shape says not_found_error (by the status).
        type: 'invalid_request_error',
        code: 'model_not_found',
        param: 'model',
      })
    }
    return entry
  }

  /** The name `model` resolves to (the only model when there is one and none is named). */
  resolve(name) {
    return this.#entry(name).name
  }

  /**
   * The lane of model `name`, loaded if it was not, held until `release`.
   * Rejects 404 for a model this server does not have, 429 when too many
   * requests wait for loads, and with the load's error when it fails.
   */
  async acquire(name, signal, { autoload = this.autoload } = {}) {
    const entry = this.#entry(name)
    if (this.#closed) throw closing()
    if (!autoload && entry.state !== 'loaded' && entry.state !== 'loading') {
      throw new ApiError(400, `model is not loaded: ${JSON.stringify(entry.name)} (this server loads models on POST /models/load only)`, {
        type: 'invalid_request_error',
        code: 'MODEL_NOT_LOADED',
        param: 'model',
      })
    }
    // Wanted: a model loaded for waiting requests is not unloaded to make
    // room for another before they hold it (two loads would otherwise
    // evict each other as each finished, and neither request be answered).
    entry.wanted++
    try {
      while (entry.state !== 'loaded') {
        if (this.#closed) throw closing()
        if (this.waiting >= this.maxQueue) {
          throw new ApiError(429, `the server is busy: ${this.waiting} requests are waiting for models to load (maxQueue ${this.maxQueue})`, {
            type: 'rate_limit_error',
            code: 'QUEUE_FULL',
            headers: { 'Retry-After': '5' },
          })
        }
        this.waiting++
        try {
          await withSignal(this.#ensureLoaded(entry), signal)
        } catch (e) {
          // A load given up just before this request came: load it again.
          if (e !== ABANDONED) throw e
        } finally {
          this.waiting--
        }
      }
      const lane = entry.lane
      lane.holds++
      lane.lastUsed = Date.now()
      clearTimeout(entry.timer)
      return lane
    } finally {
      entry.wanted--
      // No longer wanted (held, failed or gone): a load waiting for room may take it.
      this.#wake()
    }
  }

  /** Gives back what `acquire` held; an idle model may then be unloaded. */
  release(lane) {
    lane.holds--
    lane.lastUsed = Date.now()
    const entry = [...this.#entries.values()].find((e) => e.lane === lane)
    if (entry && lane.holds === 0 && !entry.pinned && this.idleUnloadMs > 0) {
      clearTimeout(entry.timer)
      entry.timer = setTimeout(() => {
        if (entry.lane === lane && lane.holds === 0 && entry.state === 'loaded') this.#unload(entry, 0).catch(() => {})
      }, this.idleUnloadMs)
      entry.timer.unref?.()
    }
    this.#wake()
  }

  /** POST /models/load: loads `name` (making room as a request would); resolves when it is loaded. */
  async load(name) {
    const entry = this.#entry(name)
    if (this.#closed) throw closing()
    entry.explicit++
    try {
      await this.#ensureLoaded(entry)
    } finally {
      entry.explicit--
    }
    return entry.state
  }

  /** POST /models/unload: queued requests get 503, running ones finish (for the grace period), then the engine is disposed. */
  async unload(name) {
    const entry = this.#entry(name)
    if (entry.state === 'loading') await entry.loading.catch(() => {})
    if (entry.state !== 'loaded') return false
    await this.#unload(entry, this.graceMs)
    return true
  }

  /** Stops every model: as unload, all at once. */
  async close(graceMs = this.graceMs) {
    this.#closed = true
    this.#wake()
    await Promise.allSettled(
      [...this.#entries.values()].map(async (e) => {
        if (e.state === 'loading') await e.loading.catch(() => {})
        if (e.state === 'loaded') await this.#unload(e, graceMs)
      }),
    )
  }

  /** A model's state changes (`onState(name, state, error)`: GET /models/sse tells it). */
  #set(entry, state) {
    entry.state = state
    try {
      this.onState?.(entry.name, state, entry.error)
    } catch {}
  }

  #wake() {
    for (const resolve of this.#changed.splice(0)) resolve()
  }

  #ensureLoaded(entry) {
    if (entry.state === 'loaded') return Promise.resolve()
    if (entry.state === 'loading') return entry.loading
    this.#set(entry, 'loading')
    entry.error = null
    entry.loading = this.#load(entry)
    entry.loading.catch(() => {})
    return entry.loading
  }

  async #load(entry) {
    try {
      if (entry.bytes == null) entry.bytes = await this.estimate(entry)
      // One load makes room at a time; it counts as loaded from then on.
      const turn = this.#lock.then(() => this.#makeRoom(entry))
      this.#lock = turn.catch(() => {})
      await turn
      entry.admitted = true
      const lane = new Lane(this.loadEngine(entry), { name: entry.name, maxQueue: this.maxQueue, metrics: this.metrics })
      await lane.ready
      if (lane.loadError) throw lane.loadError
      if (this.#closed) {
        await lane.engine.dispose().catch(() => {})
        throw closing()
      }
      entry.lane = lane
      this.#set(entry, 'loaded')
      // A load waiting for room may now unload this one (say, loaded by POST /models/load and idle).
      this.#wake()
    } catch (e) {
      entry.admitted = false
      // Given up (nobody waits for it any more): not loaded, not failed.
      entry.error = e === ABANDONED ? null : e
      this.#set(entry, e === ABANDONED ? 'unloaded' : 'failed')
      this.#wake()
      throw e
    }
  }

  /** Unloads the least recently used idle models until `entry` fits; waits for one to go idle when none is. */
  async #makeRoom(entry) {
    for (;;) {
      if (this.#closed) throw closing()
      // Every request that wanted it left while it waited for room, and no
      // POST /models/load asked for it: nothing is unloaded for it.
      if (entry.wanted === 0 && entry.explicit === 0 && !entry.pinned) throw ABANDONED
      // What holds room: loaded models, and loads that were given room
      // (a load still waiting for its turn holds none: counting it would
      // have two loads wait for each other).
      const others = [...this.#entries.values()].filter((e) => e !== entry && (e.state === 'loaded' || (e.state === 'loading' && e.admitted)))
      const bytes = others.reduce((sum, e) => sum + (e.bytes ?? 0), 0)
      const fits = others.length + 1 <= this.modelsMax && bytes + entry.bytes <= this.memoryMax
      if (fits) return
      const pinned = others.filter((e) => e.pinned)
      const pinnedBytes = pinned.reduce((sum, e) => sum + (e.bytes ?? 0), 0)
      if (pinned.length + 1 > this.modelsMax || pinnedBytes + entry.bytes > this.memoryMax) {
        throw new ApiError(
          507,
          `the model ${JSON.stringify(entry.name)} (${entry.bytes} bytes by its estimate) does not fit beside the pinned models (${pinned.length}, ${pinnedBytes} bytes) within --models-max ${this.modelsMax} and --memory-max ${this.memoryMax}`,
          { type: 'server_error', code: 'MODEL_DOES_NOT_FIT' },
        )
      }
      const idle = others
        .filter((e) => e.state === 'loaded' && !e.pinned && e.lane.holds === 0 && e.wanted === 0)
        .sort((a, b) => a.lane.lastUsed - b.lane.lastUsed)
      if (idle.length > 0) {
        await this.#unload(idle[0], 0)
        continue
      }
      await new Promise((resolve) => this.#changed.push(resolve))
    }
  }

  async #unload(entry, graceMs) {
    const lane = entry.lane
    clearTimeout(entry.timer)
    this.#set(entry, 'unloaded')
    entry.admitted = false
    entry.lane = null
    try {
      await lane.drain(graceMs)
    } finally {
      await lane.engine.dispose().catch(() => {})
      this.#wake()
    }
  }
}

function safeStatus(engine) {
  try {
    return engine?.status()
  } catch {
    return undefined
  }
}

const ABANDONED = new ApiError(499, 'the load was given up: no request waits for the model any more', { code: 'ABORTED' })

function checked(models) {
  const names = new Set()
  for (const m of models) {
    if (!m || typeof m.name !== 'string' || m.name === '') throw new TypeError('models: each needs a name')
    if (names.has(m.name)) throw new TypeError(`models: ${JSON.stringify(m.name)} is named twice`)
    names.add(m.name)
  }
  return models
}

function newEntry(m) {
  return {
    ...m,
    pinned: m.pinned === true,
    hidden: m.hidden === true,
    state: 'unloaded',
    admitted: false,
    wanted: 0,
    explicit: 0,
    lane: null,
    bytes: Number.isFinite(m.bytes) ? m.bytes : null,
    error: null,
    loading: null,
    timer: null,
  }
}

const closing = () => new ApiError(503, 'the server is shutting down', { type: 'server_error', code: 'SHUTTING_DOWN', close: true })

/** `promise`, or a 499 as soon as the client goes away (the promise goes on). */
function withSignal(promise, signal) {
  if (!signal) return promise
  if (signal.aborted) return Promise.reject(new ApiError(499, 'the client went away', { code: 'ABORTED' }))
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(new ApiError(499, 'the client went away', { code: 'ABORTED' }))
    signal.addEventListener('abort', onAbort, { once: true })
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort))
  })
}

module.exports = { Router }
