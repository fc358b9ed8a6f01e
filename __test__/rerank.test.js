// Reranking (engine.rerank, serve's /rerank, /v1/rerank, /v1/reranking) on
// a tiny BERT classifier and a tiny Qwen3-Reranker-style decoder made for
// the tests (scripts/rerank-fixture.mjs):
// its scores are the ones its weights give (a plain forward pass in double
// precision here, the reference), each pair scored alone, in llama-server's
// pair format and answer shapes (Jina/Cohere's, TEI's), its errors refused.
const path = require('node:path')
const { spawn } = require('node:child_process')
const { LlamaEngine, TARGET, model } = require('./helpers')
const { until, importEsm } = require('./server-helpers')

const RERANKER = model('bert-reranker-tiny.gguf')
const CLI = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
const QUERY = 'what is machine learning?'
const DOCS = [
  'a machine is a physical system that uses power to apply forces and control movement.',
  'learning is the process of acquiring new knowledge, values and skills.',
  'machine learning is a field of study in artificial intelligence concerned with models that learn from data.',
  'paris, capitale de la france, est une grande ville.',
  '',
]

let engine
let fixture
beforeAll(async () => {
  engine = await LlamaEngine.load({ modelPath: RERANKER, contextSize: 512, isolation: 'none' })
  fixture = await importEsm(path.join(__dirname, '..', 'scripts', 'rerank-fixture.mjs'))
})
afterAll(() => engine?.dispose())

/** A pair as llama.cpp's server makes it for this model: [CLS] query [SEP] document [SEP] (BOS, EOS = SEP). */
const pair = (q, d) => [2, ...engine.tokenize(q, { addBos: false }), 3, ...engine.tokenize(d, { addBos: false }), 3]

test("each document's score is the model's: the reference forward pass over [CLS] query [SEP] document [SEP]", async () => {
  expect(engine.status().pooling).toBe('rank')
  const results = await engine.rerank({ query: QUERY, documents: DOCS })
  const tokens = results.tokens
  expect(results.map((r) => r.index).sort()).toEqual([0, 1, 2, 3, 4])
  const spec = fixture.bertRerankerSpec()
  for (const r of results) {
    const ref = fixture.bertReference(spec, pair(QUERY, DOCS[r.index]))
    // ggml's GELU (an f16 table) and f32 arithmetic against doubles.
    expect(Math.abs(r.relevance_score - ref)).toBeLessThan(2e-3 * Math.max(1, Math.abs(ref)))
  }
  // Best first.
  for (let i = 1; i < results.length; i++) expect(results[i - 1].relevance_score).toBeGreaterThanOrEqual(results[i].relevance_score)
  expect(Object.keys(results[0]).sort()).toEqual(['index', 'relevance_score'])
  expect(tokens).toBe(DOCS.reduce((n, d) => n + pair(QUERY, d).length, 0))
})

test('a pair is scored alone: the same bits whatever the other documents, their order or the call', async () => {
  const all = await engine.rerank({ query: QUERY, documents: DOCS })
  const byIndex = new Map(all.map((r) => [r.index, r.relevance_score]))
  for (const [i, d] of DOCS.entries()) {
    const alone = await engine.rerank({ query: QUERY, documents: [d] })
    expect(alone[0].relevance_score).toBe(byIndex.get(i))
  }
  const reversed = await engine.rerank({ query: QUERY, documents: [...DOCS].reverse() })
  for (const r of reversed) expect(r.relevance_score).toBe(byIndex.get(DOCS.length - 1 - r.index))
})

test('top_n: the best N; the same scores from an isolated engine', async () => {
  const all = await engine.rerank({ query: QUERY, documents: DOCS })
  expect(await engine.rerank({ query: QUERY, documents: DOCS, top_n: 2 })).toEqual(all.slice(0, 2))
  expect(await engine.rerank({ query: QUERY, documents: DOCS, top_n: 0 })).toEqual([])
  const isolated = await LlamaEngine.load({ modelPath: RERANKER, contextSize: 512, isolation: 'process' })
  try {
    const same = await isolated.rerank({ query: QUERY, documents: DOCS })
    expect(same).toEqual(all)
    expect(same.tokens).toBe(all.tokens)
  } finally {
    await isolated.dispose()
  }
})

test('refused with INVALID_REQUEST, naming what: bad queries and documents, a pair over the context, embed() on a reranker, rerank() on a model that is none', async () => {
  const code = (p) => p.then(() => null, (e) => `${e.code}: ${e.message}`)
  const rerank = (e, query, documents, extra = {}) => e.rerank({ query, documents, ...extra })
  expect(await code(rerank(engine, '', DOCS))).toMatch(/^INVALID_REQUEST: query: is empty/)
  expect(await code(rerank(engine, QUERY, []))).toMatch(/^INVALID_REQUEST: documents: is empty/)
  expect(await code(rerank(engine, QUERY, 'a'))).toMatch(/^INVALID_REQUEST: documents: required: an array of strings/)
  expect(await code(rerank(engine, QUERY, ['a', 2]))).toMatch(/^INVALID_REQUEST: documents\[1\]: expected a string/)
  expect(await code(rerank(engine, QUERY, DOCS, { top_n: -1 }))).toMatch(/^INVALID_REQUEST: top_n/)
  expect(await code(engine.rerank('what?'))).toMatch(/^INVALID_REQUEST: request: expected \{ query, documents, top_n\? \}/)
  expect(await code(rerank(engine, QUERY, ['a', 'machine '.repeat(600)]))).toMatch(/^INVALID_REQUEST: documents\[1\]: too large: \d+ tokens with the query; the engine scores at most 512/)
  expect(await code(engine.embed('hello'))).toMatch(/^INVALID_REQUEST: input: bert-reranker-tiny.gguf is a reranker/)
  const smol = await LlamaEngine.load({ modelPath: TARGET, contextSize: 256, isolation: 'none' })
  try {
    expect(await code(rerank(smol, QUERY, DOCS))).toMatch(/^INVALID_REQUEST: rerank: SmolLM2-135M-Instruct.Q4_1.gguf is not a reranker/)
  } finally {
    await smol.dispose()
  }
  // Still serving.
  expect(await engine.rerank({ query: QUERY, documents: ['a'] })).toHaveLength(1)
})

test("a Qwen3-Reranker-style decoder: its rerank template, the last token's head, a softmax; pairs longer than a 64-token chunk too", async () => {
  const qwen3 = await LlamaEngine.load({ modelPath: model('qwen3-reranker-tiny.gguf'), contextSize: 1024, isolation: 'none' })
  try {
    const docs = [...DOCS, 'machine learning '.repeat(40)]
    const results = await qwen3.rerank({ query: QUERY, documents: docs })
    const tokens = results.tokens
    const spec = await fixture.qwen3RerankerSpecFrom(path.join(__dirname, '..', 'models'))
    const pairTokens = (d) => qwen3.tokenize(fixture.QWEN3_RERANK_TEMPLATE.replace('{query}', QUERY).replace('{document}', d), { addBos: false, special: true })
    expect(pairTokens(docs.at(-1)).length).toBeGreaterThan(128)
    for (const r of results) {
      // A probability: the first label's, after the softmax.
      expect(r.relevance_score).toBeGreaterThan(0)
      expect(r.relevance_score).toBeLessThan(1)
      expect(Math.abs(r.relevance_score - fixture.qwen3Reference(spec, pairTokens(docs[r.index])))).toBeLessThan(1e-3)
    }
    expect(tokens).toBe(docs.reduce((n, d) => n + pairTokens(d).length, 0))
    // Alone, the same bits.
    expect((await qwen3.rerank({ query: QUERY, documents: [docs.at(-1)] }))[0].relevance_score).toBe(results.find((r) => r.index === docs.length - 1).relevance_score)
  } finally {
    await qwen3.dispose()
  }
})

describe("serve --reranking: llama-server's rerank endpoints", () => {
  let srv
  let base
  let log = ''
  beforeAll(async () => {
    srv = spawn(process.execPath, [CLI, 'serve', '-m', RERANKER, '--port', '0', '-c', '512', '--reranking', '--alias', 'jina-reranker', '--isolation', 'none'], { stdio: ['ignore', 'ignore', 'pipe'] })
    srv.stderr.on('data', (d) => (log += d))
    expect(await until(() => /model loaded/.test(log), 60_000)).toBe(true)
    base = `http://127.0.0.1:${/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log)[1]}`
  })
  afterAll(() => srv?.kill())
  const post = (route, body) => fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

  test('{ query, documents, top_n } → results best first with relevance_score, usage; the same scores as the engine', async () => {
    const expected = await engine.rerank({ query: QUERY, documents: DOCS })
    for (const route of ['/rerank', '/reranking', '/v1/rerank', '/v1/reranking']) {
      const res = await post(route, { query: QUERY, documents: DOCS })
      expect(res.status).toBe(200)
      const body = await res.json()
      expect(body).toMatchObject({ model: 'jina-reranker', object: 'list', usage: { prompt_tokens: expected.tokens, total_tokens: expected.tokens } })
      expect(body.results).toEqual([...expected])
    }
    for (const [n, len] of [[2, 2], [99, DOCS.length], [0, 0]]) expect((await (await post('/rerank', { query: QUERY, documents: DOCS, top_n: n })).json()).results).toHaveLength(len)
    const docs = (await (await post('/v1/rerank', { query: QUERY, documents: DOCS, top_n: 1, return_documents: true })).json()).results
    expect(docs).toEqual([{ ...expected[0], document: { text: DOCS[expected[0].index] } }])
  })

  test("TEI's shape with texts: [{ index, score, text? }], top_n", async () => {
    const expected = await engine.rerank({ query: QUERY, documents: DOCS })
    const body = await (await post('/rerank', { query: QUERY, texts: DOCS, return_text: true })).json()
    expect(body).toEqual(expected.map((r) => ({ index: r.index, score: r.relevance_score, text: DOCS[r.index] })))
    expect(await (await post('/rerank', { query: QUERY, texts: DOCS, top_n: 2 })).json()).toHaveLength(2)
  })

  test('invalid bodies are 400s, as llama-server answers them', async () => {
    for (const documents of [[], null, 123, [1, 2, 3]]) {
      const res = await post('/rerank', { query: QUERY, documents })
      expect([JSON.stringify(documents), res.status]).toEqual([JSON.stringify(documents), 400])
      expect((await res.json()).error.message).toMatch(/"documents" must be a non-empty string array/)
    }
    expect((await post('/rerank', { documents: ['a'] })).status).toBe(400)
    expect((await post('/rerank', { query: 1, documents: ['a'] })).status).toBe(400)
    expect((await post('/rerank', { query: 'q', documents: ['a'], top_n: -1 })).status).toBe(400)
  })
})
