'use strict'
// The child side of `isolation: 'process'` (parent.js): one engine,
// driven by messages from the parent over the IPC channel (fork) or the
// parent port (Electron's utilityProcess). It prints nothing; llama.cpp's
// warnings go to stderr, which the parent keeps to explain a crash. It
// exits when the parent disposes of it or goes away.

const { loadNative, platformTriple } = require('../addon/loader.js')
const { setupGpu } = require('../addon/gpu.js')

const port = process.parentPort // Electron's utilityProcess
const send = port ? (msg) => port.postMessage(msg) : (msg) => process.send && process.send(msg)
const onMessage = (fn) => (port ? port.on('message', (e) => fn(e.data)) : process.on('message', fn))

// Signals belong to the parent (a Ctrl-C in a terminal reaches the whole
// process group): it decides when the engine stops, by disposing of it.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => {})
if (!port) process.on('disconnect', () => process.exit(0))

const native = loadNative()
const { NativeEngine } = native.binding
let engine = null
const ids = new Map() // the parent's request id -> the engine's

const wireError = (e) => ({
  code: (e && e.code) || 'INTERNAL',
  message: String((e && e.message) || e),
  field: e && e.field,
  promptTokens: e && e.promptTokens,
  contextSize: e && e.contextSize,
})

function status() {
  return { ...engine.status(), addon: native.from, rss: process.memoryUsage.rss() }
}

// While requests run, the parent's status() (its slots, the cells they
// hold: the server's /metrics) is refreshed four times a second, not only
// when a request ends.
const LIVE_STATUS_MS = 250
let live = null
function liveStatus() {
  if (ids.size === 0) {
    clearInterval(live)
    live = null
  } else if (live === null) {
    live = setInterval(() => (ids.size > 0 && engine ? send({ t: 'status', status: status() }) : liveStatus()), LIVE_STATUS_MS)
    live.unref()
  }
}

/** A handle for calls whose events, or one answer, go back to the parent as `id`'s. */
function forward(id, { events }) {
  return (out) => {
    if (typeof out !== 'string') {
      ids.delete(id)
      send({ t: 'error', id, error: wireError(out) })
      return
    }
    if (!events) {
      send({ t: 'event', id, text: out, last: true })
      send({ t: 'status', status: status() })
      return
    }
    // Events are JSON objects starting with {"type":…: "token" and
    // "progress" ones, then the last, "done".
    const last = out.startsWith('{"type":"done"')
    if (last) ids.delete(id)
    send({ t: 'event', id, text: out, last })
    if (last) send({ t: 'status', status: status() })
  }
}

async function load(msg) {
  if (process.env.LLAMA_ENGINE_FAULT_INJECTION === 'abort-on-load') process.abort() // tests only
  try {
    await setupGpu(native.binding, platformTriple())
    const progress = msg.progress ? (f) => send({ t: 'progress', f }) : undefined
    engine = await NativeEngine.load(msg.options, progress)
    send({ t: 'loaded', status: status() })
  } catch (e) {
    send({ t: 'loadFailed', error: wireError(e) })
  }
}

async function reply(id, work) {
  try {
    send({ t: 'reply', id, value: await work() })
  } catch (e) {
    send({ t: 'error', id, error: wireError(e) })
  }
}

onMessage(async (msg) => {
  switch (msg.t) {
    case 'load':
      return load(msg)
    case 'submit':
      try {
        ids.set(msg.id, engine.submit(msg.json, forward(msg.id, { events: true })))
        liveStatus()
      } catch (e) {
        send({ t: 'error', id: msg.id, error: wireError(e) })
      }
      return
    case 'abort':
      if (ids.has(msg.id)) engine.abort(ids.get(msg.id))
      return
    case 'cancel':
      return engine.cancel()
    case 'embed':
      return callWithHandle(msg, (h) => engine.embed(msg.json, h))
    case 'saveSession':
      return callWithHandle(msg, (h) => engine.saveSession(msg.path, msg.json, h))
    case 'loadSession':
      return callWithHandle(msg, (h) => engine.loadSession(msg.path, msg.slot ?? null, h))
    case 'saveSlot':
      return callWithHandle(msg, (h) => engine.saveSlot(msg.slot, msg.path, h))
    case 'eraseSlot':
      return callWithHandle(msg, (h) => engine.eraseSlot(msg.slot, h))
    case 'saveNgramCache':
      return reply(msg.id, () => engine.saveNgramCache(msg.path ?? null))
    case 'saveSuffixCache':
      return reply(msg.id, () => engine.saveSuffixCache(msg.path ?? null))
    case 'dispose':
      try {
        if (engine) await engine.dispose()
      } finally {
        process.exit(0)
      }
  }
})

function callWithHandle(msg, start) {
  try {
    start(forward(msg.id, { events: false }))
  } catch (e) {
    send({ t: 'error', id: msg.id, error: wireError(e) })
  }
}
