// Engines in a process of their own, for the bench's `contention` section:
//   node bench/contention.mjs '{"model": "...", "engines": 1, "threads": 2, "tokens": 128, "runs": 3}'
// loads `engines` engines (one after the other), then runs `runs` rounds of
// one greedy request of `tokens` tokens on each engine at once, and prints
// one JSON line: { load_ms (per engine), tps: [[per engine] per round],
// threadsInUse }. With "forever": true it streams without end instead (the
// second engine process of a scenario). LLAMA_ENGINE_ADDON picks the addon.
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const cfg = JSON.parse(process.argv[2])
const { LlamaEngine } = createRequire(import.meta.url)(join(dirname(fileURLToPath(import.meta.url)), '..'))

const t0 = performance.now()
const engines = []
for (let i = 0; i < (cfg.engines || 1); i++) {
  engines.push(await LlamaEngine.load({ modelPath: cfg.model, contextSize: 1024, threads: cfg.threads || 2, parallel: 1 }))
}
const load_ms = (performance.now() - t0) / engines.length
const request = {
  prompt: 'Write a long story about a lighthouse keeper and the sea.',
  n_predict: cfg.tokens || 128,
  temperature: 0,
  ignore_eos: true,
  cache_prompt: false,
  speculative: { mode: 'off' },
}
await Promise.all(engines.map((e) => e.complete({ ...request, n_predict: 4 })))
if (cfg.forever) {
  for (;;) await engines[0].complete(request)
}
const tps = []
for (let r = 0; r < (cfg.runs || 3); r++) {
  const results = await Promise.all(engines.map((e) => e.complete(request)))
  tps.push(results.map((x) => x.timings.predicted_per_second))
}
console.log(JSON.stringify({ load_ms, tps, threadsInUse: engines.map((e) => e.status().threadsInUse) }))
for (const e of engines) await e.dispose()
