// Issue 6: hostile input, context limits and lifecycle races never abort the
// process, hang, or lose text. (Request parsing is also fuzzed without a model
// by `cargo test`: crates/core/src/request/fuzz.rs.)
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { LlamaEngine, TARGET, DRAFT, GEMMA, matrix, user, run, loadTarget, fullTest } = require('./helpers')

const ROOT = path.join(__dirname, '..')
const N_VOCAB = 49152

/** xorshift32: reproducible test input. */
function rng(seed) {
  let s = seed >>> 0 || 1
  return () => {
    s ^= s << 13; s >>>= 0
    s ^= s >>> 17
    s ^= s << 5; s >>>= 0
    return s / 2 ** 32
  }
}

function hostileRequests(count, seed) {
  const r = rng(seed)
  const pick = (xs) => xs[Math.floor(r() * xs.length)]
  const numbers = [0, -1, 1, 2, 0.5, -0.5, 1e9, -1e9, 2 ** 31, 2 ** 32, 2 ** 53, -(2 ** 53), 1e308, -1e308,
    Number.MAX_VALUE, Number.MIN_VALUE, NaN, Infinity, -Infinity, N_VOCAB - 1, N_VOCAB, 64, 65, 256, 257]
  const values = () => pick([
    pick(numbers), pick(numbers), pick(numbers), null, true, false, '', 'x', '5', [], {}, [pick(numbers)],
    { a: 1 }, '\ud800', 'a'.repeat(2000), [[[[1]]]],
  ])
  const grammars = ['root ::= [', 'root ::= missing', 'root ::= root "a"', 'root ::= "a" | ', '', 'root ::= "\\x"',
    'root ::= [a-z]{2,1}', 'root ::= "yes" | "no"', 'root ::= ("a" root)?', '  ', 'x ::= "a"',
    // Accepted by llama.cpp's parser but unbounded in memory or stack: caught before it.
    'root ::= "a"{0,9999999}', `root ::= ${'('.repeat(5000)}"a"${')'.repeat(5000)}`,
    Array.from({ length: 3000 }, (_, i) => `r${i} ::= r${i + 1}`).join('\n') + '\nr3000 ::= "z"\nroot ::= r0']
  const schemas = [{ type: 'nonsense' }, { $ref: '#/nope' }, { type: 'string', pattern: '(' }, { type: 'object' },
    { enum: [] }, true, false, { anyOf: [] }, { type: 'integer', minimum: 5, maximum: 1 }, { oneOf: [{ type: 'null' }] },
    { type: 'array', minItems: 1000000 }, { type: 'string', minLength: 5, maxLength: 2 }, { type: 'array', items: { type: 'string' }, maxItems: 3 }]
  const prompts = () => pick([
    'Hi', '', ' ', 'Name a colour.', 'Once upon a time', 'Count to five.', [1, 2, 3], [-1], [N_VOCAB], [N_VOCAB - 1], [1.5], ['a', 7, 'b'],
    // Byte-level tokens whose text is not valid UTF-8 on its own.
    [49000, 48999, 120, 28], '\ud800\udc00', '\u0000\u0000', 'é'.repeat(300), [[1]], { text: 'x' },
  ])
  const spec = () => pick([
    undefined, { mode: pick(['off', 'auto', 'ngram', 'draft', 'ngram+draft', 'nope', 5]) },
    { mode: 'ngram', n_max: pick(numbers), n_min: pick(numbers) }, { n_parallel: pick(numbers), p_split: pick(numbers) },
    { p_min: pick(numbers) }, { adaptive: pick([true, false, 'yes']) }, 'auto', [],
  ])
  const out = []
  for (let i = 0; i < count; i++) {
    const req = { prompt: prompts(), n_predict: pick([1, 2, 3, 4, -5, 'x', 4, 3, 2, 1]), temperature: pick([0, 0.8, 2, -1, 1e30]) }
    const fields = ['top_k', 'top_p', 'min_p', 'typical_p', 'repeat_last_n', 'repeat_penalty', 'presence_penalty',
      'frequency_penalty', 'mirostat', 'mirostat_tau', 'mirostat_eta', 'seed', 'n_keep', 'n_probs', 'cache_prompt',
      'ignore_eos', 'stop', 'logit_bias']
    const n = r() < 0.5 ? 0 : 1 + Math.floor(r() * 3)
    for (let k = 0; k < n; k++) req[pick(fields)] = values()
    if (r() < 0.25) req.logit_bias = pick([[[pick(numbers), pick(numbers)]], { [pick(numbers)]: false }, [[5, false]], [[1, 'x']]])
    if (r() < 0.15) req.grammar = pick(grammars)
    else if (r() < 0.15) req.json_schema = pick(schemas)
    if (r() < 0.3) req.speculative = spec()
    out.push(req)
  }
  return out
}

const streamedText = (events) => events.filter((e) => e.type === 'token').map((e) => e.content).join('')

describe('hostile requests', () => {
  let engine
  let reference
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 512, threads: 2 })
    reference = (await engine.complete({ messages: user('Say hello.'), n_predict: 12, temperature: 0 })).content
  })
  afterAll(() => engine.dispose())

  const N = matrix(300, 150)
  test(`${N} generated requests are each served or rejected INVALID_REQUEST`, async () => {
    const outcomes = { served: 0, rejected: 0 }
    for (const req of hostileRequests(N, 20261122)) {
      const events = []
      let result
      let error
      try {
        result = await engine.complete(req, (e) => events.push(e))
      } catch (err) {
        error = err
      }
      if (error) {
        outcomes.rejected++
        expect({ req, code: error.code }).toEqual({ req, code: 'INVALID_REQUEST' })
        expect(error.message).toMatch(/^[A-Za-z_.[\]0-9]+: /)
        // The field it names is data too (JSON schema keywords are camelCase).
        if (error.field !== undefined) expect(error.message.startsWith(`${error.field}: `)).toBe(true)
        expect(events).toEqual([])
      } else {
        outcomes.served++
        // A served request streamed exactly what it returned.
        expect(streamedText(events)).toBe(result.content)
        expect(events.at(-1).type).toBe('done')
        expect(result.content).not.toMatch(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/)
      }
    }
    // Both branches are exercised, so the generator is doing its job.
    expect(outcomes.served).toBeGreaterThan(N / 10)
    expect(outcomes.rejected).toBeGreaterThan(N / 10)
    const after = await engine.complete({ messages: user('Say hello.'), n_predict: 12, temperature: 0 })
    expect(after.content).toBe(reference)
  })

  test('a 1 MB prompt is served (truncated to the context); token ids out of range are rejected', async () => {
    const big = await engine.complete({ prompt: 'lorem ipsum '.repeat(90000), n_predict: 2, temperature: 0 })
    expect(big.truncated).toBe(true)
    for (const prompt of [[N_VOCAB], [-1], [2 ** 31], ['x', 1e12]]) {
      await expect(engine.complete({ prompt })).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^prompt/) })
    }
    await expect(engine.complete({ prompt: 'x', logit_bias: [[N_VOCAB, 1]] })).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
  })

  test('token arrays that decode to invalid UTF-8 stream replacement characters, never broken strings', async () => {
    // Every single-byte token of the byte-level vocabulary, one by one.
    const bytes = []
    for (let id = 0; id < N_VOCAB && bytes.length < 40; id++) {
      const text = engine.detokenize([id])
      if (text === '\ufffd') bytes.push(id)
    }
    expect(bytes.length).toBeGreaterThan(10)
    const r = await engine.complete({ prompt: bytes, n_predict: 4, temperature: 0 })
    expect(typeof r.content).toBe('string')
    // Forcing a lone continuation byte as output: logit_bias makes the model emit it.
    const forced = await run(engine, { prompt: 'Hi', n_predict: 3, temperature: 0, logit_bias: [[bytes[0], 100]] })
    expect(forced.result.content).toContain('\ufffd')
    expect(streamedText(forced.events)).toBe(forced.result.content)
  })

  test('a grammar that only allows the end of turn, with ignore_eos, ends the request instead of hanging', async () => {
    const r = await engine.complete({ prompt: 'Hi', grammar: 'root ::= "a"', ignore_eos: true, n_predict: 8, temperature: 0 })
    expect(r.content).toBe('a')
    const r2 = await engine.complete({ prompt: 'Hi', grammar: 'root ::= "a"', ignore_eos: true, n_predict: 8, temperature: 0.9, seed: 1 })
    expect(r2.content).toBe('a')
  })
})

describe('context limits', () => {
  let engine
  // Rendered with the model's chat template: the prompt text is what the
  // context must hold (a short system message keeps it under 128 tokens).
  let prompt
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 128, threads: 2 })
    const passage = 'The quick brown fox jumps over the lazy dog. '.repeat(9)
    prompt = engine.applyChatTemplate([{ role: 'system', content: 'Copy.' }, ...user(`Repeat exactly: ${passage}`)])
  })
  afterAll(() => engine.dispose())

  test('speculation near the end of the context never overflows it and stays exact', async () => {
    const n = engine.tokenize(prompt, { special: true }).length
    expect(n).toBeGreaterThan(100)
    expect(n).toBeLessThan(128)
    const go = (speculative) => engine.complete({ prompt, n_predict: -1, temperature: 0, ignore_eos: true, cache_prompt: false, speculative })
    const off = await go({ mode: 'off' })
    expect(off.stopped_limit).toBe(true)
    expect(off.tokens_evaluated).toBe(n)
    expect(n + off.tokens_predicted).toBeLessThanOrEqual(128)
    expect(n + off.tokens_predicted).toBeGreaterThan(120)
    for (const speculative of [
      { mode: 'ngram', adaptive: false, n_max: 16 },
      { mode: 'draft', adaptive: false, n_max: 16, p_min: 0 },
      { mode: 'draft', adaptive: false, n_max: 8, n_parallel: 4, p_split: 0 },
      { mode: 'auto' },
    ]) {
      const r = await go(speculative)
      expect({ speculative, content: r.content, n: r.tokens_predicted }).toEqual({ speculative, content: off.content, n: off.tokens_predicted })
    }
  })

  test('n_predict far past the context shifts it with speculation on, exactly as without', async () => {
    const go = (speculative) => engine.complete({ prompt, n_predict: 300, temperature: 0, ignore_eos: true, cache_prompt: false, speculative })
    const off = await go({ mode: 'off' })
    expect(off.tokens_predicted).toBe(300)
    const ng = await go({ mode: 'ngram', adaptive: false, n_max: 12 })
    expect(ng.tokens_predicted).toBe(300)
    expect(ng.content).toBe(off.content)
  })

  test('n_keep out of range is clamped to the prompt, or rejected when it is not a count', async () => {
    for (const n_keep of [-1, 0, 5, 127, 128, 10000, 2 ** 31 - 1]) {
      const r = await engine.complete({ prompt, n_keep, n_predict: 40, temperature: 0, ignore_eos: true })
      expect(r.tokens_predicted).toBe(40)
    }
    for (const n_keep of [-2, 2 ** 31, 1.5, 'all']) {
      await expect(engine.complete({ prompt, n_keep })).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^n_keep/) })
    }
  })
})

describe('lifecycle races', () => {
  test('aborts racing completion: every promise settles with consistent text', async () => {
    const engine = await loadTarget({ contextSize: 256 })
    const r = rng(7)
    const runs = []
    for (let i = 0; i < 40; i++) {
      const ac = new AbortController()
      const events = []
      const p = engine.complete({ prompt: `Count: ${i}`, n_predict: 1 + (i % 6), temperature: 0 }, (e) => events.push(e), ac.signal)
      setTimeout(() => ac.abort(), Math.floor(r() * 60))
      runs.push(p.then((result) => ({ result, events })))
    }
    const settled = await Promise.all(runs)
    for (const { result, events } of settled) {
      expect(streamedText(events)).toBe(result.content)
      if (events.length) expect(events.at(-1).type).toBe('done')
      expect(result.stopped_abort || result.stopped_limit || result.stopped_eos).toBe(true)
    }
    expect(settled.some((s) => s.result.stopped_abort)).toBe(true)
    engine.cancel() // nothing running: a no-op
    expect(engine.status()).toMatchObject({ busy: false, queued: 0 })
    const ok = await engine.complete({ prompt: 'Hi', n_predict: 2, temperature: 0 })
    expect(ok.tokens_predicted).toBe(2)
    await engine.dispose()
  })

  test('abort after the promise resolved and cancel() when idle are no-ops', async () => {
    const engine = await loadTarget({ contextSize: 256 })
    const ac = new AbortController()
    const r = await engine.complete({ prompt: 'Hi', n_predict: 2, temperature: 0 }, undefined, ac.signal)
    ac.abort()
    engine.cancel()
    expect(r.stopped_abort).toBe(false)
    expect((await engine.complete({ prompt: 'Hi', n_predict: 2, temperature: 0 })).content).toBe(r.content)
    await engine.dispose()
  })

  test('dispose with a mix of running, queued and aborted requests settles all of them', async () => {
    // One slot, so that the second to fourth requests are queued.
    const engine = await loadTarget({ contextSize: 256, parallel: 1 })
    const ac = new AbortController()
    const all = [
      engine.complete({ prompt: 'Once', n_predict: 500, temperature: 0, ignore_eos: true }),
      engine.complete({ prompt: 'Twice', n_predict: 5 }, undefined, ac.signal),
      engine.complete({ prompt: 'Thrice', n_predict: 5 }),
      engine.stream({ prompt: 'Four', n_predict: 5 })[Symbol.asyncIterator]().next(),
    ]
    ac.abort()
    await new Promise((res) => setTimeout(res, 50))
    const disposing = engine.dispose()
    const late = engine.complete({ prompt: 'late' })
    const settled = await Promise.allSettled([...all, late, disposing])
    expect(settled.map((s) => s.status === 'fulfilled' ? 'ok' : s.reason.code)).toEqual(['ok', 'ok', 'DISPOSED', 'DISPOSED', 'DISPOSED', 'ok'])
    expect(settled[0].value.stopped_abort).toBe(true)
    expect(settled[1].value.stopped_abort).toBe(true)
    expect(engine.status().disposed).toBe(true)
  })

  test('two engines with different models generate at the same time in one process', async () => {
    const [smol, gemma] = await Promise.all([
      loadTarget({ contextSize: 256 }),
      LlamaEngine.load({ modelPath: GEMMA, contextSize: 256, threads: 2 }),
    ])
    const alone = await Promise.all([
      smol.complete({ prompt: 'The capital of France is', n_predict: 8, temperature: 0 }),
      gemma.complete({ prompt: 'The capital of France is', n_predict: 8, temperature: 0 }),
    ])
    expect(smol.status().model).toMatch(/SmolLM2/)
    expect(gemma.status().model).toMatch(/gemma/)
    expect(alone[0].tokens_predicted).toBe(8)
    expect(alone[1].tokens_predicted).toBe(8)
    // Same answers when run one after the other: the engines do not share state.
    expect((await smol.complete({ prompt: 'The capital of France is', n_predict: 8, temperature: 0 })).content).toBe(alone[0].content)
    expect((await gemma.complete({ prompt: 'The capital of France is', n_predict: 8, temperature: 0 })).content).toBe(alone[1].content)
    await Promise.all([smol.dispose(), gemma.dispose()])
  })

  test('the addon loaded in two worker_threads at once, each with its own engine', () => {
    const script = `
      const { Worker } = require('node:worker_threads');
      const code = \`
        const { parentPort, workerData } = require('node:worker_threads');
        const { LlamaEngine } = require(workerData.root);
        (async () => {
          const e = await LlamaEngine.load({ modelPath: workerData.model, contextSize: 256, threads: 1 });
          let events = 0;
          const r = await e.complete({ prompt: 'Hello', n_predict: 6, temperature: 0, ignore_eos: true }, () => events++);
          await e.dispose();
          parentPort.postMessage({ text: r.content, n: r.tokens_predicted, events });
        })().catch((err) => parentPort.postMessage({ error: String(err) }));\`;
      const one = () => new Promise((resolve, reject) => {
        const w = new Worker(code, { eval: true, workerData: { root: ${JSON.stringify(ROOT)}, model: ${JSON.stringify(TARGET)} } });
        w.once('message', resolve); w.once('error', reject);
      });
      // A worker terminated while its engine is generating must not take the process down.
      const doomed = new Worker(\`
        const { LlamaEngine } = require(${JSON.stringify(ROOT)});
        LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 256, threads: 1 })
          .then((e) => { e.complete({ prompt: 'Go', n_predict: 5000, ignore_eos: true }); require('node:worker_threads').parentPort.postMessage('running'); });\`, { eval: true });
      doomed.once('message', () => setTimeout(() => doomed.terminate(), 200));
      Promise.all([one(), one()]).then((rs) => console.log(JSON.stringify(rs)));`
    const out = execFileSync(process.execPath, ['-e', script], { timeout: 110000 }).toString()
    const rs = JSON.parse(out.trim().split('\n').at(-1))
    expect(rs).toHaveLength(2)
    expect(rs[0].error).toBeUndefined()
    expect(rs[0].n).toBe(6)
    expect(rs[0].events).toBeGreaterThan(0)
    expect(rs[1].text).toBe(rs[0].text)
  })

  // test:full (CI) for this and the repeated loads below: npm test stays under ten minutes.
  fullTest('the process exiting while engines generate exits cleanly (engine threads stop before ggml is torn down)', () => {
    // process.exit() from inside a token event, with a draft-model engine and
    // a second engine generating too: llama.cpp must not run on while the C++
    // runtime destroys its statics. A crash here is exit code 139 (SIGSEGV).
    const script = `
      const { LlamaEngine } = require(${JSON.stringify(ROOT)});
      (async () => {
        const a = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, draftModelPath: ${JSON.stringify(DRAFT)}, contextSize: 512, threads: 1 });
        const b = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 512, threads: 1 });
        b.complete({ prompt: 'Count on', n_predict: 5000, ignore_eos: true });
        let n = 0;
        a.complete({ prompt: 'Go on', n_predict: 5000, ignore_eos: true }, () => { if (++n === 5) process.exit(7) });
      })();`
    for (let i = 0; i < 3; i++) {
      const r = require('node:child_process').spawnSync(process.execPath, ['-e', script], { timeout: 110000 })
      expect({ run: i, status: r.status, signal: r.signal }).toEqual({ run: i, status: 7, signal: null })
    }
  })

  test('loading a missing, truncated or non-GGUF file rejects and the process carries on', async () => {
    const fs = require('node:fs')
    const os = require('node:os')
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-'))
    const truncated = path.join(dir, 'truncated.gguf')
    fs.writeFileSync(truncated, fs.readFileSync(TARGET).subarray(0, 1 << 20))
    const text = path.join(dir, 'text.gguf')
    fs.writeFileSync(text, 'this is not a model\n'.repeat(100))
    const empty = path.join(dir, 'empty.gguf')
    fs.writeFileSync(empty, '')
    for (const modelPath of [path.join(dir, 'missing.gguf'), truncated, text, empty, dir]) {
      await expect(LlamaEngine.load({ modelPath, contextSize: 256 })).rejects.toMatchObject({ code: 'MODEL_LOAD_FAILED' })
    }
    await expect(LlamaEngine.load({ modelPath: TARGET, draftModelPath: truncated, contextSize: 256 }))
      .rejects.toMatchObject({ code: 'MODEL_LOAD_FAILED' })
    fs.rmSync(dir, { recursive: true })
  })

  fullTest('loading and disposing engines repeatedly frees their memory', async () => {
    const rss = []
    const n = matrix(12, 5)
    for (let i = 0; i < n; i++) {
      const e = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 1024, threads: 2 })
      await e.complete({ prompt: 'Hi', n_predict: 2 })
      await e.dispose()
      rss.push(process.memoryUsage.rss())
    }
    // Each engine maps ~120 MB of weights and allocates KV caches; if they
    // were leaked, the 3 (npm test) or 10 (test:full) after the second would
    // add well over 300 MB.
    expect(rss.at(-1) - rss[1]).toBeLessThan(200 * 1024 * 1024)
  })
})
