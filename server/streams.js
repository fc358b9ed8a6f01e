'use strict'
// Resumable streams, as llama-server has them: a generation requested with
// an `X-Conversation-Id` header is kept in a session under that id. Its
// answer goes to the client and into the session's buffer; the client
// going away does not stop it (a page reloaded mid-answer), a stop does:
//
//   GET /v1/stream?conv_id=ID&from=N      the answer's bytes from offset N
//                                         (0: from the start), then the rest
//                                         as it comes, until it ends
//   DELETE /v1/stream?conv_id=ID          stops the generation and forgets
//                                         the session (204, whether or not
//                                         there was one)
//   POST /v1/streams/lookup               { conversation_ids: [...] } ->
//                                         [{ conversation_id, is_done,
//                                         total_bytes, started_at,
//                                         completed_at }] for those ids (and
//                                         "ID::model" ones): never a list of
//                                         ids the caller did not name
//
// One session per id (a new request under it stops the one before). A
// session keeps the last 4 MiB of its answer and is forgotten 5 minutes
// after it ended. An answer that is not a stream (a JSON body, an error
// before the stream began) leaves no session.

const { ApiError, openaiErrorBody } = require('./errors.js')

const MAX_BYTES = 4 * 1024 * 1024
const TTL_MS = 300_000
const GC_EVERY_MS = 60_000
/** Sessions kept at most; past it the oldest ended one is forgotten (live ones are bounded by the queues). */
const MAX_SESSIONS = 1024

const seconds = (ms) => Math.floor(ms / 1000)

class StreamSession {
  constructor(id) {
    this.id = id
    this.startedAt = Date.now()
    this.completedAt = 0
    this.chunks = []
    this.held = 0 // bytes in chunks
    this.dropped = 0 // bytes dropped from the front
    this.done = false
    this.cancelled = false
    /** True while the request waits for its model to load (a resume is answered 503, retry). */
    this.loading = false
    this.controller = new AbortController()
    this.waiters = new Set()
  }

  /** Bytes that ever entered the session. */
  get total() {
    return this.dropped + this.held
  }

  append(text) {
    if (this.done || text === '') return
    const chunk = Buffer.from(text)
    this.chunks.push(chunk)
    this.held += chunk.length
    while (this.held > MAX_BYTES) {
      const excess = this.held - MAX_BYTES
      const first = this.chunks[0]
      if (first.length <= excess) {
        this.chunks.shift()
        this.held -= first.length
        this.dropped += first.length
      } else {
        this.chunks[0] = first.subarray(excess)
        this.held -= excess
        this.dropped += excess
      }
    }
    this.#wake()
  }

  finalize() {
    if (this.done) return
    this.done = true
    this.completedAt = Date.now()
    this.#wake()
  }

  /** Stops the generation (its signal aborts) and ends the session. */
  cancel() {
    this.cancelled = true
    this.controller.abort()
    this.finalize()
  }

  #wake() {
    for (const w of this.waiters) w()
    this.waiters.clear()
  }

  /** The bytes held from `offset` on (one Buffer), or null when there are none yet. */
  from(offset) {
    if (offset >= this.total) return null
    let skip = offset - this.dropped
    const parts = []
    for (const c of this.chunks) {
      if (skip >= c.length) {
        skip -= c.length
        continue
      }
      parts.push(skip > 0 ? c.subarray(skip) : c)
      skip = 0
    }
    return Buffer.concat(parts)
  }

  /**
   * Writes the bytes from `offset` on with `write`, waiting for more until
   * the session ends or `signal` aborts.
   */
  async pipe(offset, write, signal) {
    for (;;) {
      if (signal?.aborted) return
      if (offset < this.dropped) return // fell behind what is kept: the reader restarts
      const bytes = this.from(offset)
      if (bytes) {
        offset += bytes.length
        write(bytes)
        continue
      }
      if (this.done) return
      await new Promise((resolve) => {
        const wake = () => {
          signal?.removeEventListener('abort', wake)
          this.waiters.delete(wake)
          resolve()
        }
        this.waiters.add(wake)
        signal?.addEventListener('abort', wake, { once: true })
      })
    }
  }

  describe() {
    return {
      conversation_id: this.id,
      is_done: this.done,
      total_bytes: this.total,
      started_at: seconds(this.startedAt),
      completed_at: seconds(this.completedAt),
    }
  }
}

class StreamSessions {
  constructor({ maxSessions = MAX_SESSIONS, ttlMs = TTL_MS } = {}) {
    this.sessions = new Map()
    this.maxSessions = maxSessions
    this.ttlMs = ttlMs
    this.timer = null
  }

  get(id) {
    return this.sessions.get(id)
  }

  /** A new session under `id`; the one it replaces is stopped. */
  create(id) {
    this.get(id)?.cancel()
    this.sessions.delete(id)
    if (this.sessions.size >= this.maxSessions) {
      const ended = [...this.sessions.values()].filter((s) => s.done).sort((a, b) => a.completedAt - b.completedAt)[0]
      if (ended) this.sessions.delete(ended.id)
    }
    const session = new StreamSession(id)
    this.sessions.set(id, session)
    this.#collect()
    return session
  }

  /** Forgets `session` (if it is still the one under its id), ending it. */
  evict(session) {
    if (this.sessions.get(session.id) === session) this.sessions.delete(session.id)
    session.finalize()
  }

  /** Stops and forgets the session under `id`, if any. */
  stop(id) {
    const session = this.sessions.get(id)
    if (!session) return false
    this.sessions.delete(id)
    session.cancel()
    return true
  }

  /** The sessions under the ids asked for, or under "ID::…" (a model's). */
  lookup(ids) {
    const out = []
    for (const id of ids) {
      for (const s of this.sessions.values()) if (s.id === id || s.id.startsWith(`${id}::`)) out.push(s.describe())
    }
    return out
  }

  /**
   * The exchange a generation under `id` answers through: what it writes
   * goes to the client (while connected) and into the session; its signal
   * aborts on a stop, not when the client goes away.
   */
  tee(id, exchange) {
    const session = this.create(id)
    const sessions = this
    let streamed = false
    return {
      method: exchange.method,
      path: exchange.path,
      get query() {
        return exchange.query
      },
      header: (name) => exchange.header(name),
      readBody: () => exchange.readBody(),
      signal: session.controller.signal,
      session,
      get headersSent() {
        return exchange.headersSent
      },
      get finished() {
        return session.done
      },
      send(status, headers, text, options) {
        exchange.send(status, headers, text, options)
        sessions.evict(session) // not a stream: nothing to resume
      },
      open(status, headers) {
        streamed = true
        exchange.open(status, headers)
      },
      write(text) {
        exchange.write(text)
        session.append(text)
      },
      end() {
        exchange.end()
        session.finalize()
      },
      /** After the request: a session nothing was streamed into is forgotten, one that was is ended. */
      settle() {
        if (!streamed) sessions.evict(session)
        else session.finalize()
      },
    }
  }

  #collect() {
    if (this.timer) return
    this.timer = setInterval(() => {
      const cutoff = Date.now() - this.ttlMs
      for (const s of [...this.sessions.values()]) if (s.done && s.completedAt <= cutoff) this.sessions.delete(s.id)
      if (this.sessions.size === 0) {
        clearInterval(this.timer)
        this.timer = null
      }
    }, GC_EVERY_MS)
    this.timer.unref?.()
  }

  /** Ends every session (readers return) and forgets them. */
  close() {
    for (const s of this.sessions.values()) s.finalize()
    this.sessions.clear()
    clearInterval(this.timer)
    this.timer = null
  }
}

const convId = (ctx) => {
  const id = ctx.query.get('conv_id')
  if (!id) throw new ApiError(400, 'conv_id: required (the X-Conversation-Id the generation was requested with)', { param: 'conv_id' })
  return id
}

/** GET /v1/stream, POST /v1/streams/lookup, DELETE /v1/stream (ctx.server.streams). */
const routes = {
  async 'GET /v1/stream'(ctx) {
    const id = convId(ctx)
    const session = ctx.server.streams.get(id)
    if (!session) throw new ApiError(404, 'Stream not found or expired', { code: 'NOT_FOUND', type: 'not_found_error' })
    if (session.loading) {
      throw new ApiError(503, 'Stream owner model is loading, retry later', { code: 'LOADING', type: 'unavailable_error', headers: { 'Retry-After': '1' } })
    }
    const fromText = ctx.query.get('from') ?? '0'
    if (!/^\d+$/.test(fromText)) throw new ApiError(400, "Invalid 'from' offset", { param: 'from' })
    const from = Number(fromText)
    if (from < session.dropped) throw new ApiError(400, 'Stream offset lost, please restart', { param: 'from' })
    const out = ctx.stream(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no' })
    await session.pipe(from, (bytes) => out.write(bytes), ctx.signal)
    out.end()
  },
  async 'POST /v1/streams/lookup'(ctx) {
    let body
    try {
      body = await ctx.body()
    } catch {
      body = {}
    }
    const ids = Array.isArray(body.conversation_ids) ? body.conversation_ids.filter((x) => typeof x === 'string' && x !== '') : []
    ctx.json(200, ctx.server.streams.lookup(ids))
  },
  async 'DELETE /v1/stream'(ctx) {
    ctx.server.streams.stop(convId(ctx))
    ctx.send(204, {}, '')
  },
}

/** The routes that read no engine and pick no model. */
const STREAM_ROUTES = new Set(Object.keys(routes))

module.exports = { StreamSessions, StreamSession, routes, errorBody: openaiErrorBody, STREAM_ROUTES, MAX_BYTES }
