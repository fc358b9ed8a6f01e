'use strict'
// The server's own admission queue in front of the engine: at most
// `concurrency` requests are in the engine at once (its slots), at most
// `maxQueue` wait here, FIFO. A full queue answers 429 with Retry-After;
// a closing server answers the waiting ones 503. Knowing which requests
// wait and which run is what lets shutdown treat them differently.

const { ApiError } = require('./errors.js')

class AdmissionQueue {
  #waiting = []
  #running = 0
  #closed = false
  // Seconds a request holds its slot, smoothed: for Retry-After.
  #meanSeconds = 1

  /** @param {{ concurrency: () => number, maxQueue: number }} options */
  constructor({ concurrency, maxQueue }) {
    this.concurrency = concurrency
    this.maxQueue = maxQueue
  }

  get waiting() {
    return this.#waiting.length
  }

  get running() {
    return this.#running
  }

  /**
   * Waits for a slot; resolves with `release()`. Rejects 429 when the queue
   * is full, 503 when the server is closing, and with the signal's reason
   * when the client leaves while waiting.
   */
  acquire(signal) {
    if (this.#closed) return Promise.reject(closing())
    if (signal?.aborted) return Promise.reject(new ApiError(499, 'the client went away', { code: 'ABORTED' }))
    if (this.#running < this.concurrency() && this.#waiting.length === 0) return Promise.resolve(this.#grant())
    if (this.#waiting.length >= this.maxQueue) {
      const seconds = this.retryAfter()
      return Promise.reject(
        new ApiError(429, `the server is busy: ${this.#waiting.length} requests are waiting (maxQueue ${this.maxQueue}); retry in ${seconds} s`, {
          type: 'rate_limit_error',
          code: 'QUEUE_FULL',
          headers: { 'Retry-After': String(seconds) },
        }),
      )
    }
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject, signal, onAbort: null }
      entry.onAbort = () => {
        const i = this.#waiting.indexOf(entry)
        if (i >= 0) this.#waiting.splice(i, 1)
        reject(new ApiError(499, 'the client went away', { code: 'ABORTED' }))
      }
      signal?.addEventListener('abort', entry.onAbort, { once: true })
      this.#waiting.push(entry)
    })
  }

  /** Whole seconds until a place is likely free: the queue ahead, served `concurrency` at a time. */
  retryAfter() {
    const ahead = this.#waiting.length + 1
    return Math.min(60, Math.max(1, Math.ceil((this.#meanSeconds * ahead) / Math.max(1, this.concurrency()))))
  }

  /** Refuses new requests and answers every waiting one 503. */
  close() {
    this.#closed = true
    for (const entry of this.#waiting.splice(0)) {
      entry.signal?.removeEventListener('abort', entry.onAbort)
      entry.reject(closing())
    }
  }

  #grant() {
    this.#running++
    const started = Date.now()
    let released = false
    return () => {
      if (released) return
      released = true
      this.#running--
      this.#meanSeconds = 0.8 * this.#meanSeconds + 0.2 * ((Date.now() - started) / 1000)
      this.#next()
    }
  }

  #next() {
    while (this.#waiting.length > 0 && this.#running < this.concurrency()) {
      const entry = this.#waiting.shift()
      entry.signal?.removeEventListener('abort', entry.onAbort)
      entry.resolve(this.#grant())
    }
  }
}

const closing = () => new ApiError(503, 'the server is shutting down', { type: 'server_error', code: 'SHUTTING_DOWN', close: true })

module.exports = { AdmissionQueue }
