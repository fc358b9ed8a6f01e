// engine.embed(): vectors computed on the engine thread in a context of
// their own, beside generating slots; the same alone and in a batch, bit
// for bit; pooled as asked; every bad input a rejected promise naming it.
const { LlamaEngine, TARGET, GEMMA, matrix, user, FULL } = require('./helpers')

const SENTENCE = 'The cat sat on the mat.'
const PARAPHRASE = 'A cat was sitting on the rug.'
const UNRELATED = 'Quarterly revenue grew by eight percent.'
// Several chunks of the embedding context (64 tokens each).
const LONG = Array.from({ length: 16 }, (_, i) => `Sentence ${i} of a long document about lighthouses, ships and the sea.`).join(' ')

const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0)
const norm = (a) => Math.sqrt(dot(a, a))
const cosine = (a, b) => dot(a, b) / (norm(a) * norm(b))
// Text is embedded with the model's BOS (and EOS), as tokenize adds them with addBos.
const BOS = { addBos: true }
const bytes = (v) => Buffer.from(v.buffer, v.byteOffset, v.byteLength)

const load = (extra = {}) => LlamaEngine.load({ modelPath: TARGET, contextSize: 512, threads: 2, parallel: 2, ...extra })

const rejection = async (promise) => {
  try {
    await promise
  } catch (e) {
    return e
  }
  throw new Error('expected a rejection')
}

describe.each(matrix([['SmolLM2 Q4_1', TARGET], ['gemma-3 Q4_K_M', GEMMA]], [['SmolLM2 Q4_1', TARGET]]))('%s', (_name, modelPath) => {
  let engine
  beforeAll(async () => {
    engine = await load({ modelPath })
  })
  afterAll(() => engine?.dispose())

  test('every input shape gives one unit Float32Array per input, and counts its tokens', async () => {
    const size = engine.status().embeddingSize
    expect(size).toBeGreaterThan(0)
    expect(engine.status().pooling).toBe('mean')
    const tokens = engine.tokenize(SENTENCE, BOS)
    for (const [input, count, n] of [
      [SENTENCE, 1, tokens.length],
      [[SENTENCE, PARAPHRASE], 2, tokens.length + engine.tokenize(PARAPHRASE, BOS).length],
      [tokens, 1, tokens.length],
      [[tokens, tokens.slice(0, 3)], 2, tokens.length + 3],
      [Int32Array.from(tokens), 1, tokens.length],
    ]) {
      const r = await engine.embed(input)
      expect(r.embeddings).toHaveLength(count)
      expect(r.tokens).toBe(n)
      for (const v of r.embeddings) {
        expect(v).toBeInstanceOf(Float32Array)
        expect(v).toHaveLength(size)
        expect(v.every(Number.isFinite)).toBe(true)
        expect(norm(v)).toBeCloseTo(1, 5)
      }
    }
    // Text and its tokens are the same input.
    const [byText, byTokens] = await Promise.all([engine.embed(SENTENCE), engine.embed(tokens)])
    expect(bytes(byText.embeddings[0]).equals(bytes(byTokens.embeddings[0]))).toBe(true)
  })

  test('a vector is the same alone, in a batch and beside other calls, bit for bit', async () => {
    const alone = (await engine.embed(SENTENCE)).embeddings[0]
    const long = (await engine.embed(LONG)).embeddings[0]
    expect(engine.tokenize(LONG, BOS).length).toBeGreaterThan(3 * 64)
    const [batch, other] = await Promise.all([engine.embed([UNRELATED, LONG, SENTENCE, PARAPHRASE]), engine.embed([PARAPHRASE, SENTENCE])])
    expect(bytes(batch.embeddings[2]).equals(bytes(alone))).toBe(true)
    expect(bytes(other.embeddings[1]).equals(bytes(alone))).toBe(true)
    expect(bytes(batch.embeddings[1]).equals(bytes(long))).toBe(true)
    expect(bytes(batch.embeddings[3]).equals(bytes(other.embeddings[0]))).toBe(true)
  })

  test('cosine: a sentence with itself 1, with a paraphrase above an unrelated sentence', async () => {
    const [s, p, u] = (await engine.embed([SENTENCE, PARAPHRASE, UNRELATED])).embeddings
    expect(cosine(s, s)).toBeCloseTo(1, 6)
    expect(cosine(s, p)).toBeGreaterThan(cosine(s, u))
    expect(cosine(s, p)).toBeLessThan(1)
  })

  test('normalize: false gives the raw pooled vector, the normalised one is it scaled', async () => {
    const [raw] = (await engine.embed(SENTENCE, { normalize: false })).embeddings
    const [unit] = (await engine.embed(SENTENCE)).embeddings
    const n = norm(raw)
    expect(Math.abs(n - 1)).toBeGreaterThan(1e-3)
    raw.forEach((x, i) => expect(x / n).toBeCloseTo(unit[i], 6))
  })
})

describe('beside generation', () => {
  let engine
  beforeAll(async () => {
    engine = await load()
  })
  afterAll(() => engine?.dispose())

  // test:full only: npm test stays under its 10 minutes (CI runs it).
  ;(FULL ? test : test.skip)('a streaming request keeps streaming while embeddings are computed, and its output does not change', async () => {
    const request = { messages: user('Write a short story about a lighthouse keeper.'), n_predict: 120, ignore_eos: true, temperature: 0, speculative: { mode: 'off' } }
    const solo = await engine.complete(request)
    const times = []
    let embedding
    let embedStarted = 0
    let embedDone = 0
    const generating = engine.complete(request, (e) => {
      if (e.type === 'token') times.push(performance.now())
      if (times.length === 5 && embedStarted === 0) {
        embedStarted = performance.now()
        embedding = engine.embed(Array.from({ length: 4 }, () => LONG)).then((r) => {
          embedDone = performance.now()
          return r
        })
      }
    })
    const result = await generating
    const embedded = await embedding
    expect(result.content).toBe(solo.content)
    expect(embedded.embeddings).toHaveLength(4)
    // Every one of the four long inputs took several chunks, one between each two steps: tokens kept arriving.
    const during = times.filter((t) => t > embedStarted && t < embedDone).length
    expect(during).toBeGreaterThan(0)
  })

  test('embed calls wait for nothing but their turn: two at once both answer beside a request', async () => {
    const generating = engine.complete({ prompt: 'Once upon a time', n_predict: 40, temperature: 0 })
    const [a, b] = await Promise.all([engine.embed(SENTENCE), engine.embed([SENTENCE])])
    expect(bytes(a.embeddings[0]).equals(bytes(b.embeddings[0]))).toBe(true)
    expect((await generating).tokens_predicted).toBe(40)
  })
})

describe('bad inputs reject with INVALID_REQUEST naming them', () => {
  let engine
  beforeAll(async () => {
    engine = await load({ contextSize: 128 })
  })
  afterAll(() => engine?.dispose())

  test.each([
    ['empty string', '', undefined, 'input'],
    ['empty list', [], undefined, 'input'],
    ['an empty string in a list', [SENTENCE, ''], undefined, 'input[1]'],
    ['an empty token array in a list', [SENTENCE, []], undefined, 'input[1]'],
    ['a token id outside the vocabulary', [1, 2, 10 ** 7], undefined, 'input[2]'],
    ['a negative token id', [[1, -1]], undefined, 'input[0][1]'],
    ['a number that is not an id', [1, 2.5], undefined, 'input[1]'],
    ['an object', { text: SENTENCE }, undefined, 'input'],
    ['no input', undefined, undefined, 'input'],
    ['a mixed list', [SENTENCE, 5], undefined, 'input[1]'],
    ['an over-long input', [SENTENCE, LONG], undefined, 'input[1]'],
    ['normalize not a boolean', SENTENCE, { normalize: 'yes' }, 'normalize'],
    ['truncate not a boolean', SENTENCE, { truncate: 1 }, 'truncate'],
    ['options not an object', SENTENCE, 'fast', 'options'],
    ['too many inputs', Array.from({ length: 2049 }, () => 'a'), undefined, 'input'],
  ])('%s', async (_what, input, options, field) => {
    const e = await rejection(engine.embed(input, options))
    expect(e.code).toBe('INVALID_REQUEST')
    if (field !== 'options') expect(e.field).toBe(field)
    expect(e.message.startsWith(field)).toBe(true)
  })

  test('an over-long input names the limit; truncate cuts it to contextSize tokens', async () => {
    const n = engine.tokenize(LONG, BOS).length
    const e = await rejection(engine.embed([SENTENCE, LONG]))
    expect(e.message).toContain(`${n} tokens`)
    expect(e.message).toContain('at most 128')
    const cut = await engine.embed([SENTENCE, LONG], { truncate: true })
    expect(cut.tokens).toBe(engine.tokenize(SENTENCE, BOS).length + 128)
    const first = engine.tokenize(LONG, BOS).slice(0, 128)
    const same = await engine.embed(first)
    expect(bytes(cut.embeddings[1]).equals(bytes(same.embeddings[0]))).toBe(true)
  })
})

describe('pooling', () => {
  test('mean, cls and last: one token gives the same vector; longer inputs differ; status says which', async () => {
    const engines = {}
    try {
      for (const pooling of ['mean', 'cls', 'last', 'none']) engines[pooling] = await load({ pooling, parallel: 1 })
      const tokens = engines.mean.tokenize(LONG, BOS)
      const one = {}
      const long = {}
      // None: every token's vector, one after another, never normalised; the mean of them is mean pooling's.
      const rows = (await engines.none.embed([tokens], { normalize: true })).embeddings[0]
      const n = engines.none.status().embeddingSize
      expect(rows.length).toBe(tokens.length * n)
      const byToken = Array.from({ length: tokens.length }, (_, t) => rows.subarray(t * n, (t + 1) * n))
      expect(byToken.some((r) => Math.abs(Math.hypot(...r) - 1) > 1e-3)).toBe(true)
      const first = (await engines.none.embed([tokens.slice(0, 1)], { normalize: false })).embeddings[0]
      expect(bytes(first).equals(bytes(byToken[0]))).toBe(true)
      const mean = (await engines.mean.embed([tokens], { normalize: false })).embeddings[0]
      mean.forEach((x, i) => expect(byToken.reduce((s, r) => s + r[i], 0) / tokens.length).toBeCloseTo(x, 4))
      await engines.none.dispose()
      delete engines.none
      for (const [pooling, e] of Object.entries(engines)) {
        expect(e.status().pooling).toBe(pooling)
        one[pooling] = (await e.embed([tokens.slice(0, 1)])).embeddings[0]
        long[pooling] = (await e.embed(LONG)).embeddings[0]
      }
      expect(bytes(one.cls).equals(bytes(one.mean))).toBe(true)
      expect(bytes(one.last).equals(bytes(one.mean))).toBe(true)
      expect(cosine(long.cls, long.last)).toBeLessThan(0.999)
      expect(cosine(long.mean, long.last)).toBeLessThan(0.999)
      // Last pooling over a decoder: the last token's vector, whatever chunk it fell in.
      const lastAlone = (await engines.last.embed([tokens])).embeddings[0]
      expect(bytes(lastAlone).equals(bytes(long.last))).toBe(true)
    } finally {
      await Promise.all(Object.values(engines).map((e) => e.dispose()))
    }
  })

  test('an unknown pooling rejects the load with INVALID_REQUEST naming pooling', async () => {
    const e = await rejection(load({ pooling: 'max' }))
    expect(e.code).toBe('INVALID_REQUEST')
    expect(e.field).toBe('pooling')
  })
})

test('dispose answers queued embed calls with DISPOSED; a disposed engine rejects them', async () => {
  const engine = await load()
  const pending = engine.embed(Array.from({ length: 20 }, () => LONG))
  const disposing = engine.dispose()
  const e = await rejection(pending)
  expect(e.code).toBe('DISPOSED')
  await disposing
  expect((await rejection(engine.embed(SENTENCE))).code).toBe('DISPOSED')
})
