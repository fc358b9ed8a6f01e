// POST /v1/embeddings over engine.embed, driven by the clients RAG code
// uses: the official openai client (which asks for base64 by default), the
// AI SDK's embed/embedMany and LangChain's OpenAIEmbeddings.
const OpenAI = require('openai')
const { startServer, stopServer } = require('./server-helpers')

const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'
const SENTENCE = 'The cat sat on the mat.'
const PARAPHRASE = 'A cat was sitting on the rug.'
const UNRELATED = 'Quarterly revenue grew by eight percent.'

const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0)
const norm = (a) => Math.sqrt(dot(a, a))
const cosine = (a, b) => dot(a, b) / (norm(a) * norm(b))

let engine
let server
let base
let client
beforeAll(async () => {
  ;({ engine, server, base } = await startServer({}, { contextSize: 1024 }))
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 })
})
afterAll(() => stopServer({ engine, server }))

const embedFloat = async (input, extra = {}) => {
  const res = await fetch(`${base}/v1/embeddings`, { method: 'POST', body: JSON.stringify({ model: MODEL, input, encoding_format: 'float', ...extra }) })
  return { status: res.status, body: await res.json() }
}

test("the official client (base64 by default) gets the engine's vectors, whole", async () => {
  const direct = await engine.embed([SENTENCE, PARAPHRASE])
  const res = await client.embeddings.create({ model: MODEL, input: [SENTENCE, PARAPHRASE] })
  expect(res.object).toBe('list')
  expect(res.model).toBe(MODEL)
  expect(res.data.map((d) => d.index)).toEqual([0, 1])
  // Decoded from base64 little-endian float32: full length (a float answer here would shrink to a quarter).
  expect(res.data[0].embedding).toHaveLength(direct.embeddings[0].length)
  expect(res.data[0].embedding).toEqual(Array.from(direct.embeddings[0]))
  expect(res.data[1].embedding).toEqual(Array.from(direct.embeddings[1]))
  expect(res.usage).toEqual({ prompt_tokens: direct.tokens, total_tokens: direct.tokens })

  const float = await embedFloat([SENTENCE, PARAPHRASE])
  expect(float.status).toBe(200)
  expect(float.body.data[0].embedding).toEqual(res.data[0].embedding)
})

test('a sentence alone and in a batch: the same vector; cosine with itself 1, a paraphrase above an unrelated sentence', async () => {
  const alone = (await client.embeddings.create({ model: MODEL, input: SENTENCE, encoding_format: 'float' })).data[0].embedding
  const batch = (await client.embeddings.create({ model: MODEL, input: [UNRELATED, SENTENCE, PARAPHRASE], encoding_format: 'float' })).data
  expect(batch[1].embedding).toEqual(alone)
  expect(norm(alone)).toBeCloseTo(1, 5)
  expect(cosine(alone, alone)).toBeCloseTo(1, 6)
  expect(cosine(alone, batch[2].embedding)).toBeGreaterThan(cosine(alone, batch[0].embedding))
})

test('token-id input, dimensions (truncated and renormalised), and the 400s', async () => {
  const tokens = engine.tokenize(SENTENCE)
  const byTokens = await embedFloat([tokens])
  expect(byTokens.status).toBe(200)
  expect(byTokens.body.usage.prompt_tokens).toBe(tokens.length)

  const full = (await embedFloat(SENTENCE)).body.data[0].embedding
  const short = await embedFloat(SENTENCE, { dimensions: 64 })
  const v = short.body.data[0].embedding
  expect(v).toHaveLength(64)
  expect(norm(v)).toBeCloseTo(1, 5)
  const scale = norm(full.slice(0, 64))
  v.forEach((x, i) => expect(x).toBeCloseTo(full[i] / scale, 5))

  for (const [extra, input, param] of [
    [{ dimensions: full.length + 1 }, SENTENCE, 'dimensions'],
    [{ dimensions: 0 }, SENTENCE, 'dimensions'],
    [{ encoding_format: 'int8' }, SENTENCE, 'encoding_format'],
    [{}, [SENTENCE, ''], 'input[1]'],
    [{}, { content: 'string' }, 'input'],
    [{}, { content: [{ type: 'unknown' }] }, 'input.content[0]'],
    [{}, [SENTENCE, { content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }], 'input[1].content[0]'],
    [{}, [], 'input'],
  ]) {
    const res = await fetch(`${base}/v1/embeddings`, { method: 'POST', body: JSON.stringify({ model: MODEL, input, ...extra }) })
    expect({ param, status: res.status }).toEqual({ param, status: 400 })
    expect((await res.json()).error.param).toBe(param)
  }
})

test("llama-server's inputs: ids with strings among them, { prompt_string }, { content: [text parts] }, an empty string", async () => {
  const vector = async (input) => {
    const res = await embedFloat(input)
    expect(res.status).toBe(200)
    return res.body.data.map((d) => d.embedding)
  }
  const ids = engine.tokenize(SENTENCE, { addBos: false })
  const [mixed] = await vector([...ids.slice(0, 2), engine.detokenize(ids.slice(2))])
  expect(mixed.length).toBeGreaterThan(1)
  const [plain, byObject, byParts] = await vector([SENTENCE, { prompt_string: SENTENCE }, { content: [{ type: 'text', text: SENTENCE.slice(0, 5) }, { type: 'text', text: SENTENCE.slice(5) }] }])
  expect(byObject).toEqual(plain)
  expect(byParts).toEqual(plain)
  expect(await vector({ prompt_string: SENTENCE })).toEqual([plain])
  // An empty string is the model's BOS alone, as llama-server embeds it; a
  // model that adds no BOS (SmolLM2) has nothing to embed: 400, as there.
  const empty = await embedFloat('')
  if (engine.tokenize('', { addBos: true }).length > 0) expect(empty.body.data).toHaveLength(1)
  else expect([empty.status, empty.body.error.param]).toEqual([400, 'input'])
})

test("llama-server's /embeddings and /embedding: [{ index, embedding: [vector] }]; embd_normalize as llama.cpp normalizes", async () => {
  const raw = (await engine.embed([SENTENCE, PARAPHRASE], { normalize: false })).embeddings
  const unit = (await engine.embed([SENTENCE, PARAPHRASE])).embeddings
  for (const route of ['/embeddings', '/embedding']) {
    const res = await fetch(base + route, { method: 'POST', body: JSON.stringify({ input: [SENTENCE, PARAPHRASE] }) })
    const body = await res.json()
    expect(body.map((e) => e.index)).toEqual([0, 1])
    expect(body[1].embedding).toEqual([Array.from(unit[1])])
  }
  // `content` instead of `input` on /v1/embeddings: llama-server's shape too.
  const content = await (await fetch(`${base}/v1/embeddings`, { method: 'POST', body: JSON.stringify({ content: SENTENCE }) })).json()
  expect(content).toEqual([{ index: 0, embedding: [Array.from(unit[0])] }])
  const with_ = async (p) => (await (await fetch(`${base}/embeddings`, { method: 'POST', body: JSON.stringify({ input: SENTENCE, embd_normalize: p }) })).json())[0].embedding[0]
  expect(await with_(-1)).toEqual(Array.from(raw[0]))
  expect(await with_(2)).toEqual(Array.from(unit[0]))
  const max = Math.max(...raw[0].map(Math.abs))
  expect(Math.max(...(await with_(0)).map(Math.abs))).toBeCloseTo(32760, 1)
  const taxicab = await with_(1)
  expect(taxicab.reduce((s, x) => s + Math.abs(x), 0)).toBeCloseTo(1, 4)
  expect(taxicab[0]).toBeCloseTo(raw[0][0] / raw[0].reduce((s, x) => s + Math.abs(x), 0), 6)
  expect(max).toBeGreaterThan(0)
  const bad = await fetch(`${base}/embeddings`, { method: 'POST', body: JSON.stringify({ input: SENTENCE, embd_normalize: 'l2' }) })
  expect([bad.status, (await bad.json()).error.param]).toEqual([400, 'embd_normalize'])
})

test("--pooling none: /embeddings answers every token's vector, not normalised; /v1/embeddings refuses it (400), as llama-server", async () => {
  const { createServer } = require('../server')
  const { listen, close } = require('./server-helpers')
  const model = require('./helpers').model(MODEL)
  const rows = createServer({ model, engineOptions: { pooling: 'none', contextSize: 256, parallel: 1 }, signals: false })
  const at = await listen(rows)
  try {
    for (let i = 0; i < 600 && (await fetch(`${at}/health`)).status !== 200; i++) await new Promise((r) => setTimeout(r, 100))
    const tokens = engine.tokenize(SENTENCE, { addBos: true })
    const res = await fetch(`${at}/embeddings`, { method: 'POST', body: JSON.stringify({ input: SENTENCE }) })
    const [{ index, embedding }] = await res.json()
    expect(index).toBe(0)
    expect(embedding).toHaveLength(tokens.length)
    expect(embedding.every((r) => r.length === engine.status().embeddingSize)).toBe(true)
    expect(embedding.some((r) => Math.abs(Math.hypot(...r) - 1) > 1e-3)).toBe(true)
    const oai = await fetch(`${at}/v1/embeddings`, { method: 'POST', body: JSON.stringify({ input: SENTENCE }) })
    expect(oai.status).toBe(400)
    expect((await oai.json()).error.message).toMatch(/not OAI compatible/)
  } finally {
    await close(rows)
    await rows.shutdown({ dispose: true })
  }
})

test("the AI SDK's embed and embedMany", async () => {
  const { embed, embedMany } = require('ai')
  const openai = require('@ai-sdk/openai').createOpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' })
  const model = openai.embedding(MODEL)
  const one = await embed({ model, value: SENTENCE, maxRetries: 0 })
  const many = await embedMany({ model, values: [SENTENCE, PARAPHRASE, UNRELATED], maxRetries: 0 })
  expect(many.embeddings).toHaveLength(3)
  expect(many.embeddings[0]).toEqual(one.embedding)
  expect(one.usage.tokens).toBeGreaterThan(0)
})

test("LangChain's OpenAIEmbeddings", async () => {
  const { OpenAIEmbeddings } = require('@langchain/openai')
  const embeddings = new OpenAIEmbeddings({ model: MODEL, apiKey: 'unused', configuration: { baseURL: `${base}/v1` }, maxRetries: 0 })
  const query = await embeddings.embedQuery(SENTENCE)
  const docs = await embeddings.embedDocuments([PARAPHRASE, UNRELATED])
  expect(docs).toHaveLength(2)
  expect(query).toHaveLength(docs[0].length)
  expect(cosine(query, docs[0])).toBeGreaterThan(cosine(query, docs[1]))
})
