'use strict'
// `isolation: 'process'`: the engine in a child process, behind the same
// interface the in-process addon gives LlamaEngine (submit/abort/cancel,
// embed, sessions, status, dispose). Anything that ends the child — an
// assert in llama.cpp, a driver fault, the out-of-memory killer — ends only
// the child: its running and queued requests reject with ENGINE_CRASHED,
// saying how it died and what llama.cpp last logged, and a new child with
// the same options takes over (with backoff; `restart: false` turns it
// off). tokenize, detokenize and applyChatTemplate stay synchronous: the
// parent holds the model's vocabulary only (no weights), loaded after the
// child has loaded the whole model.
//
// The child is Electron's utilityProcess where that exists (the main
// process of an Electron app), else child_process.fork; child.js
// (beside this file) is its side.

const { fork } = require('node:child_process')
const path = require('node:path')

const CHILD = path.join(__dirname, 'child.js')
/**
 * Restart delays, ms: the first at once, then doubling up to 30 s while the
 * new children die before answering anything (a crash loop); back to at
 * once after a child answered a call or lived a minute.
 */
const BACKOFF = [0, 1000, 2000, 4000, 8000, 16000, 30000]
/**
 * How long a call made while the child restarts waits for the next one
 * (`restartWaitMs`): when the next child is not expected to be ready by then
 * (its backoff and the last load's time), or is not, the call rejects with
 * ENGINE_RESTARTING and `retryAfterMs` rather than wait through a backoff
 * of up to 30 s or a long load.
 */
const RESTART_WAIT_MS = 5000
const HEALTHY_MS = 60_000
/** What of the child's stderr is kept (llama.cpp's asserts and warnings go there). */
const STDERR_KEEP = 16 * 1024
const DISPOSE_WAIT_MS = 10_000

function coded(code, message, field) {
  const err = new Error(message)
  err.code = code
  if (field !== undefined) err.field = field
  return err
}

function fromWire(e) {
  const err = coded(e && e.code ? e.code : 'INTERNAL', (e && e.message) || String(e), e ? e.field : undefined)
  // CONTEXT_EXCEEDED's numbers.
  for (const k of ['promptTokens', 'contextSize']) if (e && Number.isInteger(e[k])) err[k] = e[k]
  return err
}

/** A child process running child.js, as one small interface over fork() and Electron's utilityProcess. */
function spawnChild() {
  const env = { ...process.env }
  // llama.cpp's warnings and errors on the child's stderr, which the parent
  // keeps (never prints): the last line explains a crash.
  if (env.LLAMA_ENGINE_LOG === undefined) env.LLAMA_ENGINE_LOG = 'warn'
  const electron = process.versions.electron && process.type === 'browser' ? safeRequire('electron') : null
  if (electron && electron.utilityProcess) {
    const child = electron.utilityProcess.fork(CHILD, [], { stdio: ['ignore', 'ignore', 'pipe'], serviceName: 'llama-engine', env })
    return {
      child,
      get pid() {
        return child.pid
      },
      send: (msg) => child.postMessage(msg),
      onMessage: (fn) => child.on('message', fn),
      onExit: (fn) => child.on('exit', (code) => fn(code, null)),
      onError: (fn) => child.on('error', (type, location) => fn(new Error(`${type}${location ? ` at ${location}` : ''}`))),
      stderr: child.stderr,
      kill: (signal) => child.kill(signal),
      ref() {},
      unref() {},
    }
  }
  const child = fork(CHILD, [], { stdio: ['ignore', 'ignore', 'pipe', 'ipc'], serialization: 'advanced', env, execArgv: [] })
  return {
    child,
    get pid() {
      return child.pid
    },
    send: (msg) => {
      if (child.connected) child.send(msg)
    },
    onMessage: (fn) => child.on('message', fn),
    onExit: (fn) => child.on('exit', fn),
    stderr: child.stderr,
    kill: (signal) => child.kill(signal),
    // A failed spawn or a message that cannot be sent (the channel closed
    // under it) is an 'error' event: without a listener it would throw in
    // the host.
    onError: (fn) => child.on('error', fn),
    // An idle engine does not keep the parent alive; a pending request does.
    ref() {
      child.ref()
      child.channel?.ref?.()
      child.stderr?.ref?.()
    },
    unref() {
      child.unref()
      child.channel?.unref?.()
      child.stderr?.unref?.()
    },
  }
}

function safeRequire(name) {
  try {
    return require(name)
  } catch {
    return null
  }
}

function describeDeath(pid, code, signal, stderr) {
  let how
  if (signal === 'SIGKILL') how = 'was killed by SIGKILL (the out-of-memory killer, or someone)'
  else if (signal === 'SIGABRT') how = 'aborted (SIGABRT: an assert in llama.cpp or ggml)'
  else if (signal === 'SIGSEGV' || signal === 'SIGBUS') how = `crashed (${signal})`
  else if (signal) how = `was killed by ${signal}`
  else how = `exited with code ${code}`
  const last = lastLines(stderr)
  return `the engine process (pid ${pid}) ${how}${last ? `; its last log line: ${last}` : ''}`
}

/** The last non-empty line of what the child wrote (an assert's message, llama.cpp's last warning). */
function lastLines(text) {
  const lines = text.split('\n').map((l) => l.trim()).filter(Boolean)
  return lines.length ? lines[lines.length - 1].slice(0, 500) : ''
}

class IsolatedNative {
  #optionsJson
  #restart
  #vocab = null
  #proc = null
  #state = 'starting' // starting | ready | restarting | failed | disposed
  #nextId = 1
  #pending = new Map() // id -> { kind, handle?, resolve?, reject?, childBound: true }
  #waiting = [] // calls made while the child (re)starts: { send, fail, entry, timer }
  #stderr = ''
  #restarts = 0
  #lastCrash = undefined
  #startedAt = 0
  #attempt = 0
  #snapshot = {}
  #exited = null
  #parallel = 1
  #restartTimer = null
  #restartAt = 0 // when the next child starts (Date.now() ms), while restarting
  #spawning = false // a new child is loading
  #loadMs = 0 // how long the last load took
  #restartWaitMs

  static async start(optionsJson, onProgress, { restart = true, restartWaitMs = RESTART_WAIT_MS, openVocab } = {}) {
    const self = new IsolatedNative(optionsJson, restart, restartWaitMs)
    await self.#spawn(onProgress, true)
    self.#vocab = await openVocab(optionsJson)
    return self
  }

  constructor(optionsJson, restart, restartWaitMs) {
    this.#optionsJson = optionsJson
    this.#restart = restart
    this.#restartWaitMs = restartWaitMs
  }

  /** Starts a child and loads the model in it; `first`: a crash is MODEL_LOAD_FAILED, not retried. */
  #spawn(onProgress, first) {
    return new Promise((resolve, reject) => {
      const proc = spawnChild()
      this.#proc = proc
      this.#stderr = ''
      this.#startedAt = Date.now()
      let exitResolve
      this.#exited = new Promise((r) => (exitResolve = r))
      proc.stderr?.setEncoding?.('utf8')
      proc.stderr?.on('data', (d) => {
        this.#stderr = (this.#stderr + d).slice(-STDERR_KEEP)
      })
      let loading = true
      let gone = false
      this.#spawning = !first
      // An idle engine's new child does not keep the host alive (the first
      // one does: its load is awaited).
      if (!first) this.#refresh()
      proc.onMessage((msg) => {
        if (this.#proc !== proc) return
        if (loading) {
          if (msg.t === 'progress') {
            if (onProgress) onProgress(msg.f)
            return
          }
          loading = false
          this.#spawning = false
          if (msg.t === 'loaded') {
            this.#loadMs = Date.now() - this.#startedAt
            this.#snapshot = msg.status
            this.#parallel = msg.status.parallel || 1
            this.#state = 'ready'
            this.#refresh()
            resolve()
          } else {
            // Refused: this child is done with, and its exit is no crash to restart from.
            this.#state = 'failed'
            this.#proc = null
            proc.kill('SIGKILL')
            reject(fromWire(msg.error))
          }
          return
        }
        this.#onMessage(msg)
      })
      const onGone = (why) => {
        if (gone) return
        gone = true
        exitResolve()
        if (this.#proc !== proc || this.#state === 'disposed') return
        if (loading) {
          loading = false
          this.#spawning = false
          this.#state = 'failed'
          this.#proc = null
          if (first) return reject(coded('MODEL_LOAD_FAILED', `loading the model ${why}`))
          return reject(coded('ENGINE_CRASHED', `restarting: ${why}`))
        }
        this.#crashed(why)
      }
      proc.onExit((code, signal) => onGone(describeDeath(proc.pid, code, signal, this.#stderr)))
      proc.onError((e) => {
        // No process (it could not start): no 'exit' will follow.
        if (!proc.pid) onGone(`the engine process could not start: ${e.message}`)
        else if (proc.child.exitCode === null && proc.child.signalCode === null) proc.kill('SIGKILL')
      })
      proc.send({ t: 'load', options: this.#optionsJson, progress: Boolean(onProgress) })
    })
  }

  #crashed(why) {
    this.#proc = null
    this.#lastCrash = why
    const err = () => coded('ENGINE_CRASHED', why)
    const pending = [...this.#pending.values()]
    this.#pending.clear()
    for (const p of pending) this.#fail(p, err())
    if (this.#state === 'disposed') return
    if (!this.#restart) {
      this.#state = 'failed'
      this.#failWaiting(err)
      this.#refresh()
      return
    }
    this.#state = 'restarting'
    if (Date.now() - this.#startedAt > HEALTHY_MS) this.#attempt = 0
    this.#scheduleRestart(BACKOFF[Math.min(this.#attempt, BACKOFF.length - 1)])
  }

  /** The next child in `delay` ms. */
  #scheduleRestart(delay) {
    this.#attempt++
    this.#restarts++
    this.#restartAt = Date.now() + delay
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = null
      this.#restartNow()
    }, delay)
    this.#refresh()
  }

  async #restartNow() {
    if (this.#state === 'disposed') return
    try {
      await this.#spawn(null, false)
      for (const w of this.#waiting.splice(0)) {
        clearTimeout(w.timer)
        w.send()
      }
      this.#refresh()
    } catch (e) {
      const message = `the engine process could not be restarted: ${e.message}`
      this.#failWaiting(() => coded('ENGINE_CRASHED', message))
      this.#lastCrash = message
      if (this.#state !== 'disposed') {
        this.#state = 'restarting'
        this.#scheduleRestart(Math.max(BACKOFF[Math.min(this.#attempt, BACKOFF.length - 1)], 1000))
      }
    }
  }

  #fail(p, err) {
    if (p.handle) p.handle(err)
    else p.reject(err)
  }

  /** Fails every call waiting for the next child with `err()`. */
  #failWaiting(err) {
    for (const w of this.#waiting.splice(0)) {
      clearTimeout(w.timer)
      w.fail(err())
    }
  }

  /** In how many ms the next child should be ready, by its backoff and the last load's time. */
  #expectedReadyIn() {
    const now = Date.now()
    if (this.#spawning) return Math.max(0, this.#loadMs - (now - this.#startedAt))
    return Math.max(0, this.#restartAt - now) + this.#loadMs
  }

  #restartingError() {
    const wait = this.#expectedReadyIn()
    const err = coded(
      'ENGINE_RESTARTING',
      `the engine process is restarting (after: ${this.#lastCrash}); the next one is expected in about ${Math.max(1, Math.ceil(wait / 1000))} s`,
    )
    err.retryAfterMs = Math.max(wait, 100)
    return err
  }

  #onMessage(msg) {
    if (msg.t === 'status') {
      this.#snapshot = msg.status
      return
    }
    const p = this.#pending.get(msg.id)
    if (!p) return
    // A child that answers calls is no crash loop: the next crash restarts at once.
    if (msg.t !== 'event' || msg.last) this.#attempt = 0
    if (msg.t === 'event') {
      if (msg.last) this.#pending.delete(msg.id)
      p.handle(msg.text)
    } else if (msg.t === 'error') {
      this.#pending.delete(msg.id)
      this.#fail(p, fromWire(msg.error))
    } else if (msg.t === 'reply') {
      this.#pending.delete(msg.id)
      p.resolve(msg.value)
    }
    this.#refresh()
  }

  /**
   * Keeps the parent alive only while something is pending: a call in the
   * child or one waiting for the next child (then the restart timer, or the
   * loading child, holds the event loop).
   */
  #refresh() {
    const busy = this.#pending.size > 0 || this.#waiting.length > 0
    if (this.#restartTimer) busy ? this.#restartTimer.ref() : this.#restartTimer.unref()
    if (!this.#proc) return
    if (busy) this.#proc.ref()
    else this.#proc.unref()
  }

  /** Sends a call to the child now, or when a restarting child is ready. */
  #call(entry, msg) {
    const id = this.#nextId++
    const failNow = (err) => this.#fail(entry, err)
    if (this.#state === 'disposed') {
      failNow(coded('DISPOSED', 'the engine has been disposed'))
      return id
    }
    if (this.#state === 'failed') {
      failNow(coded('ENGINE_CRASHED', this.#lastCrash || 'the engine process is gone'))
      return id
    }
    if (this.#state === 'restarting' && this.#expectedReadyIn() > this.#restartWaitMs) {
      failNow(this.#restartingError())
      return id
    }
    const send = () => {
      this.#pending.set(id, entry)
      this.#proc.send({ ...msg, id })
      // Aborted while the child restarted: it leaves the child's queue at once.
      if (entry.aborted) this.#proc.send({ t: 'abort', id })
      this.#refresh()
    }
    entry.id = id
    if (this.#state === 'ready') send()
    else {
      // Waits for the next child, at most restartWaitMs.
      const w = { send, fail: failNow, entry, timer: null }
      w.timer = setTimeout(() => {
        const i = this.#waiting.indexOf(w)
        if (i < 0) return
        this.#waiting.splice(i, 1)
        failNow(this.#restartingError())
        this.#refresh()
      }, this.#restartWaitMs)
      this.#waiting.push(w)
      this.#refresh()
    }
    return id
  }

  // --- the interface LlamaEngine uses (the in-process NativeEngine's) ---

  submit(json, handle) {
    return this.#call({ kind: 'complete', handle }, { t: 'submit', json })
  }

  abort(id) {
    const waiting = this.#waiting.find((w) => w.entry.id === id)
    if (waiting) waiting.entry.aborted = true
    else if (this.#state === 'ready' && this.#pending.has(id)) this.#proc.send({ t: 'abort', id })
  }

  cancel() {
    if (this.#state === 'ready') this.#proc.send({ t: 'cancel' })
  }

  embed(json, handle) {
    this.#call({ kind: 'embed', handle }, { t: 'embed', json })
  }

  saveSession(p, json, handle) {
    this.#call({ kind: 'session', handle }, { t: 'saveSession', path: p, json })
  }

  loadSession(p, slot, handle) {
    this.#call({ kind: 'session', handle }, { t: 'loadSession', path: p, slot })
  }

  saveSlot(slot, p, handle) {
    this.#call({ kind: 'session', handle }, { t: 'saveSlot', slot, path: p })
  }

  eraseSlot(slot, handle) {
    this.#call({ kind: 'session', handle }, { t: 'eraseSlot', slot })
  }

  saveNgramCache(p) {
    return new Promise((resolve, reject) => this.#call({ kind: 'ngram', resolve, reject }, { t: 'saveNgramCache', path: p }))
  }

  saveSuffixCache(p) {
    return new Promise((resolve, reject) => this.#call({ kind: 'ngram', resolve, reject }, { t: 'saveSuffixCache', path: p }))
  }

  tokenize(text, addBos, special) {
    return this.#vocab.tokenize(text, addBos, special)
  }

  detokenize(tokens) {
    return this.#vocab.detokenize(tokens)
  }

  applyChatTemplate(json, addGenerationPrompt) {
    return this.#vocab.applyChatTemplate(json, addGenerationPrompt)
  }

  parseChatOutput(text, json) {
    return this.#vocab.parseChatOutput(text, json)
  }

  tokenizeAsync(text, addBos, special) {
    return this.#vocab.tokenizeAsync(text, addBos, special)
  }

  detokenizeAsync(tokens, pieces) {
    return this.#vocab.detokenizeAsync(tokens, pieces)
  }

  applyChatTemplateAsync(json, addGenerationPrompt) {
    return this.#vocab.applyChatTemplateAsync(json, addGenerationPrompt)
  }

  status() {
    const completions = [...this.#pending.values()].filter((p) => p.kind === 'complete').length + this.#waiting.length
    const active = this.#state === 'ready' ? Math.min(completions, this.#parallel) : 0
    const { rss, ...snapshot } = this.#snapshot
    return {
      ...snapshot,
      queued: completions - active,
      active,
      busy: active > 0,
      disposed: this.#state === 'disposed',
      isolation: {
        mode: 'process',
        pid: this.#proc ? this.#proc.pid : 0,
        restarts: this.#restarts,
        restarting: this.#state === 'restarting',
        ...(rss ? { rss } : {}),
        ...(this.#lastCrash !== undefined ? { lastCrash: this.#lastCrash } : {}),
      },
    }
  }

  async dispose() {
    if (this.#state === 'disposed') return
    const proc = this.#proc
    this.#state = 'disposed'
    const err = () => coded('DISPOSED', 'the engine has been disposed')
    clearTimeout(this.#restartTimer)
    this.#restartTimer = null
    this.#failWaiting(err)
    this.#vocab?.dispose()
    if (!proc) return
    proc.ref()
    proc.send({ t: 'dispose' })
    const timer = setTimeout(() => proc.kill('SIGKILL'), DISPOSE_WAIT_MS)
    await this.#exited
    clearTimeout(timer)
    // Whatever was still pending ended with the child (running requests
    // resolve as aborted before it exits; anything else is DISPOSED).
    for (const p of this.#pending.values()) this.#fail(p, err())
    this.#pending.clear()
    this.#proc = null
  }
}

module.exports = { IsolatedNative }
