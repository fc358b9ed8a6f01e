'use strict'
// The public LlamaEngine class. The native addon (addon/) does the work on
// its own thread; this file gives it its JavaScript shape: promises,
// AbortSignal, async iteration. Errors come from the addon as Errors with
// their stable `code` already set. With `isolation: 'process'` the same
// class drives an engine in a child process (isolation/).

const os = require('node:os')
const path = require('node:path')
const { native, binding, platformTriple } = require('./addon/native.js')
const { setupGpu } = require('./addon/gpu.js')
const { isRemoteModel } = require('./models/resolve.js')
const { resolveModel } = require('./models/index.js')
const { engineError, coded } = require('./errors.js')
const { floats, replacer, requestJson, embedInputWithFiles, checkSignal, sliced, checkTokens, templateRequest } = require('./wire.js')
const { eventStream } = require('./stream.js')

const { NativeEngine, NativeVocab } = binding

/**
 * Where the load-time self-check's verdicts are kept across processes: the
 * option's path, nothing with `false`, else `self-check.bin` in
 * llama-engine's cache directory (LLAMA_ENGINE_CACHE_DIR, else the
 * platform's user cache: XDG_CACHE_HOME or ~/.cache, ~/Library/Caches,
 * %LOCALAPPDATA%).
 */
function selfCheckCache(option) {
  if (option === false || typeof option === 'string') return option
  if (option !== undefined) throw engineError('INVALID_REQUEST', 'selfCheckCache: expected a path or false')
  const { env } = process
  let dir = env.LLAMA_ENGINE_CACHE_DIR
  if (!dir) {
    const home = os.homedir()
    if (process.platform === 'win32') dir = path.join(env.LOCALAPPDATA || path.join(home, 'AppData', 'Local'), 'llama-engine', 'cache')
    else if (process.platform === 'darwin') dir = path.join(home, 'Library', 'Caches', 'llama-engine')
    else dir = path.join(env.XDG_CACHE_HOME || path.join(home, '.cache'), 'llama-engine')
  }
  return path.join(dir, 'self-check.bin')
}
// Loaded on first use: the child-process engine (`isolation: 'process'`).
let isolation = null

/** A slot number as the engine takes it: a non-negative integer (the engine says whether it has that slot). */
function checkSlot(slot) {
  if (!Number.isInteger(slot) || slot < 0 || slot > 0xffffffff) throw engineError('INVALID_REQUEST', `slot: expected a slot number (0, 1, …), got ${JSON.stringify(slot)}`)
}

class LlamaEngine {
  #native
  #disposed = false

  constructor(native) {
    if (!(native instanceof NativeEngine || (isolation && native instanceof isolation.IsolatedNative))) {
      throw new TypeError('use LlamaEngine.load(options) to create an engine')
    }
    this.#native = native
  }

  /** Loads the model(s) on a background thread. */
  static async load(options) {
    if (options === null || typeof options !== 'object') {
      throw engineError('INVALID_REQUEST', 'options: expected an object')
    }
    const { onProgress, ...rest } = options
    if (onProgress != null && typeof onProgress !== 'function') {
      throw engineError('INVALID_REQUEST', 'onProgress: expected a function')
    }
    // RPC workers: a worker lost mid-request ends the process using it
    // (ggml-rpc aborts), so such an engine always runs in a child process.
    const rpc = Array.isArray(rest.rpc) && rest.rpc.length > 0
    const { isolation: mode = rpc ? 'process' : 'none', restart = true, restartWaitMs } = rest
    if (mode !== 'none' && mode !== 'process') throw engineError('INVALID_REQUEST', "isolation: expected 'none' or 'process'")
    if (rpc && mode !== 'process') {
      const e = engineError('INVALID_REQUEST', "isolation: rpc needs 'process' (a worker lost mid-request ends the process that uses it)")
      e.field = 'isolation'
      throw e
    }
    if (typeof restart !== 'boolean') throw engineError('INVALID_REQUEST', 'restart: expected a boolean')
    if (restartWaitMs !== undefined && !(Number.isInteger(restartWaitMs) && restartWaitMs >= 0)) {
      throw engineError('INVALID_REQUEST', 'restartWaitMs: expected a non-negative integer (ms)')
    }
    delete rest.restartWaitMs
    rest.selfCheckCache = selfCheckCache(rest.selfCheckCache)
    // hf: and https: models are fetched first (models/resolve.js); onProgress
    // then covers the download (the first half) and the load.
    // A projector named by its repository alone: that repository's mmproj file.
    if (typeof rest.mmprojPath === 'string' && /^hf:[^/:]+\/[^/:]+$/.test(rest.mmprojPath)) rest.mmprojPath += ':mmproj'
    const remote = ['modelPath', 'draftModelPath', 'mmprojPath'].filter((k) => isRemoteModel(rest[k]))
    const share = remote.length ? 0.5 : 0
    if (remote.length) {
      const sizes = new Map()
      for (const key of remote) {
        rest[key] = await resolveModel(rest[key], {
          signal: options.signal,
          offline: options.offline,
          onProgress: onProgress
            ? ({ file, downloaded, total }) => {
                sizes.set(file, [downloaded, total])
                let d = 0
                let t = 0
                for (const [a, b] of sizes.values()) (d += a), (t += b)
                try {
                  onProgress(t > 0 ? (share * d) / t : 0)
                } catch {}
              }
            : undefined,
        })
      }
    }
    // Adapters may be named the same way.
    if (Array.isArray(rest.loras)) {
      rest.loras = await Promise.all(
        rest.loras.map(async (l) =>
          l && typeof l === 'object' && isRemoteModel(l.path)
            ? { ...l, path: await resolveModel(l.path, { signal: options.signal, offline: options.offline }) }
            : l,
        ),
      )
    }
    delete rest.signal
    delete rest.offline
    let json
    try {
      json = JSON.stringify(rest, replacer)
    } catch (e) {
      throw engineError('INVALID_REQUEST', `options: cannot be serialised (${e.message})`)
    }
    const progress = onProgress
      ? (fraction) => {
          try {
            onProgress(share + (1 - share) * fraction)
          } catch {
            // A throwing progress callback must not break loading.
          }
        }
      : undefined
    try {
      if (mode === 'process') {
        isolation ??= require('./isolation/parent.js')
        const openVocab = (optionsJson) => NativeVocab.load(optionsJson)
        return new LlamaEngine(await isolation.IsolatedNative.start(json, progress, { restart, restartWaitMs, openVocab }))
      }
      await setupGpu(native.binding, platformTriple())
      return new LlamaEngine(await NativeEngine.load(json, progress))
    } catch (e) {
      throw coded(e)
    }
  }

  #check() {
    if (this.#disposed) throw engineError('DISPOSED', 'the engine has been disposed')
  }

  tokenize(text, options = {}) {
    this.#check()
    if (typeof text !== 'string') throw engineError('INVALID_REQUEST', 'text: expected a string')
    const { addBos = false, special = false } = options || {}
    try {
      return this.#native.tokenize(text, Boolean(addBos), Boolean(special))
    } catch (e) {
      throw coded(e)
    }
  }

  detokenize(tokens) {
    this.#check()
    checkTokens(tokens)
    try {
      return this.#native.detokenize(tokens)
    } catch (e) {
      throw coded(e)
    }
  }

  /**
   * The prompt a chat request with these `messages` evaluates: the model's
   * chat template (or `chatTemplate` from load) rendered with them and, when
   * given, the request's `tools`, `tool_choice`, `parallel_tool_calls` and
   * `chat_template_kwargs` (with the generic tool format, the tool preamble).
   */
  applyChatTemplate(messages, options = {}) {
    this.#check()
    const { json, addGenerationPrompt } = templateRequest(messages, options)
    try {
      return this.#native.applyChatTemplate(json, addGenerationPrompt)
    } catch (e) {
      throw coded(e)
    }
  }

  /**
   * `tokenize` off the JS thread (a thread of libuv's pool), for text of any
   * size: the event loop goes on meanwhile. `withPieces: true` resolves
   * `{ id, piece }[]`, each token with its own text.
   */
  async tokenizeAsync(text, options = {}) {
    this.#check()
    if (typeof text !== 'string') throw engineError('INVALID_REQUEST', 'text: expected a string')
    const { addBos = false, special = false, withPieces = false } = options || {}
    try {
      const ids = await this.#native.tokenizeAsync(text, Boolean(addBos), Boolean(special))
      if (!withPieces) return await sliced(ids.length, (i) => ids[i])
      const { text: joined, ends } = await this.#native.detokenizeAsync(ids, true)
      return await sliced(ids.length, (i) => ({ id: ids[i], piece: joined.slice(i > 0 ? ends[i - 1] : 0, ends[i]) }))
    } catch (e) {
      throw coded(e)
    }
  }

  /**
   * A chat answer (generated here or elsewhere) read as the engine reads
   * its own: `{ content, reasoning_content?, tool_calls? }`, with the tools
   * and settings of the request it answered — the mirror of
   * `applyChatTemplate`.
   */
  parseChatOutput(text, options = {}) {
    this.#check()
    if (typeof text !== 'string') throw engineError('INVALID_REQUEST', 'text: expected a string')
    if (options === null || typeof options !== 'object') throw engineError('INVALID_REQUEST', 'options: expected an object')
    const { tools, parallelToolCalls, chat_template_kwargs, reasoning_format, ...rest } = options
    const unknown = Object.keys(rest)[0]
    if (unknown !== undefined) throw engineError('INVALID_REQUEST', `options.${unknown}: not an option of parseChatOutput (tools, parallelToolCalls, chat_template_kwargs, reasoning_format)`)
    const request = { messages: [{ role: 'user', content: 'Hello' }], tools, parallel_tool_calls: parallelToolCalls, chat_template_kwargs, reasoning_format }
    let json
    try {
      json = JSON.stringify(request, replacer)
    } catch (e) {
      throw engineError('INVALID_REQUEST', `options: cannot be serialised (${e.message})`)
    }
    try {
      return this.#native.parseChatOutput(text, json)
    } catch (e) {
      throw coded(e)
    }
  }

  /** `detokenize` off the JS thread. */
  async detokenizeAsync(tokens) {
    this.#check()
    checkTokens(tokens)
    try {
      return await this.#native.detokenizeAsync(Int32Array.from(tokens), false)
    } catch (e) {
      throw coded(e)
    }
  }

  /** `applyChatTemplate` off the JS thread. */
  async applyChatTemplateAsync(messages, options = {}) {
    this.#check()
    const { json, addGenerationPrompt } = templateRequest(messages, options)
    try {
      return await this.#native.applyChatTemplateAsync(json, addGenerationPrompt)
    } catch (e) {
      throw coded(e)
    }
  }

  /**
   * Runs one completion. Events go to `onEvent` in order; the promise
   * resolves after the last one (`done`) was delivered.
   */
  complete(request, onEvent, signal) {
    return new Promise((resolve, reject) => {
      if (this.#disposed) return reject(engineError('DISPOSED', 'the engine has been disposed'))
      let json
      try {
        if (onEvent != null && typeof onEvent !== 'function') {
          throw engineError('INVALID_REQUEST', 'onEvent: expected a function')
        }
        signal = checkSignal(signal)
        json = requestJson(request)
      } catch (e) {
        return reject(e)
      }
      let id = null
      let thrown = null
      let settled = false
      const onAbort = () => {
        if (id !== null && !settled) this.#native.abort(id)
      }
      const settle = (fn, value) => {
        if (settled) return
        settled = true
        if (signal) signal.removeEventListener('abort', onAbort)
        fn(value)
      }
      const handle = (text) => {
        if (typeof text !== 'string') return settle(reject, coded(text))
        let event
        try {
          event = JSON.parse(text)
        } catch (e) {
          return settle(reject, engineError('INTERNAL', `bad event from the engine: ${e.message}`))
        }
        if (thrown === null && onEvent) {
          try {
            onEvent(event)
          } catch (e) {
            // A throwing handler ends its own request only.
            thrown = e
            if (event.type !== 'done') this.#native.abort(id)
          }
        }
        if (event.type === 'done') {
          if (thrown !== null) return settle(reject, thrown)
          const { type, ...result } = event
          settle(resolve, result)
        }
      }
      try {
        id = this.#native.submit(json, handle)
      } catch (e) {
        return settle(reject, coded(e))
      }
      if (signal) {
        if (signal.aborted) onAbort()
        else signal.addEventListener('abort', onAbort, { once: true })
      }
    })
  }

  /**
   * Fill-in-the-middle: `complete()` with `input_prefix` and `input_suffix`
   * required (the engine frames them with the model's FIM tokens).
   */
  infill(request, onEvent, signal) {
    if (request === null || typeof request !== 'object' || Array.isArray(request)) {
      return Promise.reject(engineError('INVALID_REQUEST', 'request: expected an object { input_prefix, input_suffix, … }'))
    }
    for (const field of ['input_prefix', 'input_suffix']) {
      if (typeof request[field] !== 'string') {
        const got = request[field] === undefined ? 'nothing' : typeof request[field]
        return Promise.reject(engineError('INVALID_REQUEST', `${field}: required, a string (got ${got})`))
      }
    }
    return this.complete(request, onEvent, signal)
  }

  /**
   * Saves the KV cells of a conversation (`{ messages, tools?, tool_choice?,
   * parallel_tool_calls?, chat_template_kwargs? }`) or a `{ prompt }` to
   * `path`, atomically. The conversation is evaluated as its next request
   * will start (whatever of it is cached is reused); resolves with
   * `{ tokens, exact, bytes }`. Runs beside other requests.
   */
  saveSession(path, conversation) {
    return this.#sessionJob(() => {
      if (typeof path !== 'string') throw engineError('INVALID_REQUEST', 'path: expected a string')
      if (conversation === null || typeof conversation !== 'object' || Array.isArray(conversation)) {
        throw engineError('INVALID_REQUEST', 'conversation: expected { messages } or { prompt }')
      }
      let json
      try {
        json = JSON.stringify(conversation, replacer)
      } catch (e) {
        throw engineError('INVALID_REQUEST', `conversation: cannot be serialised (${e.message})`)
      }
      return (handle) => this.#native.saveSession(path, json, handle)
    })
  }

  /**
   * Loads a session file written by `saveSession` into a free slot: the
   * next request starting with its tokens reuses them. Resolves with
   * `{ tokens, exact, messages | prompt }`; a file that is not a session of
   * this model and KV settings, truncated or corrupted rejects with
   * `INVALID_SESSION`.
   */
  loadSession(path, options) {
    return this.#sessionJob(() => {
      if (typeof path !== 'string') throw engineError('INVALID_REQUEST', 'path: expected a string')
      if (options != null && (typeof options !== 'object' || Array.isArray(options))) throw engineError('INVALID_REQUEST', 'options: expected { slot? }')
      const slot = options?.slot ?? null
      if (slot !== null) checkSlot(slot)
      return (handle) => this.#native.loadSession(path, slot, handle)
    })
  }

  /**
   * Writes what idle slot `slot` holds (its KV cells and their tokens) to
   * `path`, atomically, as a session file `loadSession` reads. Resolves
   * with `{ tokens, exact, bytes }`; a slot running a request, or none of
   * the engine's, rejects with `INVALID_REQUEST` naming `slot`.
   */
  saveSlot(slot, path) {
    return this.#sessionJob(() => {
      checkSlot(slot)
      if (typeof path !== 'string') throw engineError('INVALID_REQUEST', 'path: expected a string')
      return (handle) => this.#native.saveSlot(slot, path, handle)
    })
  }

  /**
   * Drops the KV cells of idle slot `slot` (not kept in the prompt cache);
   * resolves with `{ tokens }`, the tokens it held.
   */
  eraseSlot(slot) {
    return this.#sessionJob(() => {
      checkSlot(slot)
      return (handle) => this.#native.eraseSlot(slot, handle)
    })
  }

  /**
   * Embeddings of a string, token ids, content parts (text with images or
   * audio, as a message's content, with `mmprojPath`) or an array of
   * those, computed on the engine thread beside running requests. Resolves
   * with `{ embeddings: Float32Array[], tokens }`.
   */
  embed(input, options) {
    return this.#sessionJob(() => {
      if (options != null && (typeof options !== 'object' || Array.isArray(options))) {
        throw engineError('INVALID_REQUEST', 'options: expected { normalize?, truncate? }')
      }
      const plain = (v) => (ArrayBuffer.isView(v) ? Array.from(v) : v)
      const given = embedInputWithFiles(plain(input))
      const request = {
        input: Array.isArray(given) ? given.map(plain) : given,
        normalize: options?.normalize,
        truncate: options?.truncate,
      }
      let json
      try {
        // (A media part's bytes travel as base64.)
        json = JSON.stringify(request, replacer)
      } catch (e) {
        throw engineError('INVALID_REQUEST', `input: cannot be serialised (${e.message})`)
      }
      return (handle) => this.#native.embed(json, handle)
    }).then(({ embeddings, tokens }) => ({ embeddings: embeddings.map(floats), tokens }))
  }

  /**
   * Scores `documents` (strings) against `query` with a reranker (a GGUF
   * whose pooling is rank: a BERT-style classifier or a Qwen3-Reranker, as
   * llama.cpp converts them), on the engine thread beside running
   * requests. Each pair is made as llama.cpp's server makes it (the
   * model's rerank template, else BOS query EOS SEP document EOS) and
   * scored alone. Resolves with `[{ index, relevance_score }]`, best first
   * (ties in the documents' order), at most `top_n`; the array's `tokens`
   * (not enumerable) counts the tokens of every pair.
   */
  rerank(request) {
    return this.#sessionJob(() => {
      if (request === null || typeof request !== 'object' || Array.isArray(request)) {
        throw engineError('INVALID_REQUEST', 'request: expected { query, documents, top_n? }')
      }
      const { query, documents, top_n: topN } = request
      if (topN != null && !(Number.isInteger(topN) && topN >= 0)) throw engineError('INVALID_REQUEST', `top_n: expected a non-negative integer, got ${JSON.stringify(topN)}`)
      let json
      try {
        json = JSON.stringify({ rerank: { query, documents } })
      } catch (e) {
        throw engineError('INVALID_REQUEST', `documents: cannot be serialised (${e.message})`)
      }
      return (handle) => this.#native.embed(json, handle)
    }).then(({ embeddings, tokens }) => {
      const ranked = embeddings
        .map((b64, index) => ({ index, relevance_score: floats(b64)[0] }))
        .sort((a, b) => b.relevance_score - a.relevance_score || a.index - b.index)
        .slice(0, request.top_n ?? embeddings.length)
      return Object.defineProperty(ranked, 'tokens', { value: tokens, enumerable: false })
    })
  }

  #sessionJob(prepare) {
    return new Promise((resolve, reject) => {
      if (this.#disposed) return reject(engineError('DISPOSED', 'the engine has been disposed'))
      let start
      try {
        start = prepare()
      } catch (e) {
        return reject(e)
      }
      const handle = (text) => {
        if (typeof text !== 'string') return reject(coded(text))
        try {
          const { type, ...answer } = JSON.parse(text)
          resolve(answer)
        } catch (e) {
          reject(engineError('INTERNAL', `bad answer from the engine: ${e.message}`))
        }
      }
      try {
        start(handle)
      } catch (e) {
        reject(coded(e))
      }
    })
  }

  /** The same events as `complete`, as an async iterator. Breaking out of the loop aborts the request. */
  stream(request, signal) {
    return eventStream((r, onEvent, s) => this.complete(r, onEvent, s), request, signal)
  }
  /** Stops every request that is running now (each resolves with `stopped_abort`); queued ones stay queued. */
  cancel() {
    if (this.#disposed) return
    this.#native.cancel()
  }

  status() {
    if (this.#disposed) return { queued: 0, active: 0, busy: false, disposed: true }
    if (!(this.#native instanceof NativeEngine)) return this.#native.status()
    return { ...this.#native.status(), addon: native.from, isolation: { mode: 'none', pid: process.pid, restarts: 0 } }
  }

  /** Writes the dynamic n-gram cache (llama.cpp's lookup format) to `path` or to `ngramCachePath`. */
  async saveNgramCache(path) {
    this.#check()
    if (path != null && typeof path !== 'string') throw engineError('INVALID_REQUEST', 'path: expected a string')
    try {
      await this.#native.saveNgramCache(path ?? null)
    } catch (e) {
      throw coded(e)
    }
  }

  /**
   * Writes the suffix drafter's shared indexes (every namespace) to `path` or
   * to `suffixCachePath`, atomically; resolves with the tokens written.
   */
  async saveSuffixCache(path) {
    this.#check()
    if (path != null && typeof path !== 'string') throw engineError('INVALID_REQUEST', 'path: expected a string')
    try {
      return await this.#native.saveSuffixCache(path ?? null)
    } catch (e) {
      throw coded(e)
    }
  }

  /** Frees the models and contexts now. Every later call rejects or throws DISPOSED. */
  async dispose() {
    if (this.#disposed) return
    this.#disposed = true
    try {
      await this.#native.dispose()
    } catch (e) {
      throw coded(e)
    }
  }
}

module.exports = { LlamaEngine }
