const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { LlamaEngine, TARGET, loadTarget } = require('./helpers')

describe('LlamaEngine.load', () => {
  test('loads on a background thread and reports real progress', async () => {
    const progress = []
    let ticks = 0
    const timer = setInterval(() => ticks++, 1)
    const pending = LlamaEngine.load({ modelPath: TARGET, contextSize: 512, onProgress: (f) => progress.push(f) })
    // The JS thread is free while the model loads.
    const engine = await pending
    clearInterval(timer)
    expect(progress.length).toBeGreaterThan(1)
    expect(progress.every((f) => f >= 0 && f <= 1)).toBe(true)
    expect(progress[progress.length - 1]).toBe(1)
    for (let i = 1; i < progress.length; i++) expect(progress[i]).toBeGreaterThanOrEqual(progress[i - 1])
    const st = engine.status()
    expect(st).toMatchObject({ queued: 0, busy: false, disposed: false, contextSize: 512 })
    expect(st.model).toBe('SmolLM2-135M-Instruct.Q4_1.gguf')
    expect(ticks).toBeGreaterThanOrEqual(0)
    await engine.dispose()
  })

  test('caps the context at the training context', async () => {
    const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1 << 20 })
    const st = engine.status()
    expect(st.contextSize).toBe(st.trainContextSize)
    await engine.dispose()
  })

  test('a missing file rejects MODEL_LOAD_FAILED naming the path', async () => {
    const missing = path.join(os.tmpdir(), 'no-such-model.gguf')
    await expect(LlamaEngine.load({ modelPath: missing })).rejects.toMatchObject({
      code: 'MODEL_LOAD_FAILED',
      message: expect.stringContaining(missing),
    })
  })

  test('a corrupt or truncated file rejects MODEL_LOAD_FAILED', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'le-'))
    const notGguf = path.join(dir, 'text.gguf')
    fs.writeFileSync(notGguf, 'this is not a model')
    await expect(LlamaEngine.load({ modelPath: notGguf })).rejects.toMatchObject({
      code: 'MODEL_LOAD_FAILED',
      message: expect.stringContaining(notGguf),
    })
    const truncated = path.join(dir, 'truncated.gguf')
    const fd = fs.openSync(TARGET, 'r')
    const buf = Buffer.alloc(1 << 20)
    fs.readSync(fd, buf, 0, buf.length, 0)
    fs.closeSync(fd)
    fs.writeFileSync(truncated, buf)
    await expect(LlamaEngine.load({ modelPath: truncated })).rejects.toMatchObject({ code: 'MODEL_LOAD_FAILED' })
  })

  test('bad options reject INVALID_REQUEST naming the option', async () => {
    await expect(LlamaEngine.load({})).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('modelPath') })
    await expect(LlamaEngine.load({ modelPath: TARGET, contextSize: -5 })).rejects.toMatchObject({
      code: 'INVALID_REQUEST',
      message: expect.stringContaining('contextSize'),
    })
    await expect(LlamaEngine.load({ modelPath: TARGET, threads: NaN })).rejects.toMatchObject({
      code: 'INVALID_REQUEST',
      message: expect.stringContaining('threads'),
    })
    await expect(LlamaEngine.load(null)).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
  })
})

describe('tokenize / detokenize', () => {
  let engine
  beforeAll(async () => {
    engine = await loadTarget()
  })
  afterAll(() => engine.dispose())

  test('round-trips text', () => {
    const text = 'Hello, world! Ünïcödé and 日本語 🎉'
    const tokens = engine.tokenize(text)
    expect(tokens.length).toBeGreaterThan(3)
    expect(tokens.every(Number.isInteger)).toBe(true)
    expect(engine.detokenize(tokens)).toBe(text)
    expect(engine.detokenize([])).toBe('')
  })

  test('special tokens are parsed only when asked', () => {
    const plain = engine.tokenize('<|im_start|>')
    const special = engine.tokenize('<|im_start|>', { special: true })
    expect(special.length).toBe(1)
    expect(plain.length).toBeGreaterThan(1)
  })

  test('addBos follows the model (SmolLM2 adds none)', () => {
    const a = engine.tokenize('hi', { addBos: true })
    const b = engine.tokenize('hi', { addBos: false })
    expect(a.length).toBeGreaterThanOrEqual(b.length)
    expect(a.slice(-b.length)).toEqual(b)
  })

  test('bad input throws INVALID_REQUEST', () => {
    expect(() => engine.tokenize(42)).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
    expect(() => engine.detokenize([1, -1])).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
    expect(() => engine.detokenize([10 ** 9])).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
    expect(() => engine.detokenize('abc')).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
  })
})

describe('dispose', () => {
  test('frees the engine; every later call throws or rejects DISPOSED', async () => {
    const engine = await loadTarget()
    await engine.dispose()
    await engine.dispose() // idempotent
    expect(engine.status().disposed).toBe(true)
    expect(() => engine.tokenize('x')).toThrow(expect.objectContaining({ code: 'DISPOSED' }))
    expect(() => engine.detokenize([1])).toThrow(expect.objectContaining({ code: 'DISPOSED' }))
    await expect(engine.complete({ prompt: 'x' })).rejects.toMatchObject({ code: 'DISPOSED' })
    engine.cancel() // no-op, must not throw
  })

  test('dispose with a full batch and a queued request settles every promise', async () => {
    const engine = await loadTarget({ parallel: 4 })
    const tokens = [0, 0, 0, 0]
    const running = ['Once upon a time', 'The sea', 'In the year', 'Dear diary'].map((prompt, i) =>
      engine.complete({ prompt, n_predict: 2000, temperature: 0, ignore_eos: true }, (e) => e.type === 'token' && tokens[i]++),
    )
    const queued = expect(engine.complete({ prompt: 'Hello', n_predict: 10 })).rejects.toMatchObject({ code: 'DISPOSED' })
    // Every slot decoding (however busy the machine), the fifth request waiting.
    while (tokens.some((n) => n === 0)) await new Promise((r) => setTimeout(r, 10))
    expect(engine.status()).toMatchObject({ busy: true, active: 4, queued: 1, parallel: 4 })
    await engine.dispose()
    for (const r of await Promise.all(running)) {
      expect(r.stopped_abort).toBe(true)
      expect(r.tokens_predicted).toBeGreaterThan(0)
    }
    await queued
  })
})
