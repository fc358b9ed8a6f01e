'use strict'
// llama.cpp's server endpoints: POST /completion (the engine's own request
// fields and result), /tokenize, /detokenize; GET /props, GET /slots and
// GET|POST /lora-adapters in llama.cpp's shapes.

const { requestFields } = require('../index.js')
const { ApiError, invalid, openaiErrorBody } = require('./errors.js')
const { isObject } = require('./util.js')
const { tokenProbs } = require('./logprobs.js')

const PACKAGE_VERSION = require('../package.json').version
// The llama.cpp the addon is built from: the llama-cpp-sys-2 crate's version.
let llamaCppVersion
function llamaCpp() {
  if (llamaCppVersion === undefined) {
    try {
      const cargo = require('node:fs').readFileSync(require('node:path').join(__dirname, '..', 'Cargo.toml'), 'utf8')
      llamaCppVersion = /^llama-cpp-sys-2\s*=\s*"=?([^"]+)"/m.exec(cargo)?.[1] ?? null
    } catch {
      llamaCppVersion = null
    }
  }
  return llamaCppVersion
}

/**
 * llama-server's `timings` from counts and times: the rates of the prompt
 * over its tokens computed (cached ones apart), and of the generation over
 * its tokens after the first (that one came from the prompt's last pass, at
 * no decoding step of its own: one token has no rate).
 */
function llamaTimings({ cacheN = 0, promptN = 0, promptMs = 0, predictedN = 0, predictedMs = 0 }) {
  const steps = Math.max(0, predictedN - 1)
  return {
    cache_n: cacheN,
    prompt_n: promptN,
    prompt_ms: promptMs,
    prompt_per_token_ms: promptN > 0 ? promptMs / promptN : 0,
    prompt_per_second: promptMs > 0 ? (promptN * 1000) / promptMs : 0,
    predicted_n: predictedN,
    predicted_ms: predictedMs,
    predicted_per_token_ms: steps > 0 ? predictedMs / steps : 0,
    predicted_per_second: steps > 0 && predictedMs > 0 ? (steps * 1000) / predictedMs : 0,
  }
}

/** A result's `timings` over HTTP (the library's result keeps its own: the generation's rate over n tokens). */
function httpTimings(result) {
  const t = result?.timings
  if (!t) return t
  return { ...t, ...llamaTimings({ cacheN: result.tokens_cached ?? 0, promptN: t.prompt_n, promptMs: t.prompt_ms, predictedN: t.predicted_n, predictedMs: t.predicted_ms }) }
}

/** The `timings` of a prompt_progress chunk: the prompt so far (no time before its first chunk is computed), nothing generated. */
function progressTimings({ cache = 0, processed = 0, time_ms: time = 0 }) {
  const n = Math.max(0, processed - cache)
  return llamaTimings({ cacheN: cache, promptN: n, promptMs: n > 0 ? time : 0 })
}

/**
 * What chat and completion results carry as `system_fingerprint`: the
 * build, as llama-server's "b<build>-<commit>" (here llama.cpp's crate
 * version and this package's).
 */
function systemFingerprint() {
  return `b${llamaCpp() ?? '0'}-llama-engine-${PACKAGE_VERSION}`
}

// The engine's default sampling and generation settings, from its own list
// of request fields (the defaults a request without them gets), shaped as
// the `generation_settings` of its results.
const NOT_SETTINGS = new Set(['prompt', 'messages', 'tools', 'json_schema', 'response_format', 'chat_template_kwargs', 'reasoning_effort', 'lora'])
let defaults
function defaultSettings() {
  if (!defaults) {
    defaults = {}
    for (const f of requestFields) {
      if (NOT_SETTINGS.has(f.name)) continue
      if (Array.isArray(f.fields)) {
        const sub = {}
        for (const g of f.fields) if (g.default !== undefined) sub[g.name] = g.default
        if (Object.keys(sub).length) defaults[f.name] = sub
      } else if (f.default !== undefined) defaults[f.name] = f.default
      else if (f.name === 'grammar') defaults.grammar = ''
    }
  }
  return defaults
}

/** The settings a request without its own gets: the engine's defaults, and the server's LoRA scales. */
function params(ctx) {
  return { ...defaultSettings(), lora: ctx.server.loras().map(({ id, scale }) => ({ id, scale })) }
}

function props(ctx) {
  const st = ctx.engine.status()
  ctx.json(200, {
    default_generation_settings: { n_ctx: st.contextSize, params: params(ctx) },
    total_slots: st.parallel ?? 1,
    model_alias: ctx.modelName(),
    model_path: st.modelPath ?? st.model,
    // The template `messages` are rendered with (the chatTemplate option, else the GGUF's).
    chat_template: st.chatTemplate ?? '',
    bos_token: st.bosToken ?? '',
    eos_token: st.eosToken ?? '',
    // llama-server's build_info ("b<build>-<commit>"): the system fingerprint.
    build_info: systemFingerprint(),
    // What the projector (--mmproj) reads, as llama.cpp's server says it.
    modalities: { vision: st.media?.vision === true, audio: st.media?.audio === true },
    endpoint_slots: ctx.server.slots,
    endpoint_props: false,
    endpoint_metrics: ctx.server.metrics,
    is_sleeping: ctx.server.sleeping === true,
  })
}

/**
 * One entry per slot, as llama.cpp's server lists them. The engine's
 * `status().slots` says what each decodes; an engine without it gives the
 * count of busy slots only (`active`). The prompt's text is never shown.
 */
function slots(ctx) {
  if (ctx.server.slots === false) throw new ApiError(501, 'This server does not support slots endpoint (start it without --no-slots)', { code: 'NOT_SUPPORTED', type: 'not_supported_error' })
  const st = ctx.engine.status()
  const n = st.parallel ?? 1
  const list = Array.isArray(st.slots)
    ? st.slots
    : Array.from({ length: n }, (_, id) => ({ id, busy: id < (st.active ?? 0), contextSize: st.contextSize, promptTokens: 0, predicted: 0, cachedTokens: 0 }))
  const settings = params(ctx)
  const speculative = st.draftModel != null
  const answer = list.map((s) => {
    const prompt = s.promptTokens ?? 0
    const cached = s.cachedTokens ?? 0
    return {
      id: s.id,
      id_task: s.requestId ?? -1,
      n_ctx: s.contextSize ?? st.contextSize,
      speculative,
      is_processing: s.busy === true,
      n_prompt_tokens: prompt,
      n_prompt_tokens_processed: Math.max(0, prompt - cached),
      n_prompt_tokens_cache: cached,
      params: settings,
      next_token: [{ has_next_token: s.busy === true, has_new_line: false, n_remain: -1, n_decoded: s.predicted ?? 0 }],
    }
  })
  if (ctx.query.get('fail_on_no_slot') === '1' && answer.every((s) => s.is_processing)) {
    throw new ApiError(503, 'no slot available', { code: 'UNAVAILABLE', type: 'unavailable_error' })
  }
  ctx.json(200, answer)
}

function loraAdapters(ctx) {
  // llama.cpp's shape; the name a request's `model` may give is in GET /v1/models.
  ctx.json(200, ctx.server.loras().map(({ id, path, scale }) => ({ id, path, scale })))
}

// The engine's bound on a LoRA scale (a request's `lora` beyond it is refused).
const MAX_LORA_SCALE = 100

/**
 * POST /lora-adapters `[{ id, scale }]`: the scales of requests that name
 * none (adapters not listed: 0), as llama.cpp's server sets them.
 */
async function setLoraAdapters(ctx) {
  const body = await ctx.bodyValue()
  if (!Array.isArray(body)) throw new ApiError(400, 'body: expected an array of { id, scale }')
  const adapters = ctx.server.loras()
  const scales = new Map(adapters.map(({ id }) => [id, 0]))
  const ids = adapters.length ? `ids: ${adapters.map(({ id }) => id).join(', ')}` : 'none is loaded'
  body.forEach((entry, i) => {
    if (!isObject(entry)) throw invalid(`[${i}]`, 'expected an object { id, scale }')
    if (!Number.isInteger(entry.id) || !scales.has(entry.id)) throw invalid(`[${i}].id`, `no LoRA adapter has id ${JSON.stringify(entry.id)} (${ids})`)
    if (typeof entry.scale !== 'number' || !Number.isFinite(entry.scale) || Math.abs(entry.scale) > MAX_LORA_SCALE) {
      const got = typeof entry.scale === 'number' ? String(entry.scale) : JSON.stringify(entry.scale) ?? 'nothing'
      throw invalid(`[${i}].scale`, `expected a finite number within ±${MAX_LORA_SCALE}, got ${got}`)
    }
    scales.set(entry.id, entry.scale)
  })
  ctx.server.setLoraScales(scales)
  ctx.json(200, { success: true })
}

/** llama-server's `stop_type` of a result. */
function stopType(r) {
  if (r.stopped_word) return 'word'
  if (r.stopped_eos || r.stopped_tool_calls) return 'eos'
  if (r.stopped_limit) return 'limit'
  return 'none'
}

/**
 * `generation_settings` as llama-server shows them: `logit_bias` as `[{
 * bias, token }]`, a banned token's bias null (-inf: the end-of-generation
 * tokens `ignore_eos` bans among them).
 */
function llamaSettings(settings) {
  if (!settings || !Array.isArray(settings.logit_bias)) return settings
  return { ...settings, logit_bias: settings.logit_bias.map(([token, bias]) => ({ bias: typeof bias === 'number' ? bias : null, token })) }
}

/**
 * A result as llama-server answers /completion: the engine's result, and
 * `tokens` (the ids, with `return_tokens`; else []), `has_new_line`,
 * `stop_type`, `completion_probabilities` in its shape (logprobs, or probs
 * with `post_sampling_probs`), and `timings.cache_n` (prompt tokens
 * reused), `timings.draft_n` and `draft_n_accepted` (when drafts were
 * made).
 */
function llamaResult(result, turn) {
  const timings = httpTimings(result)
  const spec = result.speculative
  if (spec && spec.n_drafted > 0) Object.assign(timings, { draft_n: spec.n_drafted, draft_n_accepted: spec.n_accepted })
  const answer = {
    ...result,
    generation_settings: llamaSettings(result.generation_settings),
    tokens: turn.returnTokens ? turn.ids : [],
    has_new_line: (result.content ?? '').includes('\n'),
    stop_type: stopType(result),
    timings,
  }
  if (result.completion_probabilities) answer.completion_probabilities = tokenProbs(turn.generated, { post: turn.post }) ?? []
  return answer
}

/**
 * llama-server's `response_fields`: only these fields of the answer, a
 * nested one named by its path (`generation_settings/n_predict`) and
 * answered under that name.
 */
function pick(answer, fields) {
  const out = {}
  for (const f of fields) {
    let v = answer
    for (const k of f.split('/')) v = v !== null && typeof v === 'object' ? v[k] : undefined
    if (v !== undefined) out[f] = v
  }
  return out
}

/**
 * llama-server's `__verbose` (the request's `verbose`, or serve --verbose):
 * the result as /completion answers it, with the prompt the model read.
 */
function withVerbose(answer, result, turn) {
  if (turn.verbose) answer.__verbose = { ...llamaResult(result, turn), prompt: turn.prompt }
  return answer
}

/**
 * POST /completion: the engine's own request fields, and its result and
 * events in llama-server's shapes: each streamed event's `tokens` are ids
 * (the engine's token objects, with their source and probabilities, are
 * `token_details`); the last event has empty `content` (the text was
 * streamed) and the result's other fields, `stop: true`.
 */
const completion = {
  // `stream` is the skeleton's to read, `return_tokens` and
  // `post_sampling_probs` ours; every other field is the engine's.
  toEngine: ({ stream, return_tokens, post_sampling_probs, verbose, response_fields, ...request }, ctx) => {
    if (response_fields != null && !(Array.isArray(response_fields) && response_fields.every((f) => typeof f === 'string'))) {
      throw invalid('response_fields', 'expected an array of field names (a/b for a nested one)')
    }
    const fields = response_fields?.length ? response_fields : null
    return {
      request,
      returnTokens: return_tokens === true,
      post: post_sampling_probs === true,
      verbose: verbose === true || ctx.server.verbose,
      fields,
      wantsPrompt: fields?.includes('prompt') === true,
      ids: [],
      generated: [],
    }
  },
  observe(event, turn) {
    if (event.type !== 'token') return
    for (const t of event.tokens) turn.ids.push(t.id)
    // Kept only for their probabilities.
    if (event.tokens.some((t) => t.probs)) turn.generated.push(...event.tokens)
  },
  reply: (result, turn) => {
    const answer = withVerbose(llamaResult(result, turn), result, turn)
    return turn.fields ? pick({ ...answer, prompt: turn.prompt }, turn.fields) : answer
  },
  streamEvents: (turn, sse) => ({
    event(event) {
      if (event.type === 'progress') {
        const { type, ...prompt_progress } = event
        sse.send({ content: '', tokens: [], stop: false, prompt_progress, timings: progressTimings(prompt_progress) })
        return
      }
      if (event.type === 'token') {
        const completion_probabilities = tokenProbs(event.tokens, { post: turn.post })
        for (const t of event.tokens) turn.ids.push(t.id)
        sse.send({
          ...event,
          tokens: event.tokens.map((t) => t.id),
          token_details: event.tokens,
          stop: false,
          ...(completion_probabilities ? { completion_probabilities } : {}),
        })
      } else {
        // done: the whole result, its text already streamed.
        const last = withVerbose({ ...llamaResult(event, { ...turn, returnTokens: false }), content: '', stop: true }, event, turn)
        // Each token's probabilities went with it.
        delete last.completion_probabilities
        sse.send(last)
      }
    },
    end() {},
    fail: (e) => sse.send(openaiErrorBody(e)),
  }),
}

/**
 * POST /infill: llama.cpp's fill-in-the-middle (`input_prefix`,
 * `input_suffix`, `input_extra`, `prompt`, the usual fields); answered and
 * streamed as /completion is.
 */
const infill = {
  ...completion,
  toEngine: (body, ctx) => {
    const turn = completion.toEngine(body, ctx)
    for (const field of ['input_prefix', 'input_suffix']) {
      if (turn.request[field] == null) throw invalid(field, 'required (fill-in-the-middle: the text before and after the gap)')
    }
    return turn
  },
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

/**
 * POST /rerank (/reranking, /v1/rerank, /v1/reranking), llama-server's:
 * `{ query, documents, top_n? }` → `{ model, object: 'list', usage,
 * results: [{ index, relevance_score }] }` best first (Jina's and Cohere's
 * shape); with `texts` instead of `documents`, TEI's: `[{ index, score,
 * text? }]` (`return_text`). A model that is not a reranker: 501.
 */
async function rerank(ctx) {
  const body = await ctx.body()
  if (ctx.engine.status().pooling !== 'rank') {
    throw new ApiError(501, 'This server does not support reranking: its model is not a reranker (a GGUF whose pooling is rank)', {
      code: 'NOT_SUPPORTED',
      type: 'not_supported_error',
    })
  }
  const tei = body.texts !== undefined && body.documents === undefined
  const field = tei ? 'texts' : 'documents'
  if (typeof body.query !== 'string') throw new ApiError(400, body.query === undefined ? '"query" must be provided' : '"query" must be a string', { param: 'query' })
  const documents = body[field]
  if (!Array.isArray(documents) || documents.length === 0 || !documents.every((d) => typeof d === 'string')) {
    throw new ApiError(400, `"${field}" must be a non-empty string array`, { param: field })
  }
  const topN = body.top_n ?? documents.length
  if (!Number.isInteger(topN) || topN < 0) throw new ApiError(400, '"top_n" must be a non-negative integer', { param: 'top_n' })
  const ranked = await ctx.engine.rerank({ query: body.query, documents, top_n: topN })
  if (tei) return ctx.json(200, ranked.map((r) => ({ index: r.index, score: r.relevance_score, ...(body.return_text === true ? { text: documents[r.index] } : {}) })))
  ctx.json(200, {
    model: typeof body.model === 'string' ? body.model : ctx.modelName(),
    object: 'list',
    usage: { prompt_tokens: ranked.tokens, total_tokens: ranked.tokens },
    results: ranked.map((r) => ({ ...r, ...(body.return_documents === true ? { document: { text: documents[r.index] } } : {}) })),
  })
}

module.exports = {
  systemFingerprint,
  httpTimings,
  llamaTimings,
  withVerbose,
  errorBody: openaiErrorBody,
  routes: {
    'POST /completion': completion,
    'POST /completions': completion,
    'POST /infill': infill,
    'POST /tokenize': tokenize,
    'POST /detokenize': detokenize,
    'GET /props': props,
    'GET /slots': slots,
    'POST /rerank': rerank,
    'POST /reranking': rerank,
    'POST /v1/rerank': rerank,
    'POST /v1/reranking': rerank,
    'GET /lora-adapters': loraAdapters,
    'POST /lora-adapters': setLoraAdapters,
  },
}
