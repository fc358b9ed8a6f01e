// llama-server's model management under `serve` without a model (its router
// over the Hugging Face cache): GET /models/sse, POST /models (a download
// into the cache, from a local stand-in for the Hub) and DELETE /models (a
// cached model unloaded and its files removed), against the real CLI.

const crypto = require('node:crypto')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { TARGET, model } = require('./helpers')
const { listen, close } = require('./server-helpers')

const CLI = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex')
// A small real GGUF for the download (listed by its name; never loaded).
const SMALL = fs.readFileSync(model('SmolLM2-135M-Instruct.lora-test.gguf'))
const HUB = { 'me/new': { 'new-Q4_1.gguf': SMALL, 'README.md': Buffer.from('# new') } }

let hub
let hubBase
let cache
let child
let base
let stderr = ''

/** The hub layout with `file` a blob of `data`, as huggingface_hub and llama.cpp write it. */
function cached(repo, file, data) {
  const dir = path.join(cache, `models--${repo.replace('/', '--')}`)
  const oid = sha(data)
  fs.mkdirSync(path.join(dir, 'blobs'), { recursive: true })
  fs.mkdirSync(path.join(dir, 'refs'), { recursive: true })
  fs.mkdirSync(path.join(dir, 'snapshots', 'rev'), { recursive: true })
  fs.writeFileSync(path.join(dir, 'blobs', oid), data)
  fs.writeFileSync(path.join(dir, 'refs', 'main'), 'rev')
  fs.symlinkSync(path.join('..', '..', 'blobs', oid), path.join(dir, 'snapshots', 'rev', file))
  return dir
}

beforeAll(async () => {
  hub = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x')
    let m = /^\/api\/models\/([^/]+\/[^/]+)\/(revision|tree)\/main$/.exec(url.pathname)
    if (m) {
      const files = HUB[m[1]]
      if (!files) return res.writeHead(404).end('{"error":"Repository not found"}')
      res.setHeader('content-type', 'application/json')
      if (m[2] === 'revision') return res.end(JSON.stringify({ id: m[1], sha: 'b'.repeat(40) }))
      return res.end(JSON.stringify(Object.entries(files).map(([p, data]) => ({ type: 'file', path: p, size: data.length, lfs: { oid: sha(data), size: data.length } }))))
    }
    m = /^\/([^/]+\/[^/]+)\/resolve\/main\/(.+)$/.exec(url.pathname)
    const data = m && HUB[m[1]]?.[decodeURIComponent(m[2])]
    if (!data) return res.writeHead(404).end()
    res.writeHead(200, { 'content-length': data.length })
    res.end(data)
  })
  hubBase = await listen(hub)
  cache = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-admin-'))
  cached('me/old', 'old-Q4_1.gguf', fs.readFileSync(TARGET))
  child = spawn(process.execPath, [CLI, 'serve', '--port', '0', '-c', '256', '-np', '1', '--models-max', '1'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, LLAMA_CACHE: cache, HF_ENDPOINT: hubBase },
  })
  child.stderr.setEncoding('utf8')
  child.stderr.on('data', (d) => (stderr += d))
  for (const deadline = Date.now() + 60_000; !/listening on (http:\/\/\S+),/.test(stderr); await new Promise((r) => setTimeout(r, 25))) {
    if (Date.now() > deadline) throw new Error(`serve did not start: ${stderr}`)
  }
  base = /listening on (http:\/\/\S+),/.exec(stderr)[1]
})

afterAll(async () => {
  child?.kill('SIGKILL')
  await close(hub)
  fs.rmSync(cache, { recursive: true, force: true })
})

/** GET /models/sse: the events so far, and `until(event, model)`. */
async function subscribe() {
  const ac = new AbortController()
  const res = await fetch(`${base}/models/sse`, { signal: ac.signal })
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/)
  const events = []
  const waiters = []
  const reader = res.body.getReader()
  const dec = new TextDecoder()
  let text = ''
  let subscribed
  const ready = new Promise((r) => (subscribed = r))
  ;(async () => {
    try {
      for (let r = await reader.read(); !r.done; r = await reader.read()) {
        text += dec.decode(r.value, { stream: true })
        if (text.startsWith(': subscribed')) subscribed()
        for (let i; (i = text.indexOf('\n\n')) >= 0; text = text.slice(i + 2)) {
          const line = text.slice(0, i)
          if (line.startsWith('data: ')) events.push(JSON.parse(line.slice(6)))
        }
        for (const w of waiters.splice(0)) w()
      }
    } catch {}
  })()
  await ready
  const until = async (event, name, status) => {
    const found = () => events.find((e) => e.event === event && e.model === name && (status === undefined || e.data?.status === status))
    while (!found()) await new Promise((r) => waiters.push(r))
    return found()
  }
  return { events, until, stop: () => ac.abort() }
}

const ids = async () => (await (await fetch(`${base}/models`)).json()).data.map((m) => m.id)
const post = (route, body) => fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

test('POST /models downloads a model of the Hub into the cache, told on /models/sse, then listed; twice, an unknown one or a bad name is a 400', async () => {
  expect(await ids()).toEqual(['me/old:Q4_1'])
  const sse = await subscribe()
  try {
    const res = await post('/models', { model: 'me/new:Q4_1' })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ success: true })
    await sse.until('download_finished', 'me/new:Q4_1')
    const progress = sse.events.filter((e) => e.event === 'download_progress' && e.model === 'me/new:Q4_1')
    expect(progress.length).toBeGreaterThan(0)
    expect(progress.at(-1).data.progress['new-Q4_1.gguf']).toEqual({ done: SMALL.length, total: SMALL.length })
    await sse.until('models_reload', '*')
    expect((await ids()).sort()).toEqual(['me/new:Q4_1', 'me/old:Q4_1'])
    // In the cache as the Hub's tools lay it out: the blob by its sha256, the snapshot's link to it.
    const snap = path.join(cache, 'models--me--new', 'snapshots', 'b'.repeat(40), 'new-Q4_1.gguf')
    expect(fs.readFileSync(snap).equals(SMALL)).toBe(true)
  } finally {
    sse.stop()
  }
  for (const [body, message] of [
    [{ model: 'me/new:Q4_1' }, /already exists/],
    [{ model: 'me/nothing:Q4_1' }, /cannot be downloaded: .*no such repository/],
    [{ model: '../etc' }, /OWNER\/REPO/],
    [{}, /OWNER\/REPO/],
  ]) {
    const res = await post('/models', body)
    expect({ body, status: res.status }).toEqual({ body, status: 400 })
    expect((await res.json()).error.message).toMatch(message)
  }
})

test('DELETE /models unloads a model of the cache and removes its files (blob and link), told on /models/sse; an unknown one is a 400', async () => {
  const sse = await subscribe()
  try {
    // Loaded first: the removal unloads it.
    expect((await post('/models/load', { model: 'me/old:Q4_1' })).status).toBe(200)
    await sse.until('status_change', 'me/old:Q4_1', 'loaded')
    expect(sse.events.filter((e) => e.model === 'me/old:Q4_1' && e.event === 'status_change').map((e) => e.data.status)).toEqual(['loading', 'loaded'])
    const res = await fetch(`${base}/models?model=${encodeURIComponent('me/old:Q4_1')}`, { method: 'DELETE' })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ success: true })
    await sse.until('model_remove', 'me/old:Q4_1')
    await sse.until('status_change', 'me/old:Q4_1', 'unloaded')
    expect(sse.events.filter((e) => e.model === 'me/old:Q4_1' && e.event === 'status_change').map((e) => e.data.status)).toEqual(['loading', 'loaded', 'unloaded'])
    expect(await ids()).not.toContain('me/old:Q4_1')
    expect(fs.existsSync(path.join(cache, 'models--me--old'))).toBe(false)
    // The model file it was copied from is untouched.
    expect(fs.existsSync(TARGET)).toBe(true)
  } finally {
    sse.stop()
  }
  const unknown = await fetch(`${base}/models?model=me/old:Q4_1`, { method: 'DELETE' })
  expect(unknown.status).toBe(400)
  expect((await unknown.json()).error.message).toMatch(/not found/)
})
