// A dependency-free HTTP server over one LlamaEngine. It speaks the OpenAI
// API, so the official `openai` client (and anything built on it) works
// against a local model, and the endpoints of llama.cpp's server:
//
//   GET  /v1/models            the loaded model
//   POST /v1/chat/completions  messages rendered with the model's chat template;
//                              `stream: true` sends chat.completion.chunk events
//                              (role in the first delta, finish_reason in the
//                              last, a usage chunk with stream_options.include_usage)
//                              then `data: [DONE]`
//   POST /v1/completions       a plain prompt, streamed or not
//   POST /completion           llama.cpp's request fields as JSON; `stream: true`
//                              sends one `data: {...}` per token event, then the result
//   POST /tokenize             { content, add_special?, with_pieces? } -> { tokens }
//   POST /detokenize           { tokens } -> { content }
//   GET  /health               { status: "ok" }, or 503 { status: "loading" }
//
//   node examples/server.mjs --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--draft PATH] [--port 8080] [--host 127.0.0.1] [--api-key KEY]
//   curl localhost:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
//
// Requests share the one engine and run in its queue. A client that
// disconnects aborts its own generation. Errors are OpenAI-shaped,
// { error: { message, type, param, code } } with the engine's stable code:
// 400 for a client's mistake (the message starts with the offending field),
// 401 without the --api-key, 404/405 for unknown routes, 503 while loading,
// 500 only for the engine's own failures; 4xx answers carry
// `x-should-retry: false` so clients do not retry them.
import http from 'node:http'
import { readFileSync, realpathSync } from 'node:fs'
import { timingSafeEqual } from 'node:crypto'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import * as openai from './openai.mjs'

const { ApiError } = openai
const MAX_BODY = 16 * 1024 * 1024

function sendJson(res, status, body, headers = {}) {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': Buffer.byteLength(text), ...headers })
  res.end(text)
}

function sendError(res, err) {
  const e = openai.toApiError(err)
  if (res.headersSent) {
    // Mid-stream: the status is already 200, so say it as the last event.
    if (!res.writableEnded) res.end(`data: ${JSON.stringify(openai.errorBody(e))}\n\n`)
    return
  }
  sendJson(res, e.status, openai.errorBody(e), e.status < 500 ? { 'x-should-retry': 'false' } : {})
}

async function readJson(req) {
  const chunks = []
  let size = 0
  for await (const chunk of req) {
    size += chunk.length
    if (size > MAX_BODY) throw new ApiError(413, `body: larger than ${MAX_BODY} bytes`)
    chunks.push(chunk)
  }
  const text = Buffer.concat(chunks).toString('utf8')
  let body
  try {
    body = JSON.parse(text)
  } catch (e) {
    throw new ApiError(400, `body: invalid JSON (${e.message})`)
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new ApiError(400, 'body: expected a JSON object')
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

/**
 * Server-sent events on `res`. Headers wait for the first event, so a request
 * the engine rejects before generating still gets its 400.
 */
function eventStream(res) {
  return (data) => {
    if (res.destroyed || res.writableEnded) return
    if (!res.headersSent) {
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', Connection: 'keep-alive' })
    }
    res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`)
  }
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
  const write = eventStream(res)
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
  if (typeof body.content !== 'string') throw new ApiError(400, 'content: expected a string', { param: 'content' })
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

function models(engine, _req, res, started) {
  const id = engine.status().model
  sendJson(res, 200, { object: 'list', data: [{ id, object: 'model', created: started, owned_by: 'llama-engine' }] })
}

/** /v1/chat/completions and /v1/completions: one engine request, OpenAI's shapes around it. */
async function openaiCompletion(kind, engine, req, res) {
  const body = await readJson(req)
  const request = kind === 'chat' ? openai.chatRequest(body) : openai.completionRequest(body)
  const head = openai.responseHead(kind, engine.status().model)
  const signal = disconnectSignal(res)
  if (body.stream !== true) {
    const result = await engine.complete(request, null, signal)
    if (!res.destroyed) sendJson(res, 200, kind === 'chat' ? openai.chatCompletion(head, result) : openai.textCompletion(head, result))
    return
  }
  const write = eventStream(res)
  const chunk = kind === 'chat' ? (fields) => openai.chatChunk(head, fields) : (fields) => openai.textChunk(head, fields)
  let first = true
  const result = await engine.complete(
    request,
    (event) => {
      if (event.type !== 'token') return
      const fields = kind === 'chat' ? { delta: openai.chatDelta(event) } : { text: event.content }
      if (!fields.delta && !fields.text) return
      if (first && kind === 'chat') write(chunk({ delta: { role: 'assistant', content: '' } }))
      first = false
      write(chunk(fields))
    },
    signal,
  )
  if (first && kind === 'chat') write(chunk({ delta: { role: 'assistant', content: '' } }))
  write(chunk({ ...(kind === 'chat' ? { delta: {} } : { text: '' }), finish_reason: openai.finishReason(result) }))
  if (body.stream_options?.include_usage === true) write(chunk({ usage: openai.usage(result) }))
  write('[DONE]')
  res.end()
}

const ROUTES = {
  'GET /v1/models': models,
  'POST /v1/chat/completions': (engine, req, res) => openaiCompletion('chat', engine, req, res),
  'POST /v1/completions': (engine, req, res) => openaiCompletion('text', engine, req, res),
  'POST /completion': completion,
  'POST /completions': completion,
  'POST /tokenize': tokenize,
  'POST /detokenize': detokenize,
}

/** Whether the request carries `Authorization: Bearer <apiKey>` (compared in constant time). */
function authorized(req, apiKey) {
  const given = /^Bearer\s+(.+)$/i.exec(req.headers.authorization || '')?.[1]?.trim()
  if (!given) return false
  const a = Buffer.from(given)
  const b = Buffer.from(apiKey)
  return a.length === b.length && timingSafeEqual(a, b)
}

/**
 * An http.Server (not yet listening) serving `engine` — a LlamaEngine, or a
 * promise of one: until it resolves, /health says "loading" and the other
 * endpoints answer 503. With `apiKey`, every endpoint but /health wants
 * `Authorization: Bearer <apiKey>`.
 */
export function createServer(engine, { apiKey } = {}) {
  let ready = engine && typeof engine.then === 'function' ? null : engine
  let loadError = null
  if (!ready) {
    Promise.resolve(engine).then(
      (e) => (ready = e),
      (e) => (loadError = e),
    )
  }
  const started = Math.floor(Date.now() / 1000)
  return http.createServer(async (req, res) => {
    const path = new URL(req.url, 'http://localhost').pathname
    try {
      if (path === '/health' && req.method === 'GET') {
        if (loadError) return sendJson(res, 500, { status: 'error', error: openai.errorBody(openai.toApiError(loadError)).error })
        if (!ready) return sendJson(res, 503, { status: 'loading' })
        if (ready.status().disposed) return sendJson(res, 503, { status: 'unavailable' })
        return sendJson(res, 200, { status: 'ok' })
      }
      const handler = ROUTES[`${req.method} ${path}`]
      if (!handler) {
        const known = path === '/health' || Object.keys(ROUTES).some((r) => r.endsWith(` ${path}`))
        throw known
          ? new ApiError(405, `${req.method} is not allowed on ${path}`, { code: 'METHOD_NOT_ALLOWED' })
          : new ApiError(404, `no endpoint ${path}`, { code: 'NOT_FOUND' })
      }
      if (apiKey && !authorized(req, apiKey)) {
        throw new ApiError(401, 'a valid API key is required: Authorization: Bearer <key>', { code: 'INVALID_API_KEY' })
      }
      if (loadError) throw loadError
      if (!ready) throw new ApiError(503, 'the model is still loading', { code: 'LOADING' })
      await handler(ready, req, res, started)
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
  const usage =
    'Usage: node examples/server.mjs --model PATH [--draft PATH] [--port 8080] [--host 127.0.0.1] [--ctx-size N] [--threads N] [--api-key KEY] [--chat-template FILE]'
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
        'api-key': { type: 'string' },
        'chat-template': { type: 'string' },
        'tool-call-format': { type: 'string' },
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
  if (values['chat-template'] !== undefined) options.chatTemplate = readFileSync(values['chat-template'], 'utf8')
  if (values['tool-call-format'] !== undefined) options.toolCallFormat = values['tool-call-format']
  const apiKey = values['api-key'] ?? process.env.LLAMA_ENGINE_API_KEY
  const port = integer('port', values.port ?? process.env.PORT ?? '8080')
  const host = values.host ?? '127.0.0.1'

  const { LlamaEngine } = await import('../index.mjs')
  // Listen at once, so /health can say "loading" while the model loads.
  const loading = LlamaEngine.load(options)
  const server = createServer(loading, { apiKey })
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
