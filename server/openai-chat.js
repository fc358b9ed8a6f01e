'use strict'
// OpenAI's Chat Completions and (legacy) Completions over the engine:
// POST /v1/chat/completions and /v1/completions. Request fields mapped onto
// the engine's, results and events shaped as OpenAI's answers and chunks.

const { randomUUID } = require('node:crypto')
const { invalid, openaiErrorBody } = require('./errors.js')
const { isObject, passthrough, templateOptions, promptTokens } = require('./util.js')
const { systemFingerprint, withVerbose, httpTimings } = require('./llama.js')
const { tokenProbs, openaiLogprobs } = require('./logprobs.js')

// Engine fields a client may send beside OpenAI's: every one OpenAI's names
// do not already map. Those OpenAI shares (temperature, top_p, seed, the
// penalties, stop, tools, response_format) pass through the same way; the
// engine checks them.
const PASSTHROUGH = passthrough(['prompt', 'messages', 'logit_bias'])

/** The engine request fields shared by both endpoints. */
function commonFields(body) {
  const req = {}
  const max = body.max_completion_tokens ?? body.max_tokens
  if (max != null) {
    const name = body.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens'
    if (!Number.isInteger(max) || max < 1) throw invalid(name, 'expected a positive integer')
    req.n_predict = max
  }
  if (body.logit_bias != null) {
    if (!isObject(body.logit_bias)) throw invalid('logit_bias', 'expected an object mapping token ids to biases')
    req.logit_bias = body.logit_bias
  }
  for (const f of PASSTHROUGH) if (body[f] != null && req[f] == null) req[f] = body[f]
  return req
}

/** The engine's field name as Chat Completions calls it. */
const chatParam = (field) => (field === 'n_predict' ? 'max_tokens' : field)

/**
 * POST /v1/chat/completions body -> engine request. Tools, `tool_choice`,
 * `parallel_tool_calls`, `response_format`, `chat_template_kwargs` and
 * `reasoning_format` are the engine's own fields: they pass through, and the
 * engine checks them (a bad one is a 400 naming it).
 */
function chatRequest(body) {
  if (!Array.isArray(body.messages)) throw invalid('messages', 'expected an array of { role, content } messages')
  return { messages: body.messages, ...commonFields(body) }
}

/**
 * llama-server's (and vLLM's) `continue_final_message` with
 * `add_generation_prompt: false`: the last assistant message is continued,
 * as the engine continues any last assistant message ("prefill"). Both
 * true is a contradiction; the generation prompt left out otherwise is not
 * supported.
 */
function checkContinuation(body, messages) {
  const add = body.add_generation_prompt ?? true
  if (typeof add !== 'boolean') throw invalid('add_generation_prompt', 'expected true or false')
  const cont = body.continue_final_message ?? false
  if (typeof cont !== 'boolean') throw invalid('continue_final_message', 'expected true or false')
  if (cont && add) throw invalid('continue_final_message', 'cannot be true with add_generation_prompt true (send add_generation_prompt: false)')
  if (cont && messages.at(-1)?.role !== 'assistant') throw invalid('continue_final_message', 'the last message must be the assistant message to continue')
  if (!cont && !add) throw invalid('add_generation_prompt', 'false is supported with continue_final_message: true only (a last assistant message is continued either way)')
}

/** POST /v1/completions body -> engine request. */
function completionRequest(body) {
  let prompt = body.prompt
  if (Array.isArray(prompt) && prompt.every((p) => typeof p === 'string')) {
    if (prompt.length !== 1) throw invalid('prompt', 'only one prompt per request is supported')
    prompt = prompt[0]
  }
  if (typeof prompt !== 'string' && !(Array.isArray(prompt) && prompt.every(Number.isInteger))) {
    throw invalid('prompt', 'expected a string or an array of token ids')
  }
  if (body.echo === true) throw invalid('echo', 'not supported')
  if (body.best_of != null && body.best_of !== 1) throw invalid('best_of', 'only 1 is supported')
  if (body.suffix != null) {
    // Fill-in-the-middle (OpenAI's insert mode): the prompt is the text
    // before the gap, the suffix the text after it, framed by the model's
    // FIM tokens as POST /infill frames them.
    if (typeof body.suffix !== 'string') throw invalid('suffix', 'expected a string')
    if (typeof prompt !== 'string') throw invalid('prompt', 'with suffix, expected a string (the text before the gap)')
    const { prompt: _, ...rest } = commonFields(body)
    return { ...rest, input_prefix: prompt, input_suffix: body.suffix }
  }
  return { prompt, ...commonFields(body) }
}

/** OpenAI's finish_reason for an engine result. */
function finishReason(result) {
  if (result.stopped_tool_calls) return 'tool_calls'
  return result.stopped_limit ? 'length' : 'stop'
}

/** The assistant message of a chat result: `content` null when it only calls tools. */
function chatMessage(result) {
  const message = { role: 'assistant', content: result.content }
  if (result.tool_calls) {
    message.tool_calls = result.tool_calls
    if (result.content === '') message.content = null
  }
  if (result.reasoning_content != null) message.reasoning_content = result.reasoning_content
  return message
}

/**
 * The delta of one token event: content, `reasoning_content`, and tool-call
 * deltas in the shape the official client's stream helpers assemble (the
 * first delta of a call carries its index, id, type and name; the next ones
 * fragments of its arguments). `null` when the event adds nothing.
 */
function chatDelta(event) {
  const delta = {}
  if (event.content) delta.content = event.content
  if (event.reasoning) delta.reasoning_content = event.reasoning
  if (event.tool_calls?.length) {
    delta.tool_calls = event.tool_calls.map((t) => {
      const call = { index: t.index }
      if (t.id != null) Object.assign(call, { id: t.id, type: 'function' })
      if (t.name != null || t.arguments != null) {
        call.function = {}
        if (t.name != null) call.function.name = t.name
        call.function.arguments = t.arguments ?? ''
      }
      return call
    })
  }
  return Object.keys(delta).length ? delta : null
}

/**
 * Usage of the n choices of one request: the prompt once (each choice
 * reads it; those after the first mostly from the cache), the tokens of
 * every choice.
 */
function usage(results) {
  const [first] = results
  const completion = results.reduce((sum, r) => sum + r.tokens_predicted, 0)
  return {
    prompt_tokens: first.tokens_evaluated,
    completion_tokens: completion,
    total_tokens: first.tokens_evaluated + completion,
    // Prompt tokens whose KV cells were reused (this slot's, another
    // slot's, the prompt cache's or a loaded session's), not computed.
    prompt_tokens_details: { cached_tokens: first.tokens_cached },
  }
}

// Most choices (`n`) one request may ask for.
const MAX_CHOICES = 16

/**
 * The generation route of /v1/chat/completions ('chat') and /v1/completions
 * ('text'): one engine request (n with `n`), OpenAI's shapes around it.
 */
function completionRoute(kind) {
  const chat = kind === 'chat'
  const all = (r) => (Array.isArray(r) ? r : [r])
  return {
    toEngine(body, ctx) {
      const request = chat ? chatRequest(body) : completionRequest(body)
      if (chat) checkContinuation(body, request.messages)
      const n = body.n ?? 1
      if (!Number.isInteger(n) || n < 1 || n > MAX_CHOICES) throw invalid('n', `expected an integer from 1 to ${MAX_CHOICES}, got ${JSON.stringify(body.n)}`)
      // `logprobs` (and `top_logprobs`): the engine's n_probs.
      const probs = openaiLogprobs(body, chat)
      if (probs.n > 0 && request.n_probs == null) request.n_probs = probs.n
      const head = {
        id: `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`,
        created: Math.floor(Date.now() / 1000),
        model: ctx.modelName(),
        system_fingerprint: systemFingerprint(),
      }
      // Per choice: the tokens kept for their probabilities.
      const choices = Array.from({ length: n }, () => ({ generated: [] }))
      return { request, paramOf: chatParam, body, head, probs, n, choices, ids: [], verbose: body.verbose === true || ctx.server.verbose }
    },
    observe(event, turn, i = 0) {
      if (event.type === 'token' && turn.probs.n > 0) turn.choices[i].generated.push(...event.tokens)
    },
    reply(result, turn) {
      const { head, probs } = turn
      const results = all(result)
      const choices = results.map((r, index) => {
        const content = probs.n > 0 ? tokenProbs(turn.choices[index].generated, probs) : undefined
        const logprobs = content ? { content } : null
        return chat
          ? { index, message: chatMessage(r), logprobs, finish_reason: finishReason(r) }
          : { index, text: r.content, logprobs, finish_reason: finishReason(r) }
      })
      const answer = { ...head, object: chat ? 'chat.completion' : 'text_completion', choices, usage: usage(results), timings: httpTimings(results[0]) }
      return withVerbose(answer, results[0], { ...turn, generated: turn.choices[0].generated })
    },
    streamEvents(turn, sse) {
      const { body, head, probs } = turn
      const object = chat ? 'chat.completion.chunk' : 'text_completion'
      // Per choice: tokens whose text was held back (a stop string's
      // prefix) give their probabilities with its next chunk that has text;
      // whether its first chunk (the role) was sent.
      const state = turn.choices.map(() => ({ pending: [], first: true }))
      const chunk = ({ delta, text, finish_reason = null, usage: u, index = 0 }) => {
        const c = { ...head, object, choices: [] }
        let logprobs = null
        const st = state[index]
        if (st.pending.length && finish_reason === null && !u && !delta?.role) {
          logprobs = { content: tokenProbs(st.pending, probs) }
          st.pending = []
        }
        if (delta) c.choices.push({ index, delta, logprobs, finish_reason })
        if (text != null) c.choices.push({ index, text, logprobs, finish_reason })
        if (u) c.usage = u
        return c
      }
      const role = (index) => {
        // llama-server's first chunk: the role, content null.
        if (state[index].first && chat) sse.send(chunk({ delta: { role: 'assistant', content: null }, index }))
        state[index].first = false
      }
      return {
        event(event, index = 0) {
          if (event.type === 'progress') {
            // return_progress: llama-server's chunk, the role and `prompt_progress`.
            const { type, ...prompt_progress } = event
            const fields = chat ? { delta: { role: 'assistant', content: null } } : { text: '' }
            sse.send({ ...chunk({ ...fields, index }), prompt_progress })
            state[index].first = false
            return
          }
          if (event.type !== 'token') return
          if (probs.n > 0) state[index].pending.push(...event.tokens)
          const fields = chat ? { delta: chatDelta(event) } : { text: event.content || null }
          if (!fields.delta && !fields.text) return
          role(index)
          sse.send(chunk({ ...fields, index }))
        },
        end(result) {
          const results = all(result)
          results.forEach((r, index) => {
            role(index)
            // The last chunk carries the timings (and __verbose), as llama-server's.
            const last = chunk({ ...(chat ? { delta: {} } : { text: '' }), finish_reason: finishReason(r), index })
            sse.send(withVerbose({ ...last, timings: httpTimings(r) }, r, { ...turn, generated: [] }))
          })
          if (body.stream_options?.include_usage === true) sse.send({ ...chunk({ usage: usage(results) }), timings: httpTimings(results[0]) })
          sse.send('[DONE]')
        },
        fail: (e) => sse.send(openaiErrorBody(e)),
      }
    },
  }
}

const chatCompletion = completionRoute('chat')

/**
 * GET /v1/models: the model, and each LoRA adapter a request may name in
 * `model` (as vLLM lists its `--lora-modules`, `parent` the base model);
 * with many models (`serve --models`) every one, with its state as
 * llama.cpp's router reports it (`status.value`: loaded, loading, unloaded,
 * failed).
 */
function models(ctx) {
  const data = ctx.server.models().map((m) => {
    const model = { id: m.name, object: 'model', created: ctx.started, owned_by: 'llama-engine' }
    if (m.parent) model.parent = m.parent
    // llama-server's: the names a request may give this model, its tags, and what it reads.
    if (m.aliases) model.aliases = m.aliases
    if (m.tags) model.tags = m.tags
    const st = m.status
    model.capabilities = st?.media?.vision || st?.media?.audio ? ['completion', 'multimodal'] : ['completion']
    if (st) {
      model.meta = { n_vocab: st.vocabSize, n_ctx: st.contextSize, n_ctx_train: st.trainContextSize, n_embd: st.embeddingSize }
    }
    model.status = { value: m.state, ...(m.pinned ? { pinned: true } : {}), ...(m.error ? { error: m.error } : {}) }
    return model
  })
  // Codex (and llama-server's clients) read a `models` catalog beside OpenAI's `data`.
  ctx.json(200, { object: 'list', data, models: data.map((m) => ({ ...m, name: m.id, model: m.id })) })
}

/**
 * POST /apply-template (llama-server's): the prompt a chat request's
 * `messages` (with its tools, `chat_template_kwargs` and
 * `add_generation_prompt`, default true) renders to, without generating.
 */
async function applyTemplate(ctx) {
  const body = await ctx.body()
  const { messages } = chatRequest(body)
  const add = body.add_generation_prompt ?? true
  if (typeof add !== 'boolean') throw invalid('add_generation_prompt', 'expected true or false')
  const request = ctx.withDefaults({ ...body, messages })
  ctx.json(200, { prompt: ctx.engine.applyChatTemplate(messages, templateOptions(request, add)) })
}

/**
 * POST /v1/chat/completions/input_tokens (llama-server's): `{ input_tokens }`,
 * the prompt tokens a chat request's messages (with its tools) render to.
 */
async function inputTokens(ctx) {
  const body = await ctx.body()
  const request = ctx.withDefaults({ ...body, ...chatRequest(body) })
  ctx.json(200, { input_tokens: await promptTokens(ctx.engine, request) })
}

module.exports = {
  errorBody: openaiErrorBody,
  routes: {
    'POST /v1/chat/completions/input_tokens': inputTokens,
    'POST /chat/completions/input_tokens': inputTokens,
    'POST /apply-template': applyTemplate,
    'GET /v1/models': models,
    'GET /models': models,
    'POST /v1/chat/completions': chatCompletion,
    'POST /chat/completions': chatCompletion,
    'POST /v1/completions': completionRoute('text'),
  },
}
