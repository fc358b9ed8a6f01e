// POST /v1/responses, driven by the clients that speak it: the official
// `openai` client (responses.create and its stream helper), the Agents SDK
// with its defaults, and the AI SDK's default `openai(model)`. SmolLM2's own
// template ignores tools: the engine's generic tool preamble lists them.
const OpenAI = require('openai')
const { z } = require('zod')
const { startServer, stopServer } = require('./server-helpers')

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'
const WEATHER = {
  type: 'function',
  name: 'get_weather',
  description: 'The current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 24 } }, required: ['city'], additionalProperties: false },
  strict: true,
}
const ask = 'What is the weather in Paris?'
// A 135M model allowed several calls repeats the same one: one call, chosen from the first token.
const callOnce = { tools: [WEATHER], tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_output_tokens: 48 }

let engine
let server
let base
let client
beforeAll(async () => {
  ;({ engine, server, base } = await startServer())
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 })
})
afterAll(() => stopServer({ engine, server }))

describe('the official openai client', () => {
  test('responses.create: the text engine.complete gives for the same messages, usage with cached_tokens', async () => {
    const direct = await engine.complete({
      messages: [
        { role: 'system', content: 'Answer briefly.' },
        { role: 'user', content: 'Name three fruits.' },
      ],
      temperature: 0,
      n_predict: 24,
    })
    const res = await client.responses.create({ model: MODEL, instructions: 'Answer briefly.', input: 'Name three fruits.', temperature: 0, max_output_tokens: 24 })
    expect(res).toMatchObject({ object: 'response', model: MODEL, store: true, previous_response_id: null, instructions: 'Answer briefly.' })
    expect(res.id).toMatch(/^resp_/)
    expect(res.output).toHaveLength(1)
    expect(res.output[0]).toMatchObject({ type: 'message', role: 'assistant', content: [{ type: 'output_text', annotations: [] }] })
    expect(res.output_text).toBe(direct.content)
    expect(res.status).toBe(direct.stopped_limit ? 'incomplete' : 'completed')
    expect(res.usage).toEqual({
      input_tokens: direct.tokens_evaluated,
      input_tokens_details: { cached_tokens: expect.any(Number) },
      output_tokens: direct.tokens_predicted,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: direct.tokens_evaluated + direct.tokens_predicted,
    })
    // Evaluated just before: all of the prompt but its last token is reused.
    expect(res.usage.input_tokens_details.cached_tokens).toBe(res.usage.input_tokens - 1)
    const cut = await client.responses.create({ model: MODEL, input: 'Name three fruits.', temperature: 0, max_output_tokens: 2 })
    expect(cut.status).toBe('incomplete')
    expect(cut.incomplete_details).toEqual({ reason: 'max_output_tokens' })
  })

  test('responses.stream: numbered events the stream helper assembles into the same response', async () => {
    const params = { model: MODEL, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Name three fruits.' }] }], temperature: 0, max_output_tokens: 24 }
    const whole = await client.responses.create(params)
    const stream = client.responses.stream(params)
    const events = []
    let deltas = ''
    stream.on('response.output_text.delta', (e) => (deltas += e.delta))
    for await (const event of stream) events.push(event)
    const final = await stream.finalResponse()
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i))
    expect(events.slice(0, 4).map((e) => e.type)).toEqual(['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added'])
    expect(events[0].response).toMatchObject({ status: 'in_progress', output: [], model: MODEL, created_at: expect.any(Number) })
    expect(events.at(-1).type).toBe(whole.status === 'completed' ? 'response.completed' : 'response.incomplete')
    const completed = events.at(-1).response.output
    expect(completed.map((o) => [o.type, o.id, o.status])).toEqual(final.output.map((o) => [o.type, o.id, o.status]))
    expect(completed[0].content[0]).toEqual({ type: 'output_text', text: whole.output_text, annotations: [], logprobs: [] })
    for (const e of events.filter((e) => e.type === 'response.output_text.delta')) {
      expect(e).toMatchObject({ output_index: 0, content_index: 0, item_id: final.output[0].id })
    }
    expect(deltas).toBe(whole.output_text)
    expect(final.output_text).toBe(whole.output_text)
    expect(final.usage.output_tokens).toBe(whole.usage.output_tokens)
  })

  test.each([false, true])('a function call round trip (stream: %s)', async (streamed) => {
    const create = async (params) => {
      if (!streamed) return client.responses.create(params)
      const s = client.responses.stream(params)
      const types = []
      for await (const e of s) types.push(e.type)
      expect(types).toContain(params.tool_choice === 'required' ? 'response.function_call_arguments.done' : 'response.output_text.done')
      return s.finalResponse()
    }
    const first = await create({ model: MODEL, input: ask, ...callOnce })
    const calls = first.output.filter((o) => o.type === 'function_call')
    expect(calls).toHaveLength(1)
    const [call] = calls
    expect(call).toMatchObject({ name: 'get_weather', status: 'completed', id: expect.stringMatching(/^fc_/), call_id: expect.any(String) })
    expect(typeof JSON.parse(call.arguments).city).toBe('string')
    // The call and its output go back as items (what an agent loop sends), and the model answers.
    const input = [
      { role: 'user', content: ask },
      { type: 'function_call', id: call.id, call_id: call.call_id, name: call.name, arguments: call.arguments, status: 'completed' },
      { type: 'function_call_output', call_id: call.call_id, output: JSON.stringify({ city: 'Paris', celsius: 22, sky: 'sunny' }) },
    ]
    const second = await create({ model: MODEL, input, tools: [WEATHER], tool_choice: 'none', temperature: 0, max_output_tokens: 32 })
    expect(second.output.map((o) => o.type)).toEqual(['message'])
    expect(second.output_text.length).toBeGreaterThan(0)
  })

  test('text.format json_schema: the answer parses and matches', async () => {
    const format = {
      type: 'json_schema',
      name: 'city',
      strict: true,
      schema: { type: 'object', properties: { city: { type: 'string', maxLength: 20 } }, required: ['city'], additionalProperties: false },
    }
    const res = await client.responses.create({ model: MODEL, input: 'Name a city in France as JSON.', text: { format }, temperature: 0, max_output_tokens: 32 })
    expect(Object.keys(JSON.parse(res.output_text))).toEqual(['city'])
    const parsed = await client.responses.parse({ model: MODEL, input: 'Name a city in France as JSON.', text: { format }, temperature: 0, max_output_tokens: 32 })
    expect(typeof parsed.output_parsed.city).toBe('string')
  })

  test('namespace tools are flattened and split back; hosted tools are skipped', async () => {
    const res = await client.responses.create({
      model: MODEL,
      input: ask,
      tools: [
        { type: 'web_search' },
        { type: 'namespace', name: 'weather', description: 'Weather tools', tools: [{ ...WEATHER, name: 'current' }] },
      ],
      tool_choice: 'required',
      parallel_tool_calls: false,
      temperature: 0,
      max_output_tokens: 48,
    })
    const call = res.output.find((o) => o.type === 'function_call')
    expect(call).toMatchObject({ namespace: 'weather', name: 'current' })
    // And back as input, the namespace joined again.
    const again = await client.responses.create({
      model: MODEL,
      input: [
        { role: 'user', content: ask },
        { type: 'function_call', call_id: call.call_id, name: 'current', namespace: 'weather', arguments: call.arguments },
        { type: 'function_call_output', call_id: call.call_id, output: 'sunny' },
      ],
      temperature: 0,
      max_output_tokens: 8,
    })
    expect(again.status).toMatch(/completed|incomplete/)
  })

  test('kept responses: GET, input_items, DELETE; store: false keeps nothing', async () => {
    const kept = await client.responses.create({ model: MODEL, input: 'Name a fruit.', temperature: 0, max_output_tokens: 6 })
    expect(kept.store).toBe(true)
    expect(await client.responses.retrieve(kept.id)).toEqual(kept)
    const items = await client.responses.inputItems.list(kept.id)
    expect(items.data).toEqual([expect.objectContaining({ type: 'message', role: 'user', content: 'Name a fruit.', id: expect.any(String) })])
    expect(await client.responses.delete(kept.id)).toEqual({ id: kept.id, object: 'response', deleted: true })
    const gone = await client.responses.retrieve(kept.id).catch((e) => e)
    expect(gone).toBeInstanceOf(OpenAI.NotFoundError)
    const again = await fetch(`${base}/v1/responses/${kept.id}`, { method: 'DELETE' })
    expect(again.status).toBe(404)

    const unkept = await client.responses.create({ model: MODEL, input: 'Name a fruit.', temperature: 0, max_output_tokens: 6, store: false })
    expect(unkept.store).toBe(false)
    expect(await client.responses.retrieve(unkept.id).catch((e) => e)).toBeInstanceOf(OpenAI.NotFoundError)
  })

  test('previous_response_id continues the conversation from its cached KV cells, prefilling only the new input', async () => {
    const first = await client.responses.create({ model: MODEL, instructions: 'Answer briefly.', input: 'Name three fruits.', temperature: 0, max_output_tokens: 16 })
    const next = await client.responses.create({ model: MODEL, previous_response_id: first.id, input: 'And three vegetables?', temperature: 0, max_output_tokens: 8 })
    expect(next.previous_response_id).toBe(first.id)
    // The same answer as the whole conversation sent again, and the turn before not computed again.
    const whole = await engine.complete({
      messages: [
        { role: 'user', content: 'Name three fruits.' },
        { role: 'assistant', content: first.output_text },
        { role: 'user', content: 'And three vegetables?' },
      ],
      temperature: 0,
      n_predict: 8,
    })
    expect(next.output_text).toBe(whole.content)
    expect(next.usage.input_tokens_details.cached_tokens).toBeGreaterThanOrEqual(first.usage.input_tokens - 8)
    // Its input items are the whole conversation: the first input, the first output, the new input.
    const items = await client.responses.inputItems.list(next.id, { order: 'asc' })
    expect(items.data.map((i) => i.type + ':' + (i.role ?? ''))).toEqual(['message:user', 'message:assistant', 'message:user'])
  })

  test('responsesFile: a restarted server still has what it kept; previous_response_id goes on from there', async () => {
    const fs = require('node:fs')
    const os = require('node:os')
    const path = require('node:path')
    const { createServer } = require('../server')
    const { listen } = require('./server-helpers')
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-responses-'))
    const file = path.join(dir, 'kept.responses')
    try {
      const one = createServer({ engine, signals: false, responsesFile: file })
      const c1 = new OpenAI({ baseURL: `${await listen(one)}/v1`, apiKey: 'unused', maxRetries: 0 })
      const first = await c1.responses.create({ model: MODEL, input: 'Name three fruits.', temperature: 0, max_output_tokens: 12 })
      // As SIGTERM stops it: the kept responses are on disk when shutdown resolves.
      await one.shutdown({ dispose: false })
      // Another server over the same file (as after a restart).
      const two = createServer({ engine, signals: false, responsesFile: file })
      expect(two.responses.loadError).toBeNull()
      try {
        const c2 = new OpenAI({ baseURL: `${await listen(two)}/v1`, apiKey: 'unused', maxRetries: 0 })
        expect((await c2.responses.retrieve(first.id)).output_text).toBe(first.output_text)
        const next = await c2.responses.create({ model: MODEL, previous_response_id: first.id, input: 'And three vegetables?', temperature: 0, max_output_tokens: 8 })
        const items = await c2.responses.inputItems.list(next.id, { order: 'asc' })
        expect(items.data.map((i) => i.type + ':' + (i.role ?? ''))).toEqual(['message:user', 'message:assistant', 'message:user'])
      } finally {
        await two.shutdown({ dispose: false })
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  test('item_reference names a kept item; unknown names are a 400 that says what is kept', async () => {
    const first = await client.responses.create({ model: MODEL, input: [{ role: 'user', content: ask }], ...callOnce })
    const call = first.output.find((o) => o.type === 'function_call')
    expect(call).toBeDefined()
    const next = await client.responses.create({
      model: MODEL,
      input: [{ role: 'user', content: ask }, { type: 'item_reference', id: call.id }, { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }],
      tools: [WEATHER],
      temperature: 0,
      max_output_tokens: 8,
    })
    const sent = await client.responses.create({
      model: MODEL,
      input: [{ role: 'user', content: ask }, call, { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }],
      tools: [WEATHER],
      temperature: 0,
      max_output_tokens: 8,
    })
    expect(next.output_text).toBe(sent.output_text)

    const prev = await client.responses.create({ model: MODEL, input: 'Hi', previous_response_id: 'resp_123', max_output_tokens: 4 }).catch((e) => e)
    expect(prev).toBeInstanceOf(OpenAI.BadRequestError)
    expect(prev.param).toBe('previous_response_id')
    expect(prev.message).toMatch(/no kept response .*store: false/)
    const ref = await client.responses
      .create({ model: MODEL, input: [{ role: 'user', content: 'Hi' }, { type: 'item_reference', id: 'msg_1' }], max_output_tokens: 4 })
      .catch((e) => e)
    expect(ref).toBeInstanceOf(OpenAI.BadRequestError)
    expect(ref.param).toBe('input[1]')
    expect(ref.message).toMatch(/no kept item/)
  })

  test('a streamed response is kept as response.completed gave it', async () => {
    const stream = await client.responses.create({ model: MODEL, input: 'Say hi.', temperature: 0, max_output_tokens: 6, stream: true })
    let done
    for await (const event of stream) if (event.type === 'response.completed' || event.type === 'response.incomplete') done = event.response
    // (The client adds output_text to what retrieve() returns.)
    const { output_text, ...kept } = await client.responses.retrieve(done.id)
    expect(kept).toEqual(done)
  })

  // Needs the engine's err.field (INVALID_REQUEST errors name their field as data).
  test("an engine error names the Responses API's own field", async () => {
    const bad = await client.responses
      .create({ model: MODEL, input: 'Hi', text: { format: { type: 'json_schema', name: 'x', schema: 5 } }, max_output_tokens: 4 })
      .catch((e) => e)
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError)
    expect(bad.param).toBe('text.format.schema')
    expect(bad.message).toMatch(/^400 text\.format\.schema: /)
    const tool = await client.responses
      .create({ model: MODEL, input: 'Hi', tools: [{ type: 'web_search' }, { ...WEATHER, name: 'no spaces allowed' }], max_output_tokens: 4 })
      .catch((e) => e)
    expect(tool.param).toMatch(/^tools\[1\]/)
  })
})

test('the Agents SDK, with its defaults (the Responses API), runs an agent that calls a tool and answers', async () => {
  const agents = require('@openai/agents')
  agents.setDefaultOpenAIClient(client)
  agents.setTracingDisabled(true)
  const cities = []
  const getWeather = agents.tool({
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      cities.push(city)
      return `It is sunny and 22 degrees in ${city}.`
    },
  })
  const agent = new agents.Agent({
    name: 'Weather',
    instructions: 'You answer questions about the weather. Call the tool, then answer in one sentence.',
    model: MODEL,
    tools: [getWeather],
    // The first turn must call the tool; the SDK resets tool_choice after a call, so the next one answers.
    modelSettings: { temperature: 0, toolChoice: 'required', parallelToolCalls: false, maxTokens: 32 },
  })
  const result = await agents.run(agent, ask, { maxTurns: 3 })
  expect(cities).toHaveLength(1)
  expect(typeof result.finalOutput).toBe('string')
  expect(result.finalOutput.length).toBeGreaterThan(0)
  expect(result.newItems.map((i) => i.type)).toEqual(['tool_call_item', 'tool_call_output_item', 'message_output_item'])
  // Two model calls (the tool call, the answer), each read from response.completed with its usage.
  expect(result.rawResponses).toHaveLength(2)
  for (const r of result.rawResponses) expect(r.usage.totalTokens).toBe(r.usage.inputTokens + r.usage.outputTokens)
})

describe("the AI SDK's default openai(model)", () => {
  let ai
  let openai
  beforeAll(() => {
    ai = require('ai')
    openai = require('@ai-sdk/openai').createOpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' })
  })

  test('generateText', async () => {
    const res = await ai.generateText({ model: openai(MODEL), prompt: 'Name three fruits.', temperature: 0, maxOutputTokens: 24, maxRetries: 0 })
    const direct = await client.responses.create({ model: MODEL, input: 'Name three fruits.', temperature: 0, max_output_tokens: 24 })
    expect(res.text).toBe(direct.output_text)
    expect(res.usage.outputTokens).toBe(direct.usage.output_tokens)
    expect(res.response.modelId).toBe(MODEL)
  })

  test('streamText with a tool: the call, its result, then the answer', async () => {
    const cities = []
    const result = ai.streamText({
      model: openai(MODEL),
      prompt: ask,
      temperature: 0,
      maxOutputTokens: 48,
      maxRetries: 0,
      tools: {
        get_weather: ai.tool({
          description: 'The current weather in a city',
          inputSchema: z.object({ city: z.string() }),
          execute: async ({ city }) => {
            cities.push(city)
            return { city, celsius: 22, sky: 'sunny' }
          },
        }),
      },
      providerOptions: { openai: { parallelToolCalls: false } },
      // Step 1 must call the tool, step 2 answers.
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
      stopWhen: ai.stepCountIs(2),
    })
    let text = ''
    for await (const delta of result.textStream) text += delta
    const steps = await result.steps
    expect(cities).toHaveLength(1)
    expect(steps).toHaveLength(2)
    expect(steps[0].toolCalls.map((c) => c.toolName)).toEqual(['get_weather'])
    expect(steps[0].finishReason).toBe('tool-calls')
    expect(steps[1].text).toBe(text)
    expect(text.length).toBeGreaterThan(0)
  })
})
