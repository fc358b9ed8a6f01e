'use strict'
// Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.
// The request becomes one chat request of the engine; the result and the
// token events become Anthropic's message and its event stream, as
// @anthropic-ai/sdk's MessageStream and Claude Code read them. Errors are
// in Anthropic's shape (errorBody), on every path under /v1/messages.

const { invalid } = require('./errors.js')
const { isObject, newId, passthrough, sourcedMessages, promptTokens } = require('./util.js')

const PASSTHROUGH = passthrough(['prompt', 'messages', 'n_predict', 'tools', 'tool_choice', 'parallel_tool_calls', 'response_format', 'chat_template_kwargs'])

const ERROR_TYPES = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  408: 'timeout_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  503: 'overloaded_error',
  529: 'overloaded_error',
}

/** `{ type: "error", error: { type, message } }`, the type from the status as Anthropic names it. */
function errorBody(e) {
  const type = ERROR_TYPES[e.status] ?? (e.status < 500 ? 'invalid_request_error' : 'api_error')
  return { type: 'error', error: { type, message: e.message } }
}

/** One block's text; blocks a text-only model cannot read are refused (user turns) or named (tool results). */
function blockText(block, here, images) {
  if (!isObject(block)) throw invalid(here, 'expected a content block object')
  if (block.type === 'text') {
    if (typeof block.text !== 'string') throw invalid(`${here}.text`, 'expected a string')
    return block.text
  }
  if (block.type === 'image' || block.type === 'document') {
    if (images === 'refuse') throw invalid(`${here}.type`, `${block.type}: not read here`)
    return `[${block.type}]`
  }
  throw invalid(`${here}.type`, `${JSON.stringify(block.type)} is not a content block this server reads here`)
}

/** A string, or text blocks joined by newlines. */
function blocksText(content, at, { images = 'refuse' } = {}) {
  if (typeof content === 'string') return content
  if (!Array.isArray(content)) throw invalid(at, 'expected a string or an array of content blocks')
  if (images === 'parts' && content.some((b) => b?.type === 'image')) return imageParts(content, at)
  return content.map((block, j) => blockText(block, `${at}.${j}`, images)).join('\n')
}

/** Blocks with images as chat content parts: base64 images as bytes, `url` images as image_url parts. */
function imageParts(content, at) {
  return content.map((block, j) => {
    const here = `${at}.${j}`
    if (block?.type !== 'image') return { type: 'text', text: blockText(block, here, 'refuse') + (j + 1 < content.length ? '\n' : '') }
    const src = block.source
    if (!isObject(src)) throw invalid(`${here}.source`, 'required: { type: "base64", media_type, data }')
    if (src.type === 'base64') {
      if (typeof src.data !== 'string') throw invalid(`${here}.source.data`, 'expected base64 text')
      return { type: 'image', data: src.data, mimeType: src.media_type }
    }
    if (src.type === 'url') {
      if (typeof src.url !== 'string') throw invalid(`${here}.source.url`, 'expected a URL')
      return { type: 'image_url', image_url: { url: src.url } }
    }
    throw invalid(`${here}.source.type`, 'expected "base64" or "url"')
  })
}

/**
 * `system` and `messages` -> chat messages, with where each came from (for
 * naming the field of an engine error). A user message's tool_result blocks
 * become tool messages, before the rest of its text.
 */
function messagesOf(body) {
  const { messages, origins, push } = sourcedMessages()
  if (body.system != null) push({ role: 'system', content: blocksText(body.system, 'system') }, 'system')
  if (!Array.isArray(body.messages)) throw invalid('messages', 'expected an array of { role, content } messages')
  body.messages.forEach((m, i) => {
    const at = `messages.${i}`
    if (!isObject(m)) throw invalid(at, 'expected a { role, content } object')
    if (m.role !== 'user' && m.role !== 'assistant') throw invalid(`${at}.role`, `expected "user" or "assistant", got ${JSON.stringify(m.role)}`)
    if (typeof m.content === 'string') return push({ role: m.role, content: m.content }, at)
    if (!Array.isArray(m.content)) throw invalid(`${at}.content`, 'expected a string or an array of content blocks')
    if (m.role === 'user') {
      const texts = []
      const blocks = []
      m.content.forEach((block, j) => {
        const here = `${at}.content.${j}`
        if (block?.type === 'tool_result') {
          if (typeof block.tool_use_id !== 'string') throw invalid(`${here}.tool_use_id`, 'expected a string')
          const text = block.content == null ? '' : blocksText(block.content, `${here}.content`, { images: 'name' })
          push({ role: 'tool', tool_call_id: block.tool_use_id, content: block.is_error === true ? `Error: ${text}` : text }, here)
        } else if (block?.type === 'image') {
          blocks.push(block)
        } else {
          texts.push(blockText(block, here, 'refuse'))
          blocks.push(block)
        }
      })
      // With images: content parts (each image where it stood), else the text.
      if (blocks.some((b) => b?.type === 'image')) push({ role: 'user', content: imageParts(blocks, `${at}.content`) }, `${at}.content`)
      else if (texts.length > 0) push({ role: 'user', content: texts.join('\n') }, `${at}.content`)
      return
    }
    const message = { role: 'assistant', content: '' }
    const texts = []
    m.content.forEach((block, j) => {
      const here = `${at}.content.${j}`
      if (!isObject(block)) throw invalid(here, 'expected a content block object')
      switch (block.type) {
        case 'text':
          texts.push(String(block.text ?? ''))
          break
        case 'thinking':
          message.reasoning_content = (message.reasoning_content ?? '') + String(block.thinking ?? '')
          break
        case 'tool_use':
          if (typeof block.id !== 'string' || typeof block.name !== 'string') throw invalid(here, 'tool_use: expected its id and name')
          ;(message.tool_calls ??= []).push({ id: block.id, type: 'function', function: { name: block.name, arguments: JSON.stringify(block.input ?? {}) } })
          break
        default:
          // redacted_thinking and the blocks of Anthropic's own server tools carry nothing a local model can use.
          break
      }
    })
    message.content = texts.join('\n')
    push(message, at)
  })
  return { messages, origins }
}

/** Client tools -> the engine's functions; typed server tools (web_search_…, bash_…) are skipped. */
function toolsOf(body) {
  const tools = []
  const origins = []
  if (body.tools == null) return { tools, origins }
  if (!Array.isArray(body.tools)) throw invalid('tools', 'expected an array of tools')
  body.tools.forEach((t, i) => {
    if (!isObject(t)) throw invalid(`tools.${i}`, 'expected a tool object')
    if (t.type != null && t.type !== 'custom') return
    if (typeof t.name !== 'string') throw invalid(`tools.${i}.name`, 'expected a string')
    tools.push({ type: 'function', function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.input_schema ?? { type: 'object' } } })
    origins.push(`tools.${i}`)
  })
  return { tools, origins }
}

function toolChoiceOf(choice) {
  if (choice == null) return {}
  if (!isObject(choice)) throw invalid('tool_choice', 'expected an object: { type: "auto" | "any" | "tool" | "none" }')
  const parallel = choice.disable_parallel_tool_use === true ? { parallel_tool_calls: false } : {}
  switch (choice.type) {
    case 'auto':
      return { tool_choice: 'auto', ...parallel }
    case 'any':
      return { tool_choice: 'required', ...parallel }
    case 'none':
      return { tool_choice: 'none' }
    case 'tool':
      if (typeof choice.name !== 'string') throw invalid('tool_choice.name', 'expected the name of a tool')
      return { tool_choice: { type: 'function', function: { name: choice.name } }, ...parallel }
    default:
      throw invalid('tool_choice.type', `expected "auto", "any", "tool" or "none", got ${JSON.stringify(choice.type)}`)
  }
}

/** The engine request of a Messages body (`count` for count_tokens: no max_tokens needed). */
function engineRequest(body, { count = false } = {}) {
  const { messages, origins: messageOrigins } = messagesOf(body)
  const { tools, origins: toolOrigins } = toolsOf(body)
  const request = { messages }
  for (const f of PASSTHROUGH) if (body[f] != null) request[f] = body[f]
  if (!count) {
    if (body.max_tokens == null) throw invalid('max_tokens', 'required')
    if (!Number.isInteger(body.max_tokens) || body.max_tokens < 1) throw invalid('max_tokens', 'expected a positive integer')
    request.n_predict = body.max_tokens
  }
  if (body.stop_sequences != null) {
    if (!Array.isArray(body.stop_sequences) || !body.stop_sequences.every((s) => typeof s === 'string')) {
      throw invalid('stop_sequences', 'expected an array of strings')
    }
    request.stop = body.stop_sequences
  }
  if (tools.length > 0) {
    request.tools = tools
    Object.assign(request, toolChoiceOf(body.tool_choice))
  }
  const kwargs = { ...(isObject(body.chat_template_kwargs) ? body.chat_template_kwargs : {}) }
  if (isObject(body.thinking) && (body.thinking.type === 'enabled' || body.thinking.type === 'disabled')) {
    kwargs.enable_thinking = body.thinking.type === 'enabled'
    // The most tokens the model may think (the engine's reasoning_budget).
    if (body.thinking.type === 'enabled' && body.thinking.budget_tokens != null) request.reasoning_budget = body.thinking.budget_tokens
  }
  if (Object.keys(kwargs).length > 0) request.chat_template_kwargs = kwargs

  const paramOf = (field) => {
    if (field === 'n_predict') return 'max_tokens'
    if (field === 'reasoning_budget') return 'thinking.budget_tokens'
    if (field === 'stop' || field.startsWith('stop[')) return 'stop_sequences' + field.slice(4).replace(/\[(\d+)\]/g, '.$1')
    let m = /^messages\[(\d+)\](.*)$/.exec(field)
    if (m && messageOrigins[m[1]]) return messageOrigins[m[1]]
    m = /^tools\[(\d+)\](.*)$/.exec(field)
    if (m && toolOrigins[m[1]]) return toolOrigins[m[1]] + m[2].replace(/^\.function\.parameters/, '.input_schema').replace(/^\.function/, '')
    return field
  }
  return { request, paramOf }
}

function stopOf(result, body) {
  if (result.stopped_tool_calls) return { stop_reason: 'tool_use', stop_sequence: null }
  if (result.stopped_limit) return { stop_reason: 'max_tokens', stop_sequence: null }
  if (result.stopped_word && Array.isArray(body.stop_sequences) && body.stop_sequences.includes(result.stopping_word)) {
    return { stop_reason: 'stop_sequence', stop_sequence: result.stopping_word }
  }
  return { stop_reason: 'end_turn', stop_sequence: null }
}

// Anthropic counts cache reads apart from input_tokens.
const usageOf = (result) => ({
  input_tokens: result.tokens_evaluated - result.tokens_cached,
  output_tokens: result.tokens_predicted,
  cache_read_input_tokens: result.tokens_cached,
  cache_creation_input_tokens: 0,
})

function toolInput(args) {
  try {
    const value = JSON.parse(args)
    return isObject(value) ? value : {}
  } catch {
    return {}
  }
}

function contentOf(result) {
  const content = []
  if (result.reasoning_content) content.push({ type: 'thinking', thinking: result.reasoning_content, signature: '' })
  if (result.content !== '') content.push({ type: 'text', text: result.content })
  for (const call of result.tool_calls ?? []) content.push({ type: 'tool_use', id: call.id, name: call.function.name, input: toolInput(call.function.arguments) })
  return content
}

/** The event stream of one message: blocks opened and closed in order, indices contiguous. */
class MessageEvents {
  #sse
  #head
  #body
  #inputTokens // the prompt's size as estimated before generating
  #started = false
  #index = -1
  #open = null // 'thinking' | 'text' | 'tool_use'
  #calls = new Map() // the engine's tool-call index -> block index

  constructor(sse, head, body, inputTokens) {
    this.#sse = sse
    this.#head = head
    this.#body = body
    this.#inputTokens = inputTokens
  }

  #emit(type, payload) {
    this.#sse.send({ type, ...payload }, type)
  }

  #start() {
    if (this.#started) return
    this.#started = true
    const message = {
      ...this.#head,
      type: 'message',
      role: 'assistant',
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: this.#inputTokens, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 },
    }
    this.#emit('message_start', { message })
    this.#emit('ping', {})
  }

  #block(kind, contentBlock) {
    this.#close()
    this.#index++
    this.#open = kind
    this.#emit('content_block_start', { index: this.#index, content_block: contentBlock })
    return this.#index
  }

  #close() {
    if (this.#open === null) return
    if (this.#open === 'thinking') this.#emit('content_block_delta', { index: this.#index, delta: { type: 'signature_delta', signature: '' } })
    this.#emit('content_block_stop', { index: this.#index })
    this.#open = null
  }

  /** One event of the engine: its token events become the stream's. */
  event(event) {
    if (event.type !== 'token') return
    this.#start()
    if (event.reasoning) {
      if (this.#open !== 'thinking') this.#block('thinking', { type: 'thinking', thinking: '', signature: '' })
      this.#emit('content_block_delta', { index: this.#index, delta: { type: 'thinking_delta', thinking: event.reasoning } })
    }
    if (event.content) {
      if (this.#open !== 'text') this.#block('text', { type: 'text', text: '' })
      this.#emit('content_block_delta', { index: this.#index, delta: { type: 'text_delta', text: event.content } })
    }
    for (const d of event.tool_calls ?? []) {
      let index = this.#calls.get(d.index)
      if (index === undefined) {
        index = this.#block('tool_use', { type: 'tool_use', id: d.id ?? newId('toolu'), name: d.name ?? '', input: {} })
        this.#calls.set(d.index, index)
      }
      if (d.arguments) this.#emit('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: d.arguments } })
    }
  }

  /** The engine's result: the open block closed, then message_delta and message_stop. */
  end(result) {
    this.#start()
    this.#close()
    // The final counts: input_tokens and cache reads as measured, not as estimated at the start.
    this.#emit('message_delta', { delta: stopOf(result, this.#body), usage: usageOf(result) })
    this.#emit('message_stop', {})
  }

  /** A failure after the stream started: an `error` event in Anthropic's shape. */
  fail(e) {
    this.#start()
    this.#emit('error', { error: errorBody(e).error })
  }
}

/** POST /v1/messages: the generation route. */
const messages = {
  toEngine(body, ctx) {
    const { request, paramOf } = engineRequest(body)
    return { request, paramOf, body, head: { id: newId('msg'), model: ctx.modelName() } }
  },
  reply: (result, { body, head }) => ({ ...head, type: 'message', role: 'assistant', content: contentOf(result), ...stopOf(result, body), usage: usageOf(result) }),
  async streamEvents({ request, body, head }, sse, ctx) {
    // message_start carries the prompt's size before any token: estimated
    // here (the exact count comes with message_delta at the end).
    const estimate = await promptTokens(ctx.engine, ctx.withDefaults(request)).catch(() => 0)
    return new MessageEvents(sse, head, body, estimate)
  },
}

async function countTokens(ctx) {
  const body = await ctx.body()
  const { request, paramOf } = engineRequest(body, { count: true })
  ctx.paramOf = paramOf
  ctx.json(200, { input_tokens: await promptTokens(ctx.engine, ctx.withDefaults(request)) })
}

module.exports = {
  errorBody,
  prefix: '/v1/messages',
  routes: {
    'POST /v1/messages': messages,
    'POST /v1/messages/count_tokens': countTokens,
  },
}
