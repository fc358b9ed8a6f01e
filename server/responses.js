'use strict'
// OpenAI's Responses API: POST /v1/responses (alias /responses), and the
// kept responses (response-store.js) behind previous_response_id,
// item_reference and GET/DELETE /v1/responses/{id}. The request becomes one chat request of the engine (messages, tools,
// tool_choice, response_format, n_predict); the result and the token
// events become the Response object and its stream of typed events, as the
// official client's ResponseStream, the Agents SDK, the AI SDK and Codex
// assemble them.

const { ApiError, invalid, openaiErrorBody } = require('./errors.js')
const { performance } = require('node:perf_hooks')
const { isObject, newId, passthrough, sourcedMessages, promptTokens } = require('./util.js')
const { httpTimings, llamaTimings } = require('./llama.js')

// Engine fields this endpoint sets itself; the engine's others (top_k,
// seed, stop, …) may be sent beside the Responses fields, as on the chat endpoint.
const PASSTHROUGH = passthrough([
  'prompt',
  'messages',
  'n_predict',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'response_format',
  'chat_template_kwargs',
])

// Output items a client may send back that carry nothing for a local model.
const DROPPED_ITEMS = new Set(['web_search_call', 'file_search_call', 'image_generation_call', 'code_interpreter_call', 'compaction', 'mcp_list_tools'])

/** The text of a message's content: a string, or text parts (input_text, output_text, refusal). */
function contentText(content, at) {
  if (typeof content === 'string') return content
  if (!Array.isArray(content)) throw invalid(at, 'expected a string or an array of content parts')
  // With an image: chat content parts (the engine reads input_image's data: URL).
  if (content.some((part) => part?.type === 'input_image')) {
    return content.map((part, j) => {
      if (part?.type !== 'input_image') return { type: 'text', text: contentText([part], at) }
      const url = typeof part.image_url === 'string' ? part.image_url : null
      if (!url) throw invalid(`${at}[${j}].image_url`, part.file_id ? 'file_id: uploaded files are not kept here; send a data: URL' : 'required: a data: URL')
      return { type: 'image_url', image_url: { url } }
    })
  }
  return content
    .map((part, j) => {
      const here = `${at}[${j}]`
      if (!isObject(part)) throw invalid(here, 'expected a content part object')
      switch (part.type) {
        case 'input_text':
        case 'output_text':
        case 'text':
          if (typeof part.text !== 'string') throw invalid(`${here}.text`, 'expected a string')
          return part.text
        case 'refusal':
          return typeof part.refusal === 'string' ? part.refusal : ''
        case 'input_file':
          throw invalid(here, 'input_file: not supported')
        default:
          throw invalid(`${here}.type`, `${JSON.stringify(part.type)} is not a content part this server reads`)
      }
    })
    .join('')
}

/** A tool's output as text: images and files, which a text-only model cannot read, are named in brackets. */
function outputText(output, at) {
  if (typeof output === 'string') return output
  if (!Array.isArray(output)) throw invalid(at, 'expected a string or an array of content parts')
  return output
    .map((part) => {
      if (part?.type === 'input_text' || part?.type === 'output_text') return String(part.text ?? '')
      if (part?.type === 'input_image') return '[image]'
      if (part?.type === 'input_file') return `[file${part.filename ? ` ${part.filename}` : ''}]`
      return JSON.stringify(part)
    })
    .join('')
}

/** The reasoning text of a reasoning item: its content, else its summary (what the Agents SDK and Codex send). */
function reasoningText(item) {
  const parts = Array.isArray(item.content) && item.content.length ? item.content : Array.isArray(item.summary) ? item.summary : []
  return parts.map((p) => (typeof p?.text === 'string' ? p.text : '')).join('')
}

/**
 * `instructions` and `input` -> chat messages, and where each message came
 * from (for naming the field of an engine error). Consecutive assistant-side
 * items (assistant messages, function calls, reasoning before them) make one
 * assistant message.
 */
function messagesOf(instructions, entries) {
  const { messages, origins, push } = sourcedMessages()
  if (instructions != null) {
    if (typeof instructions !== 'string') throw invalid('instructions', 'expected a string')
    push({ role: 'system', content: instructions }, 'instructions')
  }
  let assistant = null // the assistant message the next assistant-side item joins
  let reasoning = null // reasoning waiting for the assistant message it precedes
  const assistantAt = (at) => {
    if (!assistant) assistant = push({ role: 'assistant', content: '' }, at)
    if (reasoning !== null) {
      assistant.reasoning_content = (assistant.reasoning_content ?? '') + reasoning
      reasoning = null
    }
    return assistant
  }
  const call = (at, id, name, args) => {
    const m = assistantAt(at)
    ;(m.tool_calls ??= []).push({ id, type: 'function', function: { name, arguments: args } })
  }
  const requireString = (value, at, what = 'a string') => {
    if (typeof value !== 'string' || value === '') throw invalid(at, `expected ${what}`)
    return value
  }
  for (const { item, at } of entries) {
    if (!isObject(item)) throw invalid(at, 'expected an object: a message or an item')
    const type = item.type ?? (item.role != null ? 'message' : undefined)
    switch (type) {
      case 'message': {
        if (item.role === 'assistant') {
          assistantAt(at).content += contentText(item.content, `${at}.content`)
          break
        }
        if (!['user', 'system', 'developer'].includes(item.role)) {
          throw invalid(`${at}.role`, `expected "user", "system", "developer" or "assistant", got ${JSON.stringify(item.role)}`)
        }
        assistant = null
        // Few chat templates know "developer": it is OpenAI's name for the system turn.
        push({ role: item.role === 'developer' ? 'system' : item.role, content: contentText(item.content, `${at}.content`) }, at)
        break
      }
      case 'function_call': {
        const name = requireString(item.name, `${at}.name`)
        if (typeof item.arguments !== 'string') throw invalid(`${at}.arguments`, 'expected a JSON string')
        call(at, requireString(item.call_id, `${at}.call_id`, 'a non-empty string'), item.namespace ? `${item.namespace}.${name}` : name, item.arguments)
        break
      }
      case 'custom_tool_call':
        call(at, requireString(item.call_id, `${at}.call_id`, 'a non-empty string'), requireString(item.name, `${at}.name`), JSON.stringify({ input: String(item.input ?? '') }))
        break
      case 'local_shell_call':
        call(at, requireString(item.call_id ?? item.id, `${at}.call_id`, 'a non-empty string'), 'local_shell', JSON.stringify(item.action ?? {}))
        break
      case 'function_call_output':
      case 'custom_tool_call_output':
      case 'local_shell_call_output':
        assistant = null
        push({ role: 'tool', tool_call_id: requireString(item.call_id ?? item.id, `${at}.call_id`, 'a non-empty string'), content: outputText(item.output, `${at}.output`) }, at)
        break
      case 'reasoning': {
        const text = reasoningText(item)
        assistant = null // reasoning opens the next assistant turn
        if (text !== '') reasoning = (reasoning ?? '') + text
        break
      }
      default:
        if (DROPPED_ITEMS.has(type)) break
        throw invalid(`${at}.type`, `${JSON.stringify(type)} is not an input item this server reads`)
    }
  }
  return { messages, origins }
}

/**
 * The conversation a request continues, as input items with the field each
 * came from: the kept response's (`previous_response_id`: its input and its
 * output), then `input`, with `item_reference`s replaced by the items they
 * name. Instructions are not carried over (as on OpenAI).
 */
function inputEntries(body, store) {
  const entries = []
  const previous = body.previous_response_id
  if (previous != null && previous !== '') {
    if (typeof previous !== 'string') throw invalid('previous_response_id', 'expected a string')
    const conversation = store.conversation(previous)
    if (!conversation) {
      throw invalid('previous_response_id', `no kept response has id ${JSON.stringify(previous)}: ${keptWhat(store)}`)
    }
    for (const item of conversation) entries.push({ item, at: 'previous_response_id' })
  }
  const input = body.input
  if (typeof input === 'string') {
    entries.push({ item: { type: 'message', role: 'user', content: input }, at: 'input' })
    return entries
  }
  if (!Array.isArray(input)) throw invalid('input', 'expected a string or an array of items')
  input.forEach((item, i) => {
    const at = `input[${i}]`
    if (isObject(item) && item.type === 'item_reference') {
      if (typeof item.id !== 'string' || item.id === '') throw invalid(`${at}.id`, 'expected the id of a kept item')
      const kept = store.item(item.id)
      if (!kept) throw invalid(at, `item_reference: no kept item has id ${JSON.stringify(item.id)}: ${keptWhat(store)}`)
      entries.push({ item: kept, at })
    } else {
      entries.push({ item, at })
    }
  })
  return entries
}

/** What the server keeps, for the message of a name it does not have. */
const keptWhat = (store) =>
  `the server keeps the last ${store.max} responses (at most ${store.maxBytes} bytes) in memory, none sent with store: false, none from before a restart; send the conversation itself in \`input\``

const functionTool = (name, description, parameters, strict) => ({
  type: 'function',
  function: { name, ...(description ? { description } : {}), ...(parameters != null ? { parameters } : {}), ...(strict != null ? { strict } : {}) },
})

/**
 * Flat function tools -> the engine's; `namespace` tools flattened to
 * functions named `namespace.name` (split back in the output); every other
 * type (web_search, file_search, mcp, image_generation, custom, …) is a
 * tool this server cannot run, and is skipped.
 */
function toolsOf(body) {
  const tools = []
  const origins = []
  const names = new Map() // flattened name -> { name, namespace }
  if (body.tools == null) return { tools, origins, names }
  if (!Array.isArray(body.tools)) throw invalid('tools', 'expected an array of tools')
  body.tools.forEach((t, i) => {
    if (!isObject(t)) throw invalid(`tools[${i}]`, 'expected a tool object')
    if (t.type === 'function') {
      tools.push(functionTool(t.name, t.description, t.parameters, t.strict))
      origins.push(`tools[${i}]`)
    } else if (t.type === 'namespace' && Array.isArray(t.tools)) {
      t.tools.forEach((inner, j) => {
        if (inner?.type !== 'function') return
        const flat = `${t.name}.${inner.name}`
        names.set(flat, { name: inner.name, namespace: t.name })
        tools.push(functionTool(flat, [t.description, inner.description].filter(Boolean).join(' — '), inner.parameters, inner.strict))
        origins.push(`tools[${i}].tools[${j}]`)
      })
    }
  })
  return { tools, origins, names }
}

/** tool_choice in the chat form; `allowed_tools` narrows `tools` to those it names. */
function toolChoiceOf(choice, tools) {
  if (choice == null || typeof choice === 'string') return { choice, tools }
  if (!isObject(choice)) throw invalid('tool_choice', 'expected "auto", "none", "required" or an object')
  if (choice.type === 'function') {
    if (typeof choice.name !== 'string') throw invalid('tool_choice.name', 'expected a string')
    const name = choice.namespace ? `${choice.namespace}.${choice.name}` : choice.name
    return { choice: { type: 'function', function: { name } }, tools }
  }
  if (choice.type === 'allowed_tools') {
    const allowed = new Set((choice.tools ?? []).filter((t) => t?.type === 'function').map((t) => t.name))
    return { choice: choice.mode ?? 'auto', tools: tools.filter((t) => allowed.has(t.function.name)) }
  }
  throw invalid('tool_choice.type', `${JSON.stringify(choice.type)}: only function tools run on this server`)
}

/** text.format -> response_format. */
function responseFormatOf(format) {
  if (format == null || format.type === 'text') return undefined
  if (format.type === 'json_object') return { type: 'json_object' }
  if (format.type === 'json_schema') {
    const { name, schema, strict } = format
    return { type: 'json_schema', json_schema: { ...(name != null ? { name } : {}), schema, ...(strict != null ? { strict } : {}) } }
  }
  throw invalid('text.format.type', `expected "text", "json_object" or "json_schema", got ${JSON.stringify(format.type)}`)
}

/** The Responses body -> the engine's request, the namespace map, and how to name an engine field. */
function engineRequest(body, store) {
  if (body.conversation != null) throw invalid('conversation', 'conversations are not kept on this server: send previous_response_id, or the whole conversation in `input`')
  if (body.background === true) throw invalid('background', 'background responses are not run on this server: send the request and wait for its answer (or stream it)')
  if (body.store != null && typeof body.store !== 'boolean') throw invalid('store', 'expected a boolean')
  if (body.prompt != null) throw invalid('prompt', 'prompt templates are stored by OpenAI and not available here; send `instructions` and `input`')
  if (body.max_output_tokens != null && (!Number.isInteger(body.max_output_tokens) || body.max_output_tokens < 1)) {
    throw invalid('max_output_tokens', 'expected a positive integer')
  }

  const entries = inputEntries(body, store)
  const { messages, origins: messageOrigins } = messagesOf(body.instructions, entries)
  const flat = toolsOf(body)
  const { choice, tools } = toolChoiceOf(body.tool_choice, flat.tools)
  const request = { messages }
  for (const f of PASSTHROUGH) if (body[f] != null) request[f] = body[f]
  if (body.max_output_tokens != null) request.n_predict = body.max_output_tokens
  if (tools.length > 0) request.tools = tools
  // Without tools, "auto" and "none" say nothing; "required" or a name is the engine's error to report.
  if (choice != null && (tools.length > 0 || (choice !== 'auto' && choice !== 'none'))) request.tool_choice = choice
  if (body.parallel_tool_calls != null && tools.length > 0) request.parallel_tool_calls = body.parallel_tool_calls
  const format = responseFormatOf(body.text?.format)
  if (format) request.response_format = format
  const kwargs = { ...(isObject(body.chat_template_kwargs) ? body.chat_template_kwargs : {}) }
  if (typeof body.reasoning?.effort === 'string') kwargs.reasoning_effort = body.reasoning.effort
  if (Object.keys(kwargs).length > 0) request.chat_template_kwargs = kwargs

  // Engine field names -> this request's: messages[k] is the item it came
  // from, tools[k].function.x the flat tool's x, response_format text.format.
  const toolOrigins = tools.map((t) => flat.origins[flat.tools.indexOf(t)])
  const paramOf = (field) => {
    if (field === 'n_predict') return 'max_output_tokens'
    if (field === 'chat_template_kwargs.reasoning_effort') return 'reasoning.effort'
    let m = /^messages\[(\d+)\](.*)$/.exec(field)
    if (m && messageOrigins[m[1]]) return messageOrigins[m[1]] + m[2]
    m = /^tools\[(\d+)\](?:\.function)?(.*)$/.exec(field)
    if (m && toolOrigins[m[1]]) return toolOrigins[m[1]] + m[2]
    if (field === 'response_format.json_schema' || field.startsWith('response_format.json_schema.')) {
      return 'text.format' + field.slice('response_format.json_schema'.length)
    }
    if (field === 'response_format' || field.startsWith('response_format.')) return 'text.format' + field.slice('response_format'.length)
    return field
  }
  return { request, names: flat.names, paramOf, input: entries.map((e) => e.item) }
}

// ---- output -------------------------------------------------------------

/** The tokens of an event that only reasons (those the Response counts as reasoning_tokens). */
const reasoningTokensOf = (event) => (event.reasoning && !event.content && !event.tool_calls?.length ? event.tokens.length : 0)

function usageOf(result, reasoningTokens) {
  return {
    input_tokens: result.tokens_evaluated,
    input_tokens_details: { cached_tokens: result.tokens_cached },
    output_tokens: result.tokens_predicted,
    output_tokens_details: { reasoning_tokens: reasoningTokens },
    total_tokens: result.tokens_evaluated + result.tokens_predicted,
  }
}

const messageItem = (id, text, status) => ({
  type: 'message',
  id,
  status,
  role: 'assistant',
  content: status === 'in_progress' ? [] : [{ type: 'output_text', text, annotations: [], logprobs: [] }],
})

// Reasoning as both `content` (raw text) and `summary`: the AI SDK and Codex read only the summary.
const reasoningItem = (id, text, status) => ({
  type: 'reasoning',
  id,
  status,
  summary: status === 'in_progress' ? [] : [{ type: 'summary_text', text }],
  content: status === 'in_progress' ? [] : [{ type: 'reasoning_text', text }],
  encrypted_content: null,
})

/** A function_call item; a flattened namespace tool's name split back (Codex needs `namespace`). */
function callItem(id, callId, engineName, args, status, names) {
  const split = names.get(engineName)
  return {
    type: 'function_call',
    id,
    call_id: callId,
    name: split ? split.name : engineName,
    ...(split ? { namespace: split.namespace } : {}),
    arguments: args,
    status,
  }
}

/** The Response object around `output`: the request's settings echoed back. */
function responseObject(head, body, { status, output = [], usage = null, error = null, incomplete = null }) {
  const reasoning = isObject(body.reasoning) ? body.reasoning : {}
  return {
    id: head.id,
    object: 'response',
    created_at: head.created_at,
    status,
    ...(status === 'completed' ? { completed_at: Math.floor(Date.now() / 1000) } : { completed_at: null }),
    background: false,
    error,
    incomplete_details: incomplete,
    instructions: body.instructions ?? null,
    max_output_tokens: body.max_output_tokens ?? null,
    max_tool_calls: body.max_tool_calls ?? null,
    model: head.model,
    output,
    parallel_tool_calls: body.parallel_tool_calls ?? true,
    previous_response_id: typeof body.previous_response_id === 'string' && body.previous_response_id !== '' ? body.previous_response_id : null,
    prompt_cache_key: body.prompt_cache_key ?? null,
    reasoning: { effort: reasoning.effort ?? null, summary: reasoning.summary ?? null },
    safety_identifier: body.safety_identifier ?? null,
    service_tier: 'default',
    store: body.store !== false,
    temperature: body.temperature ?? 1,
    text: { format: body.text?.format ?? { type: 'text' }, ...(body.text?.verbosity != null ? { verbosity: body.text.verbosity } : {}) },
    tool_choice: body.tool_choice ?? 'auto',
    tools: Array.isArray(body.tools) ? body.tools : [],
    top_logprobs: body.top_logprobs ?? 0,
    top_p: body.top_p ?? 1,
    truncation: body.truncation ?? 'disabled',
    usage,
    user: body.user ?? null,
    metadata: isObject(body.metadata) ? body.metadata : {},
  }
}

/** How the engine's result ended, as the Response says it. */
function ending(result) {
  return result.stopped_limit
    ? { status: 'incomplete', incomplete: { reason: 'max_output_tokens' } }
    : { status: 'completed', incomplete: null }
}

/** The output items of a finished result, in llama.cpp's order: reasoning, message, function calls. */
function outputOf(result, names) {
  const out = []
  if (result.reasoning_content) out.push(reasoningItem(newId('rs'), result.reasoning_content, 'completed'))
  const calls = result.tool_calls ?? []
  if (result.content !== '' || calls.length === 0) out.push(messageItem(newId('msg'), result.content, 'completed'))
  for (const call of calls) out.push(callItem(newId('fc'), call.id, call.function.name, call.function.arguments, 'completed', names))
  // The item the token limit cut is the last one, as in the stream.
  if (result.stopped_limit) out[out.length - 1].status = 'incomplete'
  return out
}

/**
 * The stream of one response: typed events, each with its
 * `sequence_number`, its `output_index` and `content_index`, items opened
 * and closed in order as the engine's token events bring reasoning, text
 * and tool-call deltas.
 */
class ResponseEvents {
  #sse
  #seq = 0
  #head
  #body
  #names
  #started = false
  #items = [] // the output so far
  #open = null // { kind, index, item, text } of the item being written
  #calls = new Map() // the engine's tool-call index -> its open state
  #keep
  reasoningTokens = 0
  // llama-server's telemetry (timings_per_token): when the stream began,
  // where the prompt got to, when the first token came and how many since.
  #t0 = performance.now()
  #progress = null
  #firstAt = null
  #generated = 0

  constructor(sse, head, body, names, keep) {
    this.#sse = sse
    this.#head = head
    this.#body = body
    this.#names = names
    this.#keep = keep
  }

  /** The timings so far, in llama-server's shape (prompt from the progress events, generation since the first token). */
  #timings() {
    const now = performance.now()
    const p = this.#progress
    return llamaTimings({
      cacheN: p?.cache ?? 0,
      promptN: p ? Math.max(0, p.processed - p.cache) : 0,
      promptMs: (this.#firstAt ?? now) - this.#t0,
      predictedN: this.#generated,
      predictedMs: this.#firstAt === null ? 0 : now - this.#firstAt,
    })
  }

  #emit(type, payload) {
    this.#sse.send({ type, sequence_number: this.#seq++, ...payload }, type)
  }

  /** response.created and response.in_progress, before anything else. */
  #start() {
    if (this.#started) return
    this.#started = true
    const response = responseObject(this.#head, this.#body, { status: 'in_progress' })
    this.#emit('response.created', { response })
    this.#emit('response.in_progress', { response })
  }

  #add(kind, item) {
    const index = this.#items.length
    this.#items.push(item)
    this.#emit('response.output_item.added', { output_index: index, item })
    return { kind, index, item, text: '' }
  }

  #openReasoning() {
    if (this.#open?.kind === 'reasoning') return this.#open
    this.#closeOpen('completed')
    this.#open = this.#add('reasoning', reasoningItem(newId('rs'), '', 'in_progress'))
    const { index, item } = this.#open
    this.#emit('response.reasoning_summary_part.added', { item_id: item.id, output_index: index, summary_index: 0, part: { type: 'summary_text', text: '' } })
    return this.#open
  }

  #openMessage() {
    if (this.#open?.kind === 'message') return this.#open
    this.#closeOpen('completed')
    this.#open = this.#add('message', messageItem(newId('msg'), '', 'in_progress'))
    const { index, item } = this.#open
    this.#emit('response.content_part.added', {
      item_id: item.id,
      output_index: index,
      content_index: 0,
      part: { type: 'output_text', text: '', annotations: [], logprobs: [] },
    })
    return this.#open
  }

  /** Ends the open item with its done events and its final form. */
  #closeOpen(status) {
    const o = this.#open
    if (!o) return
    this.#open = null
    const { index, item, text } = o
    let done
    if (o.kind === 'message') {
      const part = { type: 'output_text', text, annotations: [], logprobs: [] }
      this.#emit('response.output_text.done', { item_id: item.id, output_index: index, content_index: 0, text, logprobs: [] })
      this.#emit('response.content_part.done', { item_id: item.id, output_index: index, content_index: 0, part })
      done = messageItem(item.id, text, status)
    } else if (o.kind === 'reasoning') {
      const part = { type: 'summary_text', text }
      this.#emit('response.reasoning_summary_text.done', { item_id: item.id, output_index: index, summary_index: 0, text })
      this.#emit('response.reasoning_summary_part.done', { item_id: item.id, output_index: index, summary_index: 0, part })
      done = reasoningItem(item.id, text, status)
    } else {
      const args = o.final ?? text
      this.#emit('response.function_call_arguments.done', { item_id: item.id, output_index: index, name: item.name, arguments: args })
      done = { ...item, arguments: args, status }
    }
    this.#items[index] = done
    this.#emit('response.output_item.done', { output_index: index, item: done })
  }

  /** One event of the engine: its token events become the stream's (and, with return_progress, its progress events llama-server's in_progress ones). */
  event(event) {
    if (event.type === 'progress') {
      const { type, ...prompt_progress } = event
      this.#progress = prompt_progress
      if (this.#body.return_progress !== true) return
      this.#start()
      this.#emit('response.in_progress', { response: responseObject(this.#head, this.#body, { status: 'in_progress' }), prompt_progress })
      return
    }
    if (event.type !== 'token') return
    this.#start()
    this.#firstAt ??= performance.now()
    this.#generated += event.tokens?.length ?? 1
    const telemetry = this.#body.timings_per_token === true ? { timings: this.#timings() } : {}
    if (event.reasoning) {
      const o = this.#openReasoning()
      o.text += event.reasoning
      this.#emit('response.reasoning_summary_text.delta', { item_id: o.item.id, output_index: o.index, summary_index: 0, delta: event.reasoning })
      this.reasoningTokens += reasoningTokensOf(event)
    }
    if (event.content) {
      const o = this.#openMessage()
      o.text += event.content
      this.#emit('response.output_text.delta', { item_id: o.item.id, output_index: o.index, content_index: 0, delta: event.content, logprobs: [], ...telemetry })
    }
    for (const d of event.tool_calls ?? []) {
      let o = this.#calls.get(d.index)
      if (!o) {
        this.#closeOpen('completed')
        o = this.#add('function_call', callItem(newId('fc'), d.id ?? newId('call'), d.name ?? '', '', 'in_progress', this.#names))
        this.#calls.set(d.index, o)
        this.#open = o
      }
      if (d.arguments) {
        o.text += d.arguments
        this.#emit('response.function_call_arguments.delta', { item_id: o.item.id, output_index: o.index, delta: d.arguments })
      }
    }
  }

  /** The engine's result: the open item closed, then response.completed (or .incomplete) with everything. */
  end(result) {
    this.#start()
    const { status, incomplete } = ending(result)
    // The result's calls are the final word on their arguments.
    for (const [index, o] of this.#calls) {
      const call = result.tool_calls?.[index]
      if (call) o.final = call.function.arguments
    }
    if (this.#items.length === 0) this.#openMessage()
    this.#closeOpen(result.stopped_limit ? 'incomplete' : 'completed')
    const response = responseObject(this.#head, this.#body, { status, incomplete, output: this.#items, usage: usageOf(result, this.reasoningTokens) })
    this.#keep(response)
    const telemetry = this.#body.timings_per_token === true && result.timings ? { timings: httpTimings(result) } : {}
    this.#emit(status === 'completed' ? 'response.completed' : 'response.incomplete', { response, ...telemetry })
  }

  /** A failure after the stream started: an `error` event, then response.failed. */
  fail(e) {
    this.#start()
    this.#emit('error', { code: e.code, message: e.message, param: e.param })
    const response = responseObject(this.#head, this.#body, { status: 'failed', output: this.#items, error: { code: e.code, message: e.message } })
    this.#emit('response.failed', { response })
  }
}

/** POST /v1/responses: the generation route. */
const responses = {
  toEngine(body, ctx) {
    const store = ctx.server.responses
    const { request, names, paramOf, input } = engineRequest(body, store)
    const head = { id: newId('resp'), created_at: Math.floor(Date.now() / 1000), model: ctx.modelName() }
    // Kept when it finished (store, true unless false), with what it answered.
    const keep = (response) => {
      if (body.store !== false) store.put(response, input)
    }
    return { request, paramOf, names, body, head, keep, reasoningTokens: 0 }
  },
  observe(event, turn) {
    if (event.type === 'token') turn.reasoningTokens += reasoningTokensOf(event)
  },
  reply(result, { names, body, head, keep, reasoningTokens }) {
    const { status, incomplete } = ending(result)
    const response = responseObject(head, body, { status, incomplete, output: outputOf(result, names), usage: usageOf(result, reasoningTokens) })
    keep(response)
    return response
  },
  streamEvents: ({ body, head, names, keep }, sse) => new ResponseEvents(sse, head, body, names, keep),
}

const notFound = (id) => new ApiError(404, `no kept response has id ${JSON.stringify(id)}`, { code: 'NOT_FOUND', type: 'invalid_request_error' })

/** GET /v1/responses/{id}: a kept response. */
function getResponse(ctx) {
  const response = ctx.server.responses.get(ctx.params.id)
  if (!response) throw notFound(ctx.params.id)
  ctx.json(200, response)
}

/** DELETE /v1/responses/{id}. */
function deleteResponse(ctx) {
  if (!ctx.server.responses.delete(ctx.params.id)) throw notFound(ctx.params.id)
  ctx.json(200, { id: ctx.params.id, object: 'response', deleted: true })
}

/** GET /v1/responses/{id}/input_items: OpenAI's list (`order` desc by default, `limit` 1–100, `after`). */
function inputItems(ctx) {
  const input = ctx.server.responses.input(ctx.params.id)
  if (!input) throw notFound(ctx.params.id)
  const order = ctx.query.get('order') ?? 'desc'
  if (order !== 'asc' && order !== 'desc') throw invalid('order', 'expected "asc" or "desc"')
  const limit = ctx.query.has('limit') ? Number(ctx.query.get('limit')) : 20
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) throw invalid('limit', 'expected an integer from 1 to 100')
  let items = order === 'desc' ? [...input].reverse() : input
  const after = ctx.query.get('after')
  if (after != null) {
    const at = items.findIndex((item) => item.id === after)
    if (at < 0) throw invalid('after', `no input item of this response has id ${JSON.stringify(after)}`)
    items = items.slice(at + 1)
  }
  const data = items.slice(0, limit)
  ctx.json(200, { object: 'list', data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: items.length > limit })
}

/**
 * POST /v1/responses/input_tokens (OpenAI's, and llama-server's): `{ object:
 * 'response.input_tokens', input_tokens }`, the prompt tokens a Responses
 * request's input (with its instructions, tools and previous response)
 * renders to, without generating.
 */
async function inputTokens(ctx) {
  const body = await ctx.body()
  const { request, paramOf } = engineRequest(body, ctx.server.responses)
  ctx.paramOf = paramOf
  ctx.json(200, { object: 'response.input_tokens', input_tokens: await promptTokens(ctx.engine, ctx.withDefaults(request)) })
}

module.exports = {
  errorBody: openaiErrorBody,
  routes: {
    'POST /v1/responses/input_tokens': inputTokens,
    'POST /responses/input_tokens': inputTokens,
    'POST /v1/responses': responses,
    'POST /responses': responses,
    'GET /v1/responses/:id': getResponse,
    'DELETE /v1/responses/:id': deleteResponse,
    'GET /v1/responses/:id/input_items': inputItems,
  },
}
