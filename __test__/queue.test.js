const { user, run, loadTarget } = require('./helpers')

// One request at a time (parallel: 1): the FIFO queue of before parallel
// decoding, which several requests at once (parallel.test.js) extends.
let engine
beforeAll(async () => {
  engine = await loadTarget({ parallel: 1 })
  expect(engine.status()).toMatchObject({ parallel: 1, active: 0 })
})
afterAll(() => engine.dispose())

const joined = (events) => events.filter((e) => e.type === 'token').map((e) => e.content).join('')

describe('queue', () => {
  test('three concurrent requests run one at a time in FIFO order', async () => {
    const log = []
    const prompts = ['Apples are', 'The moon is', 'Rivers flow']
    expect(engine.status().queued).toBe(0)
    const all = prompts.map((prompt, i) =>
      engine.complete({ prompt, n_predict: 12, temperature: 0 }, (e) => log.push([i, e.type])),
    )
    // All three were accepted at once: one runs (or is about to), the others wait.
    expect(engine.status().queued + (engine.status().busy ? 1 : 0)).toBeGreaterThanOrEqual(2)
    const results = await Promise.all(all)
    const order = log.map(([i]) => i)
    // Never interleaved: all events of request 0, then 1, then 2.
    expect(order).toEqual([...order].sort((a, b) => a - b))
    expect([...new Set(order)]).toEqual([0, 1, 2])
    results.forEach((r) => expect(r.tokens_predicted).toBe(12))
    expect(engine.status()).toMatchObject({ queued: 0, busy: false })
  })

  test('status().queued counts waiting requests', async () => {
    const first = engine.complete({ prompt: 'Long story:', n_predict: 64, temperature: 0 })
    const second = engine.complete({ prompt: 'x', n_predict: 2 })
    const third = engine.complete({ prompt: 'y', n_predict: 2 })
    await new Promise((r) => setTimeout(r, 20))
    expect(engine.status().queued).toBe(2)
    expect(engine.status().busy).toBe(true)
    await Promise.all([first, second, third])
    expect(engine.status().queued).toBe(0)
  })
})

describe('status() after a request', () => {
  test('as its promise settles, status() already shows what the request left (its slot, its cached tokens)', async () => {
    // A one-token request starts and ends within one engine step; status()
    // once reported the step before it (a prompt-cache hit missing, the
    // slot's previous prompt) when the host read it at once.
    for (let i = 1; i <= 24; i++) {
      const r = await engine.complete({ prompt: `Item ${i}: ${'a b c '.repeat(i)}`, n_predict: 1, temperature: 0, speculative: { mode: 'off' } })
      const st = engine.status()
      expect(st.slots[0]).toMatchObject({ busy: false, cachedTokens: r.tokens_evaluated })
      expect(st.tokensCached).toBe(r.tokens_evaluated)
    }
  })
})

describe('abort and cancel', () => {
  test('AbortSignal mid-generation stops within one step and keeps the text so far', async () => {
    const ac = new AbortController()
    const events = []
    const result = await engine.complete(
      { messages: user('Write a long story about a dragon.'), n_predict: 500, temperature: 0, ignore_eos: true },
      (e) => {
        events.push(e)
        if (events.length === 5) ac.abort()
      },
      ac.signal,
    )
    expect(result.stopped_abort).toBe(true)
    expect(result.stopped_limit).toBe(false)
    expect(result.tokens_predicted).toBeGreaterThanOrEqual(5)
    // Abort lands within one step; events already in flight are still delivered.
    expect(result.tokens_predicted).toBeLessThan(40)
    expect(result.content.length).toBeGreaterThan(0)
    expect(joined(events)).toBe(result.content)
    expect(events[events.length - 1].type).toBe('done')
  })

  test('cancel() stops the running request, which resolves with its partial result', async () => {
    let n = 0
    const p = engine.complete({ prompt: 'Once upon a time', n_predict: 500, temperature: 0, ignore_eos: true }, () => {
      if (++n === 3) engine.cancel()
    })
    const r = await p
    expect(r.stopped_abort).toBe(true)
    expect(r.tokens_predicted).toBeLessThan(500)
    engine.cancel() // nothing running: no-op
  })

  test('an already-aborted signal resolves at once with empty content', async () => {
    const ac = new AbortController()
    ac.abort()
    const events = []
    const r = await engine.complete({ prompt: 'Hello', n_predict: 50 }, (e) => events.push(e), ac.signal)
    expect(r).toMatchObject({ content: '', stopped_abort: true, tokens_predicted: 0 })
    expect(events.map((e) => e.type)).toEqual(['done'])
  })

  test('a queued request whose signal aborts leaves the queue at once', async () => {
    const running = engine.complete({ prompt: 'Tell me everything about the sea.', n_predict: 200, temperature: 0, ignore_eos: true })
    const ac = new AbortController()
    const queued = engine.complete({ prompt: 'Hi', n_predict: 5 }, null, ac.signal)
    await new Promise((r) => setTimeout(r, 20))
    expect(engine.status().queued).toBe(1)
    ac.abort()
    const q = await queued
    expect(q).toMatchObject({ stopped_abort: true, content: '', tokens_predicted: 0 })
    expect(engine.status().queued).toBe(0)
    // The running one was not affected.
    expect(engine.status().busy).toBe(true)
    const r = await running
    expect(r.stopped_abort).toBe(false)
    expect(r.tokens_predicted).toBe(200)
  })
})

describe('stream()', () => {
  test('yields the same events as complete(), ending with done', async () => {
    // Without drafts, one token an event: the same steps both times (what a
    // drafter learnt from the first run would change how the second's
    // tokens are grouped, not the tokens).
    const req = { messages: user('Name two animals.'), n_predict: 16, temperature: 0, speculative: { mode: 'off' } }
    const viaCallback = await run(engine, req)
    const events = []
    for await (const e of engine.stream(req)) events.push(e)
    expect(events.map((e) => e.type)).toEqual(viaCallback.events.map((e) => e.type))
    expect(joined(events)).toBe(viaCallback.result.content)
    expect(events[events.length - 1].type).toBe('done')
  })

  test('breaking out of the loop aborts the request', async () => {
    let n = 0
    for await (const e of engine.stream({ prompt: 'Count: 1, 2,', n_predict: 300, temperature: 0, ignore_eos: true })) {
      if (e.type === 'token' && ++n === 3) break
    }
    expect(engine.status().busy).toBe(false)
    const { result } = await run(engine, { prompt: 'Hi', n_predict: 2, temperature: 0 })
    expect(result.tokens_predicted).toBe(2)
  })

  test('an abort signal ends the iteration', async () => {
    const ac = new AbortController()
    const events = []
    for await (const e of engine.stream({ prompt: 'Count: 1, 2,', n_predict: 300, temperature: 0, ignore_eos: true }, ac.signal)) {
      events.push(e)
      if (events.length === 4) ac.abort()
    }
    const done = events[events.length - 1]
    expect(done.type).toBe('done')
    expect(done.stopped_abort).toBe(true)
  })

  test('errors surface from the iterator', async () => {
    const it = engine.stream({ prompt: 'x', temperature: 'hot' })
    await expect(it.next()).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('temperature') })
  })
})
