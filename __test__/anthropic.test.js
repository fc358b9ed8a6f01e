// POST /v1/messages and /v1/messages/count_tokens, driven by
// @anthropic-ai/sdk as Claude Code and agent code drive it: text, a tool
// round trip (create and the stream helper), stop sequences, token counts,
// errors in Anthropic's shape, both ways of sending the key.
const Anthropic = require('@anthropic-ai/sdk')
const { startServer, stopServer, sseEvents } = require('./server-helpers')

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'
const KEY = 'sesame'
const WEATHER = {
  name: 'get_weather',
  description: 'The current weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 24 } }, required: ['city'], additionalProperties: false },
}
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }]
// One call, from the first token: a 135M model allowed several repeats the same one.
const callOnce = { tools: [WEATHER], tool_choice: { type: 'any', disable_parallel_tool_use: true }, temperature: 0, max_tokens: 48 }

let engine
let server
let base
let client
beforeAll(async () => {
  ;({ engine, server, base } = await startServer({ apiKey: KEY }))
  client = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 })
})
afterAll(() => stopServer({ engine, server }))

test('messages.create: text, usage with cache reads, stop_reason', async () => {
  const params = { model: MODEL, system: [{ type: 'text', text: 'Answer briefly.' }], messages: [{ role: 'user', content: 'Name three fruits.' }], temperature: 0, max_tokens: 24 }
  const direct = await engine.complete({
    messages: [{ role: 'system', content: 'Answer briefly.' }, ...params.messages],
    temperature: 0,
    n_predict: 24,
  })
  const msg = await client.messages.create(params)
  expect(msg).toMatchObject({ type: 'message', role: 'assistant', model: MODEL, content: [{ type: 'text', text: direct.content }] })
  expect(msg.id).toMatch(/^msg_/)
  expect(msg.stop_reason).toBe(direct.stopped_limit ? 'max_tokens' : 'end_turn')
  expect(msg.stop_sequence).toBeNull()
  // Anthropic counts cache reads apart: input + cache reads = the whole prompt.
  expect(msg.usage.input_tokens + msg.usage.cache_read_input_tokens).toBe(direct.tokens_evaluated)
  expect(msg.usage.input_tokens).toBe(1)
  expect(msg.usage.output_tokens).toBe(direct.tokens_predicted)

  const count = await client.messages.countTokens({ model: MODEL, system: params.system, messages: params.messages })
  expect(count.input_tokens).toBe(direct.tokens_evaluated)
})

test('stop_sequences: stop_reason "stop_sequence" names the one that matched', async () => {
  const free = { model: MODEL, messages: [{ role: 'user', content: 'Name three fruits.' }], temperature: 0, max_tokens: 24 }
  const whole = await client.messages.create(free)
  const word = whole.content[0].text.split(/\s+/)[2]
  const stopped = await client.messages.create({ ...free, stop_sequences: ['NEVER-SEEN', word] })
  expect(stopped.stop_reason).toBe('stop_sequence')
  expect(stopped.stop_sequence).toBe(word)
  expect(stopped.content[0].text).not.toContain(word)
})

test.each([false, true])('a tool round trip (stream: %s): tool_use, then tool_result, then the answer', async (streamed) => {
  const create = async (params) => {
    if (!streamed) return client.messages.create(params)
    const stream = client.messages.stream(params)
    const types = []
    let json = ''
    stream.on('streamEvent', (e) => types.push(e.type))
    stream.on('inputJson', (partial) => (json += partial))
    const final = await stream.finalMessage()
    expect(types[0]).toBe('message_start')
    expect(types.slice(-2)).toEqual(['message_delta', 'message_stop'])
    const use = final.content.find((b) => b.type === 'tool_use')
    if (use) expect(JSON.parse(json)).toEqual(use.input)
    return final
  }
  const first = await create({ model: MODEL, messages: ask, ...callOnce })
  expect(first.stop_reason).toBe('tool_use')
  const uses = first.content.filter((b) => b.type === 'tool_use')
  expect(uses).toHaveLength(1)
  expect(uses[0]).toMatchObject({ name: 'get_weather', id: expect.any(String) })
  expect(typeof uses[0].input.city).toBe('string')

  const messages = [
    ...ask,
    { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: [{ type: 'text', text: 'Sunny, 22 degrees.' }] }] },
  ]
  const second = await create({ model: MODEL, messages, tools: [WEATHER], tool_choice: { type: 'none' }, temperature: 0, max_tokens: 32 })
  expect(second.content.map((b) => b.type)).toEqual(['text'])
  expect(second.content[0].text.length).toBeGreaterThan(0)
  expect(['end_turn', 'max_tokens']).toContain(second.stop_reason)
})

test('tool_choice { type: "tool", name } calls that tool', async () => {
  const other = { name: 'get_time', description: 'The local time in a city', input_schema: WEATHER.input_schema }
  const msg = await client.messages.create({
    model: MODEL,
    messages: ask,
    tools: [WEATHER, other],
    tool_choice: { type: 'tool', name: 'get_time', disable_parallel_tool_use: true },
    temperature: 0,
    max_tokens: 48,
  })
  expect(msg.content.filter((b) => b.type === 'tool_use').map((b) => b.name)).toEqual(['get_time'])
})

test('the raw event stream: message_start first, contiguous blocks, input_json_delta, final usage in message_delta', async () => {
  const res = await fetch(`${base}/v1/messages?beta=true`, {
    method: 'POST',
    headers: { 'x-api-key': KEY, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, messages: ask, ...callOnce, stream: true }),
  })
  expect(res.status).toBe(200)
  const events = sseEvents(await res.text())
  for (const e of events) expect(e.event).toBe(e.data.type)
  expect(events[0].event).toBe('message_start')
  expect(events[0].data.message).toMatchObject({ content: [], stop_reason: null, usage: { output_tokens: 0 } })
  const starts = events.filter((e) => e.event === 'content_block_start').map((e) => e.data.index)
  expect(starts).toEqual(starts.map((_, i) => i))
  expect(events.some((e) => e.data.delta?.type === 'input_json_delta')).toBe(true)
  const delta = events.find((e) => e.event === 'message_delta').data
  expect(delta.delta).toEqual({ stop_reason: 'tool_use', stop_sequence: null })
  expect(delta.usage.output_tokens).toBeGreaterThan(0)
  expect(events.at(-1).event).toBe('message_stop')
})

test("errors in Anthropic's shape: a missing key, a bad request, a field named by the engine", async () => {
  const none = await fetch(`${base}/v1/messages`, { method: 'POST', body: JSON.stringify({ model: MODEL, messages: ask, max_tokens: 4 }) })
  expect(none.status).toBe(401)
  expect(await none.json()).toEqual({ type: 'error', error: { type: 'authentication_error', message: expect.any(String) } })
  // Authorization: Bearer (ANTHROPIC_AUTH_TOKEN) works as well as x-api-key.
  const bearer = new Anthropic({ baseURL: base, authToken: KEY, apiKey: null, maxRetries: 0 })
  expect((await bearer.messages.countTokens({ model: MODEL, messages: ask })).input_tokens).toBeGreaterThan(0)

  const missing = await client.messages.create({ model: MODEL, messages: ask }).catch((e) => e)
  expect(missing).toBeInstanceOf(Anthropic.BadRequestError)
  expect(missing.error).toEqual({ type: 'error', error: { type: 'invalid_request_error', message: 'max_tokens: required' } })
  // Needs the engine's err.field: the engine's "tools[0].function.parameters" is Anthropic's "tools.0.input_schema".
  const badSchema = await client.messages
    .create({ model: MODEL, messages: ask, max_tokens: 4, tools: [{ ...WEATHER, input_schema: { type: 'object', properties: 5 } }] })
    .catch((e) => e)
  expect(badSchema).toBeInstanceOf(Anthropic.BadRequestError)
  expect(badSchema.error.error.message).toMatch(/^tools\.0\.input_schema/)
  // thinking.budget_tokens is the engine's reasoning_budget, named as Anthropic names it.
  const badBudget = await client.messages.create({ model: MODEL, messages: ask, max_tokens: 4, thinking: { type: 'enabled', budget_tokens: -7 } }).catch((e) => e)
  expect(badBudget).toBeInstanceOf(Anthropic.BadRequestError)
  expect(badBudget.error.error.message).toMatch(/^thinking\.budget_tokens/)
  const budgeted = await client.messages.create({ model: MODEL, messages: ask, max_tokens: 4, thinking: { type: 'enabled', budget_tokens: 1024 } })
  expect(budgeted.type).toBe('message')
})
