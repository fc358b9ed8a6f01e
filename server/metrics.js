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

  request(endpoint, status) {
    const key = `${endpoint}\0${status}`
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1)
  }

  /** A finished generation's counts (the engine's result). */
  generation(result) {
    this.promptTokens += result.tokens_evaluated ?? 0
    this.cachedTokens += result.tokens_cached ?? 0
    this.generatedTokens += result.tokens_predicted ?? 0
    for (const [name, d] of Object.entries(result.speculative?.drafters ?? {})) {
      const c = this.drafters.get(name) ?? { drafted: 0, accepted: 0 }
      c.drafted += d.n_drafted ?? 0
      c.accepted += d.n_accepted ?? 0
      this.drafters.set(name, c)
    }
  }

  /**
   * The text of a scrape. `status` is the engine's status() (or null while
   * it loads), `queue` the admission queue.
   */
  render(status, queue) {
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
    metric('llama_engine_queue_depth', 'gauge', "Requests waiting: in the server's queue and in the engine's.", [
      [{}, queue.waiting + (status?.queued ?? 0)],
    ])
    metric('llama_engine_slots_busy', 'gauge', 'Slots decoding a request (engine.status().active).', [[{}, status?.active ?? 0]])
    metric('llama_engine_slots', 'gauge', 'Slots: requests decoded together (engine.status().parallel).', [[{}, status?.parallel ?? 0]])
    metric('process_resident_memory_bytes', 'gauge', "The server process's resident memory.", [[{}, process.memoryUsage.rss()]])
    if (status?.isolation?.rss) metric('llama_engine_process_resident_memory_bytes', 'gauge', "The isolated engine process's resident memory.", [[{}, status.isolation.rss]])
    metric('llama_engine_prompt_cache_bytes', 'gauge', "Bytes held by the engine's host-memory prompt cache.", [[{}, status?.promptCache?.bytes ?? 0]])
    histogram('llama_engine_time_to_first_token_seconds', 'Seconds from the request to its first generated token (queueing and prefill included).', this.ttft)
    histogram('llama_engine_time_per_output_token_seconds', 'Seconds per generated token after the first.', this.perToken)
    return out.join('\n') + '\n'
  }
}

module.exports = { Metrics }
