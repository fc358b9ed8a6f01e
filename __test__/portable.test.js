// determinism: 'portable' — the same tokens and probabilities on every CPU.
//
// One golden file (fixtures/portable-golden.json), written on the reference
// machine, holds what portable mode computes: for fixed greedy and seeded
// completions (SmolLM2 Q4_1, gemma-3 Q4_K_M and, in test:full, every other
// fixture quantization) the token ids and the f32 bits of their top
// probabilities, an embedding's bits, and a digest of every portable kernel
// on fixed inputs (every weight type, exp/silu/gelu/…, softmax, RMS norm,
// RoPE). This suite compares what this machine computes with it:
// `npm test` on this build (the native one), `npm run test:variant` again
// under every x86-64 CPU variant this machine can run
// (LLAMA_ENGINE_CPU_VARIANT: baseline SSE2, AVX, AVX2, AVX-512, VNNI…), and
// `npm run test:platforms -- --portable` under qemu-aarch64 and wine
// (scripts/portable-platform-checks.cjs, with the same cases). A mismatch names
// the variant, the case or kernel, and the first differing position.
//
// Regenerate the golden file (after changing a portable kernel, on purpose):
//   LLAMA_ENGINE_WRITE_GOLDEN=1 npx jest __test__/portable.test.js
// Also here: portable mode's guarantees that are not about other machines —
// speculation identical to `off`, parallel slots identical to alone, the
// prefix cache, validation, a model with a weight type it does not cover.
const fs = require('node:fs')
const path = require('node:path')
const { LlamaEngine, TARGET, DRAFT, FULL, model, run } = require('./helpers')
const { binding } = require('../lib/addon/native.js')

const GOLDEN_FILE = path.join(__dirname, 'fixtures', 'portable-golden.json')
const WRITE = process.env.LLAMA_ENGINE_WRITE_GOLDEN === '1'
const VARIANT = process.env.LLAMA_ENGINE_CPU_VARIANT || 'this build'
const golden = WRITE || !fs.existsSync(GOLDEN_FILE) ? { digests: {}, cases: {} } : JSON.parse(fs.readFileSync(GOLDEN_FILE, 'utf8'))
const written = { digests: {}, cases: {} }

const { PROMPT, STORY, EMBED, greedy, seeded, QUICK, VARIANT: VARIANT_CASES, FULL: FULL_CASES, LORA, loadOptions, bits, trace, firstDifference, firstDifferingValue, differingOps } = require('./portable-cases')

// `npm test` (the native build): SmolLM2; under a forced CPU variant
// (test:variant) and in test:full also gemma-3 and speculation; in
// test:full every other fixture quantization too (the cases:
// portable-cases.js, shared with the arm64 and Windows checks).
const ON_VARIANT = FULL || WRITE || Boolean(process.env.LLAMA_ENGINE_CPU_VARIANT)
const variantOrFull = ON_VARIANT ? test : test.skip
const CASES = [...QUICK, ...(ON_VARIANT ? VARIANT_CASES : []), ...(FULL || WRITE ? FULL_CASES : [])].map(([name, file, request]) => [name, model(file), request])

const engines = new Map()
async function portable(modelPath, extra = {}) {
  const key = modelPath + JSON.stringify(extra)
  if (!engines.has(key)) engines.set(key, await LlamaEngine.load({ ...loadOptions(modelPath), ...extra }))
  return engines.get(key)
}

afterAll(async () => {
  for (const e of engines.values()) await e.dispose()
  if (WRITE) fs.writeFileSync(GOLDEN_FILE, `${JSON.stringify({ ...written, note: 'determinism: portable, written by __test__/portable.test.js (LLAMA_ENGINE_WRITE_GOLDEN=1)' }, null, 1)}\n`)
})

describe(`the golden file, on ${VARIANT}`, () => {
  test('every portable kernel computes the reference bits (a digest per op on fixed inputs)', () => {
    const d = binding.portableDigest()
    expect(Object.keys(d.ops).length).toBeGreaterThanOrEqual(25)
    written.digests = d.ops
    if (WRITE) return
    expect({ variant: VARIANT, differingOps: differingOps(d.ops, golden.digests) }).toEqual({ variant: VARIANT, differingOps: [] })
    // the engine's own reference (its load-time self-check) agrees
    expect(d.mismatches).toEqual([])
  })

  test.each(CASES)('%s: the token ids and probability bits of the golden file', async (name, modelPath, request) => {
    const engine = await portable(modelPath, request.lora ? { loras: loadOptions(modelPath, model(LORA)).loras } : {})
    const st = engine.status()
    expect(st.determinism).toBe('portable')
    expect({ batchInvariant: st.batchInvariant, why: st.batchInvariant ? '' : st.batchInvariance }).toEqual({ batchInvariant: true, why: '' })
    const r = await run(engine, request)
    const got = trace(r.tokens)
    // (a JSON schema ends the answer when the object is complete)
    expect(got.length).toBe(request.json_schema ? Math.min(got.length, request.n_predict) : request.n_predict)
    expect(got.length).toBeGreaterThan(request.json_schema ? 4 : 0)
    written.cases[name] = got
    if (WRITE) return
    expect(golden.cases[name]).toBeDefined()
    expect({ variant: VARIANT, case: name, difference: firstDifference(got, golden.cases[name]) }).toEqual({ variant: VARIANT, case: name, difference: null })
  })

  test('an embedding: the bits of its vector', async () => {
    const engine = await portable(TARGET)
    const { embeddings } = await engine.embed(EMBED)
    const vec = Array.from(embeddings[0], bits)
    expect(vec.length).toBe(engine.status().embeddingSize)
    written.cases.embedding = vec
    if (WRITE) return
    expect({ variant: VARIANT, firstDifferingValue: firstDifferingValue(vec, golden.cases.embedding) }).toEqual({ variant: VARIANT, firstDifferingValue: -1 })
  })
})

describe('portable mode keeps the engine’s guarantees', () => {
  variantOrFull('speculation gives what mode off gives, token and probability bits (n-gram, a draft model)', async () => {
    const engine = await portable(TARGET, { draftModelPath: model('SmolLM2-135M-Instruct.Q8_0.gguf') })
    const passage = 'Repeat the passage word for word.\n\nThe keeper climbed the stairs at dusk, carrying a lantern and a notebook.\n\nPassage:\n'
    const base = { prompt: passage, n_predict: 32, temperature: 0, n_probs: 2, ignore_eos: true }
    const off = trace((await run(engine, { ...base, speculative: { mode: 'off' } })).tokens)
    let drafted = 0
    for (const speculative of [{ mode: 'ngram', adaptive: false, n_max: 16 }, { mode: 'draft', adaptive: false, n_max: 8, p_min: 0 }]) {
      const r = await run(engine, { ...base, speculative })
      expect({ mode: speculative.mode, difference: firstDifference(trace(r.tokens), off) }).toEqual({ mode: speculative.mode, difference: null })
      drafted += r.result.speculative.n_drafted
    }
    expect(drafted).toBeGreaterThan(0)
  })

  test('two requests decoded together give what each gives alone; a repeated prompt (prefix cache) too', async () => {
    const engine = await portable(TARGET)
    const a = greedy(PROMPT, 16)
    const b = seeded(STORY, 16)
    const alone = [trace((await run(engine, a)).tokens), trace((await run(engine, b)).tokens)]
    const together = await Promise.all([run(engine, a), run(engine, b)])
    expect(together.map((r) => trace(r.tokens))).toEqual(alone)
    const again = await run(engine, a)
    expect(again.result.tokens_cached).toBeGreaterThan(0)
    expect(trace(again.tokens)).toEqual(alone[0])
  })

  test('a session saved in portable mode continues as computing it does; one of the default mode is refused', async () => {
    const os = require('node:os')
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'portable-session-'))
    try {
      const engine = await portable(TARGET)
      const conversation = { prompt: `${PROMPT}, told in a long story. ${STORY}` }
      const next = { prompt: `${conversation.prompt} The`, n_predict: 12, temperature: 0, n_probs: 2 }
      const want = trace((await run(engine, { ...next, cache_prompt: false })).tokens)
      const file = path.join(dir, 'p.session')
      const saved = await engine.saveSession(file, conversation)
      const other = await LlamaEngine.load({ modelPath: TARGET, determinism: 'portable', contextSize: 1024, threads: 2, parallel: 1 })
      try {
        expect(await other.loadSession(file)).toMatchObject({ tokens: saved.tokens, exact: true })
        const r = await run(other, next)
        expect(r.result.tokens_cached).toBe(saved.tokens)
        expect(trace(r.tokens)).toEqual(want)
      } finally {
        await other.dispose()
      }
      const def = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, threads: 2, parallel: 1 })
      try {
        await def.saveSession(path.join(dir, 'd.session'), conversation)
      } finally {
        await def.dispose()
      }
      const err = await engine.loadSession(path.join(dir, 'd.session')).then(() => null, (e) => e)
      expect(err && err.code).toBe('INVALID_SESSION')
      expect(err.message).toMatch(/portable|flash attention/)
    } finally {
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  test('the options: determinism is checked, GPU layers and RPC workers are refused with it', async () => {
    const fail = (opts) => LlamaEngine.load({ modelPath: TARGET, ...opts }).then(
      () => null,
      (e) => ({ code: e.code, field: /^(\w+)/.exec(e.message)?.[1] }),
    )
    expect(await fail({ determinism: 'exact' })).toEqual({ code: 'INVALID_REQUEST', field: 'determinism' })
    expect(await fail({ determinism: 'portable', gpuLayers: 1 })).toEqual({ code: 'INVALID_REQUEST', field: 'gpuLayers' })
    expect(await fail({ determinism: 'portable', rpc: ['127.0.0.1:50052'], isolation: 'process' })).toEqual({ code: 'INVALID_REQUEST', field: 'rpc' })
    const def = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, threads: 2 })
    expect(def.status().determinism).toBe('default')
    await def.dispose()
  })

  test('--portable on the command line and serve is determinism: portable', async () => {
    const { pathToFileURL } = require('node:url')
    const vm = require('node:vm')
    const load = new vm.Script('(url) => import(url)', { importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER }).runInThisContext()
    const { parseServe, parseCli } = await load(pathToFileURL(path.join(__dirname, '..', 'bin', 'llama-engine.mjs')).href)
    expect(parseCli(['--portable', '--prompt', 'x'], {}).load.determinism).toBe('portable')
    expect(parseCli(['--prompt', 'x'], {}).load.determinism).toBeUndefined()
    expect(parseServe(['--portable'], {}).load.determinism).toBe('portable')
  })

  test('a model with a weight type the portable kernels do not cover fails to load, naming it', async () => {
    // SmolLM2 Q2_K: its Q2_K mat-muls have no portable kernel
    const e = await LlamaEngine.load({ modelPath: DRAFT, determinism: 'portable', contextSize: 512, threads: 2 }).catch((err) => err)
    expect(e && e.code).toBe('MODEL_LOAD_FAILED')
    expect(e.message).toMatch(/portable.*products with Q[23]_K/)
  })
})
