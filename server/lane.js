'use strict'
// One engine as the server serves it: the engine (or the promise of one
// while it loads), its admission queue, the generations running in it, and
// the LoRA scales POST /lora-adapters set for it. The server over one model
// has one lane; the router (router.js) one per model it has loaded.

const { performance } = require('node:perf_hooks')
const { ApiError } = require('./errors.js')
const { AdmissionQueue } = require('./queue.js')
const { anySignal } = require('./util.js')

/** An adapter's name: its file's, without the directory and `.gguf` (`model` may name it). */
const adapterName = (path) =>
  String(path)
    .replace(/^.*[\\/]/, '')
    .replace(/\.gguf$/i, '')

class Lane {
  /**
   * @param {object} engineOrPromise a LlamaEngine, or a promise of one
   * @param {{ name?: string, maxQueue: number, metrics: import('./metrics.js').Metrics }} options
   */
  constructor(engineOrPromise, { name, maxQueue, metrics }) {
    this.name = name
    this.metrics = metrics
    this.engine = engineOrPromise && typeof engineOrPromise.then === 'function' ? null : engineOrPromise
    this.loadError = null
    this.ready = Promise.resolve(engineOrPromise).then(
      (e) => (this.engine = e),
      (e) => {
        this.loadError = e
      },
    )
    this.queue = new AdmissionQueue({ concurrency: () => this.engine?.status().parallel || 1, maxQueue })
    /** AbortController -> the generation's promise. */
    this.running = new Map()
    // id -> scale for every adapter (POST /lora-adapters), given to each
    // generation that names none; null until then (the load scales apply).
    this.loraScales = null
    /** The adapters the engine loaded (`loras()`), once it is loaded. */
    this.adapters = null
    /** Requests holding this lane (waiting, queued or running): the router unloads none held. */
    this.holds = 0
    this.lastUsed = Date.now()
  }

  /** The engine's status, or null while it loads (or once disposed). */
  status() {
    if (!this.engine) return null
    const st = this.engine.status()
    return st.disposed ? null : st
  }

  /** The engine's LoRA adapters, `[{ id, name, path, scale }]`, with the scales POST /lora-adapters set. */
  loras() {
    // Fixed at load: read once (status() is a whole snapshot), not per request.
    this.adapters ??= this.engine ? (this.engine.status().loras ?? []).map(({ id, path, scale }) => ({ id, name: adapterName(path), path, scale })) : null
    if (!this.adapters) return []
    return this.adapters.map((a) => (this.loraScales?.has(a.id) ? { ...a, scale: this.loraScales.get(a.id) } : a))
  }

  setLoraScales(scales) {
    this.loraScales = scales
  }

  /**
   * The request as the engine gets it. `model` naming one of the adapters
   * (as the gateway's model server protocol asks, and vLLM's
   * `--lora-modules`): that adapter at scale 1, the others at 0. Else the
   * scales of POST /lora-adapters when the request names none.
   */
  engineRequest(request, model) {
    if (request === null || typeof request !== 'object' || request.lora != null) return request
    if (typeof model === 'string') {
      const loras = this.loras()
      const picked = loras.find((l) => l.name === model)
      if (picked) return { ...request, lora: loras.map(({ id }) => ({ id, scale: id === picked.id ? 1 : 0 })) }
    }
    if (!this.loraScales || this.loraScales.size === 0) return request
    return { ...request, lora: [...this.loraScales].map(([id, scale]) => ({ id, scale })) }
  }

  /** Whether `model` names one of this engine's adapters. */
  isAdapter(model) {
    return typeof model === 'string' && this.loras().some((l) => l.name === model)
  }

  /** Runs one engine request through the queue, with the client's signal, measured. */
  async generate(exchange, t0, request, onEvent) {
    const release = await this.queue.acquire(exchange.signal)
    const ac = new AbortController()
    const signal = anySignal([exchange.signal, ac.signal])
    const metrics = this.metrics
    let last = null
    const promise = this.engine.complete(
      request,
      (event) => {
        const n = event.type === 'token' ? event.tokens.length : 0
        // A step that verified a draft (llama-server's spec_decode_num_drafts_total).
        if (n > 0 && event.n_drafted > 0) metrics.llama.verifySteps++
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
    this.running.set(ac, promise)
    try {
      const result = await promise
      metrics.generation(result)
      if (ac.signal.aborted) {
        throw new ApiError(503, 'the server shut down before this request finished', { code: 'SHUTTING_DOWN', type: 'server_error', close: true })
      }
      return result
    } finally {
      this.running.delete(ac)
      this.lastUsed = Date.now()
      release()
    }
  }

  /** Runs an embedding request through the same queue. */
  async embed(exchange, input, embedOptions) {
    const release = await this.queue.acquire(exchange.signal)
    try {
      const result = await this.engine.embed(input, embedOptions)
      this.metrics.embeddingTokens += result.tokens ?? 0
      // llama-server counts an embedding's input as prompt tokens processed.
      this.metrics.llama.prompt += result.tokens ?? 0
      return result
    } finally {
      this.lastUsed = Date.now()
      release()
    }
  }

  /** Refuses new requests, answers the waiting ones 503; running ones may finish for `graceMs`, then are aborted. */
  async drain(graceMs) {
    this.queue.close()
    const settled = () => Promise.allSettled([...this.running.values()])
    let timer
    await Promise.race([settled(), new Promise((r) => (timer = setTimeout(r, graceMs)))])
    clearTimeout(timer)
    for (const ac of this.running.keys()) ac.abort()
    await settled()
  }
}

module.exports = { Lane, adapterName }
