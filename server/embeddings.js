'use strict'
// OpenAI's embeddings: POST /v1/embeddings (alias /embeddings) over
// engine.embed(input, { normalize, truncate }).

const { invalid, openaiErrorBody } = require('./errors.js')

/**
 * One input as llama-server reads a prompt: a string; token ids, strings
 * among them tokenized in place; `{ prompt_string }`; or `{ content: [{
 * type: 'text', text }] }` (the texts joined). A string, or token ids.
 */
function onePrompt(p, where, engine) {
  if (typeof p === 'string') return p
  if (Array.isArray(p)) {
    if (p.length === 0) throw invalid(where, 'cannot be empty')
    if (p.every(Number.isInteger)) return p
    if (!p.every((x) => Number.isInteger(x) || typeof x === 'string')) throw invalid(where, 'expected token ids (strings among them are tokenized)')
    return p.flatMap((x) => (typeof x === 'string' ? engine.tokenize(x, { addBos: false, special: true }) : [x]))
  }
  if (p !== null && typeof p === 'object') {
    if (typeof p.prompt_string === 'string') return p.prompt_string
    if (Array.isArray(p.content)) {
      const bad = p.content.findIndex((part) => part === null || typeof part !== 'object' || part.type !== 'text' || typeof part.text !== 'string')
      if (bad >= 0) throw invalid(`${where}.content[${bad}]`, 'expected { type: "text", text } (this endpoint embeds text)')
      return p.content.map((part) => part.text).join('')
    }
    throw invalid(where, 'expected { prompt_string } or { content: [{ type: "text", text }] }')
  }
  throw invalid(where, 'expected a string, token ids, { prompt_string } or { content: [...] }')
}

/**
 * The request's `input`: one prompt or several (a list of strings, token
 * arrays or objects), as llama-server takes them; strings, or token ids
 * for all when any is ids. An empty string embeds the model's BOS alone.
 */
function inputOf(input, engine) {
  const isEmpty = (p) => p === '' || (Array.isArray(p) && p.length === 0)
  if (input === '') {
    const bos = engine.tokenize('', { addBos: true })
    if (bos.length === 0) throw invalid('input', 'cannot be empty (this model has no BOS token to embed)')
    return bos
  }
  if (!Array.isArray(input)) {
    const one = onePrompt(input, 'input', engine)
    if (isEmpty(one)) throw invalid('input', 'cannot be empty')
    return one
  }
  if (input.length === 0) throw invalid('input', 'expected a string, an array of strings, an array of token ids or an array of those; not empty')
  // Token ids, strings among them: one prompt.
  if (input.every((x) => Number.isInteger(x) || typeof x === 'string') && !input.every((x) => typeof x === 'string')) return onePrompt(input, 'input', engine)
  const prompts = input.map((p, i) => onePrompt(p, `input[${i}]`, engine))
  const empty = prompts.findIndex(isEmpty)
  if (empty >= 0) throw invalid(`input[${empty}]`, 'cannot be empty')
  if (prompts.every((p) => typeof p === 'string')) return prompts
  return prompts.map((p) => (typeof p === 'string' ? engine.tokenize(p, { addBos: true }) : p))
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
  if (body.input === undefined && body.content !== undefined) body.input = body.content // llama.cpp's /embedding
  const input = inputOf(body.input, ctx.engine)
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
