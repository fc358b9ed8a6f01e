const { user, run, loadTarget } = require('./helpers')

let engine
beforeAll(async () => {
  engine = await loadTarget()
})
afterAll(() => engine.dispose())

const joined = (events) => events.filter((e) => e.type === 'token').map((e) => e.content).join('')

describe('events', () => {
  test('one event per step, in order; the promise resolves after the last (done) event', async () => {
    const order = []
    const p = engine.complete({ messages: user('Name three colors.'), n_predict: 24, temperature: 0, speculative: { mode: 'off' } }, (e) => order.push(e))
    const result = await p
    order.push('resolved')
    expect(order[order.length - 1]).toBe('resolved')
    const done = order[order.length - 2]
    expect(done.type).toBe('done')
    expect(order.slice(0, -2).every((e) => e.type === 'token')).toBe(true)
    const { type, ...fromEvent } = done
    expect(fromEvent).toEqual(result)
    expect(joined(order.slice(0, -1))).toBe(result.content)
    const steps = order.filter((e) => e.type === 'token' && e.tokens.length > 0)
    expect(steps.length).toBe(result.tokens_predicted)
    for (const e of steps) {
      expect(e.tokens).toHaveLength(1)
      expect(e.tokens[0]).toMatchObject({ source: 'target' })
      expect(e).toMatchObject({ n_drafted: 0, n_accepted: 0 })
    }
  })

  test('the result carries the legacy final-response fields', async () => {
    const { result } = await run(engine, { prompt: 'The capital of France is', n_predict: 8, temperature: 0, speculative: { mode: 'off' } })
    expect(result).toMatchObject({
      stop: true,
      model: 'SmolLM2-135M-Instruct.Q4_1.gguf',
      tokens_predicted: 8,
      stopped_limit: true,
      stopped_eos: false,
      stopped_word: false,
      stopped_abort: false,
      stopping_word: '',
      truncated: false,
    })
    expect(result.tokens_evaluated).toBe(engine.tokenize('The capital of France is').length)
    expect(result.generation_settings).toMatchObject({ n_predict: 8, temperature: 0, n_ctx: 2048 })
    const t = result.timings
    expect(t.predicted_n).toBe(8)
    expect(t.predicted_ms).toBeGreaterThan(0)
    expect(t.predicted_per_second).toBeCloseTo((8 * 1000) / t.predicted_ms, 5)
    expect(t.prompt_ms).toBeGreaterThan(0)
    expect(result.speculative).toMatchObject({ n_drafted: 0, n_accepted: 0, acceptance_rate: 0 })
  })

  test('greedy output is deterministic; seeded sampling is reproducible', async () => {
    const req = { messages: user('Tell me a fact about cats.'), n_predict: 20, temperature: 0 }
    const a = await run(engine, req)
    const b = await run(engine, { ...req, cache_prompt: false })
    expect(a.result.content).toBe(b.result.content)
    const s = { messages: user('Write a word.'), n_predict: 16, temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, seed: 1234 }
    const c = await run(engine, s)
    const d = await run(engine, s)
    expect(c.result.content).toBe(d.result.content)
    const seeds = new Set()
    for (const seed of [1, 2, 3, 4, 5]) seeds.add((await run(engine, { ...s, seed })).result.content)
    expect(seeds.size).toBeGreaterThan(1)
  })

  test('ends with stopped_eos when the model ends its turn', async () => {
    const { result } = await run(engine, { messages: user('Say only the word yes.'), n_predict: 200, temperature: 0 })
    expect(result.stopped_eos).toBe(true)
    expect(result.tokens_predicted).toBeLessThan(200)
  })
})

describe('stop strings', () => {
  test('a stop string split across tokens stops generation and is never emitted', async () => {
    const base = await run(engine, { messages: user('Count from one to twenty in words, comma separated.'), n_predict: 60, temperature: 0 })
    const pieces = base.tokens.map((t) => t.piece)
    // Find a boundary where the stop string straddles two tokens and does not occur earlier.
    let stop = null
    let before = 0
    for (let i = 3; i < pieces.length - 1 && !stop; i++) {
      before += pieces[i - 1].length
      const a = pieces[i]
      const b = pieces[i + 1]
      if (a.length >= 2 && b.length >= 2 && !/\uFFFD/.test(a + b)) {
        const candidate = a.slice(-2) + b.slice(0, 2)
        const text = base.result.content
        const at = text.indexOf(candidate)
        if (at >= 0 && at === pieces.slice(0, i + 1).join('').length - 2) stop = candidate
      }
    }
    expect(stop).not.toBeNull()
    const { events, result } = await run(engine, {
      messages: user('Count from one to twenty in words, comma separated.'),
      n_predict: 60,
      temperature: 0,
      stop: ['never-appears', stop],
    })
    expect(result.stopped_word).toBe(true)
    expect(result.stopping_word).toBe(stop)
    const expected = base.result.content.slice(0, base.result.content.indexOf(stop))
    expect(result.content).toBe(expected)
    expect(joined(events)).toBe(result.content)
    expect(result.content).not.toContain(stop)
  })

  test('a held-back partial match is released when it turns out not to be a stop', async () => {
    const base = await run(engine, { messages: user('Name five fruits.'), n_predict: 30, temperature: 0 })
    const text = base.result.content
    const stop = text.slice(5, 8) + '\u0000never'
    const { events, result } = await run(engine, { messages: user('Name five fruits.'), n_predict: 30, temperature: 0, stop: [stop] })
    expect(result.stopped_word).toBe(false)
    expect(result.content).toBe(text)
    expect(joined(events)).toBe(text)
  })
})

describe('UTF-8', () => {
  test('a character split across tokens is streamed whole', async () => {
    const { events, result, tokens } = await run(engine, {
      prompt: '日本語の文章：東京は日本の首都です。大阪は',
      n_predict: 40,
      temperature: 0,
    })
    // Some generated tokens are fragments of a character…
    expect(tokens.some((t) => t.piece.includes('\uFFFD'))).toBe(true)
    // …but no event ever shows a broken character. Only when generation
    // stops in the middle of one (n_predict reached) are the bytes left over
    // flushed at the very end, as U+FFFD like llama.cpp's server does.
    expect(joined(events)).toBe(result.content)
    const body = result.stopped_limit ? result.content.replace(/\uFFFD+$/, '') : result.content
    expect(body).not.toContain('\uFFFD')
    expect(body.length).toBeGreaterThan(5)
    expect(Buffer.from(result.content, 'utf8').toString('utf8')).toBe(result.content)
  })

  test('emoji prompt', async () => {
    const { events, result } = await run(engine, { messages: user('Reply with three emoji: 🎉🐱'), n_predict: 16, temperature: 0 })
    expect(joined(events)).toBe(result.content)
  })
})

describe('request fields', () => {
  test('prompt as a mixed array of strings and token ids equals the same text', async () => {
    const ids = engine.tokenize(' is a city in')
    const a = await run(engine, { prompt: ['Paris', ...ids], n_predict: 10, temperature: 0 })
    const b = await run(engine, { prompt: 'Paris is a city in', n_predict: 10, temperature: 0, cache_prompt: false })
    expect(engine.tokenize('Paris is a city in')).toEqual([...engine.tokenize('Paris'), ...ids])
    expect(a.result.content).toBe(b.result.content)
  })

  test('a request as a JSON string (the legacy form) and a plain prompt string', async () => {
    const a = await run(engine, JSON.stringify({ prompt: 'One, two, three,', n_predict: 6, temperature: 0 }))
    const b = await run(engine, { prompt: 'One, two, three,', n_predict: 6, temperature: 0 })
    expect(a.result.content).toBe(b.result.content)
    // A plain string takes the defaults (n_predict -1: until the end of
    // text or the context); stopped at its first token.
    const ac = new AbortController()
    const c = await engine.complete('One, two, three,', (e) => e.type === 'token' && ac.abort(), ac.signal)
    expect(c.stopped_abort).toBe(true)
    expect(c.generation_settings.temperature).toBeCloseTo(0.8)
  })

  test('n_predict 0 generates nothing', async () => {
    const { events, result } = await run(engine, { prompt: 'Hi', n_predict: 0 })
    expect(result.tokens_predicted).toBe(0)
    expect(result.content).toBe('')
    expect(result.stopped_limit).toBe(true)
    expect(events.map((e) => e.type)).toEqual(['done'])
  })

  test('logit_bias false bans a token; a positive bias forces it', async () => {
    const req = { prompt: 'The capital of France is', n_predict: 4, temperature: 0 }
    const base = await run(engine, req)
    const first = base.tokens[0].id
    const banned = await run(engine, { ...req, logit_bias: [[first, false]] })
    expect(banned.tokens.every((t) => t.id !== first)).toBe(true)
    const forced = engine.tokenize(' banana')[0]
    const f = await run(engine, { ...req, logit_bias: [[forced, 100]] })
    expect(f.tokens.every((t) => t.id === forced)).toBe(true)
  })

  test('repeat penalties change greedy output on a repetitive prompt', async () => {
    const prompt = 'a a a a a a a a a a a a a a a a'
    const plain = await run(engine, { prompt, n_predict: 12, temperature: 0 })
    const pen = await run(engine, { prompt, n_predict: 12, temperature: 0, repeat_penalty: 1.8, repeat_last_n: 64, frequency_penalty: 0.5, presence_penalty: 0.5 })
    expect(pen.result.content).not.toBe(plain.result.content)
    expect(pen.result.generation_settings).toMatchObject({ repeat_penalty: 1.8, frequency_penalty: 0.5 })
  })

  test('ignore_eos keeps generating past the end of turn', async () => {
    const req = { messages: user('Say only the word yes.'), n_predict: 40, temperature: 0 }
    const plain = await run(engine, req)
    expect(plain.result.stopped_eos).toBe(true)
    const forced = await run(engine, { ...req, ignore_eos: true })
    expect(forced.result.stopped_eos).toBe(false)
    expect(forced.result.tokens_predicted).toBe(40)
  })

  test('top-k 1 sampling equals greedy; mirostat and typical-p run', async () => {
    const ask = { messages: user('Describe the sea.') }
    const greedy = await run(engine, { ...ask, n_predict: 12, temperature: 0 })
    const k1 = await run(engine, { ...ask, n_predict: 12, temperature: 0.9, top_k: 1, seed: 7 })
    expect(k1.result.content).toBe(greedy.result.content)
    for (const mirostat of [1, 2]) {
      const m = await run(engine, { ...ask, n_predict: 12, temperature: 0.8, mirostat, mirostat_tau: 4, mirostat_eta: 0.2, seed: 3 })
      expect(m.result.tokens_predicted).toBeGreaterThan(0)
    }
    const t = await run(engine, { ...ask, n_predict: 12, temperature: 0.8, typical_p: 0.5, min_p: 0.1, top_p: 0.9, seed: 3 })
    expect(t.result.tokens_predicted).toBeGreaterThan(0)
  })

  test('n_probs reports top probabilities per token and completion_probabilities', async () => {
    const { tokens, result } = await run(engine, { prompt: 'The capital of France is', n_predict: 5, temperature: 0, n_probs: 3 })
    expect(result.completion_probabilities).toHaveLength(5)
    for (const [i, t] of tokens.entries()) {
      expect(t.probs).toHaveLength(3)
      const ps = t.probs.map((p) => p.prob)
      expect(ps[0]).toBeGreaterThanOrEqual(ps[1])
      expect(ps.reduce((a, b) => a + b)).toBeLessThanOrEqual(1.0001)
      expect(t.probs[0].id).toBe(t.id) // greedy picks the most probable
      expect(t.prob).toBe(t.probs[0].prob) // its own probability, the same number
      expect(result.completion_probabilities[i].content).toBe(t.piece)
      expect(result.completion_probabilities[i].probs[0].tok_str).toBe(t.probs[0].piece)
    }
  })

  test('grammar (GBNF) constrains the output', async () => {
    const grammar = 'root ::= ("yes" | "no") "." [ ]? [0-9]+'
    const { result } = await run(engine, { messages: user('Is the sky blue?'), n_predict: 12, temperature: 0.7, seed: 1, grammar })
    expect(result.content).toMatch(/^(yes|no)\. ?[0-9]+$/)
  })

  test('json_schema constrains the output to valid JSON of that shape', async () => {
    const json_schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer' } },
      required: ['name', 'age'],
      additionalProperties: false,
    }
    const { result } = await run(engine, { messages: user('Give a person as JSON.'), n_predict: 64, temperature: 0, json_schema })
    const value = JSON.parse(result.content)
    expect(typeof value.name).toBe('string')
    expect(Number.isInteger(value.age)).toBe(true)
  })

  test('an invalid grammar is INVALID_REQUEST and the engine keeps working', async () => {
    await expect(engine.complete({ prompt: 'x', grammar: 'root ::= (' })).rejects.toMatchObject({
      code: 'INVALID_REQUEST',
      message: expect.stringContaining('grammar'),
    })
    const { result } = await run(engine, { prompt: 'Hello', n_predict: 3, temperature: 0 })
    expect(result.tokens_predicted).toBe(3)
  })
})

describe('context window', () => {
  let small
  beforeAll(async () => {
    small = await loadTarget({ contextSize: 64 })
  })
  afterAll(() => small.dispose())

  test('a prompt longer than the context is truncated keeping n_keep tokens', async () => {
    const prompt = Array.from({ length: 60 }, (_, i) => `w${i}`).join(' ')
    expect(small.tokenize(prompt).length).toBeGreaterThan(64)
    const { result } = await run(small, { prompt, n_predict: 4, temperature: 0, n_keep: 5 })
    expect(result.truncated).toBe(true)
    expect(result.tokens_predicted).toBe(4)
    expect(result.tokens_evaluated).toBe(small.tokenize(prompt).length)
  })

  test('generation past the context shifts it when n_predict is set', async () => {
    const { events, result } = await run(small, { prompt: 'Count: 1, 2, 3,', n_predict: 120, temperature: 0, ignore_eos: true, n_keep: 4 })
    expect(result.tokens_predicted).toBe(120)
    expect(result.truncated).toBe(true)
    expect(joined(events)).toBe(result.content)
  })

  test('n_predict -1 stops when the context is full', async () => {
    const { result } = await run(small, { prompt: 'Count: 1, 2, 3,', n_predict: -1, temperature: 0, ignore_eos: true })
    expect(result.stopped_limit).toBe(true)
    expect(result.tokens_predicted).toBeLessThan(64)
    expect(result.tokens_predicted).toBeGreaterThan(40)
  })

  test('context_shift false: a prompt that does not fit is CONTEXT_EXCEEDED with the counts; a generation that fills the context ends, truncated', async () => {
    const prompt = Array.from({ length: 60 }, (_, i) => `w${i}`).join(' ')
    const n = small.tokenize(prompt).length
    await expect(small.complete({ prompt, n_predict: 4, context_shift: false })).rejects.toMatchObject({
      code: 'CONTEXT_EXCEEDED',
      promptTokens: n,
      contextSize: 64,
      message: expect.stringMatching(/exceeds the available context size/),
    })
    const { events, result } = await run(small, { prompt: 'Count: 1, 2, 3,', n_predict: 120, temperature: 0, ignore_eos: true, context_shift: false })
    expect(result).toMatchObject({ stopped_limit: true, truncated: true })
    expect(result.tokens_predicted).toBeLessThan(64)
    // The same tokens as the shifting run, up to where it shifted.
    const shifting = await run(small, { prompt: 'Count: 1, 2, 3,', n_predict: result.tokens_predicted, temperature: 0, ignore_eos: true })
    expect(shifting.result.content).toBe(result.content)
    expect(joined(events)).toBe(result.content)
  })

  test('return_progress: a progress event before the first chunk of the prompt and after each, before any token', async () => {
    const prompt = Array.from({ length: 50 }, (_, i) => `w${i}`).join(' ')
    const tiny = await loadTarget({ contextSize: 256, batchSize: 32, parallel: 1 })
    try {
      const { events, result } = await run(tiny, { prompt, n_predict: 2, temperature: 0, return_progress: true })
      const progress = events.filter((e) => e.type === 'progress')
      const total = result.tokens_evaluated
      expect(progress[0]).toMatchObject({ total, cache: 0, processed: 0 })
      expect(progress.at(-1)).toMatchObject({ total, processed: total })
      expect(progress).toHaveLength(1 + Math.ceil(total / 32))
      for (let i = 1; i < progress.length; i++) expect(progress[i].time_ms).toBeGreaterThanOrEqual(progress[i - 1].time_ms)
      expect(events.findLastIndex((e) => e.type === 'progress')).toBeLessThan(events.findIndex((e) => e.type === 'token'))
      expect(result.tokens_predicted).toBe(2)
      // Again: the cached prefix is reported as such.
      const again = (await run(tiny, { prompt: prompt + ' w50', n_predict: 1, temperature: 0, return_progress: true })).events.filter((e) => e.type === 'progress')
      expect(again[0].cache).toBeGreaterThan(0)
      expect(again[0].processed).toBe(again[0].cache)
      // Without it: none.
      expect((await run(tiny, { prompt, n_predict: 1, cache_prompt: false })).events.some((e) => e.type === 'progress')).toBe(false)
      // status().decodes counts the steps and the slots they served.
      const { steps, slots } = tiny.status().decodes
      expect(steps).toBeGreaterThan(progress.length)
      expect(slots).toBe(steps)
    } finally {
      await tiny.dispose()
    }
  })
})

describe('prompt cache', () => {
  test('a request sharing a prefix with the last one reuses its KV cache', async () => {
    const prefix = engine.applyChatTemplate(user('Here is a long instruction about writing a poem about the ocean and its waves.'))
    await run(engine, { prompt: prefix, n_predict: 2, temperature: 0 })
    const n = engine.tokenize(prefix, { special: true }).length
    const { result } = await run(engine, { prompt: prefix + 'The ocean', n_predict: 2, temperature: 0 })
    expect(result.tokens_cached).toBeGreaterThanOrEqual(n - 1)
    expect(result.timings.prompt_n).toBe(result.tokens_evaluated - result.tokens_cached)
    const off = await run(engine, { prompt: prefix + 'The ocean', n_predict: 2, temperature: 0, cache_prompt: false })
    expect(off.result.tokens_cached).toBe(0)
    expect(off.result.content).toBe(result.content)
    expect(engine.status().tokensCached).toBeGreaterThan(0)
  })
})
