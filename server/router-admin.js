'use strict'
// llama-server's model management under the router (serve without
// --model): what the models do, as a stream, and the Hugging Face cache's
// models added and removed.
//
//   GET /models/sse      `data: { model, event, data? }` per event:
//                        status_change ({ status: loading | loaded |
//                        unloaded | failed }), download_progress ({
//                        progress: { FILE: { done, total } } }),
//                        download_finished, download_failed ({ error }),
//                        model_remove, models_reload
//   POST /models         { model: "OWNER/REPO[:TAG]" }: downloads it into
//                        the cache (answered once it began, or 400 if it
//                        cannot), then lists it; 400 for one listed already
//   DELETE /models?model=NAME
//                        unloads a model of the cache and removes its files;
//                        400 for one not listed, or not of the cache
//
// The download and the removal are the server's options (createServer's
// `downloadModel(name, { onProgress, signal })` and `removeModel(name, {
// check })`, `check` only asking whether it could: serve gives them over
// the cache); without them, 501.

const { ApiError } = require('./errors.js')

/** The models' events, to every GET /models/sse client. */
class ModelEvents {
  constructor() {
    this.clients = new Set()
  }

  send(model, event, data) {
    const line = `data: ${JSON.stringify(data === undefined ? { model, event } : { model, event, data })}\n\n`
    for (const write of this.clients) write(line)
  }

  subscribe(write) {
    this.clients.add(write)
    return () => this.clients.delete(write)
  }
}

const HF_NAME = /^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*(:[\w.-]+)?$/
/** How often a download's progress is told, at most (ms). */
const PROGRESS_EVERY_MS = 250

const notSupported = (what) =>
  new ApiError(501, `${what}: this server manages no model cache (serve without --model, over the Hugging Face cache)`, { code: 'NOT_SUPPORTED', type: 'not_supported_error' })

class RouterAdmin {
  /**
   * @param {import('./router.js').Router} router
   * @param {{ download?: Function, remove?: Function, reload: () => Promise<void> }} options
   */
  constructor(router, { download, remove, reload }) {
    this.router = router
    this.download = download
    this.remove = remove
    this.reload = reload
    this.events = new ModelEvents()
    /** name -> { progress } of the downloads running. */
    this.downloads = new Map()
    this.controller = new AbortController()
  }

  /** GET /models/sse: events until the client goes away (or the server closes). */
  async sse(ctx) {
    const out = ctx.stream(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no' })
    // A first line, so the client knows it is subscribed before any event.
    out.write(': subscribed\n\n')
    const unsubscribe = this.events.subscribe((line) => out.write(line))
    await new Promise((resolve) => {
      if (ctx.signal.aborted || this.controller.signal.aborted) return resolve()
      ctx.signal.addEventListener('abort', resolve, { once: true })
      this.controller.signal.addEventListener('abort', resolve, { once: true })
    })
    unsubscribe()
    out.end()
  }

  /** POST /models: `{ model }` downloaded into the cache, then listed. */
  async add(ctx) {
    const body = await ctx.body()
    const name = body.model
    if (typeof name !== 'string' || !HF_NAME.test(name)) throw new ApiError(400, 'model: expected a Hugging Face model, OWNER/REPO or OWNER/REPO:TAG', { param: 'model' })
    if (typeof this.download !== 'function') throw notSupported('POST /models')
    if (this.router.names().includes(name) || this.downloads.has(name)) throw new ApiError(400, `model '${name}' already exists`, { param: 'model' })
    const state = { progress: {} }
    this.downloads.set(name, state)
    let told = 0
    let began
    const started = new Promise((resolve) => (began = resolve))
    const onProgress = ({ file, downloaded, total }) => {
      state.progress[file] = { done: downloaded, total }
      began()
      const now = Date.now()
      if (now - told < PROGRESS_EVERY_MS && downloaded !== total) return
      told = now
      this.events.send(name, 'download_progress', { progress: state.progress })
    }
    const done = (async () => {
      try {
        await this.download(name, { onProgress, signal: this.controller.signal })
        this.downloads.delete(name)
        this.events.send(name, 'download_finished')
        await this.reload().catch(() => {})
        this.events.send('*', 'models_reload')
      } catch (e) {
        this.downloads.delete(name)
        this.events.send(name, 'download_failed', { error: e.message })
        throw e
      }
    })()
    // Answered once the download began (or ended: a model the cache had, or one that cannot be had).
    const failed = await Promise.race([started.then(() => null), done.then(() => null, (e) => e)])
    done.catch(() => {})
    if (failed) throw new ApiError(400, `model '${name}' cannot be downloaded: ${failed.message}`, { param: 'model' })
    ctx.json(200, { success: true })
  }

  /** DELETE /models?model=NAME: a model of the cache unloaded and its files removed. */
  async delete(ctx) {
    const name = ctx.query.get('model')
    if (!name) throw new ApiError(400, 'model: required (?model=NAME)', { param: 'model' })
    if (typeof this.remove !== 'function') throw notSupported('DELETE /models')
    if (!this.router.names().includes(name)) throw new ApiError(400, `model name=${name} is not found`, { param: 'model' })
    if (!(await this.remove(name, { check: true }))) throw new ApiError(400, `model name=${name} is not removable (not from the cache)`, { param: 'model' })
    await this.router.unload(name)
    if (!(await this.remove(name))) throw new ApiError(500, `model name=${name}: its files could not be removed`, { code: 'INTERNAL' })
    await this.reload().catch(() => {})
    this.events.send(name, 'model_remove')
    ctx.json(200, { success: true })
  }

  close() {
    this.controller.abort()
  }
}

module.exports = { RouterAdmin, ModelEvents }
