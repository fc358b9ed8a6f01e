'use strict'
// llama.cpp's server endpoints: POST /completion (the engine's own request
// fields and result), /tokenize, /detokenize.

const { invalid } = require('./errors.js')

// llama.cpp's legacy per-token probabilities, from the event's tokens.
function probabilities(tokens) {
  if (!tokens.some((t) => Array.isArray(t.probs))) return undefined
  return tokens.map((t) => ({ content: t.piece, probs: (t.probs || []).map((p) => ({ tok_str: p.piece, prob: p.prob })) }))
}

async function completion(ctx) {
  const { stream, ...request } = await ctx.body()
  if (stream !== true) {
    ctx.json(200, await ctx.generate(request))
    return
  }
  const sse = ctx.sse()
  ctx.onStreamError = (e) => sse.send({ error: { message: e.message, type: e.type, param: e.param, code: e.code } })
  await ctx.generate(request, (event) => {
    if (event.type === 'token') {
      const completion_probabilities = probabilities(event.tokens)
      sse.send({ ...event, stop: false, ...(completion_probabilities ? { completion_probabilities } : {}) })
    } else {
      sse.send(event) // done: the whole result, stop: true
    }
  })
  sse.end()
}

async function tokenize(ctx) {
  const body = await ctx.body()
  if (typeof body.content !== 'string') throw invalid('content', 'expected a string')
  // Off the event loop: a body of megabytes takes seconds to tokenize.
  const tokens = await ctx.engine.tokenizeAsync(body.content, {
    addBos: body.add_special === true,
    // llama.cpp's server parses control tokens such as <|im_start|> here.
    special: body.parse_special !== false,
    withPieces: body.with_pieces === true,
  })
  await ctx.jsonList(200, 'tokens', tokens)
}

async function detokenize(ctx) {
  const body = await ctx.body()
  ctx.json(200, { content: await ctx.engine.detokenizeAsync(body.tokens ?? []) })
}

module.exports = {
  routes: {
    'POST /completion': completion,
    'POST /completions': completion,
    'POST /tokenize': tokenize,
    'POST /detokenize': detokenize,
  },
}
