// One engine in a process of its own, for bench sections that compare whole
// processes (a setting read once per process, another build of the addon):
//   node bench/probe.mjs '{"model": "...", "threads": 2, "tokens": 128, "prompt": "...", "package": "<dir>"}'
// Loads `package` (default: this repository), runs one short warm-up request
// and then the prompt twice with mode "off" (a long prompt without cache, to
// time prompt evaluation; then greedy generation) and prints one JSON line:
// { batchInvariant, batchCostMs, cpuBackend, prompt_tps, tps }.
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const cfg = JSON.parse(process.argv[2])
const pkg = cfg.package || join(dirname(fileURLToPath(import.meta.url)), '..')
const { LlamaEngine } = createRequire(import.meta.url)(pkg)

const engine = await LlamaEngine.load({ modelPath: cfg.model, contextSize: cfg.context || 2048, threads: cfg.threads || 2 })
const off = { mode: 'off' }
await engine.complete({ prompt: 'Hello there.', n_predict: 8, temperature: 0, speculative: off })
const res = await engine.complete({ prompt: cfg.prompt, n_predict: cfg.tokens || 128, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: off })
const st = engine.status()
console.log(JSON.stringify({
  batchInvariant: st.batchInvariant,
  batchCostMs: st.batchCostMs,
  cpuBackend: st.cpuBackend ?? null,
  prompt_n: res.timings.prompt_n,
  prompt_tps: res.timings.prompt_per_second,
  tps: res.timings.predicted_per_second,
}))
await engine.dispose()
