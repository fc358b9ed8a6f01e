'use strict'
// llama-server's --sleep-idle-seconds over one model: after `ms` without a
// request, the engine is disposed (its memory given back). Read-only
// requests (/health, /props, /v1/models, /slots, /metrics) are answered
// from what it was — its status, and /metrics the last scrape taken since
// the last generation — and any other request loads it again
// (`reloadEngine`) and is served once it is loaded.

const { Lane } = require('./lane.js')

// What a sleeping server answers without loading its model again.
const READ_ONLY = new Set(['GET /health', 'GET /v1/health', 'GET /props', 'GET /models', 'GET /v1/models', 'GET /slots', 'GET /metrics'])

class Sleep {
  /**
   * @param {{ ms: number, reloadEngine?: () => Promise<object>, maxQueue: number, metrics: import('./metrics.js').Metrics,
   *   lane: () => Lane, setLane: (lane: Lane) => void, closing: () => boolean }} options
   *   `lane`/`setLane`: the server's one lane, read and replaced.
   */
  constructor({ ms, reloadEngine, maxQueue, metrics, lane, setLane, closing }) {
    Object.assign(this, { ms, reloadEngine, maxQueue, metrics, lane, setLane, closing })
    /** The engine's status when it went to sleep; null while awake. */
    this.status = null
    this.timer = null
    this.waking = null
    /** Requests that hold it awake. */
    this.active = 0
    this.lastScrape = null
    this.metricsText = null
    if (ms > 0) this.lane().ready.then(() => this.#arm())
  }

  get asleep() {
    return this.status !== null
  }

  /** Whether a request for `key` ("METHOD /path") keeps it awake (and wakes it). */
  wakes(key) {
    return this.ms > 0 && !READ_ONLY.has(key)
  }

  /** A request that needs the engine begins: awake it (loading it again if it slept). */
  async enter() {
    this.active++
    clearTimeout(this.timer)
    if (this.status) await this.#wake()
  }

  /** That request ended: the idle timer starts once none is left. */
  leave() {
    this.active--
    this.#arm()
  }

  /** GET /metrics: asleep, the last scrape taken since the last generation, as it was; else null (scrape now, `scraped`). */
  metricsWhileAsleep() {
    return this.status && this.metricsText ? this.metricsText : null
  }

  scraped(text) {
    if (!this.status) this.lastScrape = { text, generations: this.metrics.generations }
  }

  #arm() {
    if (this.ms <= 0 || this.closing() || this.active > 0 || this.status || !this.lane().engine) return
    clearTimeout(this.timer)
    this.timer = setTimeout(() => this.#sleep().catch(() => {}), this.ms)
    this.timer.unref?.()
  }

  async #sleep() {
    const old = this.lane()
    if (this.active > 0 || this.status || this.closing() || !old.engine) return
    this.status = { ...old.engine.status(), disposed: false }
    this.metricsText = this.lastScrape?.generations === this.metrics.generations ? this.lastScrape.text : null
    const stub = { status: () => this.status, loras: () => [], dispose: async () => {} }
    const lane = new Lane(stub, { maxQueue: this.maxQueue, metrics: this.metrics })
    lane.loraScales = old.loraScales
    lane.adapters = old.adapters
    this.setLane(lane)
    await old.drain(0)
    await old.engine.dispose().catch(() => {})
  }

  #wake() {
    this.waking ??= (async () => {
      const lane = new Lane(this.reloadEngine(), { maxQueue: this.maxQueue, metrics: this.metrics })
      await lane.ready
      if (lane.loadError) throw lane.loadError
      lane.loraScales = this.lane().loraScales
      this.setLane(lane)
      this.status = null
    })().finally(() => (this.waking = null))
    return this.waking
  }
}

module.exports = { Sleep }
