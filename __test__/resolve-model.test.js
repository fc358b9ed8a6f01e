// resolveModel against a local stand-in for the Hugging Face Hub (loopback
// only): its file list with each file's LFS sha256, its resolve URLs with
// Range requests, a private repository, a download cut halfway, a file whose
// bytes do not match its sha256, a split GGUF; then offline use of the cache.

const crypto = require('node:crypto')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { resolveModel, parseModelUri } = require('../lib/models/resolve.js')

const sha = (b) => crypto.createHash('sha256').update(b).digest('hex')
const bytes = (n, seed) => {
  const b = Buffer.alloc(n)
  let x = seed
  for (let i = 0; i < n; i++) b[i] = (x = (x * 1103515245 + 12345) >>> 0) >>> 24
  return b
}

// repo -> { private?, files: { path: { data, oid? } } }
const REPOS = {
  'me/tiny': {
    files: {
      'tiny-Q4_K_M.gguf': { data: bytes(300_000, 1) },
      'tiny-Q6_K.gguf': { data: bytes(200_000, 2) },
      'mmproj-tiny-Q4_K_M.gguf': { data: bytes(1000, 3) },
      'Q8_0/tiny-Q8_0-00001-of-00003.gguf': { data: bytes(70_000, 4) },
      'Q8_0/tiny-Q8_0-00002-of-00003.gguf': { data: bytes(70_000, 5) },
      'Q8_0/tiny-Q8_0-00003-of-00003.gguf': { data: bytes(10_000, 6) },
      'README.md': { data: Buffer.from('# tiny'), lfs: false },
    },
  },
  'me/liar': { files: { 'liar-Q4_K_M.gguf': { data: bytes(50_000, 7), oid: sha(Buffer.from('something else')) } } },
  'me/secret': { private: true, files: { 'secret-Q4_K_M.gguf': { data: bytes(40_000, 8) } } },
  // A real GGUF (the test LoRA adapter `npm run models` writes), for inspect.
  'me/adapter': { files: { 'smol-lora.gguf': { data: fs.readFileSync(path.join(__dirname, '..', 'models', 'SmolLM2-135M-Instruct.lora-test.gguf')) } } },
}

let server
let base
const seen = []
let cutNext = false

beforeAll(async () => {
  server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x')
    seen.push({ path: url.pathname, range: req.headers.range, auth: req.headers.authorization })
    let m = /^\/api\/models\/([^/]+\/[^/]+)\/(revision|tree)\/main$/.exec(url.pathname)
    const repoOf = (name) => {
      const repo = REPOS[name]
      if (!repo) {
        res.writeHead(404).end('{"error":"Repository not found"}')
        return null
      }
      if (repo.private && req.headers.authorization !== 'Bearer hf_good') {
        res.writeHead(401).end('{"error":"Invalid credentials"}')
        return null
      }
      return repo
    }
    if (m) {
      const repo = repoOf(m[1])
      if (!repo) return
      res.setHeader('content-type', 'application/json')
      if (m[2] === 'revision') return res.end(JSON.stringify({ id: m[1], sha: 'a'.repeat(40) }))
      const list = Object.entries(repo.files).map(([p, f]) => ({
        type: 'file',
        path: p,
        size: f.data.length,
        ...(f.lfs === false ? {} : { lfs: { oid: f.oid || sha(f.data), size: f.data.length } }),
      }))
      return res.end(JSON.stringify(list))
    }
    m = /^\/([^/]+\/[^/]+)\/resolve\/main\/(.+)$/.exec(url.pathname)
    if (m) {
      const repo = repoOf(m[1])
      if (!repo) return
      const f = repo.files[decodeURIComponent(m[2])]
      if (!f) return res.writeHead(404).end('not found')
      const r = /^bytes=(\d+)-$/.exec(req.headers.range || '')
      const from = r ? Number(r[1]) : 0
      const body = f.data.subarray(from)
      res.writeHead(r ? 206 : 200, { 'content-length': body.length, ...(r ? { 'content-range': `bytes ${from}-${f.data.length - 1}/${f.data.length}` } : {}) })
      if (cutNext) {
        cutNext = false
        res.write(body.subarray(0, body.length >> 1))
        return setTimeout(() => res.destroy(), 20)
      }
      return res.end(body)
    }
    res.writeHead(404).end()
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  base = `http://127.0.0.1:${server.address().port}`
  process.env.HF_ENDPOINT = base
})

afterAll(() => {
  delete process.env.HF_ENDPOINT
  delete process.env.HF_TOKEN
  server?.close()
})

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-hub-'))

test('URIs are read as llama.cpp and node-llama-cpp read them', () => {
  expect(parseModelUri('hf:me/tiny:q6_k')).toEqual({ kind: 'hf', repo: 'me/tiny', quant: 'q6_k' })
  expect(parseModelUri('hf:me/tiny')).toEqual({ kind: 'hf', repo: 'me/tiny', quant: 'Q4_K_M', fallback: true })
  expect(parseModelUri('hf:me/tiny/Q8_0/x.gguf')).toEqual({ kind: 'hf', repo: 'me/tiny', file: 'Q8_0/x.gguf' })
  expect(parseModelUri('https://example.com/a/b%20c.gguf')).toMatchObject({ kind: 'url', file: 'b c.gguf' })
  expect(parseModelUri('models/x.gguf')).toEqual({ kind: 'path', path: path.resolve('models/x.gguf') })
  for (const bad of ['', 'hf:', 'hf:me', 'hf:me/tiny/../x.gguf', 'hf:me/tiny/notes.txt']) expect(() => parseModelUri(bad)).toThrow(expect.objectContaining({ code: 'MODEL_LOAD_FAILED' }))
})

test('hf:OWNER/REPO:QUANT downloads into the hub cache layout, checked, with progress; then offline it answers from the cache', async () => {
  const cacheDir = tmp()
  const progress = []
  const file = await resolveModel('hf:me/tiny:q4_k_m', { cacheDir, onProgress: (p) => progress.push(p) })
  const data = REPOS['me/tiny'].files['tiny-Q4_K_M.gguf'].data
  const repoDir = path.join(cacheDir, 'models--me--tiny')
  expect(file).toBe(path.join(repoDir, 'snapshots', 'a'.repeat(40), 'tiny-Q4_K_M.gguf'))
  expect(fs.readFileSync(file).equals(data)).toBe(true)
  expect(fs.lstatSync(file).isSymbolicLink()).toBe(true)
  expect(fs.realpathSync(file)).toBe(fs.realpathSync(path.join(repoDir, 'blobs', sha(data))))
  expect(fs.readFileSync(path.join(repoDir, 'refs', 'main'), 'utf8')).toBe('a'.repeat(40))
  expect(progress.at(-1)).toEqual({ file: 'tiny-Q4_K_M.gguf', downloaded: data.length, total: data.length })
  // Not the mmproj file that also contains the quant's name.
  expect(fs.readdirSync(path.join(repoDir, 'blobs'))).toEqual([sha(data)])
  // Again: no bytes downloaded.
  const before = seen.filter((s) => s.path.includes('/resolve/')).length
  expect(await resolveModel('hf:me/tiny:Q4_K_M', { cacheDir })).toBe(file)
  expect(seen.filter((s) => s.path.includes('/resolve/')).length).toBe(before)
  // Offline: no request at all.
  const requests = seen.length
  expect(await resolveModel('hf:me/tiny:Q4_K_M', { cacheDir, offline: true })).toBe(file)
  expect(seen.length).toBe(requests)
  // The repository's projector, by name (mmprojPath: 'hf:me/tiny' asks for it).
  const projector = await resolveModel('hf:me/tiny:mmproj', { cacheDir })
  expect(path.basename(projector)).toBe('mmproj-tiny-Q4_K_M.gguf')
  await expect(resolveModel('hf:me/liar:mmproj', { cacheDir })).rejects.toThrow(/no multimodal projector/)
  // A quant never fetched is not there offline, and the error says so.
  await expect(resolveModel('hf:me/tiny:Q6_K', { cacheDir, offline: true })).rejects.toThrow(/no \.gguf file whose name contains Q6_K.*offline/)
})

test('a download cut halfway resumes with a Range request and lands checked', async () => {
  const cacheDir = tmp()
  cutNext = true
  const mark = seen.length
  const file = await resolveModel('hf:me/tiny:Q6_K', { cacheDir })
  expect(fs.readFileSync(file).equals(REPOS['me/tiny'].files['tiny-Q6_K.gguf'].data)).toBe(true)
  const gets = seen.slice(mark).filter((s) => s.path.endsWith('tiny-Q6_K.gguf'))
  expect(gets.length).toBe(2)
  expect(gets[1].range).toBe('bytes=100000-')
  expect(fs.readdirSync(path.join(cacheDir, 'models--me--tiny', 'blobs')).some((f) => f.endsWith('.incomplete'))).toBe(false)
})

test('a split GGUF: every part, the first returned; a file by path', async () => {
  const cacheDir = tmp()
  const first = await resolveModel('hf:me/tiny:Q8_0', { cacheDir })
  expect(path.basename(first)).toBe('tiny-Q8_0-00001-of-00003.gguf')
  for (const k of [1, 2, 3]) {
    const p = path.join(path.dirname(first), `tiny-Q8_0-0000${k}-of-00003.gguf`)
    expect(fs.readFileSync(p).equals(REPOS['me/tiny'].files[`Q8_0/tiny-Q8_0-0000${k}-of-00003.gguf`].data)).toBe(true)
  }
  const one = await resolveModel('hf:me/tiny/tiny-Q6_K.gguf', { cacheDir })
  expect(path.basename(one)).toBe('tiny-Q6_K.gguf')
})

test('a sha256 mismatch is refused naming both digests and leaves nothing loadable', async () => {
  const cacheDir = tmp()
  const f = REPOS['me/liar'].files['liar-Q4_K_M.gguf']
  const err = await resolveModel('hf:me/liar:Q4_K_M', { cacheDir }).catch((e) => e)
  expect(err).toMatchObject({ code: 'MODEL_LOAD_FAILED', expected: f.oid, actual: sha(f.data) })
  expect(err.message).toContain(f.oid)
  expect(err.message).toContain(sha(f.data))
  const blobs = path.join(cacheDir, 'models--me--liar', 'blobs')
  expect(fs.existsSync(blobs) ? fs.readdirSync(blobs) : []).toEqual([])
  expect(fs.existsSync(path.join(cacheDir, 'models--me--liar', 'snapshots'))).toBe(false)
})

test('404 and 401 say which repository and why; HF_TOKEN opens a private one', async () => {
  const cacheDir = tmp()
  await expect(resolveModel('hf:me/nothing:Q4_K_M', { cacheDir })).rejects.toThrow(/me\/nothing: no such repository .*404/)
  await expect(resolveModel('hf:me/secret:Q4_K_M', { cacheDir })).rejects.toThrow(/me\/secret: the Hub refused access \(HTTP 401\): it is private or gated; set HF_TOKEN/)
  process.env.HF_TOKEN = 'hf_wrong'
  await expect(resolveModel('hf:me/secret:Q4_K_M', { cacheDir })).rejects.toThrow(/HF_TOKEN does not grant access/)
  process.env.HF_TOKEN = 'hf_good'
  try {
    const file = await resolveModel('hf:me/secret:Q4_K_M', { cacheDir })
    expect(fs.readFileSync(file).equals(REPOS['me/secret'].files['secret-Q4_K_M.gguf'].data)).toBe(true)
  } finally {
    delete process.env.HF_TOKEN
  }
  await expect(resolveModel('hf:me/tiny:IQ2_XXS', { cacheDir })).rejects.toThrow(/no \.gguf file whose name contains IQ2_XXS \(it has Q4_K_M, Q6_K, Q8_0\)/)
})

test('with no network the cache answers; an AbortSignal stops a download', async () => {
  const cacheDir = tmp()
  const file = await resolveModel('hf:me/tiny:Q4_K_M', { cacheDir })
  process.env.HF_ENDPOINT = 'http://127.0.0.1:9' // nothing listens there
  try {
    expect(await resolveModel('hf:me/tiny:Q4_K_M', { cacheDir })).toBe(file)
    await expect(resolveModel('hf:me/tiny:Q6_K', { cacheDir })).rejects.toThrow(/the Hub is unreachable/)
  } finally {
    process.env.HF_ENDPOINT = base
  }
  const ac = new AbortController()
  ac.abort(new Error('user'))
  await expect(resolveModel('hf:me/tiny:Q6_K', { cacheDir: tmp(), signal: ac.signal })).rejects.toMatchObject({ name: 'AbortError', code: 'MODEL_LOAD_FAILED' })
})

test('https URLs download into the cache once', async () => {
  const cacheDir = tmp()
  const url = `${base}/me/tiny/resolve/main/tiny-Q6_K.gguf`
  const file = await resolveModel(url, { cacheDir })
  expect(fs.readFileSync(file).equals(REPOS['me/tiny'].files['tiny-Q6_K.gguf'].data)).toBe(true)
  expect(await resolveModel(url, { cacheDir, offline: true })).toBe(file)
})

test("the hub cache as llama-server's router lists it (OWNER/REPO:TAG), found as llama.cpp finds it; no tag picks Q4_K_M, else Q8_0, else the first model", async () => {
  const { listCachedModels, hubCache } = require('../lib/models/resolve.js')
  const cacheDir = tmp()
  const put = (repo, files) => {
    const dir = path.join(cacheDir, `models--${repo.replace('/', '--')}`)
    fs.mkdirSync(path.join(dir, 'refs'), { recursive: true })
    fs.writeFileSync(path.join(dir, 'refs', 'main'), 'rev')
    for (const f of files) {
      fs.mkdirSync(path.dirname(path.join(dir, 'snapshots', 'rev', f)), { recursive: true })
      fs.writeFileSync(path.join(dir, 'snapshots', 'rev', f), 'x')
    }
  }
  put('ggml-org/tinygemma3-GGUF', ['tinygemma3-Q8_0.gguf', 'mmproj-tinygemma3.gguf'])
  put('me/big', ['big-Q4_K_M-00001-of-00002.gguf', 'big-Q4_K_M-00002-of-00002.gguf', 'sub/big.F16.gguf', 'mtp-big-Q8_0.gguf', 'README.md'])
  put('me/untagged', ['model.gguf', 'stories-f32.gguf'])
  fs.mkdirSync(path.join(cacheDir, 'models--me--nosnapshot'))
  const listed = listCachedModels(cacheDir)
  expect(listed.map((m) => m.name)).toEqual(['ggml-org/tinygemma3-GGUF:Q8_0', 'me/big:Q4_K_M', 'me/big:F16', 'me/untagged:F32'])
  expect(listed[0]).toMatchObject({ uri: 'hf:ggml-org/tinygemma3-GGUF:Q8_0', mmproj: expect.stringMatching(/mmproj-tinygemma3\.gguf$/) })
  expect(listed[1].path).toMatch(/big-Q4_K_M-00001-of-00002\.gguf$/)
  // Each name resolves, offline, to the file listed; a repository named without a tag falls back as llama.cpp does.
  for (const m of listed) expect(await resolveModel(m.uri, { cacheDir, offline: true })).toBe(m.path)
  expect(path.basename(await resolveModel('hf:ggml-org/tinygemma3-GGUF', { cacheDir, offline: true }))).toBe('tinygemma3-Q8_0.gguf')
  expect(path.basename(await resolveModel('hf:me/untagged', { cacheDir, offline: true }))).toBe('model.gguf')
  await expect(resolveModel('hf:me/untagged:Q4_K_M', { cacheDir, offline: true })).rejects.toThrow(/no \.gguf file whose name contains Q4_K_M/)
  // LLAMA_CACHE first, as llama.cpp.
  const saved = { ...process.env }
  try {
    Object.assign(process.env, { LLAMA_CACHE: '/a', HF_HUB_CACHE: '/b', HF_HOME: '/c' })
    expect(hubCache()).toBe(path.resolve('/a'))
    delete process.env.LLAMA_CACHE
    expect(hubCache()).toBe(path.resolve('/b'))
    delete process.env.HF_HUB_CACHE
    expect(hubCache()).toBe(path.join(path.resolve('/c'), 'hub'))
  } finally {
    for (const k of ['LLAMA_CACHE', 'HF_HUB_CACHE', 'HF_HOME']) if (saved[k] === undefined) delete process.env[k]
    else process.env[k] = saved[k]
  }
})

test('LlamaEngine.load fetches an hf: model first; onProgress covers the download, then the load', async () => {
  const { LlamaEngine, TARGET } = require('./helpers')
  const data = fs.readFileSync(TARGET)
  REPOS['me/smol'] = { files: { 'smol-Q4_1.gguf': { data } } }
  const cacheDir = tmp()
  process.env.HF_HUB_CACHE = cacheDir
  const seenProgress = []
  try {
    const engine = await LlamaEngine.load({ modelPath: 'hf:me/smol:Q4_1', contextSize: 512, onProgress: (f) => seenProgress.push(f) })
    try {
      const file = path.join(cacheDir, 'models--me--smol', 'snapshots', 'a'.repeat(40), 'smol-Q4_1.gguf')
      expect(engine.status().model).toBe('smol-Q4_1.gguf')
      expect(fs.realpathSync(file)).toBe(path.join(fs.realpathSync(cacheDir), 'models--me--smol', 'blobs', sha(data)))
      const r = await engine.complete({ prompt: 'The capital of France is', n_predict: 4, temperature: 0 })
      expect(r.tokens_predicted).toBe(4)
    } finally {
      await engine.dispose()
    }
    // Monotonic, the download in the first half, ending at 1.
    expect(seenProgress.every((f, i) => i === 0 || f >= seenProgress[i - 1])).toBe(true)
    expect(seenProgress.some((f) => f > 0 && f <= 0.5)).toBe(true)
    expect(seenProgress.at(-1)).toBe(1)
    // Offline afterwards: no request to the Hub.
    const requests = seen.length
    const again = await LlamaEngine.load({ modelPath: 'hf:me/smol:Q4_1', contextSize: 512, offline: true })
    await again.dispose()
    expect(seen.length).toBe(requests)
  } finally {
    delete process.env.HF_HUB_CACHE
  }
}, 120_000)

test('llama-engine pull URI: a line per 10 % off a TTY, the path on stdout; errors name the repository', async () => {
  const { execFile } = require('node:child_process')
  const cli = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
  const cacheDir = tmp()
  const run = (args) =>
    new Promise((resolve) => {
      execFile(process.execPath, [cli, 'pull', ...args], { env: { ...process.env, HF_ENDPOINT: base } }, (err, stdout, stderr) => resolve({ code: err ? err.code : 0, stdout, stderr }))
    })
  const ok = await run(['hf:me/tiny:Q6_K', '--cache-dir', cacheDir])
  expect(ok.code).toBe(0)
  expect(ok.stdout).toBe(`${path.join(cacheDir, 'models--me--tiny', 'snapshots', 'a'.repeat(40), 'tiny-Q6_K.gguf')}\n`)
  const lines = ok.stderr.trim().split('\n')
  for (const l of lines) expect(l).toMatch(/^tiny-Q6_K\.gguf: \d+0?% \(\d+\.\d of 0\.2 MB\)$/)
  const pcts = lines.map((l) => Number(/(\d+)%/.exec(l)[1]))
  expect(pcts.every((p, i) => p % 10 === 0 && (i === 0 || p > pcts[i - 1]))).toBe(true)
  expect(lines.at(-1)).toBe('tiny-Q6_K.gguf: 100% (0.2 of 0.2 MB)')
  const missing = await run(['hf:me/nothing:Q4_K_M', '--cache-dir', cacheDir])
  expect(missing.code).toBe(1)
  expect(missing.stderr).toMatch(/^error MODEL_LOAD_FAILED: me\/nothing: no such repository/)
  expect((await run([])).code).toBe(2)
})

describe('llama-engine inspect', () => {
  const { execFile } = require('node:child_process')
  const cli = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
  const run = (args) =>
    new Promise((resolve) => {
      execFile(process.execPath, [cli, 'inspect', ...args], { env: { ...process.env, HF_ENDPOINT: base } }, (err, stdout, stderr) =>
        resolve({ code: err ? err.code : 0, stdout, stderr }),
      )
    })
  const SMOL = path.join(__dirname, '..', 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf')

  test("a model: what it holds, and the memory of a context as llama.cpp sizes it, without loading the weights", async () => {
    const json = await run([SMOL, '--json', '--ctx', '1024', '--parallel', '2'])
    expect(json.code).toBe(0)
    const info = JSON.parse(json.stdout)
    expect(info).toMatchObject({
      kind: 'model',
      architecture: 'llama',
      quantization: 'Q4_1',
      layers: 30,
      embeddingLength: 576,
      heads: 9,
      kvHeads: 3,
      vocabSize: 49152,
      contextLength: 8192,
      chatTemplate: true,
      toolCallFormat: expect.any(String),
      fileBytes: fs.statSync(SMOL).size,
    })
    expect(info.parameters).toBeGreaterThan(130e6)
    expect(info.parameters).toBeLessThan(140e6)
    const m = info.memory
    expect(m).toMatchObject({ contextSize: 1024, parallel: 2, fits: true })
    // An F16 K and V row of kvHeads × head size per layer and cell.
    expect(m.kvCache).toBe(30 * 2 * 3 * (576 / 9) * 1024 * 2 * 2)
    const tensorBytes = info.tensorTypes.reduce((a, t) => a + t.bytes, 0)
    expect(Math.abs(m.weights - tensorBytes) / tensorBytes).toBeLessThan(0.05)
    expect(m.compute).toBeGreaterThan(0)
    expect(m.total).toBe(m.weights + m.kvCache + m.compute)
    // Twice the context: twice the KV cache.
    const twice = JSON.parse((await run([SMOL, '--json', '--ctx', '2048', '--parallel', '2'])).stdout)
    expect(twice.memory.kvCache).toBe(2 * m.kvCache)

    const text = await run([SMOL, '--ctx', '1024'])
    expect(text.code).toBe(0)
    expect(text.stdout).toMatch(/^architecture: +llama/m)
    expect(text.stdout).toMatch(/^quantization: +Q4_1/m)
    expect(text.stdout).toMatch(/^memory: +[\d.]+ MiB for 1024 tokens × 4 slots: weights/m)
    expect(text.stdout).toMatch(/^available: .*fits/m)
  })

  test('an adapter by hf: URI; a damaged file and a missing one are refused', async () => {
    const cacheDir = tmp()
    const adapter = await run(['hf:me/adapter/smol-lora.gguf', '--json', '--cache-dir', cacheDir])
    expect(adapter.code).toBe(0)
    expect(JSON.parse(adapter.stdout)).toMatchObject({ kind: 'adapter', architecture: 'llama', adapterType: 'lora', rank: 8, alpha: 16, tensors: 120 })
    const cut = path.join(cacheDir, 'cut.gguf')
    fs.writeFileSync(cut, fs.readFileSync(SMOL).subarray(0, 1 << 20))
    const damaged = await run([cut])
    expect(damaged.code).toBe(1)
    expect(damaged.stderr).toMatch(/^error MODEL_LOAD_FAILED: .*cut\.gguf/)
    expect((await run([path.join(cacheDir, 'none.gguf')])).code).toBe(1)
    expect((await run([])).code).toBe(2)
  })
})
