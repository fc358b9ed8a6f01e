// A dependency-free HTTP server over one LlamaEngine, with the endpoints of
// llama.cpp's server that map onto it:
//
//   POST /completion   request fields as JSON; `stream: true` answers with
//                      server-sent events, one `data: {...}` per token event,
//                      then the result with `stop: true`
//   POST /tokenize     { content, add_special?, with_pieces? } -> { tokens }
//   POST /detokenize   { tokens } -> { content }
//   GET  /health       { status: "ok" }, or 503 { status: "loading" }
//
//   node examples/server.mjs --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--draft PATH] [--port 8080] [--host 127.0.0.1]
//   curl -N localhost:8080/completion -d '{"prompt": "Once upon a time", "n_predict": 32, "stream": true}'
//
// Requests share the one engine and run one at a time in arrival order (the
// engine's FIFO queue). A client that disconnects aborts its own generation.
// Errors are { error: { code, message } }: 400 for INVALID_REQUEST (the
// message starts with the offending field) and unparseable JSON, 500 for
// the rest.
import http from 'node:http'
import { realpathSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

const MAX_BODY = 16 * 1024 * 1024

class HttpError extends Error {
  constructor(status, code, message) {
    super(message)
    this.status = status
    this.code = code
  }
}

function statusFor(err) {
  if (err instanceof HttpError) return err.status
  return err && err.code === 'INVALID_REQUEST' ? 400 : 500
}

function sendJson(res, status, body) {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': Buffer.byteLength(text) })
  res.end(text)
}

function sendError(res, err) {
  const code = (err && err.code) || 'INTERNAL'
  const message = (err && err.message) || String(err)
  if (res.headersSent) {
    // Mid-stream: the status is already 200, so say it as the last event.
    if (!res.writableEnded) res.end(`data: ${JSON.stringify({ error: { code, message } })}\n\n`)
    return
  }
  sendJson(res, statusFor(err), { error: { code, message } })
}

async function readJson(req) {
  const chunks = []
  let size = 0
  for await (const chunk of req) {
    size += chunk.length
    if (size > MAX_BODY) throw new HttpError(413, 'INVALID_REQUEST', `body: larger than ${MAX_BODY} bytes`)
    chunks.push(chunk)
  }
  const text = Buffer.concat(chunks).toString('utf8')
  let body
  try {
    body = JSON.parse(text)
  } catch (e) {
    throw new HttpError(400, 'INVALID_REQUEST', `body: invalid JSON (${e.message})`)
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new HttpError(400, 'INVALID_REQUEST', 'body: expected a JSON object')
  }
  return body
}

// An AbortSignal that fires when the client goes away before its answer was
// written: the response closes without having ended.
function disconnectSignal(res) {
  const ac = new AbortController()
  res.on('close', () => {
    if (!res.writableEnded) ac.abort()
  })
  return ac.signal
}

// llama.cpp's legacy per-token probabilities, from the event's tokens.
function probabilities(tokens) {
  if (!tokens.some((t) => Array.isArray(t.probs))) return undefined
  return tokens.map((t) => ({ content: t.piece, probs: (t.probs || []).map((p) => ({ tok_str: p.piece, prob: p.prob })) }))
}

async function completion(engine, req, res) {
  const body = await readJson(req)
  const signal = disconnectSignal(res)
  const { stream, ...request } = body
  if (stream !== true) {
    const result = await engine.complete(request, null, signal)
    if (!res.destroyed) sendJson(res, 200, result)
    return
  }
  // Headers wait for the first event, so a request the engine rejects
  // (INVALID_REQUEST) still gets its 400.
  const write = (data) => {
    if (res.destroyed || res.writableEnded) return
    if (!res.headersSent) {
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', Connection: 'keep-alive' })
    }
    res.write(`data: ${JSON.stringify(data)}\n\n`)
  }
  await engine.complete(
    request,
    (event) => {
      if (event.type === 'token') {
        const completion_probabilities = probabilities(event.tokens)
        write({ ...event, stop: false, ...(completion_probabilities ? { completion_probabilities } : {}) })
      } else {
        write(event) // done: the whole result, stop: true
      }
    },
    signal,
  )
  if (!res.writableEnded) res.end()
}

async function tokenize(engine, req, res) {
  const body = await readJson(req)
  if (typeof body.content !== 'string') throw new HttpError(400, 'INVALID_REQUEST', 'content: expected a string')
  const ids = engine.tokenize(body.content, {
    addBos: body.add_special === true,
    // llama.cpp's server parses control tokens such as <|im_start|> here.
    special: body.parse_special !== false,
  })
  const tokens = body.with_pieces === true ? ids.map((id) => ({ id, piece: engine.detokenize([id]) })) : ids
  sendJson(res, 200, { tokens })
}

async function detokenize(engine, req, res) {
  const body = await readJson(req)
  sendJson(res, 200, { content: engine.detokenize(body.tokens ?? []) })
}

const ROUTES = {
  'POST /completion': completion,
  'POST /completions': completion,
  'POST /tokenize': tokenize,
  'POST /detokenize': detokenize,
}

/**
 * An http.Server (not yet listening) serving `engine` — a LlamaEngine, or a
 * promise of one: until it resolves, /health says "loading" and the other
 * endpoints answer 503.
 */
export function createServer(engine) {
  let ready = engine && typeof engine.then === 'function' ? null : engine
  let loadError = null
  if (!ready) {
    Promise.resolve(engine).then(
      (e) => (ready = e),
      (e) => (loadError = e),
    )
  }
  return http.createServer(async (req, res) => {
    const path = new URL(req.url, 'http://localhost').pathname
    try {
      if (path === '/health' && req.method === 'GET') {
        if (loadError) return sendJson(res, 500, { status: 'error', error: { code: loadError.code || 'INTERNAL', message: loadError.message } })
        if (!ready) return sendJson(res, 503, { status: 'loading' })
        if (ready.status().disposed) return sendJson(res, 503, { status: 'unavailable' })
        return sendJson(res, 200, { status: 'ok' })
      }
      const handler = ROUTES[`${req.method} ${path}`]
      if (!handler) {
        const known = path === '/health' || Object.keys(ROUTES).some((r) => r.endsWith(` ${path}`))
        throw known
          ? new HttpError(405, 'METHOD_NOT_ALLOWED', `${req.method} is not allowed on ${path}`)
          : new HttpError(404, 'NOT_FOUND', `no endpoint ${path}`)
      }
      if (loadError) throw loadError
      if (!ready) throw new HttpError(503, 'LOADING', 'the model is still loading')
      await handler(ready, req, res)
    } catch (err) {
      if (!res.destroyed) sendError(res, err)
    }
  })
}

function isMain() {
  if (!process.argv[1]) return false
  try {
    return import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href
  } catch {
    return false
  }
}

async function serve() {
  const usage = 'Usage: node examples/server.mjs --model PATH [--draft PATH] [--port 8080] [--host 127.0.0.1] [--ctx-size N] [--threads N]'
  let values
  try {
    ;({ values } = parseArgs({
      options: {
        model: { type: 'string', short: 'm' },
        draft: { type: 'string' },
        port: { type: 'string' },
        host: { type: 'string' },
        'ctx-size': { type: 'string', short: 'c' },
        threads: { type: 'string', short: 't' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }))
  } catch (e) {
    console.error(`${e.message}\n${usage}`)
    process.exit(2)
  }
  if (values.help) return console.log(usage)
  const integer = (name, text) => {
    const n = Number(text)
    if (text === undefined) return undefined
    if (text.trim() === '' || !Number.isInteger(n) || n < 0) {
      console.error(`--${name}: expected a non-negative integer\n${usage}`)
      process.exit(2)
    }
    return n
  }
  const root = join(dirname(fileURLToPath(import.meta.url)), '..')
  const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
  const options = { modelPath: resolve(values.model ?? join(models, 'SmolLM2-135M-Instruct.Q4_1.gguf')) }
  if (values.draft) options.draftModelPath = resolve(values.draft)
  if (values['ctx-size'] !== undefined) options.contextSize = integer('ctx-size', values['ctx-size'])
  if (values.threads !== undefined) options.threads = integer('threads', values.threads)
  const port = integer('port', values.port ?? process.env.PORT ?? '8080')
  const host = values.host ?? '127.0.0.1'

  const { LlamaEngine } = await import('../index.mjs')
  // Listen at once, so /health can say "loading" while the model loads.
  const loading = LlamaEngine.load(options)
  const server = createServer(loading)
  server.listen(port, host, () => {
    const { port: actual } = server.address()
    console.error(`listening on http://${host}:${actual}, loading ${options.modelPath}`)
  })
  let engine
  try {
    engine = await loading
  } catch (e) {
    console.error(`error ${e.code || 'INTERNAL'}: ${e.message}`)
    process.exit(1)
  }
  console.error('model loaded')

  let stopping = false
  const stop = async () => {
    if (stopping) process.exit(130)
    stopping = true
    server.close()
    server.closeAllConnections() // open event streams would otherwise hold close() up
    await engine.dispose() // the running generation resolves aborted, queued ones reject DISPOSED
  }
  process.on('SIGINT', stop)
  process.on('SIGTERM', stop)
}

if (isMain()) {
  serve().catch((e) => {
    console.error(e)
    process.exit(1)
  })
}
