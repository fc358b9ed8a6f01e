'use strict'
// The APIs the server speaks, and the one interface each implements. A
// protocol is a module exporting
//
//   routes             "METHOD /path" -> a generation route, or a handler; a
//                      segment ":name" matches one path segment, given to the
//                      handler as ctx.params.name
//   errorBody(e)       the JSON body of an error answer (an ApiError) in its shape
//   prefix             optional: paths under it that no route serves (a 404,
//                      a 405) still answer in this shape
//
// A generation route is an object that `generation` below runs, the same
// for every API: read the body, toEngine, queue and generate, then reply or
// stream.
//
//   toEngine(body, ctx)            the turn: `{ request, paramOf, verbose, … }`:
//                                  the engine's request, how to name an engine
//                                  error's field as this API does (optional),
//                                  whether the answer carries `__verbose` (then
//                                  the skeleton sets `turn.prompt`, the text
//                                  the model reads), and whatever reply and
//                                  streamEvents need
//   reply(result, turn)            the JSON body of an answer not streamed
//   observe(event, turn)           optional: each engine event of an answer
//                                  not streamed (the Responses API counts
//                                  reasoning tokens)
//   streamEvents(turn, sse, ctx)   (or a promise of) `{ event(event),
//                                  end(result), fail(e) }`: each engine
//                                  event, the result, and an error once the
//                                  stream began, as this API's events on
//                                  `sse` (`send(data, event?)`)
//
// With `turn.n` > 1 (OpenAI's `n`), the request runs n times side by side
// and observe / event take the choice's index as a third / second
// argument; reply and end get the n results, in order.
//
// Any other route (models, tokenize, embeddings, count_tokens, …) is a plain
// handler, `async (ctx) => …`, answering with ctx.json().
//
// A new API: one module, and one line in PROTOCOLS.

const { openaiErrorBody } = require('./errors.js')

const PROTOCOLS = [
  require('./openai-chat.js'),
  require('./llama.js'),
  require('./responses.js'),
  require('./embeddings.js'),
  require('./anthropic.js'),
  require('./streams.js'),
  require('./slot-files.js'),
]

/** The handler of a generation route: the skeleton every API's generations run. */
function generation(route) {
  return async (ctx) => {
    const body = await ctx.body()
    const turn = route.toEngine(body, ctx)
    ctx.paramOf = turn.paramOf
    // `verbose` (llama-server's __verbose): the prompt as the model reads it.
    if (turn.verbose || turn.wantsPrompt) turn.prompt = ctx.promptText(turn.request)
    const n = turn.n ?? 1
    // The n choices, each its own generation (side by side as slots allow).
    const each = (onEvent) => Promise.all(Array.from({ length: n }, (_, i) => ctx.generate(turn.request, onEvent && ((event) => onEvent(event, i)))))
    if (body.stream !== true) {
      const observe = route.observe && ((event, i) => route.observe(event, turn, i))
      const results = await each(observe)
      ctx.json(200, route.reply(n === 1 ? results[0] : results, turn))
      return
    }
    const sse = ctx.sse()
    const events = await route.streamEvents(turn, sse, ctx)
    // Once the stream began, an error is its last event (the status is already 200).
    ctx.onStreamError = (e) => events.fail(e)
    const results = await each((event, i) => events.event(event, i))
    events.end(n === 1 ? results[0] : results)
    sse.end()
  }
}

/** "METHOD /path" -> { run(ctx), protocol }; and the routes with parameters. */
const ROUTES = new Map()
const PATTERNS = []
for (const protocol of PROTOCOLS) {
  for (const [key, route] of Object.entries(protocol.routes)) {
    const entry = { run: typeof route === 'function' ? route : generation(route), protocol, generation: typeof route !== 'function' }
    const [method, path] = key.split(' ')
    if (!path.includes('/:')) {
      ROUTES.set(key, entry)
      continue
    }
    const names = []
    const source = path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/\/:(\w+)/g, (_, name) => (names.push(name), '/([^/]+)'))
    PATTERNS.push({ method, path, regex: new RegExp(`^${source}$`), names, entry })
  }
}

/** Every path some route serves (another method on it is a 405, not a 404). */
const PATHS = new Set([...ROUTES.keys()].map((k) => k.slice(k.indexOf(' ') + 1)))

/**
 * The route of a request: `{ route, params, known, pattern }` — `route`
 * undefined when none serves this method and path, `known` when some route
 * serves the path (with another method: a 405), `pattern` the path as the
 * routes spell it (`/v1/responses/:id`).
 */
function findRoute(method, path) {
  const route = ROUTES.get(`${method} ${path}`)
  if (route) return { route, params: {}, known: true, pattern: path }
  let known = PATHS.has(path)
  let pattern = path
  for (const p of PATTERNS) {
    const m = p.regex.exec(path)
    if (!m) continue
    known = true
    pattern = p.path
    if (p.method !== method) continue
    let params
    try {
      params = Object.fromEntries(p.names.map((n, i) => [n, decodeURIComponent(m[i + 1])]))
    } catch {
      continue // a malformed escape matches nothing
    }
    return { route: p.entry, params, known, pattern }
  }
  return { route: undefined, params: {}, known, pattern }
}

// Errors of a path no protocol claims: OpenAI's shape.
const OPENAI = { errorBody: openaiErrorBody }

/** The protocol whose errors a path no route serves answers with. */
const protocolOf = (path) => PROTOCOLS.find((p) => p.prefix && path.startsWith(p.prefix)) ?? OPENAI

module.exports = { ROUTES, PATHS, findRoute, protocolOf }
