// Constrained output (JSON schemas, tool calls) and the grammar drafter:
// what the constraint forces — braces, quotes, key names, the one value an
// enum leaves, a call's closing tag — is drafted (token source "grammar")
// and verified like any draft. The output is plain decoding's: bit for bit
// greedy (tokens and probabilities), token for token with a seed, alone and
// beside other requests.
const { LlamaEngine, TARGET, matrix, tiers, run } = require('./helpers')

const ask = (text) => [{ role: 'user', content: text }]
const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 16 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    city: { type: 'string', enum: ['Paris', 'London', 'Tokyo', 'New York'] },
    languages: { type: 'array', items: { type: 'string', enum: ['English', 'French', 'Japanese'] }, maxItems: 3 },
  },
  required: ['name', 'age', 'city', 'languages'],
  additionalProperties: false,
}
const order = {
  type: 'object',
  properties: {
    order_id: { type: 'string', pattern: '^[A-Z]{2}[0-9]{4}$' },
    status: { type: 'string', enum: ['pending', 'shipped', 'delivered', 'cancelled'] },
    items: {
      type: 'array',
      items: { type: 'object', properties: { sku: { type: 'string', maxLength: 8 }, quantity: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['sku', 'quantity'], additionalProperties: false },
      minItems: 1,
      maxItems: 3,
    },
    express: { type: 'boolean' },
  },
  required: ['order_id', 'status', 'items', 'express'],
  additionalProperties: false,
}
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city', 'unit'], additionalProperties: false },
  },
}

const CASES = matrix(
  [
    ['a person (enums, bounded strings)', { messages: ask('Describe a person as JSON.'), response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person } } }],
    ['an order (nested objects, a pattern)', { messages: ask('Write an example order as JSON.'), json_schema: order }],
    ['a tool call', { messages: ask('What is the weather in Paris?'), tools: [weather], tool_choice: 'required', parallel_tool_calls: false }],
    ['a prompt with a schema', { prompt: 'A person, as JSON:', json_schema: person }],
  ],
  [
    ['a person (enums, bounded strings)', { messages: ask('Describe a person as JSON.'), response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person } } }],
    ['a tool call', { messages: ask('What is the weather in Paris?'), tools: [weather], tool_choice: 'required', parallel_tool_calls: false }],
  ],
)

const trace = (r) => ({ ids: r.tokens.map((t) => t.id), probs: r.tokens.map((t) => t.probs), content: r.result.content, calls: (r.result.tool_calls || []).map((c) => c.function) })

let engine
beforeAll(async () => {
  engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: 2, parallel: 4 })
})
afterAll(() => engine.dispose())

describe.each(CASES)('%s', (_name, input) => {
  const greedy = { ...input, n_predict: 96, temperature: 0, n_probs: 3 }

  test('greedy: the grammar drafts, and the output is mode "off"’s bit for bit', async () => {
    const off = await run(engine, { ...greedy, speculative: { mode: 'off' } })
    const auto = await run(engine, { ...greedy, speculative: { mode: 'auto' } })
    const fixed = await run(engine, { ...greedy, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } })
    expect(trace(auto)).toEqual(trace(off))
    expect(trace(fixed)).toEqual(trace(off))
    for (const r of [auto, fixed]) {
      const g = r.result.speculative.drafters.grammar
      expect(g.n_drafted).toBeGreaterThan(0)
      expect(r.tokens.filter((t) => t.source === 'grammar').length).toBe(g.n_accepted)
    }
    expect(off.result.speculative.n_drafted).toBe(0)
  })

  test('seeded sampling: the same tokens with and without drafting', async () => {
    for (let seed = 1; seed <= tiers(8, 3, 3); seed++) {
      const sampled = { ...input, n_predict: 64, temperature: 0.8, seed }
      const off = await run(engine, { ...sampled, speculative: { mode: 'off' } })
      const auto = await run(engine, { ...sampled, speculative: { mode: 'auto' } })
      expect({ seed, ids: auto.tokens.map((t) => t.id) }).toEqual({ seed, ids: off.tokens.map((t) => t.id) })
    }
  })
})

test('beside other requests: every case decoded together gives its output alone', async () => {
  const greedy = (input) => ({ ...input, n_predict: 96, temperature: 0, n_probs: 3 })
  const alone = []
  for (const [, input] of CASES) alone.push(trace(await run(engine, { ...greedy(input), speculative: { mode: 'off' } })))
  const together = await Promise.all(CASES.map(([, input]) => run(engine, { ...greedy(input), speculative: { mode: 'auto' } })))
  expect(together.map(trace)).toEqual(alone)
  expect(together.some((r) => r.result.speculative.drafters.grammar.n_accepted > 0)).toBe(true)
})

test('forced text is written in the tokenizer’s own tokens, not spelled in pieces the mask would allow', async () => {
  const keys = ['notifications', 'privacy', 'font_size', 'autosave']
  const schema = {
    type: 'object',
    properties: Object.fromEntries(keys.map((k) => [k, { type: 'string', enum: ['on', 'off'] }])),
    required: keys,
    additionalProperties: false,
  }
  const r = await run(engine, { messages: ask('Give my app settings as JSON.'), json_schema: schema, n_predict: 64, temperature: 0, speculative: { mode: 'off' } })
  const ids = r.tokens.map((t) => t.id)
  const contains = (seq) => ids.some((_, i) => seq.every((t, j) => ids[i + j] === t))
  expect(Object.keys(JSON.parse(r.result.content))).toEqual(keys)
  for (const k of keys.slice(1)) {
    // `, "key": "`: the key's canonical tokens follow the separator.
    expect({ k, canonical: contains(engine.tokenize(`${k}":`)) }).toEqual({ k, canonical: true })
  }
})
