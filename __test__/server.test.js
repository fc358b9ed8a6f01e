const { user, loadTarget } = require('./helpers')
const { importServer, listen, close, until } = require('./server-helpers')

const post = (base, route, body) =>
  fetch(base + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })

/** The JSON payloads of an SSE body's `data:` lines. */
function sseData(text) {
  return text
    .split('\n')
    .filter((line) => line.startsWith('data: '))
    .map((line) => JSON.parse(line.slice('data: '.length)))
}

let createServer
let engine
let server
let base
beforeAll(async () => {
  ;({ createServer } = await importServer())
  engine = await loadTarget({ contextSize: 1024 })
  server = createServer({ engine })
  base = await listen(server)
})
afterAll(async () => {
  if (server) await close(server)
  if (engine) await engine.dispose()
})

describe('llama-engine/server: the llama.cpp endpoints', () => {
  test('GET /health is ok', async () => {
    const res = await fetch(`${base}/health`)
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ status: 'ok' })
  })

  test('/health is 503 loading while the engine promise is pending', async () => {
    const loading = createServer({ engine: new Promise(() => {}) })
    const url = await listen(loading)
    try {
      const health = await fetch(`${url}/health`)
      expect(health.status).toBe(503)
      expect(await health.json()).toEqual({ status: 'loading' })
      const completion = await post(url, '/completion', { prompt: 'x' })
      expect(completion.status).toBe(503)
    } finally {
      await close(loading)
    }
  })

  test('/tokenize and /detokenize round trip', async () => {
    const content = 'Hello world, this is a round trip.'
    const tok = await post(base, '/tokenize', { content })
    expect(tok.status).toBe(200)
    const { tokens } = await tok.json()
    expect(tokens).toEqual(engine.tokenize(content))
    expect(tokens.every(Number.isInteger)).toBe(true)

    const withPieces = await (await post(base, '/tokenize', { content, with_pieces: true })).json()
    expect(withPieces.tokens.map((t) => t.id)).toEqual(tokens)
    expect(withPieces.tokens.map((t) => t.piece).join('')).toBe(content)

    const detok = await post(base, '/detokenize', { tokens })
    expect(detok.status).toBe(200)
    expect(await detok.json()).toEqual({ content })
  })

  test('POST /completion returns the result', async () => {
    const request = { prompt: 'The capital of France is', n_predict: 12, temperature: 0 }
    const res = await post(base, '/completion', request)
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toMatch(/application\/json/)
    const result = await res.json()
    expect(result).toMatchObject({
      stop: true,
      tokens_predicted: 12,
      stopped_limit: true,
      stopped_abort: false,
      model: 'SmolLM2-135M-Instruct.Q4_1.gguf',
    })
    expect(typeof result.content).toBe('string')
    expect(result.timings.predicted_n).toBe(12)
    expect(result.speculative).toHaveProperty('target_passes')
    expect(result.generation_settings.n_predict).toBe(12)
    // Greedy: the same text as the engine gives directly.
    expect(result.content).toBe((await engine.complete(request)).content)
  })

  test('stream: true sends server-sent events ending with the result (its text already streamed: content "")', async () => {
    const res = await post(base, '/completion', { messages: user('Name three fruits.'), n_predict: 24, temperature: 0, stream: true })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/)
    const events = sseData(await res.text())
    expect(events.length).toBeGreaterThan(1)
    const last = events.pop()
    expect(last.stop).toBe(true)
    expect(last.tokens_predicted).toBeGreaterThan(0)
    expect(last.content).toBe('')
    for (const e of events) {
      expect(e.stop).toBe(false)
      expect(typeof e.content).toBe('string')
      expect(e.tokens.every(Number.isInteger)).toBe(true)
      expect(e.token_details.map((t) => t.id)).toEqual(e.tokens)
    }
    const whole = await (await post(base, '/completion', { messages: user('Name three fruits.'), n_predict: 24, temperature: 0 })).json()
    expect(events.map((e) => e.content).join('')).toBe(whole.content)
  })

  test('bad JSON is 400 INVALID_REQUEST', async () => {
    const res = await post(base, '/completion', '{"prompt": "x",')
    expect(res.status).toBe(400)
    expect((await res.json()).error.code).toBe('INVALID_REQUEST')
  })

  test('an invalid field is 400 naming the field, streaming or not', async () => {
    for (const stream of [false, true]) {
      const res = await post(base, '/completion', { prompt: 'x', top_p: 5, stream })
      expect(res.status).toBe(400)
      const { error } = await res.json()
      expect(error.code).toBe('INVALID_REQUEST')
      expect(error.message).toMatch(/^top_p/)
    }
  })

  test('an unknown endpoint is 404', async () => {
    const res = await fetch(`${base}/nope`)
    expect(res.status).toBe(404)
    expect((await res.json()).error.code).toBe('NOT_FOUND')
  })

  test('a client disconnecting mid-stream aborts its generation', async () => {
    const spy = jest.spyOn(engine, 'complete')
    try {
      const ac = new AbortController()
      const res = await fetch(`${base}/completion`, {
        method: 'POST',
        body: JSON.stringify({ messages: user('Write a very long story about a dragon.'), n_predict: 2000, ignore_eos: true, temperature: 0, stream: true }),
        signal: ac.signal,
      })
      expect(res.status).toBe(200)
      const reader = res.body.getReader()
      const first = await reader.read()
      expect(first.done).toBe(false)
      expect(engine.status().busy).toBe(true)
      ac.abort()
      await reader.read().catch(() => {})

      // Free again within a few seconds — 2000 tokens would take far longer.
      expect(await until(() => !engine.status().busy, 5000)).toBe(true)
      expect(spy).toHaveBeenCalledTimes(1)
      const aborted = await spy.mock.results[0].value
      expect(aborted.stopped_abort).toBe(true)
      expect(aborted.tokens_predicted).toBeLessThan(2000)
    } finally {
      spy.mockRestore()
    }

    const next = await post(base, '/completion', { prompt: 'Hi', n_predict: 4, temperature: 0 })
    expect(next.status).toBe(200)
    expect((await next.json()).tokens_predicted).toBe(4)
  })
})
