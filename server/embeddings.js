'use strict'
// OpenAI's embeddings: POST /v1/embeddings (alias /embeddings) over
// engine.embed(input, { normalize, truncate }).

const { ApiError, invalid, openaiErrorBody } = require('./errors.js')

const MEDIA_MARKER = '<__media__>'

const MEDIA_TYPES = ['image_url', 'input_image', 'image', 'input_audio', 'audio']

/** Refuses media (`kind`: image, audio or any) for a model without a projector that reads them. */
function readsMedia(engine, kind, where) {
  const media = engine.status().media
  const ok = kind === 'any' ? media?.vision || media?.audio : kind === 'audio' ? media?.audio : media?.vision
  if (!ok) throw invalid(where, `this model reads no ${kind === 'audio' ? 'audio' : kind === 'any' ? 'images or audio' : 'images'} (the server needs a projector that does: --mmproj)`)
}

/** A media file's part as the engine takes it: audio by its header (WAV, MP3, FLAC, OGG), else an image. */
function mediaPart(data, where) {
  if (typeof data !== 'string' || data === '') throw invalid(where, 'expected a file\'s bytes in base64')
  const payload = data.startsWith('data:') ? data.slice(data.indexOf(',') + 1) : data
  const head = Buffer.from(payload.slice(0, 16), 'base64').toString('latin1')
  const audio = /^(RIFF....WAVE|ID3|fLaC|OggS)/s.test(head) || /^\xff[\xf2-\xfb]/.test(head)
  return audio ? { type: 'audio', data } : { type: 'image', data }
}

/**
 * llama-server's multimodal prompt, `{ prompt_string, multimodal_data:
 * [base64, ...] }`: one file per `<__media__>` marker of the text, in
 * order; as content parts.
 */
function multimodalPrompt(p, where, engine) {
  const files = p.multimodal_data
  if (!Array.isArray(files)) throw invalid(`${where}.multimodal_data`, 'expected an array of files in base64')
  if (files.length > 0) readsMedia(engine, 'any', `${where}.multimodal_data`)
  const pieces = p.prompt_string.split(MEDIA_MARKER)
  if (pieces.length - 1 !== files.length) {
    throw invalid(`${where}.multimodal_data`, `${files.length} file(s) for ${pieces.length - 1} ${MEDIA_MARKER} marker(s) in prompt_string: one file per marker`)
  }
  const parts = []
  pieces.forEach((text, i) => {
    if (text !== '') parts.push({ type: 'text', text })
    if (i < files.length) parts.push(mediaPart(files[i], `${where}.multimodal_data[${i}]`))
  })
  return parts
}

/**
 * One input as llama-server reads a prompt: a string; token ids, strings
 * among them tokenized in place; `{ prompt_string, multimodal_data? }`; or
 * `{ content: [...parts] }` (text, `image_url`, `input_audio`, as a chat
 * message's). A string, token ids, or content parts (an array of objects).
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
    if (typeof p.prompt_string === 'string') return p.multimodal_data == null ? p.prompt_string : multimodalPrompt(p, where, engine)
    if (Array.isArray(p.content)) {
      if (p.content.length === 0) throw invalid(`${where}.content`, 'cannot be empty')
      p.content.forEach((part, i) => {
        const type = part !== null && typeof part === 'object' ? part.type : undefined
        if (type === 'text' && typeof part.text === 'string') return
        if (!MEDIA_TYPES.includes(type)) throw invalid(`${where}.content[${i}]`, 'expected a content part: { type: "text", text }, { type: "image_url", image_url } or { type: "input_audio", input_audio }')
        readsMedia(engine, type === 'input_audio' || type === 'audio' ? 'audio' : 'image', `${where}.content[${i}]`)
      })
      return p.content
    }
    throw invalid(where, 'expected { prompt_string, multimodal_data? } or { content: [...parts] }')
  }
  throw invalid(where, 'expected a string, token ids, { prompt_string } or { content: [...] }')
}

/**
 * The request's `input`: one prompt or several (a list of strings, token
 * arrays or objects), as llama-server takes them; strings, or token ids
 * for all when any is ids. An empty string embeds the model's BOS alone.
 */
const isParts = (p) => Array.isArray(p) && p.length > 0 && typeof p[0] === 'object'

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
  if (prompts.every((p) => typeof p === 'string' || isParts(p))) return prompts
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

/**
 * llama.cpp's `embd_normalize`: -1 none, 0 the largest magnitude scaled to
 * int16's range, 1 taxicab, 2 Euclidean (the engine's own), p > 2 the p-norm.
 */
function normalized(vector, p) {
  let sum = 0
  if (p === -1) sum = 1
  else if (p === 0) {
    for (const x of vector) sum = Math.max(sum, Math.abs(x))
    sum /= 32760
  } else {
    for (const x of vector) sum += Math.abs(x) ** p
    sum **= 1 / p
  }
  const norm = sum > 0 ? 1 / sum : 0
  return Float32Array.from(vector, (x) => x * norm)
}

/**
 * POST /v1/embeddings (OpenAI's), and llama-server's POST /embeddings and
 * /embedding (`native`): `[{ index, embedding: [vector] }]`, as is a
 * /v1/embeddings body with `content` instead of `input`.
 */
async function embeddings(ctx, native) {
  const body = await ctx.body()
  if (body.input === undefined && body.content !== undefined) {
    body.input = body.content
    native = true
  }
  if (body.input === undefined) throw invalid('input', 'required ("input" or "content")')
  const st = ctx.engine.status()
  // --pooling none: every token's vector, on llama-server's own paths only.
  const rows = st.pooling === 'none'
  if (rows && !native) throw new ApiError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type (or POST /embeddings)", { param: 'pooling' })
  const input = inputOf(body.input, ctx.engine)
  const format = body.encoding_format ?? 'float'
  if (format !== 'float' && format !== 'base64') throw invalid('encoding_format', `expected "float" or "base64", got ${JSON.stringify(format)}`)
  if (body.dimensions != null && (!Number.isInteger(body.dimensions) || body.dimensions < 1)) throw invalid('dimensions', 'expected a positive integer')
  for (const name of ['normalize', 'truncate']) {
    if (body[name] != null && typeof body[name] !== 'boolean') throw invalid(name, 'expected a boolean')
  }
  const p = body.embd_normalize
  if (p != null && !(Number.isInteger(p) && p >= -1)) throw invalid('embd_normalize', 'expected -1 (none), 0 (max absolute), 1 (taxicab), 2 (Euclidean) or a p-norm > 2')
  // embd_normalize other than 2 is applied here, to the vectors as the engine computed them.
  const own = p != null && p !== 2
  const normalize = own ? false : p === 2 ? true : body.normalize ?? true
  const result = await ctx.embed(input, { normalize, truncate: body.truncate ?? false })
  const vectors = own ? result.embeddings.map((v) => normalized(v, p)) : result.embeddings
  const size = vectors[0]?.length ?? 0
  if (body.dimensions != null && body.dimensions > size) {
    throw invalid('dimensions', `this model's embeddings have ${size} dimensions; ask for at most that many`)
  }
  const shaped = vectors.map((vector) => {
    const v = body.dimensions != null ? shorten(vector, body.dimensions, normalize) : vector
    return format === 'base64' ? base64(v) : Array.from(v)
  })
  if (rows) {
    const n = st.embeddingSize
    const split = (v) => Array.from({ length: v.length / n }, (_, t) => Array.from(v.subarray(t * n, (t + 1) * n)))
    return ctx.json(200, result.embeddings.map((v, index) => ({ index, embedding: split(v) })))
  }
  if (native) return ctx.json(200, shaped.map((embedding, index) => ({ index, embedding: [embedding] })))
  const data = shaped.map((embedding, index) => ({ object: 'embedding', index, embedding }))
  ctx.json(200, { object: 'list', model: ctx.modelName(), data, usage: { prompt_tokens: result.tokens, total_tokens: result.tokens } })
}

module.exports = {
  errorBody: openaiErrorBody,
  routes: {
    'POST /v1/embeddings': (ctx) => embeddings(ctx, false),
    'POST /embeddings': (ctx) => embeddings(ctx, true),
    'POST /embedding': (ctx) => embeddings(ctx, true),
  },
}
