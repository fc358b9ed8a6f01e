'use strict'
// The responses the Responses API keeps (`store`, true by default as on
// OpenAI): each finished response with the whole conversation it answered,
// so that a follow-up may name it (`previous_response_id`) or name its items
// (`item_reference`), and GET / DELETE /v1/responses/{id} work. Bounded by a
// count and by bytes (the JSON of what is kept); the oldest go first.
// In memory: a restart forgets them, and a client that sends a name the
// server no longer has gets a 400 that says so.

const { newId } = require('./util.js')

const DEFAULT_MAX = 1000
const DEFAULT_MAX_BYTES = 64 * 1024 * 1024

class ResponseStore {
  #max
  #maxBytes
  #bytes = 0
  #responses = new Map() // id -> { response, input, bytes }, oldest first
  #items = new Map() // item id -> { item, holders }: how many kept responses hold it

  constructor({ max = DEFAULT_MAX, maxBytes = DEFAULT_MAX_BYTES } = {}) {
    for (const [name, v] of [
      ['responsesMax', max],
      ['responsesMaxBytes', maxBytes],
    ]) {
      if (!Number.isInteger(v) || v < 0) throw new TypeError(`${name}: expected a non-negative integer, got ${JSON.stringify(v)}`)
    }
    this.#max = max
    this.#maxBytes = maxBytes
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
    return true
  }
}

module.exports = { ResponseStore, DEFAULT_MAX, DEFAULT_MAX_BYTES }
