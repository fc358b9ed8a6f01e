'use strict'
// OpenAI's Chat Completions and (legacy) Completions over the engine:
// POST /v1/chat/completions and /v1/completions. Request fields mapped onto
// the engine's, results and events shaped as OpenAI's answers and chunks.

const { randomUUID } = require('node:crypto')
const { invalid, openaiErrorBody } = require('./errors.js')
const { isObject, passthrough } = require('./util.js')
const { systemFingerprint } = require('./llama.js')

// Engine fields a client may send beside OpenAI's: every one OpenAI's names
// do not already map. Those OpenAI shares (temperature, top_p, seed, the
// penalties, stop, tools, response_format) pass through the same way; the
// engine checks them.
const PASSTHROUGH = passthrough(['prompt', 'messages', 'logit_bias'])

/** The engine request fields shared by both endpoints. */
function commonFields(body) {
  const req = {}
  if (body.n != null && body.n !== 1) throw invalid('n', `only 1 choice per request is supported, got ${JSON.stringify(body.n)}`)
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

function usage(result) {
  return {
    prompt_tokens: result.tokens_evaluated,
    completion_tokens: result.tokens_predicted,
    total_tokens: result.tokens_evaluated + result.tokens_predicted,
    // Prompt tokens whose KV cells were reused (this slot's, another
    // slot's, the prompt cache's or a loaded session's), not computed.
    prompt_tokens_details: { cached_tokens: result.tokens_cached },
  }
}

/**
 * The generation route of /v1/chat/completions ('chat') and /v1/completions
 * ('text'): one engine request, OpenAI's shapes around it.
 */
function completionRoute(kind) {
  const chat = kind === 'chat'
  return {
    toEngine(body, ctx) {
      const request = chat ? chatRequest(body) : completionRequest(body)
      const head = {
        id: `${chat ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`,
        created: Math.floor(Date.now() / 1000),
        model: ctx.modelName(),
        system_fingerprint: systemFingerprint(),
      }
      return { request, paramOf: chatParam, body, head }
    },
    reply(result, { head }) {
      const choice = chat
        ? { index: 0, message: chatMessage(result), logprobs: null, finish_reason: finishReason(result) }
        : { index: 0, text: result.content, logprobs: null, finish_reason: finishReason(result) }
      return { ...head, object: chat ? 'chat.completion' : 'text_completion', choices: [choice], usage: usage(result) }
    },
    streamEvents({ body, head }, sse) {
      const object = chat ? 'chat.completion.chunk' : 'text_completion'
      const chunk = ({ delta, text, finish_reason = null, usage: u }) => {
        const c = { ...head, object, choices: [] }
        if (delta) c.choices.push({ index: 0, delta, logprobs: null, finish_reason })
        if (text != null) c.choices.push({ index: 0, text, logprobs: null, finish_reason })
        if (u) c.usage = u
        return c
      }
      let first = true
      const role = () => {
        // llama-server's first chunk: the role, content null.
        if (first && chat) sse.send(chunk({ delta: { role: 'assistant', content: null } }))
        first = false
      }
      return {
        event(event) {
          if (event.type !== 'token') return
          const fields = chat ? { delta: chatDelta(event) } : { text: event.content || null }
          if (!fields.delta && !fields.text) return
          role()
          sse.send(chunk(fields))
        },
        end(result) {
          role()
          sse.send(chunk({ ...(chat ? { delta: {} } : { text: '' }), finish_reason: finishReason(result) }))
          if (body.stream_options?.include_usage === true) sse.send(chunk({ usage: usage(result) }))
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
    model.status = { value: m.state, ...(m.pinned ? { pinned: true } : {}), ...(m.error ? { error: m.error } : {}) }
    return model
  })
  // Codex reads a `models` catalog beside OpenAI's `data`.
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
  const options = { addGenerationPrompt: add }
  for (const f of ['tools', 'tool_choice', 'parallel_tool_calls', 'chat_template_kwargs']) {
    // An empty tools list is none (as llama-server reads it).
    if (body[f] != null && !(f === 'tools' && Array.isArray(body[f]) && body[f].length === 0)) options[f] = body[f]
  }
  ctx.json(200, { prompt: ctx.engine.applyChatTemplate(messages, options) })
}

module.exports = {
  errorBody: openaiErrorBody,
  routes: {
    'POST /apply-template': applyTemplate,
    'GET /v1/models': models,
    'GET /models': models,
    'POST /v1/chat/completions': chatCompletion,
    'POST /chat/completions': chatCompletion,
    'POST /v1/completions': completionRoute('text'),
  },
}
