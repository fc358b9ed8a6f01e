'use strict'
// The APIs the server speaks, and the one interface each implements. A
// protocol is a module exporting
//
//   routes             "METHOD /path" -> a generation route, or a handler
//   errorBody(e)       the JSON body of an error answer (an ApiError) in its shape
//   prefix             optional: paths under it that no route serves (a 404,
//                      a 405) still answer in this shape
//
// A generation route is an object that `generation` below runs, the same
// for every API: read the body, toEngine, queue and generate, then reply or
// stream.
//
//   toEngine(body, ctx)            the turn: `{ request, paramOf, … }`: the
//                                  engine's request, how to name an engine
//                                  error's field as this API does (optional),
//                                  and whatever reply and streamEvents need
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
]

/** The handler of a generation route: the skeleton every API's generations run. */
function generation(route) {
  return async (ctx) => {
    const body = await ctx.body()
    const turn = route.toEngine(body, ctx)
    ctx.paramOf = turn.paramOf
    if (body.stream !== true) {
      const result = await ctx.generate(turn.request, route.observe && ((event) => route.observe(event, turn)))
      ctx.json(200, route.reply(result, turn))
      return
    }
    const sse = ctx.sse()
    const events = await route.streamEvents(turn, sse, ctx)
    // Once the stream began, an error is its last event (the status is already 200).
    ctx.onStreamError = (e) => events.fail(e)
    const result = await ctx.generate(turn.request, (event) => events.event(event))
    events.end(result)
    sse.end()
  }
}

/** "METHOD /path" -> { run(ctx), protocol }. */
const ROUTES = new Map()
for (const protocol of PROTOCOLS) {
  for (const [key, route] of Object.entries(protocol.routes)) {
    ROUTES.set(key, { run: typeof route === 'function' ? route : generation(route), protocol })
  }
}

/** Every path some route serves (another method on it is a 405, not a 404). */
const PATHS = new Set([...ROUTES.keys()].map((k) => k.slice(k.indexOf(' ') + 1)))

// Errors of a path no protocol claims: OpenAI's shape.
const OPENAI = { errorBody: openaiErrorBody }

/** The protocol whose errors a path no route serves answers with. */
const protocolOf = (path) => PROTOCOLS.find((p) => p.prefix && path.startsWith(p.prefix)) ?? OPENAI

module.exports = { ROUTES, PATHS, protocolOf }
