// A model over several processes with llama.cpp's RPC back end, on
// loopback: two `llama-engine rpc-worker`s hold the model's layers, and the
// engine computes the same tokens and probabilities as a local run (the
// same CPU kernels, the weights as they are in the file); a worker that is
// not there fails the load by name; a worker killed mid-request rejects that
// request with ENGINE_CRASHED naming the worker, and nothing hangs. In test:full.
const fs = require('node:fs')
const net = require('node:net')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { LlamaEngine, TARGET, GEMMA, FULL } = require('./helpers')
const { until } = require('./server-helpers')

const CLI = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
const full = FULL ? describe : describe.skip
const rssKb = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1])

const freePort = () =>
  new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => resolve(port))
    })
  })
const connects = (port) =>
  new Promise((resolve) => {
    const c = net.connect(port, '127.0.0.1', () => {
      c.end()
      resolve(true)
    })
    c.on('error', () => resolve(false))
  })

/** A worker on a free loopback port, listening when this resolves. */
async function worker(...args) {
  const port = await freePort()
  const child = spawn(process.execPath, [CLI, 'rpc-worker', '--port', String(port), '--threads', '1', ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout.on('data', (d) => (out += d))
  child.stderr.on('data', (d) => (out += d))
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })))
  for (let i = 0; !(await connects(port)); i++) {
    if (i > 400 || child.exitCode !== null) throw new Error(`rpc-worker did not start: ${out}`)
    await new Promise((r) => setTimeout(r, 25))
  }
  return { port, endpoint: `127.0.0.1:${port}`, child, exited, output: () => out }
}

full('two loopback workers', () => {
  let workers = []
  beforeAll(async () => {
    workers = [await worker(), await worker()]
  })
  afterAll(() => {
    for (const w of workers) w.child.kill('SIGKILL')
  })

  test.each([
    ['SmolLM2 Q4_1', TARGET],
    ['gemma-3 Q4_K_M', GEMMA],
  ])('%s: the layers on the workers; the same tokens and probabilities as a local run, greedy and seeded', async (_, modelPath) => {
    const requests = [
      { prompt: 'The capital of France is', n_predict: 32, temperature: 0, n_probs: 2 },
      { prompt: 'A haiku about rivers:', n_predict: 32, temperature: 0.9, seed: 7, n_probs: 2 },
    ]
    const local = await LlamaEngine.load({ modelPath, contextSize: 512, threads: 2 })
    const expected = []
    try {
      for (const r of requests) expected.push(await local.complete(r))
    } finally {
      await local.dispose()
    }
    const before = workers.map((w) => rssKb(w.child.pid))
    const engine = await LlamaEngine.load({ modelPath, contextSize: 512, threads: 2, rpc: workers.map((w) => w.endpoint) })
    try {
      const st = engine.status()
      expect(st.rpc).toEqual({ workers: workers.map((w) => w.endpoint) })
      // A worker lost would end the process using it: an engine with workers is isolated.
      expect(st.isolation.mode).toBe('process')
      expect(st.batchInvariant).toBe(true)
      // Each worker now holds a share of the weights (an eighth of the file at least: the token
      // embeddings, much of gemma-3-270m's file, stay here, as llama.cpp keeps them).
      const grown = workers.map((w, i) => (rssKb(w.child.pid) - before[i]) * 1024)
      for (const g of grown) expect(g).toBeGreaterThan(fs.statSync(modelPath).size / 8)
      for (const [i, r] of requests.entries()) {
        const got = await engine.complete(r)
        expect(got.content).toBe(expected[i].content)
        expect(got.completion_probabilities).toEqual(expected[i].completion_probabilities)
      }
    } finally {
      await engine.dispose()
    }
  })

  test('rpc-worker --mem sets a worker’s share of the layers', async () => {
    const small = await worker('--mem', '40')
    const large = await worker('--mem', '4000')
    try {
      const before = [small, large].map((w) => rssKb(w.child.pid))
      const engine = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 512, threads: 2, rpc: [small.endpoint, large.endpoint] })
      try {
        const [s, l] = [small, large].map((w, i) => rssKb(w.child.pid) - before[i])
        expect(l).toBeGreaterThan(4 * s)
        expect((await engine.complete({ prompt: 'Hello', n_predict: 4, temperature: 0 })).tokens_predicted).toBe(4)
      } finally {
        await engine.dispose()
      }
    } finally {
      small.child.kill('SIGKILL')
      large.child.kill('SIGKILL')
    }
  })

  test('a worker that is not there: MODEL_LOAD_FAILED naming it; rpc without isolation is refused by name', async () => {
    const gone = `127.0.0.1:${await freePort()}`
    await expect(LlamaEngine.load({ modelPath: TARGET, contextSize: 512, rpc: [workers[0].endpoint, gone] })).rejects.toMatchObject({
      code: 'MODEL_LOAD_FAILED',
      message: expect.stringContaining(gone),
    })
    await expect(LlamaEngine.load({ modelPath: TARGET, rpc: [workers[0].endpoint], isolation: 'none' })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'isolation' })
    await expect(LlamaEngine.load({ modelPath: TARGET, rpc: ['no-port'] })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'rpc[0]' })
  })

  test('a worker killed mid-request: the request rejects ENGINE_CRASHED naming the worker, the next one with a code, dispose resolves', async () => {
    const doomed = await worker()
    const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: 2, rpc: [workers[0].endpoint, doomed.endpoint] })
    let n = 0
    const running = engine.complete({ prompt: 'Once upon a time', n_predict: 1500, ignore_eos: true, temperature: 0 }, (e) => {
      if (e.type === 'token' && ++n === 10) doomed.child.kill('SIGKILL')
    })
    await expect(running).rejects.toMatchObject({ code: 'ENGINE_CRASHED' })
    // The next child cannot reach the worker either: refused with a code, not left waiting.
    await expect(engine.complete({ prompt: 'Hi', n_predict: 2 })).rejects.toMatchObject({ code: expect.stringMatching(/^ENGINE_(CRASHED|RESTARTING)$/) })
    // The next child's load fails on the lost worker, by name (once the
    // restart has been tried: the request above may have been refused
    // while it was still under way).
    const named = new RegExp(doomed.endpoint.replace(/\./g, '\\.'))
    await until(() => named.test(engine.status().isolation.lastCrash || ''), 60_000)
    expect(engine.status().isolation.lastCrash).toMatch(named)
    await engine.dispose()
    // The surviving worker serves the next engine.
    const again = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, threads: 2, rpc: [workers[0].endpoint] })
    expect((await again.complete({ prompt: 'Hello', n_predict: 3, temperature: 0 })).tokens_predicted).toBe(3)
    await again.dispose()
  })
})

test('rpc-worker: loopback unless --allow-network; its flags checked', async () => {
  const { pathToFileURL } = require('node:url')
  const vm = require('node:vm')
  const load = new vm.Script('(url) => import(url)', { importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER }).runInThisContext()
  const { parseRpcWorker, parseServe, parseCli } = await load(pathToFileURL(CLI).href)
  expect(parseRpcWorker([])).toMatchObject({ endpoint: '127.0.0.1:50052' })
  expect(parseRpcWorker(['--host', '::1', '--port', '7000'])).toMatchObject({ endpoint: '[::1]:7000' })
  expect(() => parseRpcWorker(['--host', '0.0.0.0'])).toThrow(/--allow-network/)
  expect(parseRpcWorker(['--host', '0.0.0.0', '--allow-network', '--mem', '512', '-t', '3'])).toMatchObject({ endpoint: '0.0.0.0:50052', mem: 512, threads: 3 })
  expect(() => parseRpcWorker(['--port', '0'])).toThrow(/--port/)
  expect(parseServe(['-m', 'm.gguf', '--rpc', '10.0.0.2:50052,10.0.0.3:50052'], {}).load.rpc).toEqual(['10.0.0.2:50052', '10.0.0.3:50052'])
  expect(parseCli(['--rpc', 'h:1', '--prompt', 'x'], {}).load.rpc).toEqual(['h:1'])
  expect(() => parseServe(['-m', 'm.gguf', '--rpc', 'a:1,'], {})).toThrow(/--rpc/)
})
