const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { LlamaEngine, TARGET, DRAFT, GEMMA, matrix, tiers, user, run, releaseTest, fullTest } = require('./helpers')

// A request's input: a chat (rendered with the model's template) or a plain prompt.
const ask = (text) => ({ messages: user(text) })

const PROMPTS = [
  ask('List the planets of the solar system in order.'),
  ask('Write a haiku about autumn leaves.'),
  ask('Explain what a hash table is in two sentences.'),
  ask('Write a JavaScript function that reverses a string.'),
  ask('Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.'),
  ask('What is the capital of Japan? Answer briefly.'),
  { prompt: 'Once upon a time, in a small village by the sea,' },
  { prompt: 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n' },
  ask('Translate to French: good morning, my friend.'),
  ask('Give me three tips for better sleep.'),
]

// Modes that must reproduce plain greedy decoding exactly. Fixed-length
// drafting (adaptive: false) forces drafts on every step, so verification
// is really exercised; the adaptive ones are what users get by default.
const MODES = [
  { mode: 'draft', adaptive: false, n_max: 4 },
  { mode: 'draft', adaptive: false, n_max: 8, p_min: 0 },
  { mode: 'ngram', adaptive: false, n_max: 8 },
  { mode: 'ngram+draft', adaptive: false, n_max: 6 },
  { mode: 'draft', adaptive: false, n_max: 4, n_parallel: 3, p_split: 0.05, p_min: 0 },
  { mode: 'auto' },
]

// The bench's 'code edit' input (read as text).
const CODE = fs.readFileSync(path.join(__dirname, '..', 'bench', 'fixtures', 'summarize-orders.js'), 'utf8').split('\n').slice(1).join('\n').trimEnd()
const LONG_PROMPT = ask(`Rename the variable \`subtotal\` to \`netAmount\` in this JavaScript function and return the whole function.\n\n\`\`\`js\n${CODE}\n\`\`\``)

const N = 40

describe('draft compatibility', () => {
  test('a draft with another vocabulary is rejected with INCOMPATIBLE_DRAFT saying why', async () => {
    const err = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: GEMMA, contextSize: 512 }).catch((e) => e)
    expect(err.code).toBe('INCOMPATIBLE_DRAFT')
    expect(err.message).toMatch(/vocabulary|token|BOS|EOS/)
  })

  test('a missing draft file is MODEL_LOAD_FAILED naming it', async () => {
    await expect(LlamaEngine.load({ modelPath: TARGET, draftModelPath: '/nonexistent/draft.gguf' })).rejects.toMatchObject({
      code: 'MODEL_LOAD_FAILED',
      message: expect.stringContaining('/nonexistent/draft.gguf'),
    })
  })

  test('draft modes without a draft model are INVALID_REQUEST', async () => {
    const e = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512 })
    await expect(e.complete({ prompt: 'x', speculative: { mode: 'draft' } })).rejects.toMatchObject({
      code: 'INVALID_REQUEST',
      message: expect.stringContaining('speculative.mode'),
    })
    await e.dispose()
  })
})

// F16 targets are compared bit for bit (probabilities too, with drafts)
// in exactness.test.js's quantization matrix.
// test:full keeps four of the ten prompts (every mode on each); test:release all.
const IDENTITY_PROMPTS = tiers(PROMPTS.map((p, i) => [i, p]), [0, 3, 6, 9].map((i) => [i, PROMPTS[i]]), [6].map((i) => [i, PROMPTS[i]]))

describe.each([['Q4_1 target + Q2_K draft', TARGET, IDENTITY_PROMPTS]])('greedy identity: %s', (_name, target, prompts) => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: target, draftModelPath: DRAFT, contextSize: 2048, threads: 2 })
  })
  afterAll(() => engine.dispose())

  test.each(prompts)('prompt %i: every mode equals mode "off" token for token', async (_i, input) => {
    const base = { ...input, n_predict: N, temperature: 0, ignore_eos: true }
    const off = await run(engine, { ...base, speculative: { mode: 'off' } })
    const ids = off.tokens.map((t) => t.id)
    expect(off.result.speculative.n_drafted).toBe(0)
    let drafted = 0
    for (const speculative of MODES) {
      const r = await run(engine, { ...base, speculative })
      expect({ mode: speculative, ids: r.tokens.map((t) => t.id) }).toEqual({ mode: speculative, ids })
      expect(r.result.content).toBe(off.result.content)
      drafted += r.result.speculative.n_drafted
    }
    expect(drafted).toBeGreaterThan(0)
  })

  test('identity holds with penalties, logit_bias, a grammar and stop strings', async () => {
    const variants = [
      { ...PROMPTS[0], repeat_penalty: 1.3, repeat_last_n: 32, frequency_penalty: 0.2, presence_penalty: 0.2 },
      { ...PROMPTS[2], logit_bias: [[engine.tokenize(' a')[0], -5], [engine.tokenize(' the')[0], 2]] },
      { ...PROMPTS[5], grammar: 'root ::= [A-Z][a-z]+ (" " [a-z]+)* "."' },
      { ...PROMPTS[4], stop: ['lazy dog. The'] },
    ]
    // npm test: penalties with a stop string on one prompt, a grammar on another.
    for (const v of matrix(variants, [{ ...variants[0], stop: ['.'] }, variants[2]])) {
      const base = { n_predict: N, temperature: 0, ...v }
      const off = await run(engine, { ...base, speculative: { mode: 'off' } })
      for (const speculative of matrix(MODES, [MODES[2], MODES[4]])) {
        const r = await run(engine, { ...base, speculative })
        expect(r.tokens.map((t) => t.id)).toEqual(off.tokens.map((t) => t.id))
        expect(r.result.content).toBe(off.result.content)
        expect(r.result.stopping_word).toBe(off.result.stopping_word)
      }
    }
  })

  // ~300 prompt tokens put the KV cache past 512 cells, where llama.cpp's CPU
  // flash attention (and its repacked / llamafile matrix kernels) would give a
  // position decoded in a batch different rounding from the same position
  // decoded alone, and greedy output flipped at near-ties. The engine is built
  // and configured so that every position's logits are batch-size invariant.
  // test:release: the bit-exact suites (exactness.test.js) prove long
  // drafts over a cache past 512 and 4,096 cells in CI.
  releaseTest('identity holds on a long input-grounded prompt (128 tokens)', async () => {
    const base = { ...LONG_PROMPT, n_predict: 128, temperature: 0, ignore_eos: true, cache_prompt: false }
    expect(engine.tokenize(engine.applyChatTemplate(LONG_PROMPT.messages), { special: true }).length).toBeGreaterThan(256)
    const off = await run(engine, { ...base, speculative: { mode: 'off' } })
    for (const speculative of matrix([MODES[1], MODES[2], MODES[4], MODES[5]], [MODES[2], MODES[4]])) {
      const r = await run(engine, { ...base, speculative })
      expect({ mode: speculative, ids: r.tokens.map((t) => t.id) }).toEqual({ mode: speculative, ids: off.tokens.map((t) => t.id) })
    }
  })
})

describe('events and stats', () => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 2048, threads: 2 })
  })
  afterAll(() => engine.dispose())

  test.each([
    [{ mode: 'draft', adaptive: false, n_max: 5 }],
    [{ mode: 'ngram+draft', adaptive: false, n_max: 6 }],
    [{ mode: 'auto' }],
  ])('per-step counts add up to the result totals (%j)', async (speculative) => {
    const { events, result } = await run(engine, { ...PROMPTS[4], n_predict: 48, temperature: 0, ignore_eos: true, speculative })
    const steps = events.filter((e) => e.type === 'token' && e.tokens.length > 0)
    const s = result.speculative
    expect(steps.reduce((a, e) => a + e.n_drafted, 0)).toBe(s.n_drafted)
    expect(steps.reduce((a, e) => a + e.n_accepted, 0)).toBe(s.n_accepted)
    const drafters = Object.values(s.drafters)
    expect(drafters.reduce((a, d) => a + d.n_drafted, 0)).toBe(s.n_drafted)
    expect(drafters.reduce((a, d) => a + d.n_accepted, 0)).toBe(s.n_accepted)
    // Accepted tokens carry their drafter as source; the rest are the target's.
    const tokens = steps.flatMap((e) => e.tokens)
    expect(tokens.filter((t) => t.source !== 'target').length).toBe(s.n_accepted)
    for (const [name, d] of Object.entries(s.drafters)) {
      expect(tokens.filter((t) => t.source === name).length).toBe(d.n_accepted)
    }
    // A step has at most n_accepted + 1 tokens; each step after the first is one target pass.
    for (const e of steps) {
      expect(e.n_accepted).toBeLessThanOrEqual(e.n_drafted)
      expect(e.tokens.length).toBeLessThanOrEqual(e.n_accepted + 1)
    }
    expect(s.target_passes).toBe(steps.length - 1)
    expect(result.tokens_predicted).toBe(tokens.length)
    expect(s.acceptance_rate).toBeCloseTo(s.n_drafted ? s.n_accepted / s.n_drafted : 0, 10)
    expect(s.mode).toBe(speculative.mode)
    expect(s.draft_ms).toBeGreaterThanOrEqual(0)
  })
})

describe('sampling with a seed: the same output with or without drafting, from the target distribution', () => {
  // The target's distribution is tilted away from the draft's with
  // logit_bias (the draft does not see it), so drafts are often wrong.
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 1024, threads: 2 })
  })
  afterAll(() => engine.dispose())

  // Upper 0.1 % point of chi-square via the Wilson–Hilferty approximation.
  const chiCritical = (df) => df * (1 - 2 / (9 * df) + 3.09 * Math.sqrt(2 / (9 * df))) ** 3

  const prompt = ask('Name a color.')
  const ARMS = [
    ['draft', { mode: 'draft', adaptive: false, n_max: 3, p_min: 0 }],
    ['tree', { mode: 'draft', adaptive: false, n_max: 3, p_min: 0, n_parallel: 3, p_split: 0.05 }],
    ['ngram+draft', { mode: 'ngram+draft', adaptive: false, n_max: 4, p_min: 0 }],
    ['suffix+draft', { mode: 'suffix+draft', adaptive: false, n_max: 4, p_min: 0 }],
  ]
  const favourite = async () => (await run(engine, { ...prompt, n_predict: 1, temperature: 0 })).tokens[0].id
  const sampling = async () => ({ ...prompt, temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, ignore_eos: true, logit_bias: [[await favourite(), -2]] })

  // Every arm drafts and verifies with the same seeds as plain sampling.
  const SEEDS = tiers(40, 12, 6)
  test(`every seed gives the same tokens drafted (chain, tree, n-grams) as plain (${SEEDS} seeds)`, async () => {
    const base = { ...(await sampling()), n_predict: 6 }
    const drafted = {}
    const accepted = {}
    for (let seed = 1; seed <= SEEDS; seed++) {
      const plain = await run(engine, { ...base, seed, speculative: { mode: 'off' } })
      const ids = plain.tokens.map((t) => t.id)
      for (const [name, speculative] of ARMS) {
        const r = await run(engine, { ...base, seed, speculative })
        expect({ seed, name, ids: r.tokens.map((t) => t.id) }).toEqual({ seed, name, ids })
        drafted[name] = (drafted[name] || 0) + r.result.speculative.n_drafted
        accepted[name] = (accepted[name] || 0) + r.result.speculative.n_accepted
      }
    }
    for (const [name] of ARMS) {
      // Drafts were really verified: some accepted, some rejected.
      expect({ name, accepted: accepted[name] > 0, rejected: accepted[name] < drafted[name] }).toEqual({ name, accepted: true, rejected: true })
    }
  }, 900000)

  // The seeded sampler itself follows the distribution the engine reports
  // (the arms above give its tokens seed for seed): goodness of fit of the
  // first token against the target's own top-40 probabilities, the rest
  // pooled. One token per seed, so 300 seeds are cheap (9 s: test:full;
  // npm test keeps the seeds' identity with and without drafting).
  const FIT_SEEDS = 300
  fullTest(`first tokens follow the reported probabilities (chi-square at 0.1 %, ${FIT_SEEDS} seeds)`, async () => {
    const base = { ...(await sampling()), n_predict: 1, n_probs: 40, speculative: { mode: 'off' } }
    const firsts = new Map()
    let probs = null
    for (let seed = 1; seed <= FIT_SEEDS; seed++) {
      const { tokens } = await run(engine, { ...base, seed })
      firsts.set(tokens[0].id, (firsts.get(tokens[0].id) || 0) + 1)
      // The same distribution for every seed.
      if (probs) expect(tokens[0].probs).toEqual(probs)
      probs = tokens[0].probs
    }
    let chi = 0
    let cells = 0
    let restObserved = FIT_SEEDS
    let restExpected = FIT_SEEDS
    for (const { id, prob } of probs) {
      const expected = prob * FIT_SEEDS
      const observed = firsts.get(id) || 0
      if (expected < 5) continue
      chi += (observed - expected) ** 2 / expected
      cells++
      restObserved -= observed
      restExpected -= expected
    }
    if (restExpected >= 5) {
      chi += (restObserved - restExpected) ** 2 / restExpected
      cells++
    }
    expect(cells).toBeGreaterThan(2)
    expect(chi).toBeLessThan(chiCritical(cells - 1))
  }, 900000)
})

describe('n-gram caches', () => {
  const question = ask('Describe the water cycle in a few sentences.')
  const similar = ask('Describe the water cycle in a few sentences, please.')
  const req = (input) => ({ ...input, n_predict: 64, temperature: 0, ignore_eos: true, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } })
  const load = (extra = {}) => LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, threads: 2, ...extra })

  test('the dynamic cache raises acceptance on a second, similar request; it saves and loads', async () => {
    const cold = await load()
    const coldRun = await run(cold, req(similar))
    await cold.dispose()

    const warm = await load()
    // The dynamic cache drafts with llama.cpp's strict thresholds (an n-gram
    // seen at least twice), so it learns from two runs of the question.
    await run(warm, req(question))
    await run(warm, req(question))
    const warmRun = await run(warm, req(similar))
    expect(warmRun.result.speculative.n_accepted).toBeGreaterThan(coldRun.result.speculative.n_accepted)
    expect(warmRun.result.content).toBe(coldRun.result.content)

    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'le-ngram-'))
    const file = path.join(dir, 'dynamic.bin')
    await warm.saveNgramCache(file)
    const entries = warm.status().ngramCache.dynamicEntries
    expect(entries).toBeGreaterThan(0)
    expect(fs.statSync(file).size).toBeGreaterThan(0)
    await warm.dispose()

    // Loaded back through the public API, it drafts like the warm engine.
    const reloaded = await load({ ngramCachePath: file })
    expect(reloaded.status().ngramCache).toMatchObject({ dynamicEntries: entries, errors: [] })
    const again = await run(reloaded, req(similar))
    expect(again.result.speculative.n_accepted).toBeGreaterThan(coldRun.result.speculative.n_accepted)
    await reloaded.saveNgramCache() // to ngramCachePath
    await reloaded.dispose()

    // The same file works as a read-only static cache.
    const withStatic = await load({ staticNgramCachePath: file })
    expect(withStatic.status().ngramCache.staticEntries).toBe(entries)
    const s = await run(withStatic, req(similar))
    expect(s.result.content).toBe(coldRun.result.content)
    await withStatic.dispose()
  })

  test('the suffix drafter copies an earlier request\'s output: identical to "off", most of it drafted; suffixCacheTokens 0 keeps none', async () => {
    const suffix = (input) => ({ ...input, n_predict: 48, temperature: 0, ignore_eos: true, speculative: { mode: 'suffix', adaptive: false, n_max: 8 } })
    const engine = await load()
    const off = await run(engine, { ...suffix(question), speculative: { mode: 'off' } })
    const first = await run(engine, suffix(question))
    const second = await run(engine, suffix(question))
    await engine.dispose()
    for (const r of [first, second]) expect(r.tokens.map((t) => t.id)).toEqual(off.tokens.map((t) => t.id))
    // The second request finds the first one's whole output in the shared index.
    expect(second.result.speculative.drafters.suffix.n_accepted).toBeGreaterThan(32)
    expect(second.result.speculative.n_accepted).toBeGreaterThan(first.result.speculative.n_accepted)
    expect(second.tokens.filter((t) => t.source === 'suffix').length).toBe(second.result.speculative.n_accepted)

    const forgetful = await load({ suffixCacheTokens: 0 })
    await run(forgetful, suffix(question))
    const again = await run(forgetful, suffix(question))
    await forgetful.dispose()
    expect(again.result.speculative.n_accepted).toBe(first.result.speculative.n_accepted)
    expect(again.tokens.map((t) => t.id)).toEqual(off.tokens.map((t) => t.id))
  })

  // test:full (CI); npm test keeps the suffix drafter's copy above.
  fullTest('suffix namespaces keep agents apart; the store is saved atomically, loaded back, and refused when damaged or of another vocabulary', async () => {
    const suffix = (input, namespace) => ({
      ...input,
      n_predict: 48,
      temperature: 0,
      ignore_eos: true,
      speculative: { mode: 'suffix', adaptive: false, n_max: 8, ...(namespace == null ? {} : { namespace }) },
    })
    const ids = (r) => r.tokens.map((t) => t.id)
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'le-suffix-'))
    const file = path.join(dir, 'agents.suffix')
    const engine = await load({ suffixCachePath: file }) // not there yet: starts empty
    expect(engine.status().suffixCache).toEqual({ tokens: 0, outputs: 0, namespaces: 0, limitTokens: 262144, errors: [] })
    const off = await run(engine, { ...suffix(question), speculative: { mode: 'off' } })
    const first = await run(engine, suffix(question, 'agent-a'))
    // Another namespace does not see agent-a's output; agent-a does.
    const other = await run(engine, suffix(question, 'agent-b'))
    const again = await run(engine, suffix(question, 'agent-a'))
    for (const r of [first, other, again]) expect(ids(r)).toEqual(ids(off))
    expect(other.result.speculative.n_accepted).toBe(first.result.speculative.n_accepted)
    expect(again.result.speculative.drafters.suffix.n_accepted).toBeGreaterThan(32)
    const kept = engine.status().suffixCache
    expect(kept).toMatchObject({ outputs: 3, namespaces: 2, errors: [] })
    expect(await engine.saveSuffixCache()).toBe(kept.tokens) // to suffixCachePath
    expect(fs.readdirSync(dir)).toEqual(['agents.suffix']) // no temporary file left
    await engine.dispose()

    // Loaded back, with agent-a as the engine's namespace: the first request already copies.
    const reloaded = await load({ suffixCachePath: file, suffixNamespace: 'agent-a' })
    expect(reloaded.status().suffixCache).toEqual(kept)
    const warm = await run(reloaded, suffix(question))
    expect(ids(warm)).toEqual(ids(off))
    expect(warm.result.speculative.drafters.suffix.n_accepted).toBeGreaterThan(32)
    await expect(reloaded.complete(suffix(question, 'x'.repeat(129)))).rejects.toMatchObject({
      code: 'INVALID_REQUEST',
      message: expect.stringContaining('speculative.namespace'),
    })
    await reloaded.dispose()

    // One flipped byte: reported, the engine starts empty and decodes as before.
    const bytes = fs.readFileSync(file)
    bytes[bytes.length - 40] ^= 0x10
    const damaged = path.join(dir, 'damaged.suffix')
    fs.writeFileSync(damaged, bytes)
    const e = await load({ suffixCachePath: damaged, suffixNamespace: 'agent-a' })
    expect(e.status().suffixCache).toMatchObject({ tokens: 0, errors: [expect.stringMatching(/^suffixCachePath: .*(checksum|outside the vocabulary)/)] })
    const fresh = await run(e, suffix(question))
    expect(ids(fresh)).toEqual(ids(off))
    expect(fresh.result.speculative.n_accepted).toBe(first.result.speculative.n_accepted)
    await e.dispose()

    // Another model's vocabulary: refused by name.
    const gemma = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 512, threads: 2, suffixCachePath: file })
    expect(gemma.status().suffixCache.errors).toEqual([expect.stringMatching(/another vocabulary/)])
    await gemma.dispose()
    await expect(load({ suffixNamespace: 7 })).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('suffixNamespace') })
    fs.rmSync(dir, { recursive: true })
  })

  test('fuzz: mutated suffix cache files loaded in a child process — each read whole or reported, none crashes', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'le-suffix-fuzz-'))
    const file = path.join(dir, 'valid.suffix')
    const e = await load({ suffixCachePath: file })
    await run(e, { ...question, n_predict: 24, temperature: 0, speculative: { mode: 'suffix' } })
    await run(e, { ...question, n_predict: 24, temperature: 0, speculative: { mode: 'suffix', namespace: 'b' } })
    await e.saveSuffixCache()
    await e.dispose()
    const valid = fs.readFileSync(file)
    // Cut, bit-flipped, a byte inserted, a word set to 0xffffffff (a huge count or length).
    let x = 20261127
    const rand = (n) => {
      x = (x * 1103515245 + 12345) >>> 0
      return x % n
    }
    const count = tiers(60, 20, 4)
    for (let i = 0; i < count; i++) {
      let b = Buffer.from(valid)
      const at = rand(b.length)
      switch (i % 4) {
        case 0: b = b.subarray(0, at); break
        case 1: b[at] ^= 1 << rand(8); break
        case 2: b = Buffer.concat([b.subarray(0, at), Buffer.from([rand(256)]), b.subarray(at)]); break
        default: b.writeUInt32LE(0xffffffff, Math.min(at & ~3, b.length - 4))
      }
      fs.writeFileSync(path.join(dir, `f${String(i).padStart(3, '0')}.suffix`), b)
    }
    const script = `
      const fs = require('node:fs'), path = require('node:path');
      const { LlamaEngine } = require(${JSON.stringify(path.join(__dirname, '..'))});
      (async () => {
        const seen = { read: 0, reported: 0, other: [] };
        for (const f of fs.readdirSync(${JSON.stringify(dir)}).filter((f) => f.startsWith('f')).sort()) {
          const e = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 256, threads: 2, parallel: 1, promptCacheMB: 0, suffixCachePath: path.join(${JSON.stringify(dir)}, f) });
          const s = e.status().suffixCache;
          if (s.errors.length === 0) seen.read++;
          else if (s.errors.length === 1 && /^suffixCachePath: suffix cache: /.test(s.errors[0]) && s.tokens === 0) seen.reported++;
          else seen.other.push(s);
          await e.complete({ prompt: 'The sky is', n_predict: 4, temperature: 0, speculative: { mode: 'suffix' } });
          await e.dispose();
        }
        console.log(JSON.stringify(seen));
      })();`
    const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { timeout: 540_000 }).toString().trim().split('\n').at(-1))
    expect(out.other).toEqual([])
    expect(out.read + out.reported).toBe(count)
    // Every mutation but one that leaves the bytes as they were is caught (the checksum).
    expect(out.reported).toBeGreaterThanOrEqual(count - 1)
    fs.rmSync(dir, { recursive: true })
  }, 600_000)

  test('a corrupt cache file is reported and the engine works without it', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'le-ngram-'))
    const bad = path.join(dir, 'bad.bin')
    fs.writeFileSync(bad, Buffer.from([1, 0, 0, 0, 2, 0, 0])) // cut mid-record
    const e = await load({ ngramCachePath: bad, staticNgramCachePath: bad })
    const errors = e.status().ngramCache.errors
    expect(errors).toHaveLength(2)
    expect(errors[0]).toMatch(/ngramCachePath/)
    const r = await run(e, req(question))
    expect(r.result.tokens_predicted).toBe(64)
    await e.dispose()
  })

  test('saveNgramCache without a path or configured file is INVALID_REQUEST', async () => {
    const e = await load()
    await expect(e.saveNgramCache()).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
    await expect(e.saveSuffixCache()).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('suffixCachePath') })
    await e.dispose()
  })
})
