'use strict'
// Electron main process with one LlamaEngine shared by every window.
//
// Renderer side (through a preload script with contextBridge):
//   const id = crypto.randomUUID()
//   ipcRenderer.on('llm:event', (_e, reqId, ev) => { if (reqId === id && ev.type === 'token') show(ev.content) })
//   const result = await ipcRenderer.invoke('llm:complete', id, { prompt, n_predict: 256 })
//   ipcRenderer.send('llm:abort', id)   // stop early; the invoke still resolves, with stopped_abort
//
// Packaging: native code cannot be loaded from inside an asar archive, so
// unpack the platform package — the .node and the shared libraries beside it
// (electron-builder: asarUnpack: ["node_modules/llama-engine-*/**"]) — and
// keep the model files outside the archive too. The addon is Node-API: no
// electron-rebuild, the same binary works in every Electron version.
const path = require('node:path')
const { app, BrowserWindow, ipcMain } = require('electron')
const { LlamaEngine } = require('llama-engine')

// The model loads on the engine's own thread, so the main process (and every
// window) stays responsive meanwhile. Requests that arrive before it is done
// await the same promise.
let enginePromise = null
// Running requests by "<webContents id>:<renderer's id>", so two windows
// choosing the same id cannot abort each other's requests.
const running = new Map()

app.whenReady().then(() => {
  enginePromise = LlamaEngine.load({
    modelPath: path.join(app.getAppPath(), 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf'),
  })
  // A failed load is reported to each request; don't crash on an unhandled rejection.
  enginePromise.catch((e) => console.error(`model load failed: ${e.code}: ${e.message}`))
  new BrowserWindow({ webPreferences: { preload: path.join(__dirname, 'preload.js') } }).loadFile('index.html')
})

ipcMain.handle('llm:complete', async (event, id, request) => {
  const sender = event.sender
  const key = `${sender.id}:${id}`
  const ac = new AbortController()
  running.set(key, ac)
  // A closed or reloaded window cannot read its answer: stop generating for it
  // (otherwise the one engine stays busy and every other request waits).
  const onDestroyed = () => ac.abort()
  sender.once('destroyed', onDestroyed)
  try {
    const engine = await enginePromise
    // The engine runs requests one at a time, FIFO; events arrive in order on
    // this (main) thread, one per decoding step.
    return await engine.complete(
      request,
      (ev) => {
        if (!sender.isDestroyed()) sender.send('llm:event', id, ev)
      },
      ac.signal,
    )
  } catch (e) {
    // invoke() passes only the message to the renderer: keep the code in it.
    throw new Error(`${e.code || 'INTERNAL'}: ${e.message}`)
  } finally {
    running.delete(key)
    sender.removeListener('destroyed', onDestroyed)
  }
})

ipcMain.on('llm:abort', (event, id) => {
  running.get(`${event.sender.id}:${id}`)?.abort()
})

app.on('window-all-closed', () => {
  if (process.platform !== 'darwin') app.quit()
})

// Free the models before exiting rather than leaving it to process teardown:
// dispose() stops the running generation and joins the engine thread. Quitting
// is held back once for that; the second will-quit (from app.quit() below)
// goes through.
let disposed = false
app.on('will-quit', (e) => {
  if (disposed || !enginePromise) return
  e.preventDefault()
  disposed = true
  for (const ac of running.values()) ac.abort()
  enginePromise
    .then((engine) => engine.dispose())
    .catch(() => {}) // a failed load has nothing to free
    .finally(() => app.quit())
})
