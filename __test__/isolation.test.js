// isolation: 'process' — the engine in a child process behind the same
// API. A child that dies (SIGKILL mid-stream, an abort in native code)
// rejects what it was running with ENGINE_CRASHED from its exit, a new
// child takes over, and its answers are the in-process engine's, bit for
// bit. Everything the API offers works across the boundary.

const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFile } = require('node:child_process')
const { LlamaEngine, TARGET, tiers, loadTarget, run, user } = require('./helpers')

const GREEDY = { prompt: 'The three most useful kitchen tools are', n_predict: 24, temperature: 0, n_probs: 3 }

function loadIsolated(extra = {}) {
  return LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: 2, isolation: 'process', ...extra })
}

/** Live engine child processes of this process. */
function engineChildren() {
  const out = require('node:child_process').execFileSync('ps', ['-eo', 'pid=,ppid=,args='], { encoding: 'utf8' })
  return out
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => Number(f[1]) === process.pid && f.slice(2).join(' ').includes(path.join('lib', 'isolation', 'child.js')))
    .map((f) => Number(f[0]))
}

/** Waits until `f()` is true, polling. */
async function until(f, ms = 30_000) {
  const end = Date.now() + ms
  while (!f()) {
    if (Date.now() > end) throw new Error('timed out')
    await new Promise((r) => setTimeout(r, 20))
  }
}

describe('isolation: process', () => {
  let local
  let expected
  beforeAll(async () => {
    local = await loadTarget()
    expected = await run(local, GREEDY)
  })
  afterAll(() => local.dispose())

  test('the same API: results bit-identical to in-process, streaming, tokenize, templates, status', async () => {
    const progress = []
    const engine = await loadIsolated({ onProgress: (f) => progress.push(f) })
    try {
      expect(progress.length).toBeGreaterThan(0)
      expect(progress[progress.length - 1]).toBe(1)
      const st = engine.status()
      expect(st.isolation).toMatchObject({ mode: 'process', restarts: 0, restarting: false })
      expect(st.isolation.pid).not.toBe(process.pid)
      expect(st).toMatchObject({ model: 'SmolLM2-135M-Instruct.Q4_1.gguf', contextSize: 2048, batchInvariant: true })
      expect(local.status().isolation).toEqual({ mode: 'none', pid: process.pid, restarts: 0 })

      const got = await run(engine, GREEDY)
      expect(got.result.content).toBe(expected.result.content)
      expect(got.result.completion_probabilities).toEqual(expected.result.completion_probabilities)
      expect(got.events.filter((e) => e.type === 'token').map((e) => e.content).join('')).toBe(got.result.content)

      // Synchronous text work, from the parent's vocabulary.
      const text = 'Hello, world! Ünïcödé <|im_start|>'
      expect(engine.tokenize(text, { special: true })).toEqual(local.tokenize(text, { special: true }))
      expect(engine.detokenize(local.tokenize(text))).toBe(text)
      expect(engine.applyChatTemplate(user('hi'))).toBe(local.applyChatTemplate(user('hi')))
      expect(await engine.tokenizeAsync(text)).toEqual(local.tokenize(text))
      expect(await engine.applyChatTemplateAsync(user('hi'))).toBe(local.applyChatTemplate(user('hi')))
      const answer = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
      const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'number' } } } } }]
      expect(engine.parseChatOutput(answer, { tools }).tool_calls[0].function).toEqual(local.parseChatOutput(answer, { tools }).tool_calls[0].function)

      // Chat, stream(), embed(), errors with their fields.
      const chat = await engine.complete({ messages: user('Name a colour.'), n_predict: 12, temperature: 0 })
      expect(chat.content).toBe((await local.complete({ messages: user('Name a colour.'), n_predict: 12, temperature: 0 })).content)
      const streamed = []
      for await (const e of engine.stream({ prompt: 'Once upon a time', n_predict: 8, temperature: 0 })) streamed.push(e)
      expect(streamed[streamed.length - 1].type).toBe('done')
      const [a, b] = await Promise.all([engine.embed('a lighthouse'), local.embed('a lighthouse')])
      expect(Array.from(a.embeddings[0])).toEqual(Array.from(b.embeddings[0]))
      await expect(engine.complete({ prompt: 'x', top_p: 5 })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'top_p' })
      // Events of every type cross (progress events came first and ended the request here once).
      const withProgress = await run(engine, { ...GREEDY, return_progress: true, cache_prompt: false })
      expect(withProgress.events.filter((e) => e.type === 'progress').length).toBeGreaterThanOrEqual(2)
      expect(withProgress.result.content).toBe(expected.result.content)
      // CONTEXT_EXCEEDED's numbers cross too.
      const long = 'word '.repeat(3000)
      await expect(engine.complete({ prompt: long, context_shift: false })).rejects.toMatchObject({ code: 'CONTEXT_EXCEEDED', contextSize: 2048, promptTokens: local.tokenize(long).length })
      expect(() => engine.detokenize([1e9])).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
    } finally {
      await engine.dispose()
    }
    expect(engine.status().disposed).toBe(true)
    await expect(engine.complete('x')).rejects.toMatchObject({ code: 'DISPOSED' })
  })

  test('abort, cancel, queued requests and sessions work across the boundary', async () => {
    const engine = await loadIsolated({ parallel: 1 })
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'le-iso-'))
    try {
      const ac = new AbortController()
      let seen = 0
      const running = engine.complete({ prompt: 'Tell me a long story', n_predict: 400, temperature: 0 }, (e) => {
        if (e.type === 'token' && ++seen === 3) ac.abort()
      }, ac.signal)
      // Queued behind it; cancel() once it runs.
      const queued = engine.complete({ prompt: 'Queued', n_predict: 400 }, (e) => {
        if (e.type === 'token') engine.cancel()
      })
      await until(() => engine.status().queued === 1)
      const r = await running
      expect(r.stopped_abort).toBe(true)
      expect((await queued).stopped_abort).toBe(true)

      const messages = user('Remember the number 42.')
      const saved = await engine.saveSession(path.join(dir, 's'), { messages })
      expect(saved.tokens).toBeGreaterThan(5)
      const loaded = await engine.loadSession(path.join(dir, 's'))
      expect(loaded).toMatchObject({ tokens: saved.tokens, messages })
      await expect(engine.loadSession(path.join(dir, 'missing'))).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
    } finally {
      await engine.dispose()
      fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  test('SIGKILL mid-stream: ENGINE_CRASHED from the exit itself, a new child, then answers bit-identical to in-process', async () => {
    const engine = await loadIsolated()
    try {
      const pid = engine.status().isolation.pid
      const events = []
      const streaming = engine.complete({ prompt: 'Write a long story about the sea', n_predict: 2000, temperature: 0 }, (e) => {
        events.push(e)
        if (events.length === 5) process.kill(pid, 'SIGKILL')
      })
      const queued = [engine.complete({ prompt: 'one', n_predict: 50 }), engine.complete({ prompt: 'two', n_predict: 50 })]
      const err = await streaming.catch((e) => e)
      // Rejected by the child's exit itself (its signal is in the message),
      // not by a timeout that noticed it later.
      expect(err).toMatchObject({ code: 'ENGINE_CRASHED', message: expect.stringContaining('SIGKILL') })
      for (const q of queued) await expect(q).rejects.toMatchObject({ code: 'ENGINE_CRASHED' })

      // A request made now waits for the new child.
      const again = await run(engine, GREEDY)
      const st = engine.status()
      expect(st.isolation.restarts).toBe(1)
      expect(st.isolation.pid).not.toBe(pid)
      expect(st.isolation.lastCrash).toContain('SIGKILL')
      expect(again.result.content).toBe(expected.result.content)
      expect(again.result.completion_probabilities).toEqual(expected.result.completion_probabilities)
    } finally {
      await engine.dispose()
    }
  })

  test('an abort in native code ends the child, with its last log line; restart: false leaves the engine failed', async () => {
    process.env.LLAMA_ENGINE_FAULT_INJECTION = '1'
    let engine
    try {
      engine = await loadIsolated({ restart: false })
    } finally {
      delete process.env.LLAMA_ENGINE_FAULT_INJECTION
    }
    try {
      const err = await engine.complete({ prompt: '__llama_engine_abort__', n_predict: 4 }).catch((e) => e)
      expect(err).toMatchObject({ code: 'ENGINE_CRASHED', message: expect.stringMatching(/SIGABRT.*fault injected/) })
      expect(engine.status().isolation).toMatchObject({ restarts: 0, restarting: false })
      await expect(engine.complete({ prompt: 'x', n_predict: 2 })).rejects.toMatchObject({ code: 'ENGINE_CRASHED' })
    } finally {
      await engine.dispose()
    }
  })

  test('a request sent while the child restarts keeps the host alive until it is answered (a plain node process, nothing else pending)', async () => {
    // In Jest something always keeps the loop alive; a host script does not:
    // if nothing referenced the loop while the request waited for the next
    // child, node would exit with code 13 (an unsettled top-level await).
    const ROOT = path.join(__dirname, '..')
    const script = `
      const { LlamaEngine } = require(${JSON.stringify(ROOT)});
      (async () => {
        const engine = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 512, threads: 2, isolation: 'process' });
        const delay = process.argv[1] === 'before' ? -1 : Number(process.argv[1]);
        const crashed = engine.complete({ prompt: 'Tell me a long story', n_predict: 500, ignore_eos: true }).catch((e) => e.code);
        await new Promise((r) => setTimeout(r, 100));
        process.kill(engine.status().isolation.pid, 'SIGKILL');
        // delay < 0: before the parent has seen the child die; else after, by delay ms.
        const first = delay < 0 ? null : await crashed;
        if (delay > 0) await new Promise((r) => setTimeout(r, delay));
        const r = await engine.complete({ prompt: 'Hello', n_predict: 4, temperature: 0 }).then((r) => r.tokens_predicted, (e) => e.code);
        console.log(JSON.stringify({ first: first ?? (await crashed), r }));
        await engine.dispose();
      })();`
    const once = (delay) =>
      new Promise((resolve) => {
        execFile(process.execPath, ['-e', script, `${delay}`], { timeout: 120_000 }, (err, stdout) => resolve({ code: err ? err.code : 0, out: stdout.trim().split('\n').at(-1) }))
      })
    // Before the parent has seen the child die (sent to it, it fails with
    // it), at once after (the next child is not started yet) and later
    // (while it loads): it waits for the next child, which answers.
    for (const delay of [-1, 0, 0, 50, 300]) {
      const { code, out } = await once(delay < 0 ? 'before' : delay)
      expect({ delay, code }).toEqual({ delay, code: 0 })
      const r = JSON.parse(out)
      expect(r.first).toBe('ENGINE_CRASHED')
      if (delay < 0) expect([4, 'ENGINE_CRASHED']).toContain(r.r)
      else expect(r.r).toBe(4)
    }
  })

  const KILLS = tiers(50, 12, 3)
  test(`killed ${KILLS} times at random moments, with requests in flight and arriving: every promise settles`, async () => {
    // A call waits for the next child at most restartWaitMs: 4 s leaves a
    // second for the small requests to be answered.
    const engine = await loadIsolated({ parallel: 2, contextSize: 1024, restartWaitMs: 4000 })
    const reference = await run(local, GREEDY)
    // A seeded generator: the same moments on every run.
    let seed = 47
    const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31)
    const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
    const calls = []
    const track = (what, promise) => {
      const call = { what, t0: Date.now(), ms: null, outcome: null }
      calls.push(call)
      promise.then(
        () => (call.outcome = 'ok'),
        (e) => (call.outcome = e.code || String(e)),
      ).finally(() => (call.ms = Date.now() - call.t0))
      return promise.catch(() => null)
    }
    // A child that answers (one that seems ready may be dead already, its exit not yet seen).
    const ready = async () => {
      const end = Date.now() + 60_000
      for (;;) {
        const r = await engine.complete({ prompt: 'Hi', n_predict: 1 }).then(() => true, (e) => {
          if (e.code !== 'ENGINE_CRASHED' && e.code !== 'ENGINE_RESTARTING') throw e
          return false
        })
        if (r) return
        if (Date.now() > end) throw new Error('no child answered for 60 s')
        await sleep(50)
      }
    }
    const kill = (pid = engine.status().isolation?.pid) => {
      if (pid > 0) {
        try {
          process.kill(pid, 'SIGKILL')
        } catch {}
      }
    }
    const LONG = 'The history of the lighthouse keepers of the northern coast. '.repeat(40)
    const moments = ['prefill', 'decode', 'embed', 'tokenize', 'load', 'arriving']
    try {
      for (let round = 0; round < KILLS; round++) {
        // The child answers first (a child that answers is no crash loop: the next restart is at once).
        await ready()
        const moment = moments[round % moments.length]
        if (moment === 'prefill') {
          track('prefill', engine.complete({ prompt: LONG, n_predict: 4 }))
          await sleep(random() * 60)
        } else if (moment === 'decode') {
          let seen = 0
          const target = 1 + Math.floor(random() * 8)
          let killed
          const done = new Promise((r) => (killed = r))
          track('decode', engine.complete({ prompt: 'Write a long story about the sea', n_predict: 400 }, (e) => {
            if (e.type === 'token' && ++seen === target) killed()
          }))
          await Promise.race([done, sleep(5000)])
        } else if (moment === 'embed') {
          track('embed', engine.embed([LONG, LONG.slice(0, 500)]))
          await sleep(random() * 40)
        } else if (moment === 'tokenize') {
          track('tokenize', engine.tokenizeAsync(LONG.repeat(20)))
          track('complete', engine.complete({ prompt: 'Count to ten:', n_predict: 32 }))
          await sleep(random() * 30)
        } else if (moment === 'load') {
          const old = engine.status().isolation.pid
          kill(old)
          // The next child, while it loads.
          await until(() => {
            const { pid, restarting } = engine.status().isolation
            return restarting && pid > 0 && pid !== old
          }, 10_000)
          await sleep(random() * 300)
        }
        const queued = track('queued', engine.complete({ prompt: 'And then', n_predict: 6 }))
        kill()
        // Sent before this process can have seen the child die: it fails with it, or waits.
        track('racing', engine.complete({ prompt: 'Hi there', n_predict: 4 }))
        // Requests arriving while it restarts (once its death was seen): at once, and a little later.
        await queued
        track('arriving', engine.complete({ prompt: 'Hello', n_predict: 4 }))
        track('arriving-embed', engine.embed('a lighthouse'))
        await sleep(random() * 100)
        track('arriving-late', engine.complete({ prompt: 'Goodbye', n_predict: 4 }))
      }
      // After it all, the engine answers as in-process, bit for bit.
      await ready()
      const again = await run(engine, GREEDY)
      expect(again.result.completion_probabilities).toEqual(reference.result.completion_probabilities)
      // Killed during dispose: dispose resolves, nothing hangs.
      track('at-dispose', engine.complete({ prompt: 'Write a long story', n_predict: 400 }))
      await sleep(50)
      const pid = engine.status().isolation.pid
      const disposing = track('dispose', engine.dispose())
      kill(pid)
      await disposing
      // Every call settles (none is left waiting on a child that is gone):
      // until() fails the test when one is still pending after a minute.
      await until(() => calls.every((c) => c.ms !== null), 60_000)
    } finally {
      await engine.dispose()
    }
    if (process.env.SHOW_CALLS) console.log(JSON.stringify(calls.map((c) => [c.what, c.outcome, c.ms])))
    // Each call answered, or refused with the crash's codes: none dropped, none INTERNAL.
    const outcomes = new Set(calls.map((c) => c.outcome))
    for (const o of outcomes) expect(['ok', 'ENGINE_CRASHED', 'ENGINE_RESTARTING', 'DISPOSED']).toContain(o)
    expect(calls.filter((c) => c.what === 'tokenize').every((c) => c.outcome === 'ok')).toBe(true)
    // Those arriving while it restarts are answered by the next child (but
    // where that one was killed as it loaded).
    const arrived = calls.filter((c) => c.what.startsWith('arriving'))
    expect(arrived.filter((c) => c.outcome === 'ok').length).toBeGreaterThan(arrived.length / 2)
  }, 900_000)

  test('a load that kills the child rejects MODEL_LOAD_FAILED, saying how it died, and is not retried', async () => {
    process.env.LLAMA_ENGINE_FAULT_INJECTION = 'abort-on-load'
    try {
      await expect(loadIsolated()).rejects.toMatchObject({ code: 'MODEL_LOAD_FAILED', message: expect.stringContaining('SIGABRT') })
    } finally {
      delete process.env.LLAMA_ENGINE_FAULT_INJECTION
    }
    // A load the child refuses is refused as in-process, and nothing is
    // left behind: no child retrying the load in the background.
    await expect(loadIsolated({ modelPath: path.join(os.tmpdir(), 'no-such.gguf') })).rejects.toMatchObject({ code: 'MODEL_LOAD_FAILED' })
    const end = Date.now() + 2500
    while (Date.now() < end) {
      expect(engineChildren()).toEqual([])
      await new Promise((r) => setTimeout(r, 50))
    }
  })
})
