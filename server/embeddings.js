'use strict'
// OpenAI's embeddings: POST /v1/embeddings (alias /embeddings) over
// engine.embed(input, { normalize, truncate }).

const { invalid, openaiErrorBody } = require('./errors.js')

const isTokens = (v) => Array.isArray(v) && v.length > 0 && v.every(Number.isInteger)

/** The request's `input` checked: a string, strings, token ids, or arrays of token ids; none empty. */
function inputOf(input) {
  if (typeof input === 'string') {
    if (input === '') throw invalid('input', 'cannot be empty')
    return input
  }
  if (!Array.isArray(input) || input.length === 0) throw invalid('input', 'expected a string, an array of strings, an array of token ids or an array of those; not empty')
  if (input.every(Number.isInteger)) return input
  if (input.every((s) => typeof s === 'string')) {
    const empty = input.findIndex((s) => s === '')
    if (empty >= 0) throw invalid(`input[${empty}]`, 'cannot be empty')
    return input
  }
  if (input.every(Array.isArray)) {
    const bad = input.findIndex((t) => !isTokens(t))
    if (bad >= 0) throw invalid(`input[${bad}]`, 'expected a non-empty array of token ids')
    return input
  }
  throw invalid('input', 'expected a string, an array of strings, an array of token ids or an array of those (not mixed)')
}

/**
 * `dimensions` as OpenAI's text-embedding-3 models apply it: the first
 * `dimensions` components, L2-normalised again. Meaningful for models
 * trained for it (Matryoshka embeddings); more than the model has is a 400.
 */
function shorten(vector, dimensions, normalize) {
  if (dimensions === vector.length) return vector
  const out = vector.slice(0, dimensions)
  if (normalize) {
    let sum = 0
    for (const x of out) sum += x * x
    const norm = Math.sqrt(sum)
    if (norm > 0) for (let i = 0; i < out.length; i++) out[i] /= norm
  }
  return out
}

/** The little-endian bytes of a Float32Array, in base64 (what the official client decodes). */
function base64(vector) {
  const bytes = Buffer.alloc(vector.length * 4)
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i], i * 4)
  return bytes.toString('base64')
}

async function embeddings(ctx) {
  const body = await ctx.body()
  const input = inputOf(body.input)
  const format = body.encoding_format ?? 'float'
  if (format !== 'float' && format !== 'base64') throw invalid('encoding_format', `expected "float" or "base64", got ${JSON.stringify(format)}`)
  if (body.dimensions != null && (!Number.isInteger(body.dimensions) || body.dimensions < 1)) throw invalid('dimensions', 'expected a positive integer')
  for (const name of ['normalize', 'truncate']) {
    if (body[name] != null && typeof body[name] !== 'boolean') throw invalid(name, 'expected a boolean')
  }
  const normalize = body.normalize ?? true
  const result = await ctx.embed(input, { normalize, truncate: body.truncate ?? false })
  const size = result.embeddings[0]?.length ?? 0
  if (body.dimensions != null && body.dimensions > size) {
    throw invalid('dimensions', `this model's embeddings have ${size} dimensions; ask for at most that many`)
  }
  const data = result.embeddings.map((vector, index) => {
    const v = body.dimensions != null ? shorten(vector, body.dimensions, normalize) : vector
    return { object: 'embedding', index, embedding: format === 'base64' ? base64(v) : Array.from(v) }
  })
  ctx.json(200, { object: 'list', model: ctx.modelName(), data, usage: { prompt_tokens: result.tokens, total_tokens: result.tokens } })
}

module.exports = {
  errorBody: openaiErrorBody,
  routes: {
    'POST /v1/embeddings': embeddings,
    'POST /embeddings': embeddings,
  },
}
