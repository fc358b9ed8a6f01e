// Resumable streams (llama-server's X-Conversation-Id, GET/DELETE /v1/stream,
// POST /v1/streams/lookup): a generation that outlives its client and is
// replayed, stopped on request, and answered "retry later" while its model
// loads — against a real engine.

const http = require('node:http')
const { LlamaEngine, TARGET } = require('./helpers')
const { listen, close } = require('./server-helpers')
const { createServer } = require('../server')
const { createCore } = require('../server/handler.js')
const { nodeExchange } = require('../server/http.js')

const ENGINE = { contextSize: 1024, parallel: 2, threads: 2 }

/** The data events of an SSE text. */
const events = (text) =>
  text
    .split('\n\n')
    .filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)))

describe('resumable streams over one engine', () => {
  let server
  let base
  beforeAll(async () => {
    server = createServer({ engine: await LlamaEngine.load({ modelPath: TARGET, ...ENGINE }), signals: false })
    base = await listen(server)
  })
  afterAll(async () => {
    await close(server)
    await server.shutdown({ dispose: true })
  })

  const post = (body, headers = {}, signal) =>
    fetch(`${base}/completion`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal })
  const resume = (id, from = 0) => fetch(`${base}/v1/stream?conv_id=${encodeURIComponent(id)}&from=${from}`)
  const lookup = async (ids) => (await fetch(`${base}/v1/streams/lookup`, { method: 'POST', body: JSON.stringify({ conversation_ids: ids }) })).json()
  const settled = async (id) => {
    for (const deadline = Date.now() + 120_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 50))) {
      const [s] = await lookup([id])
      if (s?.is_done) return s
    }
    throw new Error(`${id} never ended`)
  }

  test('the client leaves after the first event: the generation goes on, and a resume replays all of it, from any offset', async () => {
    const body = { prompt: 'Once upon a time', n_predict: 24, temperature: 0, ignore_eos: true, stream: true }
    const whole = await (await post(body)).text()
    const id = 'conv-1::SmolLM2/with/slashes'
    const ac = new AbortController()
    const res = await post(body, { 'X-Conversation-Id': id }, ac.signal)
    const reader = res.body.getReader()
    await reader.read()
    ac.abort()
    const s = await settled(id)
    const replay = await resume(id)
    expect(replay.status).toBe(200)
    expect(replay.headers.get('content-type')).toMatch(/^text\/event-stream/)
    const text = await replay.text()
    expect(Buffer.byteLength(text)).toBe(s.total_bytes)
    // What the client missed is all there: the same content, the same tokens.
    const mine = events(text)
    expect(mine.map((e) => e.content).join('')).toBe(events(whole).map((e) => e.content).join(''))
    expect(mine.at(-1)).toMatchObject({ stop: true, stop_type: 'limit' })
    // From an offset: the bytes after it.
    const from = Buffer.byteLength(text.slice(0, text.indexOf('\n\n') + 2))
    expect(await (await resume(id, from)).text()).toBe(text.slice(text.indexOf('\n\n') + 2))
    // The lookup answers for the id asked and for "id::model" ones, never others.
    expect((await lookup(['conv-1'])).map((x) => x.conversation_id)).toEqual([id])
    expect(await lookup(['conv-2'])).toEqual([])
    expect(s).toMatchObject({ conversation_id: id, is_done: true })
    expect(s.completed_at).toBeGreaterThanOrEqual(s.started_at)
    // A stop forgets it (and says 204 again for one gone).
    expect((await fetch(`${base}/v1/stream?conv_id=${encodeURIComponent(id)}`, { method: 'DELETE' })).status).toBe(204)
    expect((await resume(id)).status).toBe(404)
    expect((await fetch(`${base}/v1/stream?conv_id=${encodeURIComponent(id)}`, { method: 'DELETE' })).status).toBe(204)
  })

  test('a resume while the generation runs follows it live to its end', async () => {
    const id = 'conv-live'
    const res = await post({ prompt: 'The river', n_predict: 40, temperature: 0, ignore_eos: true, stream: true }, { 'X-Conversation-Id': id })
    const reader = res.body.getReader()
    await reader.read()
    const [own, replayed] = await Promise.all([
      (async () => {
        let text = ''
        const dec = new TextDecoder()
        for (let r = await reader.read(); !r.done; r = await reader.read()) text += dec.decode(r.value, { stream: true })
        return text
      })(),
      resume(id).then((r) => r.text()),
    ])
    const all = events(replayed)
    expect(all.at(-1)).toMatchObject({ stop: true })
    // The replay has every event the client had after the first (and the first).
    expect(replayed.endsWith(own)).toBe(true)
  })

  test('a stop (DELETE) ends a generation whose client is gone; the session is forgotten', async () => {
    const predicted = async () => Number(/^llamacpp:tokens_predicted_total (\d+)/m.exec(await (await fetch(`${base}/metrics`)).text())[1])
    const idle = async () => (await (await fetch(`${base}/slots`)).json()).every((s) => !s.is_processing)
    const before = await predicted()
    const id = 'conv-stop'
    const ac = new AbortController()
    const res = await post({ prompt: 'Count to a thousand:', n_predict: 2000, temperature: 0, ignore_eos: true, stream: true }, { 'X-Conversation-Id': id }, ac.signal)
    await res.body.getReader().read()
    ac.abort()
    expect((await lookup([id]))[0].is_done).toBe(false)
    expect((await fetch(`${base}/v1/stream?conv_id=${id}`, { method: 'DELETE' })).status).toBe(204)
    expect((await resume(id)).status).toBe(404)
    while (!(await idle())) await new Promise((r) => setTimeout(r, 50))
    // Stopped: far fewer than the 2000 tokens it asked for were generated.
    expect((await predicted()) - before).toBeLessThan(2000)
  })

  test('an answer that is no stream, or an error before one, leaves no session; a new request under an id replaces the old one', async () => {
    expect((await post({ prompt: 'Hi', n_predict: 2 }, { 'X-Conversation-Id': 'plain' })).status).toBe(200)
    expect((await resume('plain')).status).toBe(404)
    const bad = await post({ prompt: 'Hi', n_predict: 'two', stream: true }, { 'X-Conversation-Id': 'bad' })
    expect(bad.status).toBe(400)
    expect((await resume('bad')).status).toBe(404)
    expect((await fetch(`${base}/v1/stream`)).status).toBe(400)
    expect((await fetch(`${base}/v1/stream?conv_id=x&from=-1`)).status).toBe(404)
    await (await post({ prompt: 'A', n_predict: 2, stream: true }, { 'X-Conversation-Id': 'twice' })).text()
    await (await post({ prompt: 'B', n_predict: 3, stream: true }, { 'X-Conversation-Id': 'twice' })).text()
    const list = await lookup(['twice'])
    expect(list).toHaveLength(1)
    expect(events(await (await resume('twice')).text()).at(-1).tokens_predicted).toBe(3)
    expect((await resume('twice', 1e9)).status).toBe(200)
  })
})

test('with many models: a resume while the model loads is "retry later" (503); a stop then cancels the waiting request (400)', async () => {
  // A router whose load waits for the test to let it go: the window is the test's, not the machine's.
  let release
  const gate = new Promise((r) => (release = r))
  const core = createCore(null, {
    router: {
      models: [{ name: 'org/model:Q8_0', uri: TARGET }],
      modelsMax: 1,
      memoryMax: Infinity,
      idleUnloadMs: 0,
      autoload: true,
      load: async () => {
        await gate
        return LlamaEngine.load({ modelPath: TARGET, ...ENGINE })
      },
      estimate: async () => 0,
    },
  })
  const server = http.createServer((req, res) => core.handle(nodeExchange(req, res, core.limits)))
  const base = await listen(server)
  try {
    const id = 'conv::org/model:Q8_0'
    const qs = `conv_id=${encodeURIComponent(id)}`
    const body = { model: 'org/model:Q8_0', stream: true, max_tokens: 8, messages: [{ role: 'user', content: 'hello' }] }
    const answer = fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'X-Conversation-Id': id }, body: JSON.stringify(body) })
    let status
    for (const deadline = Date.now() + 10_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 10))) {
      status = (await fetch(`${base}/v1/stream?${qs}&from=0`)).status
      if (status === 503) break
    }
    expect(status).toBe(503)
    expect((await fetch(`${base}/v1/stream?${qs}`, { method: 'DELETE' })).status).toBe(204)
    const res = await answer
    expect(res.status).toBe(400)
    expect(JSON.stringify(await res.json())).toMatch(/cancelled/)
    expect((await fetch(`${base}/v1/stream?${qs}&from=0`)).status).toBe(404)

    // Again, the client gone while the model loads: the answer is there to resume once it loaded.
    const ac = new AbortController()
    const gone = fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'X-Conversation-Id': id }, body: JSON.stringify(body), signal: ac.signal }).catch(() => null)
    for (let s = 0; s !== 503; await new Promise((r) => setTimeout(r, 10))) s = (await fetch(`${base}/v1/stream?${qs}&from=0`)).status
    ac.abort()
    await gone
    release()
    let replay
    for (const deadline = Date.now() + 120_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 50))) {
      const r = await fetch(`${base}/v1/stream?${qs}&from=0`)
      const text = await r.text()
      if (r.status === 200 && text.includes('[DONE]')) {
        replay = text
        break
      }
    }
    expect(replay).toMatch(/"role":"assistant"/)
    expect(replay).toMatch(/"finish_reason":"(length|stop)"/)
  } finally {
    await core.close({ graceMs: 0 })
    await close(server)
  }
})
