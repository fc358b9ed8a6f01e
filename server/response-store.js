'use strict'
// The responses the Responses API keeps (`store`, true by default as on
// OpenAI): each finished response with the whole conversation it answered,
// so that a follow-up may name it (`previous_response_id`) or name its items
// (`item_reference`), and GET / DELETE /v1/responses/{id} work. Bounded by a
// count and by bytes (the JSON of what is kept); the oldest go first.
// In memory, and with `file` also on disk: written atomically (a temporary
// file, fsync, rename) a moment after each change and when the server
// closes, read back at start with the checks every file we read gets (a
// header, the length, a sha256 of the body, the shape of each entry, the
// bounds); a file that fails them is not used (the store starts empty, the
// reason in `loadError`) and is replaced at the next write. A client that
// sends a name the server no longer has gets a 400 that says so.

const fs = require('node:fs')
const path = require('node:path')
const { createHash } = require('node:crypto')
const { isObject, newId } = require('./util.js')

const DEFAULT_MAX = 1000
const DEFAULT_MAX_BYTES = 64 * 1024 * 1024
const MAGIC = 'llama-engine responses 1'
// How long after a change the file is written (changes in between are
// written together).
const WRITE_DELAY_MS = 200

const isId = (v) => typeof v === 'string' && v.length > 0 && v.length <= 256

class ResponseStore {
  #max
  #maxBytes
  #bytes = 0
  #responses = new Map() // id -> { response, input, bytes }, oldest first
  #items = new Map() // item id -> { item, holders }: how many kept responses hold it

  #file = null
  #timer = null
  #writing = null // the write in flight
  #dirty = false
  #closed = false
  /** Why the file was not used at start (null when it was, or there was none). */
  loadError = null
  /** The last write's failure (null after one succeeds). */
  writeError = null

  constructor({ max = DEFAULT_MAX, maxBytes = DEFAULT_MAX_BYTES, file = null } = {}) {
    for (const [name, v] of [
      ['responsesMax', max],
      ['responsesMaxBytes', maxBytes],
    ]) {
      if (!Number.isInteger(v) || v < 0) throw new TypeError(`${name}: expected a non-negative integer, got ${JSON.stringify(v)}`)
    }
    if (file != null && (typeof file !== 'string' || file === '')) throw new TypeError('responsesFile: expected a path')
    this.#max = max
    this.#maxBytes = maxBytes
    if (file != null) {
      this.#file = path.resolve(file)
      this.#load()
    }
  }

  get file() {
    return this.#file
  }

  get max() {
    return this.#max
  }

  get maxBytes() {
    return this.#maxBytes
  }

  get size() {
    return this.#responses.size
  }

  get bytes() {
    return this.#bytes
  }

  /**
   * Keeps a finished response and the input items it answered (the whole
   * conversation: earlier responses' items included), replacing none. One
   * larger than the byte bound is not kept.
   */
  put(response, input) {
    if (this.#max === 0) return false
    const stored = input.map((item) => (item.id ? item : { id: newId(item.type === 'message' || item.role ? 'msg' : 'item'), ...item }))
    const bytes = Buffer.byteLength(JSON.stringify(response)) + Buffer.byteLength(JSON.stringify(stored))
    if (bytes > this.#maxBytes) return false
    this.delete(response.id)
    this.#responses.set(response.id, { response, input: stored, bytes })
    this.#bytes += bytes
    for (const item of [...stored, ...response.output]) {
      if (!item.id) continue
      const held = this.#items.get(item.id)
      if (held) held.holders++
      else this.#items.set(item.id, { item, holders: 1 })
    }
    while (this.#responses.size > this.#max || this.#bytes > this.#maxBytes) this.delete(this.#responses.keys().next().value)
    this.#changed()
    return true
  }

  /** The stored response, or undefined. */
  get(id) {
    return this.#responses.get(id)?.response
  }

  /** The input items a stored response answered, or undefined. */
  input(id) {
    return this.#responses.get(id)?.input
  }

  /** The conversation a follow-up continues: its input items, then its output. */
  conversation(id) {
    const kept = this.#responses.get(id)
    return kept && [...kept.input, ...kept.response.output]
  }

  /** A stored item (input or output of a kept response) by its id. */
  item(id) {
    return this.#items.get(id)?.item
  }

  delete(id) {
    const kept = this.#responses.get(id)
    if (!kept) return false
    this.#responses.delete(id)
    this.#bytes -= kept.bytes
    // An item a later response also holds (its conversation goes on) stays.
    for (const item of [...kept.input, ...kept.response.output]) {
      const held = item.id && this.#items.get(item.id)
      if (held && --held.holders === 0) this.#items.delete(item.id)
    }
    this.#changed()
    return true
  }

  /** Writes what is kept now (with a file; resolves when it is on disk). */
  async flush() {
    if (!this.#file) return
    clearTimeout(this.#timer)
    this.#timer = null
    while (this.#writing) await this.#writing
    if (!this.#dirty) return
    this.#dirty = false
    this.#writing = this.#write().finally(() => (this.#writing = null))
    await this.#writing
  }

  /** The last write, then no more (the server closes). */
  async close() {
    await this.flush()
    this.#closed = true
  }

  #changed() {
    if (!this.#file || this.#closed) return
    this.#dirty = true
    if (this.#timer) return
    this.#timer = setTimeout(() => {
      this.#timer = null
      this.flush().catch(() => {})
    }, WRITE_DELAY_MS)
    this.#timer.unref?.()
  }

  async #write() {
    const body = Buffer.from(JSON.stringify({ responses: [...this.#responses.values()].map(({ response, input }) => ({ response, input })) }))
    const data = Buffer.concat([Buffer.from(`${MAGIC}\n${body.length} ${createHash('sha256').update(body).digest('hex')}\n`), body])
    const tmp = `${this.#file}.${process.pid}.tmp`
    try {
      const fh = await fs.promises.open(tmp, 'w', 0o600)
      try {
        await fh.writeFile(data)
        await fh.sync()
      } finally {
        await fh.close()
      }
      await fs.promises.rename(tmp, this.#file)
      this.writeError = null
    } catch (e) {
      this.writeError = e
      await fs.promises.rm(tmp, { force: true }).catch(() => {})
      this.#dirty = true
      throw e
    }
  }

  /** Reads the file back (at start): every check passes, or nothing of it is used. */
  #load() {
    let data
    try {
      const st = fs.statSync(this.#file)
      if (!st.isFile()) throw new Error('not a regular file')
      // What a full store writes, with room for JSON's escapes: more is not ours.
      if (st.size > 2 * this.#maxBytes + 4096) throw new Error(`${st.size} bytes, more than a store of responsesMaxBytes ${this.#maxBytes} writes`)
      data = fs.readFileSync(this.#file)
    } catch (e) {
      if (e.code === 'ENOENT') return // none yet: written at the first change
      this.loadError = `${this.#file}: ${e.message}`
      return
    }
    try {
      const nl1 = data.indexOf(10)
      if (nl1 < 0 || data.subarray(0, nl1).toString('latin1') !== MAGIC) throw new Error('not a responses file of this server (its first line)')
      const nl2 = data.indexOf(10, nl1 + 1)
      const m = nl2 > 0 && /^(\d{1,12}) ([0-9a-f]{64})$/.exec(data.subarray(nl1 + 1, nl2).toString('latin1'))
      if (!m) throw new Error('damaged header')
      const body = data.subarray(nl2 + 1)
      if (body.length !== Number(m[1])) throw new Error(`cut short or extended: ${body.length} bytes of body, the header says ${m[1]}`)
      if (createHash('sha256').update(body).digest('hex') !== m[2]) throw new Error('its checksum does not match: altered or damaged')
      const parsed = JSON.parse(body.toString('utf8'))
      if (!isObject(parsed) || !Array.isArray(parsed.responses)) throw new Error('no list of responses')
      const entries = parsed.responses.map((entry, i) => {
        const ok =
          isObject(entry) &&
          isObject(entry.response) &&
          isId(entry.response.id) &&
          Array.isArray(entry.response.output) &&
          entry.response.output.every(isObject) &&
          Array.isArray(entry.input) &&
          entry.input.every((item) => isObject(item) && (item.id === undefined || isId(item.id)))
        if (!ok) throw new Error(`response ${i}: not a kept response`)
        return entry
      })
      // Kept as they were, under today's bounds (the oldest go first).
      for (const { response, input } of entries) this.put(response, input)
      this.#dirty = false
      clearTimeout(this.#timer)
      this.#timer = null
    } catch (e) {
      this.#responses.clear()
      this.#items.clear()
      this.#bytes = 0
      this.loadError = `${this.#file}: ${e.message}; starting with no kept responses (the file is replaced at the next change)`
    }
  }
}

module.exports = { ResponseStore, DEFAULT_MAX, DEFAULT_MAX_BYTES }
