// Many models behind one server (`serve --models`, createServer({ models })):
// three small models under a memory cap that fits two. The request's
// `model` picks; a model not loaded loads on demand, in its own child
// process; the least recently used idle one makes room; one running a
// request is never unloaded under it; pinned models stay; idle ones unload;
// an unknown model is a 404 in each protocol's shape; requests waiting for
// a load count as queued in /metrics. In test:full (npm test stays under
// its ten minutes).
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { spawn } = require('node:child_process')
const parsePrometheus = require('parse-prometheus-text-format')
const { LlamaEngine, TARGET, GEMMA, model, FULL } = require('./helpers')
const { inspectModel } = require('..')
const { listen, close } = require('./server-helpers')
const { createServer } = require('../server')

const SMOL8 = model('SmolLM2-135M-Instruct.Q8_0.gguf')
const ENGINE = { contextSize: 512, parallel: 2, threads: 2 }
const MODELS = [
  { name: 'smol', uri: TARGET },
  { name: 'gemma', uri: GEMMA },
  { name: 'smol8', uri: SMOL8 },
]
const post = (url, body) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
const complete = (base, name, extra = {}) => post(`${base}/v1/completions`, { model: name, prompt: 'The capital of France is', max_tokens: 8, temperature: 0, ...extra })
const states = async (base) => Object.fromEntries((await (await fetch(`${base}/v1/models`)).json()).data.map((m) => [m.id, m.status.value]))
const gauges = async (base) =>
  Object.fromEntries(parsePrometheus(await (await fetch(`${base}/metrics`)).text()).map((f) => [f.name, f.metrics.length === 1 && !f.metrics[0].buckets ? Number(f.metrics[0].value) : f]))

async function until(predicate, ms) {
  const deadline = Date.now() + ms
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${predicate}`)
    await new Promise((r) => setTimeout(r, 25))
  }
}

let estimates
beforeAll(async () => {
  if (!FULL) return
  estimates = {}
  for (const m of MODELS) estimates[m.name] = (await inspectModel(m.uri, { contextSize: ENGINE.contextSize, parallel: ENGINE.parallel })).memory.total
})

/** A router over the three models; the memory cap fits the two largest, never all three. */
async function serve(options = {}) {
  const sizes = Object.values(estimates).sort((a, b) => b - a)
  const memoryMax = sizes[0] + sizes[1] + 1
  expect(sizes[0] + sizes[1] + sizes[2]).toBeGreaterThan(memoryMax)
  const server = createServer({ models: MODELS, memoryMax, engineOptions: ENGINE, signals: false, ...options })
  const base = await listen(server)
  return { server, base }
}

const full = FULL ? describe : describe.skip

full('three models, a memory cap that fits two', () => {
  let server, base
  beforeAll(async () => {
    ;({ server, base } = await serve())
  })
  afterAll(async () => {
    if (server) await close(server)
  })

  test('listed, none loaded; each loads on its first request, in its own process, and answers as that model alone does', async () => {
    expect(await states(base)).toEqual({ smol: 'unloaded', gemma: 'unloaded', smol8: 'unloaded' })
    const res = await complete(base, 'smol')
    expect(res.status).toBe(200)
    const body = await res.json()
    expect(body.model).toBe('smol')
    // The same tokens as the model loaded on its own.
    const alone = await LlamaEngine.load({ modelPath: TARGET, ...ENGINE })
    try {
      const r = await alone.complete({ prompt: 'The capital of France is', n_predict: 8, temperature: 0 })
      expect(body.choices[0].text).toBe(r.content)
    } finally {
      await alone.dispose()
    }
    expect((await complete(base, 'gemma')).status).toBe(200)
    expect(await states(base)).toEqual({ smol: 'loaded', gemma: 'loaded', smol8: 'unloaded' })
    const pids = server.router.lanes().map((lane) => lane.engine.status().isolation.pid)
    expect(new Set([...pids, process.pid]).size).toBe(3)
    const g = await gauges(base)
    expect(g.llama_engine_models_loaded).toBe(2)
  })

  test('a third: the least recently used idle model is unloaded to make room', async () => {
    expect((await complete(base, 'gemma')).status).toBe(200) // smol is now the least recently used
    expect((await complete(base, 'smol8')).status).toBe(200)
    expect(await states(base)).toEqual({ smol: 'unloaded', gemma: 'loaded', smol8: 'loaded' })
    expect(server.router.lanes()).toHaveLength(2)
  })

  test('a model running a request is not unloaded under it: the idle one goes', async () => {
    // gemma streams; smol8 idle; smol needs room.
    const ac = new AbortController()
    const stream = await post(`${base}/v1/completions`, { model: 'gemma', prompt: 'Once upon a time', max_tokens: 60, ignore_eos: true, temperature: 0, stream: true })
    const reader = stream.body.getReader()
    await reader.read()
    expect((await complete(base, 'smol')).status).toBe(200)
    expect(await states(base)).toEqual({ smol: 'loaded', gemma: 'loaded', smol8: 'unloaded' })
    let text = ''
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      text += Buffer.from(value).toString()
    }
    ac.abort()
    expect(text).toMatch(/"finish_reason":"length"/)
    expect(text.trim().endsWith('data: [DONE]')).toBe(true)
  })

  test('requests for a model that is loading wait, counted as queued, then all run', async () => {
    expect((await states(base)).smol8).toBe('unloaded')
    const answers = Promise.all([0, 1, 2].map(() => complete(base, 'smol8')))
    let seen = 0
    let done = false
    answers.finally(() => (done = true))
    while (!done) {
      const g = await gauges(base)
      seen = Math.max(seen, g['vllm:num_requests_waiting'])
      await new Promise((r) => setTimeout(r, 10))
    }
    for (const r of await answers) expect(r.status).toBe(200)
    expect(seen).toBeGreaterThanOrEqual(1)
    const g = await gauges(base)
    expect(g['vllm:num_requests_waiting']).toBe(0)
    expect(g['vllm:num_requests_running']).toBe(0)
  })

  test('an unknown model: 404 in OpenAI’s shape and in Anthropic’s', async () => {
    const openai = await complete(base, 'nope')
    expect(openai.status).toBe(404)
    expect((await openai.json()).error).toMatchObject({ code: 'model_not_found', param: 'model', type: 'invalid_request_error' })
    const anthropic = await post(`${base}/v1/messages`, { model: 'nope', max_tokens: 4, messages: [{ role: 'user', content: 'Hi' }] })
    expect(anthropic.status).toBe(404)
    expect(await anthropic.json()).toMatchObject({ type: 'error', error: { type: 'not_found_error' } })
    const chat = await post(`${base}/v1/chat/completions`, { model: 'nope', messages: [{ role: 'user', content: 'Hi' }] })
    expect(chat.status).toBe(404)
  })

  test('POST /models/load and /models/unload, as llama.cpp’s router has them', async () => {
    let res = await post(`${base}/models/unload`, { model: 'smol' })
    expect(res.status).toBe(200)
    expect(await res.json()).toMatchObject({ success: true })
    expect((await states(base)).smol).toBe('unloaded')
    res = await post(`${base}/models/load`, { model: 'smol8' })
    expect(res.status).toBe(200)
    expect((await states(base)).smol8).toBe('loaded')
    expect((await post(`${base}/models/load`, { model: 'nope' })).status).toBe(404)
    expect((await post(`${base}/models/load`, {})).status).toBe(400)
  })
})

full('pinned and idle models', () => {
  test('a pinned model loads at start and stays; what cannot fit beside it is refused by name', async () => {
    const server = createServer({ models: [{ ...MODELS[0], pinned: true }, MODELS[1]], modelsMax: 1, engineOptions: ENGINE, signals: false })
    const base = await listen(server)
    try {
      await until(async () => (await states(base)).smol === 'loaded', 60_000)
      const res = await complete(base, 'gemma')
      expect(res.status).toBe(507)
      expect((await res.json()).error.code).toBe('MODEL_DOES_NOT_FIT')
      expect((await complete(base, 'smol')).status).toBe(200)
    } finally {
      await close(server)
    }
  })

  test('a load waiting for room while another model loads (by POST /models/load, no request) gets it once that one is loaded', async () => {
    const server = createServer({ models: MODELS.slice(0, 2), modelsMax: 1, engineOptions: ENGINE, signals: false })
    const base = await listen(server)
    try {
      const [loaded, answered] = await Promise.all([post(`${base}/models/load`, { model: 'smol' }), complete(base, 'gemma')])
      expect(loaded.status).toBe(200)
      expect(answered.status).toBe(200)
      expect(server.router.lanes()).toHaveLength(1)
    } finally {
      await close(server)
    }
  })

  test('room for one, one loaded and idle, two requests at once for the two others: both answered, in turn', async () => {
    // Each load used to unload the other as it finished, before its request
    // held it: both showed "loading" for as long as the clients waited.
    // (Sizes given: both loads go for room at once, no estimate between.)
    const server = createServer({ models: MODELS.map((m) => ({ ...m, bytes: 1 })), modelsMax: 1, engineOptions: ENGINE, signals: false })
    const base = await listen(server)
    try {
      expect((await post(`${base}/tokenize`, { model: 'smol', content: 'hello' })).status).toBe(200)
      const [a, b] = await Promise.all(['gemma', 'smol8'].map((name) => post(`${base}/tokenize`, { model: name, content: 'hello' })))
      expect([a.status, b.status]).toEqual([200, 200])
      // Each model's own tokens (gemma's vocabulary is not SmolLM2's).
      const [ta, tb] = [(await a.json()).tokens, (await b.json()).tokens]
      expect(ta.length).toBeGreaterThan(0)
      expect(ta).not.toEqual(tb)
      expect(server.router.lanes()).toHaveLength(1)
    } finally {
      await close(server)
    }
  })

  test('a client that leaves while its model waits for room costs the busy model nothing: the load is given up', async () => {
    const server = createServer({ models: MODELS.map((m) => ({ ...m, bytes: 1 })), modelsMax: 1, engineOptions: ENGINE, signals: false })
    const base = await listen(server)
    try {
      expect((await post(`${base}/tokenize`, { model: 'smol', content: 'hello' })).status).toBe(200)
      // smol busy for a while: gemma has to wait for room.
      const busy = complete(base, 'smol', { max_tokens: 200, ignore_eos: true })
      await until(() => server.router.list().find((m) => m.name === 'smol').requests === 1, 10_000)
      const ac = new AbortController()
      const waiting = fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify({ model: 'gemma', content: 'hello' }), signal: ac.signal }).catch((e) => e)
      await until(() => server.router.list().find((m) => m.name === 'gemma').state === 'loading', 10_000)
      ac.abort()
      expect((await waiting).name).toBe('AbortError')
      expect((await busy).status).toBe(200)
      // Nobody waits for gemma any more: smol keeps its room.
      await until(() => server.router.list().find((m) => m.name === 'gemma').state === 'unloaded', 10_000)
      expect(Object.fromEntries(server.router.list().map((m) => [m.name, m.state]))).toEqual({ smol: 'loaded', gemma: 'unloaded', smol8: 'unloaded' })
      // A new request for it loads it as ever.
      expect((await post(`${base}/tokenize`, { model: 'gemma', content: 'hello' })).status).toBe(200)
    } finally {
      await close(server)
    }
  })

  test('--idle-unload: a model no request used for that long is unloaded', async () => {
    const server = createServer({ models: MODELS.slice(0, 1), idleUnloadMs: 1000, engineOptions: ENGINE, signals: false })
    const base = await listen(server)
    try {
      // One model: a request that names none gets it.
      const res = await post(`${base}/v1/completions`, { prompt: 'Hi', max_tokens: 2 })
      expect(res.status).toBe(200)
      expect((await states(base)).smol).toBe('loaded')
      await until(async () => (await states(base)).smol === 'unloaded', 15_000)
    } finally {
      await close(server)
    }
  })
})

;(FULL ? test : test.skip)('`llama-engine serve --models DIR`: the model GGUFs of the directory (not projectors or adapters), named by file', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-models-'))
  for (const f of ['SmolLM2-135M-Instruct.Q4_1.gguf', 'gemma-3-270m-q4_k_m.gguf', 'gemma-3-270m.mmproj-test.gguf', 'SmolLM2-135M-Instruct.lora-test.gguf']) {
    fs.symlinkSync(model(f), path.join(dir, f))
  }
  const CLI = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
  // An empty cache: llama-server's router lists the cache's models beside the directory's.
  const cache = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-cache-'))
  const child = spawn(process.execPath, [CLI, 'serve', '--models', dir, '--port', '0', '--ctx-size', '512', '--parallel', '1', '--models-max', '1', '--pin', 'gemma-3-270m-q4_k_m'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, LLAMA_CACHE: cache },
  })
  let stderr = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d) => (stderr += d))
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)))
  try {
    await until(() => /listening on (http:\/\/\S+),/.test(stderr), 30_000)
    const base = /listening on (http:\/\/\S+),/.exec(stderr)[1]
    const models = await (await fetch(`${base}/v1/models`)).json()
    expect(models.data.map((m) => m.id).sort()).toEqual(['SmolLM2-135M-Instruct.Q4_1', 'gemma-3-270m-q4_k_m'])
    await until(async () => (await states(base))['gemma-3-270m-q4_k_m'] === 'loaded', 60_000)
    // --models-max 1 with gemma pinned: smol cannot load.
    expect((await complete(base, 'SmolLM2-135M-Instruct.Q4_1')).status).toBe(507)
    expect((await complete(base, 'gemma-3-270m-q4_k_m')).status).toBe(200)
    child.kill('SIGTERM')
    expect(await exited).toBe(143)
    expect(stderr).toMatch(/engines disposed/)
  } finally {
    child.kill('SIGKILL')
    fs.rmSync(dir, { recursive: true, force: true })
    fs.rmSync(cache, { recursive: true, force: true })
  }
})

;(FULL ? test : test.skip)("`llama-engine serve` without a model: llama-server's router over the cache (OWNER/REPO:TAG), an INI preset read again on ?reload=1, --no-models-autoload, the router's /props", async () => {
  const cache = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-cache-'))
  const put = (repo, file, target) => {
    const dir = path.join(cache, `models--${repo.replace('/', '--')}`)
    fs.mkdirSync(path.join(dir, 'refs'), { recursive: true })
    fs.writeFileSync(path.join(dir, 'refs', 'main'), 'rev')
    fs.mkdirSync(path.join(dir, 'snapshots', 'rev'), { recursive: true })
    fs.symlinkSync(target, path.join(dir, 'snapshots', 'rev', file))
  }
  put('me/smol', 'smol-Q4_1.gguf', TARGET)
  put('me/smol8', 'smol8-Q8_0.gguf', SMOL8)
  const preset = path.join(cache, 'preset.ini')
  fs.writeFileSync(preset, `version = 1\n[*]\nc = 512\n\n; a model of its own\n[fast]\nmodel = ${TARGET}\nctx-size = 256\n\n[me/smol8:Q8_0]\nLLAMA_ARG_CTX_SIZE = 384\n`)
  const CLI = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
  const child = spawn(process.execPath, [CLI, 'serve', '--port', '0', '-np', '1', '--models-max', '1', '--no-models-autoload', '--models-preset', preset], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, LLAMA_CACHE: cache },
  })
  let stderr = ''
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d) => (stderr += d))
  try {
    await until(() => /listening on (http:\/\/\S+),/.test(stderr), 30_000)
    const base = /listening on (http:\/\/\S+),/.exec(stderr)[1]
    const props = await (await fetch(`${base}/props`)).json()
    expect(props).toMatchObject({ role: 'router', max_instances: 1, models_autoload: false, build_info: expect.stringMatching(/^b/) })
    const ids = async (query = '') => (await (await fetch(`${base}/v1/models${query}`)).json()).data.map((m) => m.id).sort()
    expect(await ids()).toEqual(['fast', 'me/smol8:Q8_0', 'me/smol:Q4_1'])
    // Not loaded, and no autoload: a 400 until POST /models/load (or ?autoload=1).
    const res = await complete(base, 'me/smol8:Q8_0')
    expect(res.status).toBe(400)
    expect((await res.json()).error.message).toMatch(/model is not loaded/)
    expect((await post(`${base}/models/load`, { model: 'me/smol8:Q8_0' })).status).toBe(200)
    expect((await complete(base, 'me/smol8:Q8_0')).status).toBe(200)
    // The preset section of a cache model gave it its context; [*] gave fast its own, under its section's.
    const slots = await (await fetch(`${base}/props?model=me/smol8:Q8_0`)).json()
    expect(slots.default_generation_settings.n_ctx).toBe(384)
    expect((await fetch(`${base}/v1/completions?autoload=1`, { method: 'POST', body: JSON.stringify({ model: 'fast', prompt: 'Hi', max_tokens: 2 }) })).status).toBe(200)
    expect((await (await fetch(`${base}/props?model=fast`)).json()).default_generation_settings.n_ctx).toBe(256)
    // The preset changed: read again on ?reload=1 (fast, loaded, goes; slow comes).
    fs.writeFileSync(preset, `[slow]\nmodel = ${SMOL8}\n`)
    expect(await ids('?reload=1')).toEqual(['me/smol8:Q8_0', 'me/smol:Q4_1', 'slow'])
    expect((await complete(base, 'fast')).status).toBe(404)
  } finally {
    child.kill('SIGKILL')
    fs.rmSync(cache, { recursive: true, force: true })
  }
})
