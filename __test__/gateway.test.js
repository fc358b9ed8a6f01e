// The model server protocol of the Kubernetes Gateway API Inference
// Extension, as its Endpoint Picker reads it with its default flags:
// /metrics scraped by a Prometheus text-format parser while requests run,
// queue and use a LoRA adapter, each gauge checked against status() (the
// engine in this process, and isolated in a child); OpenAI Completions and
// Chat as the gateway sends them, `model` naming an adapter,
// `stream_options.include_usage`.
const parsePrometheus = require('parse-prometheus-text-format')
const { LlamaEngine, TARGET, model, user, FULL, tiers } = require('./helpers')
const { listen, close } = require('./server-helpers')
const { createServer } = require('../server')

const ADAPTER = model('SmolLM2-135M-Instruct.lora-test.gguf')
const ADAPTER_NAME = 'SmolLM2-135M-Instruct.lora-test'
const post = (url, body) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

/** Waits for `predicate` (sync or async) to hold; fails the test after `ms`. */
async function until(predicate, ms) {
  const deadline = Date.now() + ms
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${predicate}`)
    await new Promise((r) => setTimeout(r, 25))
  }
}

async function scrape(base) {
  const res = await fetch(`${base}/metrics`)
  expect(res.status).toBe(200)
  return Object.fromEntries(parsePrometheus(await res.text()).map((f) => [f.name, f]))
}
const gauge = (families, name) => {
  const f = families[name]
  expect(f.type).toBe('GAUGE')
  expect(f.metrics).toHaveLength(1)
  return Number(f.metrics[0].value)
}
/** KV usage as the gauges define it, from status(): cells of busy slots / cells. */
const kvUsage = (st) => st.slots.filter((s) => s.busy).reduce((n, s) => n + s.cachedTokens, 0) / (st.contextSize * st.parallel)

/** A stream that runs until stopped: returns once its first token arrived (or at once when it waits in the queue). */
function endless(base, extra = {}) {
  const ac = new AbortController()
  const started = post(`${base}/v1/completions`, { prompt: 'Once upon a time', max_tokens: 1500, ignore_eos: true, temperature: 0, stream: true, ...extra }).then(
    async (res) => {
      const reader = res.body.getReader()
      ac.signal.addEventListener('abort', () => reader.cancel().catch(() => {}))
      for (;;) {
        const { done } = await reader.read().catch(() => ({ done: true }))
        if (done) return
      }
    },
    () => {},
  )
  return { stop: () => ac.abort(), ended: started, signal: ac.signal }
}

// In test:full on an isolated engine, in test:release in-process too (npm
// test keeps its ten minutes; server-ops.test.js reads the same gauges idle,
// in-process).
(FULL ? describe : describe.skip).each(tiers([['none'], ['process']], [['process']], [['process']]))('isolation %s', (isolation) => {
  let engine, server, base
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: 2, parallel: 2, isolation, loras: [{ path: ADAPTER }] })
    server = createServer({ engine, signals: false, maxQueue: 8 })
    base = await listen(server)
  })
  afterAll(async () => {
    if (server) await close(server)
    if (engine) await engine.dispose()
  })

  test('idle: nothing waits or runs, the KV cache is free, the adapter is loaded and ready', async () => {
    const f = await scrape(base)
    expect(gauge(f, 'vllm:num_requests_waiting')).toBe(0)
    expect(gauge(f, 'vllm:num_requests_running')).toBe(0)
    expect(gauge(f, 'vllm:kv_cache_usage_perc')).toBe(0)
    expect(f['vllm:num_requests_waiting'].metrics[0].labels.model_name).toBe(engine.status().model)
    const lora = f['vllm:lora_requests_info'].metrics
    expect(lora).toHaveLength(1)
    expect(lora[0].labels).toEqual({ running_lora_adapters: ADAPTER_NAME, waiting_lora_adapters: '', max_lora: '1' })
    // The value is when it was read (the EPP keeps the latest).
    expect(Math.abs(Number(lora[0].value) - Date.now() / 1000)).toBeLessThan(60)
  })

  test('two running, two queued: the gauges say what status() says', async () => {
    const running = [endless(base), endless(base, { model: ADAPTER_NAME })]
    await until(() => engine.status().active === 2 && engine.status().slots.every((s) => s.busy && s.cachedTokens > 8), 60_000)
    const queued = [endless(base), endless(base)]
    try {
      // Both wait in the server's queue (the engine's two slots are taken).
      await until(async () => gauge(await scrape(base), 'vllm:num_requests_waiting') === 2, 30_000)
      const before = kvUsage(engine.status())
      const f = await scrape(base)
      const after = kvUsage(engine.status())
      expect(gauge(f, 'vllm:num_requests_running')).toBe(engine.status().active)
      expect(gauge(f, 'vllm:num_requests_running')).toBe(2)
      expect(gauge(f, 'vllm:num_requests_waiting')).toBe(2)
      expect(gauge(f, 'llama_engine_queue_depth')).toBe(2)
      expect(gauge(f, 'llama_engine_slots_busy')).toBe(2)
      // The cells grow as the streams run: the scrape sits between the two reads.
      const kv = gauge(f, 'vllm:kv_cache_usage_perc')
      expect(kv).toBeGreaterThan(0)
      expect(kv).toBeLessThan(1)
      expect(kv).toBeGreaterThanOrEqual(before - 1e-9)
      expect(kv).toBeLessThanOrEqual(after + 1e-9)
      expect(gauge(f, 'vllm:gpu_cache_usage_perc')).toBe(kv)
      expect(gauge(f, 'llama_engine_kv_cache_usage_ratio')).toBe(kv)
      expect(gauge(f, 'llama_engine_kv_cache_cells')).toBe(engine.status().contextSize * 2)
      // One running stream stops: a queued one takes its slot.
      running[0].stop()
      await until(async () => gauge(await scrape(base), 'vllm:num_requests_waiting') === 1, 30_000)
      expect(gauge(await scrape(base), 'vllm:num_requests_running')).toBe(2)
    } finally {
      for (const s of [...running, ...queued]) s.stop()
      await Promise.all([...running, ...queued].map((s) => s.ended))
    }
    await until(async () => {
      const f = await scrape(base)
      return gauge(f, 'vllm:num_requests_running') === 0 && gauge(f, 'vllm:num_requests_waiting') === 0
    }, 30_000)
    // Idle slots keep their cells as a cache; they count as free.
    expect(gauge(await scrape(base), 'vllm:kv_cache_usage_perc')).toBe(0)
  })

  test('`model` naming the adapter runs it (as lora [{ id: 0, scale: 1 }]) and answers with that name; GET /v1/models lists it', async () => {
    const body = { prompt: 'The capital of France is', max_tokens: 12, temperature: 0 }
    const named = await (await post(`${base}/v1/completions`, { ...body, model: ADAPTER_NAME })).json()
    const explicit = await (await post(`${base}/v1/completions`, { ...body, lora: [{ id: 0, scale: 1 }] })).json()
    const plain = await (await post(`${base}/v1/completions`, { ...body, lora: [{ id: 0, scale: 0 }] })).json()
    expect(named.model).toBe(ADAPTER_NAME)
    expect(named.choices[0].text).toBe(explicit.choices[0].text)
    // The adapter changes what the model writes (else this test could not fail).
    expect(named.choices[0].text).not.toBe(plain.choices[0].text)
    const models = await (await fetch(`${base}/v1/models`)).json()
    expect(models.data.map((m) => m.id)).toEqual([engine.status().model, ADAPTER_NAME])
    expect(models.data[1].parent).toBe(engine.status().model)
    expect(models.data.every((m) => m.status.value === 'loaded')).toBe(true)
  })

  test('Completions and Chat streamed with stream_options.include_usage: a last chunk of usage, no choices', async () => {
    for (const [path, body] of [
      ['/v1/completions', { prompt: 'Hello', max_tokens: 5, temperature: 0 }],
      ['/v1/chat/completions', { messages: user('Hello'), max_tokens: 5, temperature: 0 }],
    ]) {
      const text = await (await post(`${base}${path}`, { ...body, stream: true, stream_options: { include_usage: true } })).text()
      const chunks = text
        .split('\n\n')
        .filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]')
        .map((e) => JSON.parse(e.slice(6)))
      expect(text.trim().endsWith('data: [DONE]')).toBe(true)
      const last = chunks.at(-1)
      expect(last.choices).toEqual([])
      expect(last.usage.completion_tokens).toBe(5)
      expect(last.usage.prompt_tokens).toBeGreaterThan(0)
      expect(chunks.slice(0, -1).every((c) => c.usage === undefined)).toBe(true)
    }
  })
})
