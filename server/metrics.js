'use strict'
// GET /metrics: counters and histograms in Prometheus' text format (0.0.4),
// kept in memory by the server; gauges read from the engine and the queue
// when scraped.

const TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
const TOKEN_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]

class Histogram {
  constructor(buckets) {
    this.buckets = buckets
    this.counts = buckets.map(() => 0)
    this.sum = 0
    this.count = 0
  }

  observe(value, times = 1) {
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]) this.counts[i] += times
    this.sum += value * times
    this.count += times
  }
}

const escape = (v) => String(v).replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"')
const labels = (obj) => {
  const parts = Object.entries(obj).map(([k, v]) => `${k}="${escape(v)}"`)
  return parts.length ? `{${parts.join(',')}}` : ''
}
const num = (x) => (Number.isFinite(x) ? String(x) : x > 0 ? '+Inf' : x < 0 ? '-Inf' : 'NaN')

class Metrics {
  requests = new Map() // "endpoint\0status" -> count
  promptTokens = 0
  cachedTokens = 0
  generatedTokens = 0
  embeddingTokens = 0
  drafters = new Map() // name -> { drafted, accepted }
  ttft = new Histogram(TTFT_BUCKETS)
  perToken = new Histogram(TOKEN_BUCKETS)
  // llama-server's counters (its `llamacpp:` names): prompt tokens computed
  // (cached ones apart) and their seconds, tokens generated and theirs, the
  // longest sequence, drafts.
  llama = { prompt: 0, promptSeconds: 0, cached: 0, predicted: 0, predictedSeconds: 0, maxTokens: 0, drafted: 0, accepted: 0, verifySteps: 0 }
  // llama-server's throughput gauges are over what happened since the last
  // scrape (its "bucket", emptied by each /metrics).
  bucket = { prompt: 0, promptSeconds: 0, predicted: 0, predictedSeconds: 0 }

  request(endpoint, status) {
    const key = `${endpoint}\0${status}`
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1)
  }

  /** Finished generations counted. */
  generations = 0

  /** A finished generation's counts (the engine's result). */
  generation(result) {
    this.generations++
    this.promptTokens += result.tokens_evaluated ?? 0
    this.cachedTokens += result.tokens_cached ?? 0
    this.generatedTokens += result.tokens_predicted ?? 0
    const l = this.llama
    const t = result.timings ?? {}
    l.prompt += t.prompt_n ?? 0
    l.promptSeconds += (t.prompt_ms ?? 0) / 1000
    l.cached += result.tokens_cached ?? 0
    l.predicted += t.predicted_n ?? 0
    l.predictedSeconds += (t.predicted_ms ?? 0) / 1000
    const b = this.bucket
    b.prompt += t.prompt_n ?? 0
    b.promptSeconds += (t.prompt_ms ?? 0) / 1000
    b.predicted += t.predicted_n ?? 0
    b.predictedSeconds += (t.predicted_ms ?? 0) / 1000
    l.maxTokens = Math.max(l.maxTokens, (result.tokens_evaluated ?? 0) + (result.tokens_predicted ?? 0))
    l.drafted += result.speculative?.n_drafted ?? 0
    l.accepted += result.speculative?.n_accepted ?? 0
    for (const [name, d] of Object.entries(result.speculative?.drafters ?? {})) {
      const c = this.drafters.get(name) ?? { drafted: 0, accepted: 0 }
      c.drafted += d.n_drafted ?? 0
      c.accepted += d.n_accepted ?? 0
      this.drafters.set(name, c)
    }
  }

  /**
   * The text of a scrape: `lanes` are the loaded engines (`{ name, status,
   * queue, loras }`, status null while one loads), `loading` the requests
   * waiting for a model to load, `modelName` the model's name when there is
   * one (the `model_name` label of the vLLM names).
   */
  render({ lanes, loading = 0, modelName = null }) {
    const out = []
    const metric = (name, type, help, samples) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`)
      for (const [l, v] of samples) out.push(`${name}${labels(l)} ${num(v)}`)
    }
    const histogram = (name, help, h) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`)
      h.buckets.forEach((b, i) => out.push(`${name}_bucket{le="${b}"} ${h.counts[i]}`))
      out.push(`${name}_bucket{le="+Inf"} ${h.count}`, `${name}_sum ${num(h.sum)}`, `${name}_count ${h.count}`)
    }
    const g = gauges(lanes, loading)
    metric(
      'llama_engine_http_requests_total',
      'counter',
      'HTTP requests answered, by endpoint and status.',
      [...this.requests].map(([key, v]) => {
        const [endpoint, status] = key.split('\0')
        return [{ endpoint, status }, v]
      }),
    )
    metric('llama_engine_prompt_tokens_total', 'counter', 'Prompt tokens of finished generations (cached ones included).', [[{}, this.promptTokens]])
    metric('llama_engine_prompt_tokens_cached_total', 'counter', 'Prompt tokens whose KV cells were reused, not computed.', [[{}, this.cachedTokens]])
    metric('llama_engine_generated_tokens_total', 'counter', 'Tokens generated.', [[{}, this.generatedTokens]])
    metric('llama_engine_embedding_tokens_total', 'counter', 'Input tokens of embedding requests.', [[{}, this.embeddingTokens]])
    const drafters = [...this.drafters]
    metric('llama_engine_drafted_tokens_total', 'counter', 'Tokens drafted, by drafter.', drafters.map(([drafter, c]) => [{ drafter }, c.drafted]))
    metric('llama_engine_accepted_tokens_total', 'counter', 'Drafted tokens accepted, by drafter.', drafters.map(([drafter, c]) => [{ drafter }, c.accepted]))
    metric('llama_engine_queue_depth', 'gauge', "Requests waiting: for a model to load, in the server's queue and in the engine's.", [[{}, g.waiting]])
    metric('llama_engine_slots_busy', 'gauge', 'Slots decoding a request (engine.status().active).', [[{}, g.running]])
    metric('llama_engine_slots', 'gauge', 'Slots: requests decoded together (engine.status().parallel).', [[{}, g.slots]])
    metric('llama_engine_kv_cache_usage_ratio', 'gauge', 'KV cells held by running requests / KV cells of the loaded models (0-1).', [[{}, g.kvUsage]])
    metric('llama_engine_kv_cache_cells', 'gauge', 'KV cells of the loaded models (contextSize x parallel each).', [[{}, g.kvCells]])
    if (modelName === null) {
      metric('llama_engine_models_loaded', 'gauge', 'Models loaded (serve --models).', [[{}, lanes.length]])
      metric(
        'llama_engine_model_requests_waiting',
        'gauge',
        'Requests waiting for a slot, by model.',
        lanes.map((l) => [{ model: l.name }, (l.queue?.waiting ?? 0) + (l.status?.queued ?? 0)]),
      )
      metric('llama_engine_model_requests_running', 'gauge', 'Requests decoding, by model.', lanes.map((l) => [{ model: l.name }, l.status?.active ?? 0]))
    }
    // The model server protocol of the Kubernetes Gateway API Inference
    // Extension, under vLLM's names: what its Endpoint Picker reads by default.
    const vllm = modelName === null ? {} : { model_name: modelName }
    metric('vllm:num_requests_waiting', 'gauge', 'Requests waiting (for a model to load, or for a slot).', [[vllm, g.waiting]])
    metric('vllm:num_requests_running', 'gauge', 'Requests decoding in a slot.', [[vllm, g.running]])
    metric('vllm:kv_cache_usage_perc', 'gauge', 'KV-cache usage, 0-1: cells held by running requests / cells.', [[vllm, g.kvUsage]])
    metric('vllm:gpu_cache_usage_perc', 'gauge', 'KV-cache usage, 0-1 (the name older Endpoint Pickers read).', [[vllm, g.kvUsage]])
    // Also without adapters (both lists empty, which the Endpoint Picker
    // skips): it reports a missing family as an error at every scrape.
    metric('vllm:lora_requests_info', 'gauge', 'LoRA adapters: loaded and ready (all of them), waiting (none: every adapter stays loaded), max; the value is when this was read.', [
      [{ running_lora_adapters: g.adapters.join(','), waiting_lora_adapters: '', max_lora: String(g.adapters.length) }, Date.now() / 1000],
    ])
    metric('process_resident_memory_bytes', 'gauge', "The server process's resident memory.", [[{}, process.memoryUsage.rss()]])
    const rss = lanes.reduce((sum, l) => sum + (l.status?.isolation?.rss ?? 0), 0)
    if (rss > 0) metric('llama_engine_process_resident_memory_bytes', 'gauge', "The isolated engine processes' resident memory.", [[{}, rss]])
    metric('llama_engine_prompt_cache_bytes', 'gauge', "Bytes held by the engines' host-memory prompt caches.", [
      [{}, lanes.reduce((sum, l) => sum + (l.status?.promptCache?.bytes ?? 0), 0)],
    ])
    this.renderLlama(metric, lanes, g)
    histogram('llama_engine_time_to_first_token_seconds', 'Seconds from the request to its first generated token (queueing and prefill included).', this.ttft)
    histogram('llama_engine_time_per_output_token_seconds', 'Seconds per generated token after the first.', this.perToken)
    return out.join('\n') + '\n'
  }

  /** llama-server's metrics, under its names (its help texts): what its dashboards read. */
  renderLlama(metric, lanes, g) {
    const l = this.llama
    let steps = 0
    let slots = 0
    for (const { status } of lanes) {
      steps += status?.decodes?.steps ?? 0
      slots += status?.decodes?.slots ?? 0
    }
    const rate = (n, s) => (s > 0 ? n / s : 0)
    const counters = [
      ['prompt_tokens_total', 'Number of prompt tokens processed, excluding cached tokens', l.prompt],
      ['prompt_tokens_cached_total', 'Number of prompt tokens reused from the cache', l.cached],
      ['prompt_seconds_total', 'Total time spent processing prompts', l.promptSeconds],
      ['tokens_predicted_total', 'Number of generation tokens processed', l.predicted],
      ['tokens_predicted_seconds_total', 'Total time spent generating tokens', l.predictedSeconds],
      ['n_decode_total', "Total number of llama_decode() calls of the loaded models' targets (prompt chunks, generation and verification steps, embedding passes)", steps],
      ['n_tokens_max', 'Largest observed sequence length (prompt + generation)', l.maxTokens],
      ['spec_decode_num_draft_tokens_total', 'Speculative: Total draft tokens generated', l.drafted],
      ['spec_decode_num_accepted_tokens_total', 'Speculative: Total draft tokens accepted by the target model', l.accepted],
      ['spec_decode_num_drafts_total', 'Speculative: Total speculative decoding verification steps', l.verifySteps],
    ]
    const gaugeItems = [
      ['prompt_tokens_seconds', 'Average prompt throughput in tokens/s', rate(this.bucket.prompt, this.bucket.promptSeconds)],
      ['predicted_tokens_seconds', 'Average generation throughput in tokens/s', rate(this.bucket.predicted, this.bucket.predictedSeconds)],
      ['requests_processing', 'Number of requests processing', g.running],
      ['requests_deferred', 'Number of requests deferred', g.waiting],
      ['n_busy_slots_per_decode', 'Average number of busy slots per llama_decode() call', slots / Math.max(steps, 1)],
    ]
    for (const [name, help, value] of counters) metric(`llamacpp:${name}`, 'counter', help, [[{}, value]])
    for (const [name, help, value] of gaugeItems) metric(`llamacpp:${name}`, 'gauge', help, [[{}, value]])
    this.bucket = { prompt: 0, promptSeconds: 0, predicted: 0, predictedSeconds: 0 }
  }
}

/**
 * The gauges over every loaded engine. Waiting: requests waiting for a
 * model to load, in a server queue, or in an engine's (prepared, not yet
 * in a slot). Running: requests in a slot. KV usage: cells the running
 * requests' slots hold / cells (each slot has its own `contextSize` cells;
 * an idle slot's cells are a cache any request may take, so they count as
 * free, as vLLM counts cached blocks no request holds).
 */
function gauges(lanes, loading) {
  let waiting = loading
  let running = 0
  let slots = 0
  let kvCells = 0
  let kvUsed = 0
  const adapters = []
  for (const { status, queue, loras } of lanes) {
    waiting += (queue?.waiting ?? 0) + (status?.queued ?? 0)
    if (!status) continue
    running += status.active ?? 0
    slots += status.parallel ?? 0
    kvCells += (status.contextSize ?? 0) * (status.parallel ?? 0)
    for (const s of status.slots ?? []) if (s.busy) kvUsed += s.cachedTokens ?? 0
    for (const l of loras ?? []) if (!adapters.includes(l.name)) adapters.push(l.name)
  }
  return { waiting, running, slots, kvCells, kvUsage: kvCells > 0 ? Math.min(1, kvUsed / kvCells) : 0, adapters }
}

module.exports = { Metrics, gauges }
