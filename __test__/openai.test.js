// llama-engine/server speaks the OpenAI API: driven here by the official
// `openai` npm client, as a user's code would.
const OpenAI = require('openai')
const { user, loadTarget } = require('./helpers')
const { importServer, listen, close, until } = require('./server-helpers')

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'

let createServer
let engine
let server
let client
beforeAll(async () => {
  ;({ createServer } = await importServer())
  engine = await loadTarget({ contextSize: 2048 })
  server = createServer({ engine })
  client = new OpenAI({ baseURL: `${await listen(server)}/v1`, apiKey: 'unused', maxRetries: 0 })
})
afterAll(async () => {
  if (server) await close(server)
  if (engine) await engine.dispose()
})

const messages = user('Name three fruits, comma separated.')

describe('OpenAI API with the official client', () => {
  test('models.list names the loaded model', async () => {
    const page = await client.models.list()
    expect(page.data).toEqual([expect.objectContaining({ id: MODEL, object: 'model', owned_by: 'llama-engine' })])
  })

  test('chat.completions.create gives the text of engine.complete({ messages }) and usage', async () => {
    const res = await client.chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 48 })
    const direct = await engine.complete({ messages, temperature: 0, n_predict: 48 })
    expect(res.object).toBe('chat.completion')
    expect(res.id).toMatch(/^chatcmpl-/)
    expect(res.model).toBe(MODEL)
    expect(res.choices).toHaveLength(1)
    expect(res.choices[0].message).toEqual({ role: 'assistant', content: direct.content })
    expect(res.choices[0].finish_reason).toBe(direct.stopped_limit ? 'length' : 'stop')
    expect(res.usage).toEqual({
      prompt_tokens: direct.tokens_evaluated,
      completion_tokens: direct.tokens_predicted,
      total_tokens: direct.tokens_evaluated + direct.tokens_predicted,
      prompt_tokens_details: { cached_tokens: expect.any(Number) },
    })
    // The same prompt again: all of it but its last token comes from the cache.
    const again = await client.chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 4 })
    expect(again.usage.prompt_tokens_details.cached_tokens).toBe(again.usage.prompt_tokens - 1)
    const cut = await client.chat.completions.create({ model: MODEL, messages, temperature: 0, max_completion_tokens: 3 })
    expect(cut.choices[0].finish_reason).toBe('length')
    expect(cut.usage.completion_tokens).toBe(3)
  })

  test('streamed: role in the first delta, deltas add up to the text, finish_reason last, then a usage chunk', async () => {
    const full = await client.chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 48 })
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages,
      temperature: 0,
      max_tokens: 48,
      stream: true,
      stream_options: { include_usage: true },
    })
    const chunks = []
    for await (const chunk of stream) chunks.push(chunk)
    expect(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id)).toBe(true)
    expect(chunks[0].choices[0].delta.role).toBe('assistant')
    const usage = chunks.pop()
    expect(usage.choices).toEqual([])
    const { prompt_tokens_details: cached, ...counts } = usage.usage
    const { prompt_tokens_details: _, ...fullCounts } = full.usage
    expect(counts).toEqual(fullCounts)
    expect(cached.cached_tokens).toBe(counts.prompt_tokens - 1)
    const last = chunks.pop()
    expect(last.choices[0].finish_reason).toBe(full.choices[0].finish_reason)
    expect(chunks.every((c) => c.choices[0].finish_reason === null)).toBe(true)
    expect(chunks.map((c) => c.choices[0].delta.content ?? '').join('')).toBe(full.choices[0].message.content)
  })

  test("the client's stream helper assembles the same completion", async () => {
    const full = await client.chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 48 })
    const runner = client.chat.completions.stream({ model: MODEL, messages, temperature: 0, max_tokens: 48 })
    let deltas = ''
    runner.on('content', (delta) => (deltas += delta))
    const final = await runner.finalChatCompletion()
    expect(final.choices[0].message.content).toBe(full.choices[0].message.content)
    expect(deltas).toBe(full.choices[0].message.content)
    expect(final.choices[0].finish_reason).toBe(full.choices[0].finish_reason)
  })

  test('completions.create (plain prompt), streamed and not', async () => {
    const prompt = 'The capital of France is'
    const res = await client.completions.create({ model: MODEL, prompt, temperature: 0, max_tokens: 8 })
    const direct = await engine.complete({ prompt, temperature: 0, n_predict: 8 })
    expect(res.object).toBe('text_completion')
    expect(res.choices[0].text).toBe(direct.content)
    expect(res.choices[0].finish_reason).toBe('length')
    expect(res.usage.completion_tokens).toBe(8)
    const stream = await client.completions.create({ model: MODEL, prompt, temperature: 0, max_tokens: 8, stream: true })
    let text = ''
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? ''
    expect(text).toBe(direct.content)
  })

  test('request fields map: stop, seed, logit_bias, response_format json_schema', async () => {
    const free = { model: MODEL, messages: user('Write a sentence about the sea.'), max_tokens: 24 }
    const a = await client.chat.completions.create({ ...free, temperature: 1, seed: 5 })
    const b = await client.chat.completions.create({ ...free, temperature: 1, seed: 5 })
    expect(a.choices[0].message.content).toBe(b.choices[0].message.content)
    const greedy = await client.chat.completions.create({ ...free, temperature: 0 })
    const word = greedy.choices[0].message.content.split(' ')[2]
    const stopped = await client.chat.completions.create({ ...free, temperature: 0, stop: word })
    expect(stopped.choices[0].message.content).not.toContain(word)
    expect(stopped.choices[0].finish_reason).toBe('stop')
    const banned = engine.tokenize(greedy.choices[0].message.content)[0]
    const biased = await client.chat.completions.create({ ...free, temperature: 0, logit_bias: { [banned]: -100 } })
    expect(engine.tokenize(biased.choices[0].message.content)[0]).not.toBe(banned)
    const schema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }
    const json = await client.chat.completions.create({
      model: MODEL,
      messages: user('Name a city as JSON.'),
      temperature: 0,
      max_tokens: 64,
      response_format: { type: 'json_schema', json_schema: { name: 'city', schema } },
    })
    expect(typeof JSON.parse(json.choices[0].message.content).city).toBe('string')
  })

  test("a client's mistake is a 400 naming the field, not retried", async () => {
    for (const [body, param] of [
      [{ model: MODEL, messages, n: 0 }, 'n'],
      [{ model: MODEL, messages: [{ role: 'user', content: 5 }] }, 'messages[0].content'],
      [{ model: MODEL, messages, top_p: 7 }, 'top_p'],
      [{ model: MODEL, messages, response_format: { type: 'xml' } }, 'response_format.type'],
    ]) {
      const err = await client.chat.completions.create(body).catch((e) => e)
      expect(err).toBeInstanceOf(OpenAI.BadRequestError)
      expect({ param, status: err.status, got: err.param }).toEqual({ param, status: 400, got: param })
      expect(err.error.type).toBe('invalid_request_error')
      expect(err.code).toBe('INVALID_REQUEST')
      expect(err.headers.get('x-should-retry')).toBe('false')
    }
    const raw = await fetch(client.baseURL + '/chat/completions', { method: 'POST', body: '{"messages": [' })
    expect(raw.status).toBe(400)
    expect((await raw.json()).error).toMatchObject({ type: 'invalid_request_error', code: 'INVALID_REQUEST' })
  })

  test('--api-key: a request without the key gets 401, with it works', async () => {
    const guarded = createServer({ engine, apiKey: 'sesame' })
    const base = `${await listen(guarded)}/v1`
    try {
      const wrong = new OpenAI({ baseURL: base, apiKey: 'nope', maxRetries: 0 })
      const err = await wrong.models.list().catch((e) => e)
      expect(err).toBeInstanceOf(OpenAI.AuthenticationError)
      expect(err.status).toBe(401)
      const none = await fetch(`${base}/chat/completions`, { method: 'POST', body: JSON.stringify({ messages }) })
      expect(none.status).toBe(401)
      expect(none.headers.get('x-should-retry')).toBe('false')
      const right = new OpenAI({ baseURL: base, apiKey: 'sesame', maxRetries: 0 })
      const res = await right.chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 4 })
      expect(res.usage.completion_tokens).toBe(4)
    } finally {
      await close(guarded)
    }
  })

  test('a client aborting mid-stream stops its generation; the server keeps serving', async () => {
    const spy = jest.spyOn(engine, 'complete')
    try {
      const ac = new AbortController()
      const stream = await client.chat.completions.create(
        { model: MODEL, messages: user('Write a very long story about a dragon.'), max_tokens: 2000, temperature: 0, stream: true, ignore_eos: true },
        { signal: ac.signal },
      )
      let seen = 0
      // The client ends the iteration quietly (or with an AbortError) once aborted.
      await (async () => {
        for await (const _chunk of stream) {
          if (++seen === 3) ac.abort()
        }
      })().catch((e) => expect(e.name).toMatch(/Abort/))
      expect(seen).toBeGreaterThanOrEqual(3)
      expect(await until(() => !engine.status().busy, 5000)).toBe(true)
      const aborted = await spy.mock.results[0].value
      expect(aborted.stopped_abort).toBe(true)
      expect(aborted.tokens_predicted).toBeLessThan(2000)
    } finally {
      spy.mockRestore()
    }
    const next = await client.chat.completions.create({ model: MODEL, messages, temperature: 0, max_tokens: 4 })
    expect(next.usage.completion_tokens).toBe(4)
  })
})
