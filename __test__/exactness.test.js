// Greedy speculation is bit-exact: the same tokens *and the same
// probabilities* as plain decoding, on every CPU quantization type we make
// (\`npm run test:full\`; \`npm test\` checks the shipped K-quant and Q4_1),
// K-quants included, with long fixed drafts, trees and the adaptive modes.
// And the load-time self-check (status().batchInvariant) that the guarantee
// rests on: true here, false when ggml's batch-dependent tiled K-quant path
// is left on, whichever thread loads the addon first.
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { LlamaEngine, TARGET, DRAFT, F16, GEMMA, FULL, matrix, tiers, model, run } = require('./helpers')

const ROOT = path.join(__dirname, '..')
const GEMMA_DRAFT = model('gemma-3-270m.Q2_K.gguf')

// Input-grounded prompts: long accepted drafts, so verification batches are
// large and every row of them is compared with plain decoding.
const PASSAGE =
  'The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a small notebook in which he recorded the weather, the ships that passed, and the colour of the sea.'
const PROMPTS = {
  repeat: `Repeat the following passage word for word.\n\n${PASSAGE}\n\nPassage:\n`,
  code: 'Rename the variable total to sum in this JavaScript function:\n\nfunction add(items) {\n  let total = 0;\n  for (const x of items) {\n    total += x.price * x.qty;\n  }\n  return total;\n}\n\nAnswer:\n',
  json: 'Copy this JSON object, changing "city" to "Paris":\n{"name": "Alice", "age": 31, "city": "London", "tags": ["a", "b"], "active": true}\nResult:\n',
}

// Fixed lengths make every step draft (up to 16 tokens and well past it);
// the tree puts 4 branches in one batch; the rest are what users get.
const MODES = {
  'ngram n16': { mode: 'ngram', adaptive: false, n_max: 16 },
  'ngram n48': { mode: 'ngram', adaptive: false, n_max: 48 },
  'ngram adaptive': { mode: 'ngram' },
  'suffix n16': { mode: 'suffix', adaptive: false, n_max: 16 },
  'draft n16': { mode: 'draft', adaptive: false, n_max: 16, p_min: 0 },
  'ngram+draft n16': { mode: 'ngram+draft', adaptive: false, n_max: 16, p_min: 0 },
  'tree 4x6': { mode: 'draft', adaptive: false, n_max: 6, n_parallel: 4, p_split: 0.02, p_min: 0 },
  'draft adaptive': { mode: 'draft' },
  auto: { mode: 'auto' },
}

/** Token ids, and every token's top probabilities exactly as the engine serialised them. */
function trace(r) {
  return { ids: r.tokens.map((t) => t.id), probs: r.tokens.map((t) => t.probs), legacy: r.result.completion_probabilities }
}

async function expectBitExact(engine, prompt, modes, n_predict) {
  const base = { prompt, n_predict, temperature: 0, n_probs: 3, ignore_eos: true }
  const off = await run(engine, { ...base, speculative: { mode: 'off' } })
  expect(off.tokens).toHaveLength(n_predict)
  expect(off.result.speculative.batch_invariant).toBe(true)
  const want = trace(off)
  let drafted = 0
  // Every mode drafted (a mode that drafted nothing would prove nothing,
  // and the total of several modes could hide it).
  for (const name of modes) {
    const r = await run(engine, { ...base, speculative: MODES[name] })
    // Labelled, so a failure names the mode; toEqual on floats is bitwise
    // here (shortest round-trip decimal of the same f32).
    expect({ mode: name, ...trace(r) }).toEqual({ mode: name, ...want })
    expect(r.result.speculative.batch_invariant).toBe(true)
    expect({ mode: name, drafted: r.result.speculative.n_drafted > 0 }).toEqual({ mode: name, drafted: true })
    drafted += r.result.speculative.n_drafted
  }
  return drafted
}

describe('bit-exact greedy speculation: gemma-3 Q4_K_M as shipped, every mode', () => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: GEMMA, draftModelPath: GEMMA_DRAFT, contextSize: 1024, threads: 2 })
  })
  afterAll(() => engine.dispose())

  test('the self-check passed', () => {
    const s = engine.status()
    expect(s.batchInvariant).toBe(true)
    expect(s.batchInvariance).toMatch(/identical alone and in batches of 2, 4, 8, 16, 33/)
    // The attention kernel alone over long caches (past one 512-cell block, past 4,096 cells).
    expect(s.batchInvariance).toMatch(/attention over 600 and 4200 cells identical alone, batched and on other thread counts/)
  })

  // The code prompt in every mode (npm test: the longest n-gram drafts and
  // the draft model's tree); the others (test:release) in the
  // modes with the longest drafts, the tree and auto.
  test.each(tiers(Object.keys(PROMPTS), ['code'], ['code']))('%s prompt: same tokens and probabilities as mode "off"', async (name) => {
    const n = 64
    const every = matrix(Object.keys(MODES), ['ngram n48', 'tree 4x6'])
    const modes = name === 'code' ? every : ['ngram n48', 'suffix n16', 'draft n16', 'tree 4x6', 'auto']
    const drafted = await expectBitExact(engine, PROMPTS[name], modes, n)
    expect(drafted).toBeGreaterThan(n)
  }, 600000)
})

// Quick: one non-K type beside the shipped K-quant above.
describe.each(
  matrix(
    [
      ['gemma-3 Q5_K_M', model('gemma-3-270m.Q5_K_M.gguf'), GEMMA_DRAFT],
      ['gemma-3 Q6_K', model('gemma-3-270m.Q6_K.gguf'), GEMMA_DRAFT],
      ['gemma-3 Q8_0', model('gemma-3-270m.Q8_0.gguf'), GEMMA_DRAFT],
      ['SmolLM2 Q4_0', model('SmolLM2-135M-Instruct.Q4_0.gguf'), DRAFT],
      ['SmolLM2 Q8_0', model('SmolLM2-135M-Instruct.Q8_0.gguf'), DRAFT],
      ['SmolLM2 Q4_1', TARGET, DRAFT],
      ['SmolLM2 F16', F16, DRAFT],
    ],
    [['SmolLM2 Q4_1', TARGET, DRAFT]],
  ),
)('bit-exact greedy speculation: %s', (_name, target, draft) => {
  // Each type's kernels in verification batches of up to 49 rows (n-grams)
  // and 17 (the suffix tree); every mode, the draft model's among them, is
  // proven on gemma-3 Q4_K_M above. test:release (and npm test's one type)
  // runs the draft model, the tree and auto on each type too.
  const modes = tiers(['ngram n48', 'draft n16', 'tree 4x6', 'auto'], ['ngram n48', 'suffix n16'], ['suffix n16', 'auto'])
  const withDraft = modes.includes('draft n16')
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: target, draftModelPath: withDraft ? draft : undefined, contextSize: 1024, threads: 2 })
  })
  afterAll(() => engine.dispose())

  test(`self-check passed; ${modes.join(', ')} give the same tokens and probabilities as "off"`, async () => {
    expect(engine.status().batchInvariant).toBe(true)
    // Each mode drafted (checked inside); two modes in CI, four in test:release.
    const drafted = await expectBitExact(engine, PROMPTS.code, modes, 64)
    expect(drafted).toBeGreaterThanOrEqual(64)
  }, 600000)
})

// Long caches: the attention kernel's fixed blocks and the split of a
// decode step's cells between threads are exercised past 512 cells (npm test)
// and past 4,096 cells (test:full), with the prompt's words never seen in
// training order, and a passage to repeat so that drafts are long.
function longPrompt(words) {
  const W = 'river stone market bright quietly harbour engine silver winter garden letter orange mountain whisper ancient copper lantern forest gentle thunder velvet ribbon marble candle shadow meadow crystal falcon canyon breeze'.split(' ')
  let x = 12345
  const rnd = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648
  const text = Array.from({ length: words }, () => W[Math.floor(rnd() * W.length)] + (rnd() < 0.1 ? '.' : ''))
  return `${text.join(' ')}\n\nRepeat the last sentence above:\n${text.slice(-40).join(' ')}`
}

// test:full: gemma-3 (K-quants, sliding-window and global attention) past
// 4,096 cells, with n-gram drafts (the target's verification batches over
// the long cache; no draft model to prefill it again); test:release also
// the draft model's drafts, and SmolLM2 there.
describe.each(
  tiers(
    [
      ['SmolLM2 Q4_1, ~4,300-token prompt', TARGET, DRAFT, 3900],
      ['gemma-3 Q4_K_M, ~4,300-token prompt', GEMMA, GEMMA_DRAFT, 3900],
    ],
    [['gemma-3 Q4_K_M, ~4,300-token prompt', GEMMA, GEMMA_DRAFT, 3900]],
    [['SmolLM2 Q4_1, ~1,300-token prompt', TARGET, DRAFT, 1200]],
  ),
)('bit-exact greedy speculation over a long cache: %s', (_name, target, draft, words) => {
  const modes = tiers(['ngram n16', 'draft n16', 'auto'], ['ngram n16', 'auto'], ['ngram n16'])
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: target, draftModelPath: modes.includes('draft n16') ? draft : undefined, contextSize: 8192, threads: 2 })
  })
  afterAll(() => engine.dispose())

  test(`${modes.join(', ')} give the same tokens and probabilities as "off"`, async () => {
    const prompt = longPrompt(words)
    const n = (await engine.tokenize(prompt)).length
    expect(n).toBeGreaterThan(words > 2000 ? 4096 : 512)
    // Each mode drafted (checked inside); several together, past the completion's length.
    const drafted = await expectBitExact(engine, prompt, modes, 48)
    if (modes.length > 1) expect(drafted).toBeGreaterThan(48)
  }, 600000)
})

// Runs `body` (an async function's source, given `LlamaEngine`, `Worker`
// and the fixture paths) in a fresh Node process whose environment is `env`,
// and returns what it printed as JSON. ggml reads GGML_CPU_TILED_MM once per
// process, so these cases cannot share Jest's.
function inChild(body, env = {}) {
  const script = `
    const { Worker } = require('node:worker_threads')
    const { LlamaEngine } = require(${JSON.stringify(ROOT)})
    const [GEMMA, SMOL, PROMPTS, GEMMA_DRAFT] = ${JSON.stringify([GEMMA, TARGET, PROMPTS, GEMMA_DRAFT])}
    const probsOf = (r) => JSON.stringify(r.completion_probabilities)
    ;(async () => { ${body} })().then((out) => console.log(JSON.stringify(out)), (e) => { console.error(e); process.exit(1) })
  `
  const childEnv = { ...process.env, ...env }
  for (const [k, v] of Object.entries(env)) if (v === undefined) delete childEnv[k]
  return JSON.parse(execFileSync(process.execPath, ['-e', script], { env: childEnv, timeout: 300000 }).toString())
}

// The tiled K-quant path and the repacked K-quant layout need AVX2 with FMA:
// every x64 build has them but test:variant's addon on an AVX2 machine
// (`sandybridge`, AVX only; `x64`, SSE2), where the check must not claim them.
const AVX2 = process.arch === 'x64' && !['x64', 'sandybridge'].includes(process.env.LLAMA_ENGINE_CPU_VARIANT ?? '')

describe('the load-time self-check', () => {
  test('proves each weight type\'s kernels and names the fast ones on, the tiled K-quant path among them', () => {
    const out = inChild(
      `
      const gemma = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 1024, threads: 2 })
      const out = { on: gemma.status() }
      await gemma.dispose()
      return out
    `,
      { GGML_CPU_TILED_MM: undefined },
    )
    expect(out.on.batchInvariant).toBe(true)
    expect(out.on.batchInvariance).toMatch(/mat-mul of F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K( \(plain and repacked\))?, Q5_K( \(plain and repacked\))?, Q6_K( \(plain and repacked\))? identical alone, batched and on other thread counts/)
    if (AVX2) {
      expect(out.on.batchInvariance).toMatch(/fast kernels on: .*tiled K-quants \(Q4_K, Q5_K, Q6_K\) from 8 rows/)
      // AVX2 with FMA: Q4_K, Q5_K and Q6_K weights are repacked (patch
      // 0009), and the check proves that layout too.
      for (const t of ['Q4_K', 'Q5_K', 'Q6_K']) expect(out.on.batchInvariance).toContain(`${t} (plain and repacked)`)
      expect(out.on.batchInvariance).toMatch(/repacked Q4_K, Q5_K, Q6_K \(/)
    } else {
      expect(out.on.batchInvariance).not.toMatch(/tiled K-quants|repacked/)
    }
    const off = inChild(`const e = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 1024, threads: 2 }); const s = e.status(); await e.dispose(); return s`, { GGML_CPU_TILED_MM: '0' })
    expect(off.batchInvariant).toBe(true)
    expect(off.batchInvariance).not.toMatch(/tiled K-quants/)
  })

  // test:full (CI): npm test relies on the load-time self-check, which proves the repacked layout at every load.
  const onAvx2 = AVX2 && FULL ? test : test.skip
  onAvx2('repacked Q4_K, Q5_K and Q6_K weights give the same tokens and probabilities as plain ones, alone and in verification batches', () => {
    const body = `
      const probs = []
      let status
      for (const modelPath of MODEL_LIST) {
        const e = await LlamaEngine.load({ modelPath, contextSize: 2048, threads: 2 })
        status = e.status()
        for (const prompt of PROMPT_LIST) {
          const base = { prompt, n_predict: 48, temperature: 0, n_probs: 3, ignore_eos: true, cache_prompt: false }
          probs.push(probsOf(await e.complete({ ...base, speculative: { mode: 'off' } })))
          // fixed 16-token n-gram drafts: verification batches of 2 to 17 rows
          const spec = await e.complete({ ...base, speculative: { mode: 'ngram', adaptive: false, n_max: 16 } })
          probs.push(probsOf(spec), spec.speculative.n_drafted)
        }
        await e.dispose()
      }
      return { probs, status }
    `
    const prompts = tiers(Object.values(PROMPTS), [PROMPTS.repeat], [PROMPTS.repeat])
    // gemma-3 Q4_K_M holds Q4_K and Q6_K weights; Q5_K_M (full matrix) Q5_K too
    const models = matrix([GEMMA, model('gemma-3-270m.Q5_K_M.gguf')], [GEMMA])
    const head = `const PROMPT_LIST = ${JSON.stringify(prompts)}\nconst MODEL_LIST = ${JSON.stringify(models)}\n`
    const repacked = inChild(`${head}${body}`, { LLAMA_ENGINE_REPACK: undefined })
    const plain = inChild(`${head}${body}`, { LLAMA_ENGINE_REPACK: '0' })
    expect(repacked.status.batchInvariance).toMatch(/Q4_K \(plain and repacked\)/)
    expect(repacked.status.batchInvariance).toMatch(/Q6_K \(plain and repacked\)/)
    expect(plain.status.batchInvariance).not.toMatch(/repacked/)
    for (const s of [repacked.status, plain.status]) expect(s.batchInvariant).toBe(true)
    // The same bits with the layout and without it: the repacked kernels
    // compute the plain layout's chain, one row or a batch.
    expect(repacked.probs).toEqual(plain.probs)
    for (let i = 0; i < prompts.length * models.length; i++) expect(repacked.probs[3 * i + 1]).toBe(repacked.probs[3 * i])
    expect(repacked.probs.filter((x) => typeof x === 'number').reduce((a, b) => a + b, 0)).toBeGreaterThan(16)
  }, 600000)

  // An opt-in that gives up exactness: its check runs in the full matrix
  // (npm run test:full, and CI), keeping npm test under ten minutes.
  const onX64Full = AVX2 && FULL ? test : test.skip
  onX64Full('finds the tiled path when a user puts every type on it (GGML_CPU_TILED_MM=all), and the result says so', () => {
    const out = inChild(
      `
      const q2 = await LlamaEngine.load({ modelPath: GEMMA_DRAFT, contextSize: 1024, threads: 2 })
      const gemma = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 1024, threads: 2 })
      const smol = await LlamaEngine.load({ modelPath: SMOL, contextSize: 1024, threads: 2 })
      const differs = []
      let flag
      for (const prompt of Object.values(PROMPTS)) {
        const base = { prompt, n_predict: 64, temperature: 0, n_probs: 3, ignore_eos: true }
        const off = await q2.complete({ ...base, speculative: { mode: 'off' } })
        const spec = await q2.complete({ ...base, speculative: { mode: 'ngram', adaptive: false, n_max: 16 } })
        differs.push(probsOf(off) !== probsOf(spec))
        flag = spec.speculative.batch_invariant
      }
      const out = { q2: q2.status(), gemma: gemma.status(), smol: smol.status(), differs, flag }
      await q2.dispose(); await gemma.dispose(); await smol.dispose()
      return out
    `,
      { GGML_CPU_TILED_MM: 'all' },
    )
    // gemma-3 Q2_K holds Q2_K and Q3_K weights, whose one-row vec_dot sums
    // in another order than the tiled kernel.
    expect(out.q2.batchInvariant).toBe(false)
    expect(out.q2.batchInvariance).toMatch(/^(row \d+ of a batch of \d+ differs from the same token decoded alone|mat-mul: Q[23]_K weights: row \d+ of a batch of \d+)/)
    expect(out.flag).toBe(false)
    // Not a false alarm: speculation really changes the probabilities then,
    // which is what the bit-exact tests above would catch.
    expect(out.differs).toContain(true)
    // Q4_K_M and Q4_1 models hold none of those types: still invariant,
    // and the check names what it found for the others.
    for (const s of [out.gemma, out.smol]) {
      expect(s.batchInvariant).toBe(true)
      expect(s.batchInvariance).toMatch(/not invariant for weight types these models do not hold: Q2_K weights/)
      expect(s.batchInvariance).toMatch(/tiled K-quants from 8 rows for every type/)
    }
  })

  // test:full only: npm test stays under its 10 minutes (CI runs it).
  ;(FULL ? test : test.skip)('holds when a worker thread loads the addon first, and for engines loaded after another one ran', () => {
    const out = inChild(
      `
      const code = \`
        const { parentPort, workerData } = require('node:worker_threads')
        const { LlamaEngine } = require(workerData.root)
        LlamaEngine.load({ modelPath: workerData.model, contextSize: 1024, threads: 2 }).then(async (e) => {
          const base = { prompt: workerData.prompt, n_predict: 48, temperature: 0, n_probs: 3, ignore_eos: true }
          const off = await e.complete({ ...base, speculative: { mode: 'off' } })
          const spec = await e.complete({ ...base, speculative: { mode: 'ngram', adaptive: false, n_max: 16 } })
          parentPort.postMessage({ invariant: e.status().batchInvariant, same: JSON.stringify(off.completion_probabilities) === JSON.stringify(spec.completion_probabilities), drafted: spec.speculative.n_drafted })
          await e.dispose()
        })\`
      const worker = await new Promise((resolve, reject) => {
        const w = new Worker(code, { eval: true, workerData: { root: ${JSON.stringify(ROOT)}, model: GEMMA, prompt: PROMPTS.json } })
        w.once('message', resolve)
        w.once('error', reject)
      })
      const first = await LlamaEngine.load({ modelPath: SMOL, contextSize: 512, threads: 2 })
      await first.complete({ prompt: 'Hello', n_predict: 8 })
      await first.dispose()
      // Another context size than the worker's engine: checked afresh, not
      // the verdict an earlier load with the same settings left.
      // (No file of verdicts: only this process's own are reused.)
      const later = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 768, threads: 2, selfCheckCache: false })
      const laterStatus = later.status()
      await later.dispose()
      const again = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 768, threads: 2, selfCheckCache: false })
      const againStatus = again.status()
      await again.dispose()
      return {
        worker,
        later: laterStatus.batchInvariant,
        laterFresh: !/earlier load/.test(laterStatus.batchInvariance),
        again: againStatus.batchInvariant,
        againReused: /checked at an earlier load of this model with these settings in this process/.test(againStatus.batchInvariance),
      }
    `,
      { GGML_CPU_TILED_MM: undefined },
    )
    expect(out.worker).toEqual({ invariant: true, same: true, drafted: expect.any(Number) })
    expect(out.worker.drafted).toBeGreaterThan(0)
    expect(out.later).toBe(true)
    expect(out.laterFresh).toBe(true)
    // The same model and settings again in this process: the verdict that held is reused.
    expect(out.again).toBe(true)
    expect(out.againReused).toBe(true)
  })
})

// test:full (18 s: five processes).
;(FULL ? describe : describe.skip)('self-check verdicts kept across processes', () => {
  test('the next process with the same model and settings reuses the verdict; a damaged file is checked afresh and replaced', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-verdicts-'))
    const file = path.join(dir, 'self-check.bin')
    const load = (extra = {}) =>
      inChild(`
        const e = await LlamaEngine.load({ modelPath: SMOL, contextSize: 640, threads: 2, selfCheckCache: ${JSON.stringify(file)}, ...${JSON.stringify(extra)} })
        const base = { prompt: PROMPTS.json, n_predict: 32, temperature: 0, n_probs: 3, ignore_eos: true }
        const off = await e.complete({ ...base, speculative: { mode: 'off' } })
        const spec = await e.complete({ ...base, speculative: { mode: 'ngram', adaptive: false, n_max: 16 } })
        const s = e.status()
        await e.dispose()
        return { invariant: s.batchInvariant, how: s.batchInvariance, same: probsOf(off) === probsOf(spec), drafted: spec.speculative.n_drafted }
      `)
    try {
      const first = load()
      expect(first).toMatchObject({ invariant: true, same: true })
      expect(first.how).not.toMatch(/earlier load/)
      expect(fs.existsSync(file)).toBe(true)
      // Another process: the verdict (and its batch costs) from the file; exact as before.
      const second = load()
      expect(second).toMatchObject({ invariant: true, same: true })
      expect(second.how).toContain(`checked at an earlier load of this model with these settings on this machine, kept in ${file}`)
      expect(second.drafted).toBeGreaterThan(0)
      // Other settings: checked afresh.
      expect(load({ contextSize: 768 }).how).not.toMatch(/earlier load/)
      // One byte changed: the file is not trusted, the check runs, the file is written again.
      const bytes = fs.readFileSync(file)
      bytes[bytes.length - 3] ^= 0x20
      fs.writeFileSync(file, bytes)
      const damaged = load()
      expect(damaged).toMatchObject({ invariant: true, same: true })
      expect(damaged.how).not.toMatch(/earlier load/)
      expect(load().how).toMatch(/kept in/)
      // Not a file of verdicts at all, and a directory: the same, no crash.
      fs.writeFileSync(file, 'GGUF not this')
      expect(load().how).not.toMatch(/earlier load/)
      fs.rmSync(file)
      fs.mkdirSync(file)
      expect(load()).toMatchObject({ invariant: true, same: true })
      // selfCheckCache: false reads and writes nothing.
      fs.rmSync(file, { recursive: true })
      load({ selfCheckCache: false })
      expect(fs.existsSync(file)).toBe(false)
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })
})

// The engine computes with one thread instead of all when that is faster
// (a machine busy with other work, crates/core/src/threads.rs): the thread count
// must not change a single bit.
describe.each(matrix([TARGET, GEMMA, F16, model('gemma-3-270m.Q6_K.gguf')], [TARGET]))('%s: one thread and two give the same bits', (file) => {
  test('greedy tokens and probabilities, a prompt prefilled in one batch, then decoded', async () => {
    const request = {
      prompt: 'The history of the lighthouse begins with ' + 'a long prompt prefilled in one batch of many rows. '.repeat(8),
      n_predict: 24,
      temperature: 0,
      n_probs: 5,
      speculative: { mode: 'off' },
    }
    const out = []
    for (const threads of [1, 2]) {
      const engine = await LlamaEngine.load({ modelPath: file, contextSize: 1024, threads })
      try {
        out.push((await engine.complete(request)).completion_probabilities)
      } finally {
        await engine.dispose()
      }
    }
    expect(out[1]).toEqual(out[0])
  })
})
