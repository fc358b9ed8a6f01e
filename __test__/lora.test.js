// LoRA adapters (EngineOptions.loras, the request field `lora`): the test
// adapter `npm run models` writes (rank 8 on every attn_q and attn_v of
// SmolLM2) over the real model. Scale 0 is the base bit for bit; scale 1
// changes the output; requests with different adapters or scales decode in
// one batch, each identical to running alone; cells computed with one
// adapter set are never reused by another; files for another base model,
// or that are no adapter, are refused with the reason; the CLI and the
// server's /lora-adapters load and set them.
const { execFile } = require('node:child_process')
const path = require('node:path')
const { LlamaEngine, TARGET, GEMMA, model } = require('./helpers')
const { createServer } = require('../server')
const { listen, close } = require('./server-helpers')

const ADAPTER = model('SmolLM2-135M-Instruct.lora-test.gguf')
const GEMMA_ADAPTER = model('gemma-3-270m.lora-test.gguf')
const PROMPT = 'The capital of France is'

const greedy = (extra = {}) => ({ prompt: PROMPT, n_predict: 20, temperature: 0, n_probs: 3, ...extra })
// What must be identical: the text and every probability, bit for bit.
const trace = (r) => JSON.stringify({ content: r.content, probs: r.completion_probabilities })

let base // an engine without adapters
let engine // the same model with the adapter at load scale 1
let alone // what each setting gives alone, on an engine fresh for it
beforeAll(async () => {
  base = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1 })
  engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 3, loras: [{ path: ADAPTER, scale: 1 }] })
  alone = { base: trace(await base.complete(greedy())) }
  // Scale 1 and 0.5 alone: each on an engine with nothing cached yet.
  for (const scale of [1, 0.5]) {
    const fresh = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1, loras: [{ path: ADAPTER, scale: 0 }] })
    alone[scale] = trace(await fresh.complete(greedy({ lora: [{ id: 0, scale }] })))
    await fresh.dispose()
  }
}, 120_000)
afterAll(async () => {
  await base?.dispose()
  await engine?.dispose()
})

test('status().loras lists the adapters in load order with their scales', () => {
  expect(engine.status().loras).toEqual([{ id: 0, path: ADAPTER, scale: 1 }])
  expect(base.status().loras).toEqual([])
  // Adapters do not change what the load-time self-check proves.
  expect(engine.status().batchInvariant).toBe(true)
})

test('scale 0, an empty list and the base model are bit-identical; scale 1 and 0.5 differ', async () => {
  expect(trace(await engine.complete(greedy({ lora: [{ id: 0, scale: 0 }] })))).toBe(alone.base)
  expect(trace(await engine.complete(greedy({ lora: [] })))).toBe(alone.base)
  expect(alone[1]).not.toBe(alone.base)
  expect(alone[0.5]).not.toBe(alone.base)
  expect(alone[0.5]).not.toBe(alone[1])
  // Without `lora`, the load scale (1) applies.
  expect(trace(await engine.complete(greedy()))).toBe(alone[1])
})

test('cells computed with one adapter set are not reused by another', async () => {
  // A prompt long enough to be worth reusing from a slot.
  const long = greedy({ prompt: `${'Paris, Lyon, Marseille, Toulouse, Nice, Nantes and Strasbourg are cities. '.repeat(4)}${PROMPT}` })
  const baseLong = trace(await base.complete(long))
  const a1 = await engine.complete({ ...long, lora: [{ id: 0, scale: 1 }] })
  const a2 = await engine.complete({ ...long, lora: [{ id: 0, scale: 1 }] })
  // The same adapters reuse the cells, and give the same.
  expect(a2.tokens_cached).toBeGreaterThan(16)
  expect(trace(a2)).toBe(trace(a1))
  expect(trace(a1)).not.toBe(baseLong)
  // Without the adapter: none of those cells, the base's output.
  const b = await engine.complete({ ...long, lora: [] })
  expect(b.tokens_cached).toBe(0)
  expect(trace(b)).toBe(baseLong)
  // Another scale: none of either.
  const c = await engine.complete({ ...long, lora: [{ id: 0, scale: 0.5 }] })
  expect(c.tokens_cached).toBe(0)
  expect(trace(c)).not.toBe(trace(a1))
  const a3 = await engine.complete({ ...long, lora: [{ id: 0, scale: 1 }] })
  expect(trace(a3)).toBe(trace(a1))
})

test('requests with different adapters and scales in one batch are each identical to alone', async () => {
  for (let round = 0; round < 2; round++) {
    const [a, b, c] = await Promise.all([
      engine.complete(greedy({ lora: [{ id: 0, scale: 1 }] })),
      engine.complete(greedy({ lora: [] })),
      engine.complete(greedy({ lora: [{ id: 0, scale: 0.5 }] })),
    ])
    expect([trace(a), trace(b), trace(c)]).toEqual([alone[1], alone.base, alone[0.5]])
  }
  // Speculation beside them changes nothing either.
  const spec = await engine.complete(greedy({ lora: [{ id: 0, scale: 1 }], speculative: { mode: 'ngram' } }))
  expect(trace(spec)).toBe(alone[1])
})

test('the request field is checked: unknown ids, bad scales, duplicates', async () => {
  for (const [lora, field] of [
    [[{ id: 1, scale: 1 }], 'lora[0].id'],
    [[{ id: -1, scale: 1 }], 'lora[0]'],
    [[{ id: 0, scale: Number.NaN }], 'lora[0]'],
    [[{ id: 0, scale: 1e6 }], 'lora[0]'],
    [[{ id: 0 }, { id: 0 }], 'lora[1]'],
    [{ id: 0 }, 'lora'],
  ]) {
    const err = await engine.complete(greedy({ lora })).catch((e) => e)
    expect({ lora, code: err.code }).toEqual({ lora, code: 'INVALID_REQUEST' })
    expect(err.message.startsWith(field)).toBe(true)
  }
  // The engine without adapters has no id 0.
  const err = await base.complete(greedy({ lora: [{ id: 0, scale: 1 }] })).catch((e) => e)
  expect(err.code).toBe('INVALID_REQUEST')
  expect(err.message).toMatch(/0 is not a loaded adapter \(0 loaded/)
})

test('adapters for another base model, model files and missing files are refused with the reason', async () => {
  const refused = async (loras) => {
    const err = await LlamaEngine.load({ modelPath: TARGET, contextSize: 256, parallel: 1, loras }).catch((e) => e)
    expect(typeof err.message).toBe('string')
    return err
  }
  const gemma = await refused([{ path: GEMMA_ADAPTER }])
  expect(gemma.code).toBe('MODEL_LOAD_FAILED')
  expect(gemma.message).toMatch(/an adapter for a gemma3 model, not for this llama model/)
  const notAdapter = await refused([{ path: GEMMA }])
  expect(notAdapter.message).toMatch(/not a LoRA adapter/)
  const missing = await refused([{ path: path.join(__dirname, 'no-such-adapter.gguf') }])
  expect(missing.code).toBe('MODEL_LOAD_FAILED')
  const badScale = await refused([{ path: ADAPTER, scale: 'x' }])
  expect(badScale.code).toBe('INVALID_REQUEST')
  expect(badScale.message).toMatch(/^loras\[0\]\.scale/)
})

test('the CLI loads --lora PATH:SCALE', async () => {
  const cli = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
  const runCli = (args) =>
    new Promise((resolve, reject) =>
      execFile(process.execPath, [cli, '-m', TARGET, '--prompt', PROMPT, '--n_predict', '20', '--temperature', '0', '--json', ...args], (err, stdout) =>
        err ? reject(err) : resolve(JSON.parse(stdout.trim().split('\n').pop()).content),
      ),
    )
  const [withAdapter, atZero] = await Promise.all([runCli(['--lora', `${ADAPTER}:1`]), runCli(['--lora', `${ADAPTER}:0`])])
  expect(withAdapter).toBe(JSON.parse(alone[1]).content)
  expect(atZero).toBe(JSON.parse(alone.base).content)
}, 60_000)

describe('the server: GET and POST /lora-adapters', () => {
  let server
  let url
  beforeAll(async () => {
    server = createServer({ engine, signals: false })
    url = await listen(server)
  })
  afterAll(async () => {
    if (server) await close(server)
  })
  const completion = async (extra = {}) => {
    const res = await fetch(`${url}/completion`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(greedy(extra)) })
    expect(res.status).toBe(200)
    return (await res.json()).content
  }

  test('lists the adapter, and the scales POST sets are what requests without lora get', async () => {
    expect(await (await fetch(`${url}/lora-adapters`)).json()).toEqual([{ id: 0, path: ADAPTER, scale: 1 }])
    expect(await completion()).toBe(JSON.parse(alone[1]).content)
    const set = async (body) => fetch(`${url}/lora-adapters`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) })
    expect((await set([{ id: 0, scale: 0 }])).status).toBe(200)
    expect(await (await fetch(`${url}/lora-adapters`)).json()).toEqual([{ id: 0, path: ADAPTER, scale: 0 }])
    expect(await completion()).toBe(JSON.parse(alone.base).content)
    // A request's own lora still wins.
    expect(await completion({ lora: [{ id: 0, scale: 0.5 }] })).toBe(JSON.parse(alone[0.5]).content)
    expect((await set([{ id: 0, scale: 1 }])).status).toBe(200)
    expect(await completion()).toBe(JSON.parse(alone[1]).content)
  })
})
