// Hostile constraints: a small request body must not hold the engine or its
// memory. Counts in the millions in every position of a schema (and of a
// tool's parameters, a pattern, a GBNF grammar) are refused with
// INVALID_REQUEST naming the place, while another request streams beside
// them; schemas that pass the limits compile off the engine thread; resident
// memory comes back. Nothing is timed: the neighbour's tokens are counted.
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { loadTarget, user, TARGET } = require('./helpers')

const SCHEMA = 'response_format.json_schema.schema'
const asSchema = (schema) => ({ messages: user('Answer in JSON.'), n_predict: 16, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } })
const asTool = (parameters) => ({
  messages: user('Call the tool.'),
  n_predict: 16,
  tools: [{ type: 'function', function: { name: 'f', parameters } }],
  tool_choice: 'required',
})
const M = 100_000_000

// [name, request, the field the error names]
const REFUSED = [
  ['minItems 100,000,000', asSchema({ type: 'array', items: { type: 'integer' }, minItems: M }), `${SCHEMA}.minItems`],
  ['maxItems in the millions', asSchema({ type: 'array', items: { type: 'integer' }, maxItems: 5_000_000 }), `${SCHEMA}.maxItems`],
  ['minLength in the millions', asSchema({ type: 'object', properties: { s: { type: 'string', minLength: 3_000_000 } } }), `${SCHEMA}.properties.s.minLength`],
  ['maxLength in the millions', asSchema({ type: 'string', maxLength: 9_000_000 }), `${SCHEMA}.maxLength`],
  ['minProperties in the millions', asSchema({ type: 'object', additionalProperties: { type: 'integer' }, minProperties: 2_000_000 }), `${SCHEMA}.minProperties`],
  ['maxProperties in the millions', asSchema({ type: 'object', additionalProperties: { type: 'integer' }, maxProperties: 2_000_000 }), `${SCHEMA}.maxProperties`],
  ["a pattern's {m,n} in the millions", asSchema({ type: 'string', pattern: '^a{1,5000000}$' }), `${SCHEMA}.pattern`],
  ['nested arrays multiplying', asSchema({ type: 'array', minItems: 1000, items: { type: 'array', minItems: 1000, items: { type: 'integer' } } }), `${SCHEMA}.items.minItems`],
  ["nested pattern groups multiplying", asSchema({ type: 'string', pattern: '^((ab){900}){900}$' }), `${SCHEMA}.pattern`],
  ["a tool's parameters", asTool({ type: 'object', properties: { xs: { type: 'array', items: { type: 'integer' }, minItems: M } } }), 'tools[0].function.parameters.properties.xs.minItems'],
  ['legacy json_schema', { prompt: 'JSON:', n_predict: 16, json_schema: { type: 'array', minItems: M } }, 'json_schema.minItems'],
  ['5,000 nested objects', asSchema(JSON.parse('{"type":"object","properties":{"a":'.repeat(5000) + '{}' + '}}'.repeat(5000))), null],
  ['a 200,000-value enum', asSchema({ enum: Array.from({ length: 200_000 }, (_, i) => `v${i}`) }), SCHEMA],
  ['GBNF repetition in the millions', { prompt: 'x', n_predict: 16, grammar: 'root ::= "a"{0,9999999}' }, 'grammar'],
]

// Allowed, near the limits: compiled (off the engine thread) and answered.
const ALLOWED = [
  ['1,000 items', asSchema({ type: 'array', items: { type: 'integer' }, maxItems: 1000 })],
  ['a 10,000-character string', asSchema({ type: 'object', properties: { s: { type: 'string', maxLength: 10_000 } }, required: ['s'] })],
  ['a pattern near its limits', asSchema({ type: 'string', pattern: '^([a-z]{1,20}-){1,900}$' })],
  ['an exponential DFA (a, then 20 of anything)', asSchema({ type: 'string', pattern: '^(a|b)*a(a|b){20}$' })],
  ['1,000 items of 1,000-character strings', asSchema({ type: 'array', items: { type: 'string', maxLength: 1000 }, minItems: 1000 })],
  ['json_object', { messages: user('Answer in JSON.'), n_predict: 16, response_format: { type: 'json_object' } }],
  // llama.cpp expands a group's repetition by reference: 1,000 x 1,000 is
  // 2,000 rule elements, not a million.
  ['GBNF repetitions nested', { prompt: 'x', n_predict: 16, grammar: 'root ::= (("a"{1000}){1000})' }],
]
// Compiles, but a token's mask needs more parser work than llguidance's
// per-token limits allow (500 optional properties: 2,007 items in a row):
// the request ends with INVALID_REQUEST, the batch goes on.
const TOO_COSTLY_PER_TOKEN = asSchema({ type: 'object', properties: Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`p${i}`, { type: 'string' }])) })

let engine
beforeAll(async () => {
  engine = await loadTarget({ parallel: 2 })
  // Warm up: the compiler's vocabulary walk, a first constrained request.
  await engine.complete(asSchema({ type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] }))
})
afterAll(() => engine && engine.dispose())

/** A neighbour that streams while `during` runs; its token count as it goes. */
async function beside(during) {
  const seen = { tokens: 0 }
  const ac = new AbortController()
  const neighbour = engine.complete({ prompt: 'Once upon a time', n_predict: 4000, temperature: 0, ignore_eos: true }, (e) => e.type === 'token' && seen.tokens++, ac.signal)
  while (seen.tokens < 8) await new Promise((r) => setTimeout(r, 5))
  const out = await during(seen)
  ac.abort()
  const result = await neighbour
  return { out, result }
}

// Timing is not asserted (this machine's speed drifts, and a busy one
// stretches any gap): what is asserted is what the engine promises, counted
// in the neighbour's own tokens.
test('counts in the millions in every position are refused at once, naming the place, while a neighbour streams', async () => {
  const rssBefore = process.memoryUsage().rss
  const { out, result } = await beside(async (seen) => {
    const answers = []
    // The list again until the neighbour has streamed 3 tokens while they
    // were refused: refusals that held the engine would starve it.
    const start = seen.tokens
    for (let round = 0; round < 100 && seen.tokens - start < 3; round++) {
      for (const [name, request, field] of REFUSED) {
        const err = await engine.complete(request).then(() => null, (e) => e)
        if (round === 0) answers.push({ name, err, field })
      }
      await new Promise((r) => setImmediate(r))
    }
    return { answers, streamed: seen.tokens - start }
  })
  for (const { name, err, field } of out.answers) {
    expect({ name, code: err && err.code }).toEqual({ name, code: 'INVALID_REQUEST' })
    if (field) expect({ name, field: err.field }).toEqual({ name, field })
    expect(err.message).toMatch(/at most|nested|bytes|limit|copies|serialised|not allowed/)
  }
  // The neighbour streamed on, and was still streaming when they were all
  // refused (its 4,000 tokens are far from done: it was aborted).
  expect(out.streamed).toBeGreaterThanOrEqual(3)
  expect(result.stopped_abort).toBe(true)
  // Nothing was built, so nothing stays.
  global.gc && global.gc()
  expect(process.memoryUsage().rss - rssBefore).toBeLessThan(100 * 2 ** 20)
})

test('schemas near the limits compile off the engine thread and answer; memory comes back', async () => {
  const rssBefore = process.memoryUsage().rss
  const { out, result } = await beside(async () => {
    const answers = []
    for (const [name, request] of [...ALLOWED, ['too costly per token', TOO_COSTLY_PER_TOKEN]]) {
      const r = await engine.complete(request).then((r) => ({ r }), (err) => ({ err }))
      answers.push({ name, ...r })
    }
    return answers
  })
  for (const { name, r, err } of out.filter((a) => a.name !== 'too costly per token')) {
    expect({ name, err: err ? err.message : null, stop: r && r.stop }).toEqual({ name, err: null, stop: true })
  }
  const costly = out.find((a) => a.name === 'too costly per token')
  expect(costly.err.code).toBe('INVALID_REQUEST')
  expect(costly.err.field).toBe('response_format')
  expect(costly.err.message).toMatch(/more work per token than the engine allows/)
  expect(result.stopped_abort).toBe(true)
  expect(process.memoryUsage().rss - rssBefore).toBeLessThan(100 * 2 ** 20)
})

// A compile that takes seconds whatever the machine (the fault injection
// holds this schema's compile 3 s; it is read from the environment of the
// process, so the engine runs in a child that has it): the neighbour
// streams through it. Compiled on the engine thread, it would get at most
// the step it was in and the one that admits the request (2 tokens).
test('the engine thread goes on stepping while a constraint compiles', () => {
  const script = `
    const { LlamaEngine } = require(${JSON.stringify(path.join(__dirname, '..'))})
    ;(async () => {
      const engine = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 2048, threads: 2, parallel: 2 })
      let neighbour = 0
      const ac = new AbortController()
      const streaming = engine.complete({ prompt: 'Once upon a time', n_predict: 4000, temperature: 0, ignore_eos: true }, (e) => e.type === 'token' && neighbour++, ac.signal)
      while (neighbour < 8) await new Promise((r) => setTimeout(r, 5))
      const start = neighbour
      let beforeFirst = null
      const schema = { title: '__llama_engine_slow_compile__', type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] }
      const r = await engine.complete({ messages: [{ role: 'user', content: 'Answer in JSON.' }], n_predict: 8, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }, (e) => {
        if (e.type === 'token' && beforeFirst === null) beforeFirst = neighbour - start
      })
      ac.abort()
      await streaming
      await engine.dispose()
      console.log(JSON.stringify({ beforeFirst, content: r.content }))
    })().catch((e) => { console.error(e); process.exit(1) })
  `
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { env: { ...process.env, LLAMA_ENGINE_FAULT_INJECTION: '1' }, timeout: 300_000 }).toString())
  expect(out.content.startsWith('{')).toBe(true)
  expect(out.beforeFirst).toBeGreaterThan(2)
})

test('a request aborted while its constraint compiles resolves as aborted; the next one with that schema is served', async () => {
  const schema = { type: 'object', properties: Object.fromEntries(Array.from({ length: 300 }, (_, i) => [`p${i}`, { type: 'string', maxLength: 8 }])) }
  const ac = new AbortController()
  const pending = engine.complete(asSchema(schema), undefined, ac.signal)
  ac.abort()
  const r = await pending
  expect(r.stopped_abort).toBe(true)
  const again = await engine.complete(asSchema(schema))
  expect(again.stop).toBe(true)
  expect(again.content.startsWith('{')).toBe(true)
})
