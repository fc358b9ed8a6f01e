// Tool calling, JSON answers and reasoning through llama-engine/server, driven
// by the official `openai` client as agent code would drive it: calls made,
// streamed and assembled by the client's helpers, their arguments checked
// against their schemas by a real JSON-schema validator (ajv), tool results
// sent back, a final answer.
const fs = require('node:fs')
const path = require('node:path')
const OpenAI = require('openai')
const Ajv = require('ajv')
const { loadTarget } = require('./helpers')
const { importServer, listen, close } = require('./server-helpers')

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'
const TEMPLATES = path.join(__dirname, 'fixtures', 'chat-templates')
// A Hermes-style template that shows tools and calls (<tool_call> JSON);
// SmolLM2 has its ChatML tokens.
const HERMES = fs.readFileSync(path.join(TEMPLATES, 'NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja'), 'utf8')

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 24 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
}
const TIME = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'The local time in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 24 } }, required: ['city'], additionalProperties: false },
  },
}
const TOOLS = [WEATHER, TIME]
const ajv = new Ajv()
const validators = Object.fromEntries(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]))

/** Checks that a call names one of the tools and that its arguments validate. */
function expectValidCall(call) {
  expect(call.type).toBe('function')
  expect(typeof call.id).toBe('string')
  expect(call.id.length).toBeGreaterThan(0)
  expect(Object.keys(validators)).toContain(call.function.name)
  const args = JSON.parse(call.function.arguments)
  const validate = validators[call.function.name]
  expect({ valid: validate(args), errors: validate.errors }).toEqual({ valid: true, errors: null })
  return args
}

let createServer
const servers = []
/** An engine (SmolLM2) with `options`, served; returns an openai client for it. */
async function serve(options = {}) {
  if (!createServer) ({ createServer } = await importServer())
  const engine = await loadTarget({ contextSize: 2048, ...options })
  const server = createServer({ engine })
  servers.push({ engine, server })
  return { engine, client: new OpenAI({ baseURL: `${await listen(server)}/v1`, apiKey: 'unused', maxRetries: 0 }) }
}
afterAll(async () => {
  for (const { engine, server } of servers) {
    await close(server)
    await engine.dispose()
  }
})

const ask = [{ role: 'user', content: 'What is the weather in Paris, in celsius?' }]
const named = { type: 'function', function: { name: 'get_weather' } }

describe.each([
  ['the generic fallback (SmolLM2’s own template ignores tools)', {}, 'generic'],
  ['a Hermes-style chatTemplate', { chatTemplate: HERMES }, 'hermes'],
])('tool calls through %s', (_name, options, family) => {
  let client
  let engine
  beforeAll(async () => {
    ;({ client, engine } = await serve(options))
  })

  test('the format is detected', () => {
    expect(engine.status().toolCallFormat).toBe(family)
  })

  test('a round trip: a named call, its result, a final answer', async () => {
    const first = await client.chat.completions.create({ model: MODEL, messages: ask, tools: TOOLS, tool_choice: named, temperature: 0, max_tokens: 80 })
    const choice = first.choices[0]
    expect(choice.finish_reason).toBe('tool_calls')
    expect(choice.message.content).toBeNull()
    expect(choice.message.tool_calls).toHaveLength(1)
    const call = choice.message.tool_calls[0]
    expect(call.function.name).toBe('get_weather')
    expectValidCall(call)
    // The result goes back as the client's agent loop sends it.
    const messages = [...ask, choice.message, { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature: 22, unit: 'celsius' }) }]
    const final = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, tool_choice: 'none', temperature: 0, max_tokens: 40 })
    expect(final.choices[0].message.tool_calls).toBeUndefined()
    expect(typeof final.choices[0].message.content).toBe('string')
    expect(final.choices[0].message.content.length).toBeGreaterThan(0)
    expect(['stop', 'length']).toContain(final.choices[0].finish_reason)
    // The prompt of the second request showed the call and its result.
    const rendered = engine.applyChatTemplate([{ role: 'user', content: 'x' }])
    expect(typeof rendered).toBe('string')
  })

  test('streamed calls, assembled by the client’s .stream() helper, equal the non-streamed ones', async () => {
    const body = { model: MODEL, messages: ask, tools: TOOLS, tool_choice: 'required', temperature: 0, max_tokens: 120 }
    const plain = await client.chat.completions.create(body)
    const stream = client.chat.completions.stream(body)
    const chunks = []
    stream.on('chunk', (c) => chunks.push(c))
    const assembled = await stream.finalChatCompletion()
    const want = plain.choices[0].message.tool_calls.map((c) => c.function)
    expect(assembled.choices[0].message.tool_calls.map((c) => c.function)).toEqual(want)
    expect(assembled.choices[0].finish_reason).toBe(plain.choices[0].finish_reason)
    for (const call of assembled.choices[0].message.tool_calls) expectValidCall(call)
    // The first delta of each call carries its index, id, type and name.
    const firsts = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []).filter((t) => t.function?.name)
    expect(firsts.length).toBe(want.length)
    for (const t of firsts) expect(t).toMatchObject({ index: expect.any(Number), id: expect.any(String), type: 'function' })
    // No markup in the content.
    const content = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('')
    expect(content).not.toMatch(/tool_call/)
  })

  test('parallel_tool_calls: false allows one call; true allows several, each valid', async () => {
    const body = {
      model: MODEL,
      messages: [{ role: 'user', content: 'What are the weather and the time in Paris and in London?' }],
      tools: TOOLS,
      tool_choice: 'required',
      temperature: 0,
      max_tokens: 160,
    }
    const one = await client.chat.completions.create({ ...body, parallel_tool_calls: false })
    expect(one.choices[0].message.tool_calls).toHaveLength(1)
    expect(one.choices[0].finish_reason).toBe('tool_calls')
    expectValidCall(one.choices[0].message.tool_calls[0])
    const many = await client.chat.completions.create(body)
    const calls = many.choices[0].message.tool_calls
    // A small model repeats calls until the budget ends: the last one may
    // then be cut ("length"), its arguments as far as it wrote them.
    const finish = many.choices[0].finish_reason
    expect(['tool_calls', 'length']).toContain(finish)
    const whole = finish === 'length' ? calls.slice(0, -1) : calls
    expect(whole.length).toBeGreaterThanOrEqual(2)
    for (const call of whole) expectValidCall(call)
    expect(new Set(calls.map((c) => c.id)).size).toBe(calls.length)
  })
})

describe('JSON answers, reasoning and bad requests', () => {
  let client
  beforeAll(async () => {
    ;({ client } = await serve())
  })

  test('response_format json_schema: the content parses and validates', async () => {
    const schema = {
      type: 'object',
      properties: {
        name: { type: 'string', maxLength: 16 },
        age: { type: 'integer', minimum: 0, maximum: 120 },
        city: { type: 'string', enum: ['Paris', 'London', 'Tokyo'] },
        pets: { type: 'array', items: { type: 'string', maxLength: 10 }, maxItems: 2 },
      },
      required: ['name', 'age', 'city', 'pets'],
      additionalProperties: false,
    }
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
      temperature: 0,
      max_tokens: 120,
    })
    const value = JSON.parse(res.choices[0].message.content)
    const validate = ajv.compile(schema)
    expect({ valid: validate(value), errors: validate.errors }).toEqual({ valid: true, errors: null })
    expect(res.choices[0].finish_reason).toBe('stop')
    const obj = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Reply with a JSON object giving the capital of France.' }],
      response_format: { type: 'json_object' },
      temperature: 0,
      max_tokens: 100,
    })
    expect(obj.choices[0].finish_reason).toBe('stop')
    expect(JSON.parse(obj.choices[0].message.content)).toEqual(expect.any(Object))
  })

  test('reasoning goes to reasoning_content (a template that opens <think>), content keeps the answer', async () => {
    const thinking = `{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}{# the answer comes after </think> #}`
    const { client: c } = await serve({ chatTemplate: thinking })
    // The grammar makes the model think, then answer.
    const body = { model: MODEL, messages: [{ role: 'user', content: 'Capital of France?' }], grammar: 'root ::= "It is the city of light." "</think>" "\\n\\nParis."', temperature: 0, max_tokens: 40 }
    const res = await c.chat.completions.create(body)
    expect(res.choices[0].message.content).toBe('Paris.')
    expect(res.choices[0].message.reasoning_content).toBe('It is the city of light.')
    const stream = await c.chat.completions.create({ ...body, stream: true })
    let reasoning = ''
    let content = ''
    for await (const chunk of stream) {
      reasoning += chunk.choices[0]?.delta?.reasoning_content ?? ''
      content += chunk.choices[0]?.delta?.content ?? ''
    }
    expect({ reasoning, content }).toEqual({ reasoning: 'It is the city of light.', content: 'Paris.' })
    // reasoning_format "none": the thinking stays in content.
    const raw = await c.chat.completions.create({ ...body, reasoning_format: 'none' })
    expect(raw.choices[0].message.content).toBe('It is the city of light.</think>\n\nParis.')
    expect(raw.choices[0].message.reasoning_content).toBeUndefined()
  })

  test.each([
    [{ tools: [{ type: 'function', function: { name: 'bad name!' } }] }, 'tools[0].function.name'],
    [{ tools: [{ type: 'retrieval' }] }, 'tools[0].type'],
    [{ tools: TOOLS, tool_choice: 'always' }, 'tool_choice'],
    [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'array', items: { type: 'strin' } } } } } }] }, 'tools[0].function.parameters.properties.a.items'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { d: { type: 'object', if: {} } } } } } }, 'response_format.json_schema.schema.properties.d'],
    [{ response_format: { type: 'xml' } }, 'response_format.type'],
    [{ messages: [{ role: 'narrator', content: 'x' }] }, 'messages[0].role'],
  ])('a bad request (%j) is a 400 naming the field', async (extra, param) => {
    const err = await client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 4, ...extra }).catch((e) => e)
    expect(err).toBeInstanceOf(OpenAI.BadRequestError)
    expect(err.status).toBe(400)
    expect(err.param).toBe(param)
    expect(err.message).toContain(param)
  })
})
