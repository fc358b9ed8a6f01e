// `npm run bench`: speed, measured side by side in one run on this machine.
// Not a test: it prints numbers and asserts nothing.
//
//   binding   greedy tokens/s of complete() vs the same loop in plain Rust
//             with llama-cpp-2 (examples/plain_greedy.rs), same model/threads.
import { execFileSync } from 'node:child_process'
import { cpus } from 'node:os'
import { join } from 'node:path'
import { ensureReady } from '../scripts/ensure-ready.mjs'
import { root } from '../scripts/native.mjs'

ensureReady()
const { LlamaEngine } = await import('../index.mjs')

const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
const TARGET = join(models, 'SmolLM2-135M-Instruct.Q4_1.gguf')
const THREADS = Number(process.env.BENCH_THREADS || cpus().length)
const N = Number(process.env.BENCH_TOKENS || 128)
const REPEATS = Number(process.env.BENCH_REPEATS || 5)
const sections = new Set((process.env.BENCH_SECTIONS || 'binding').split(','))

const chat = (u) => `<|im_start|>user\n${u}<|im_end|>\n<|im_start|>assistant\n`
const FREE_PROMPTS = [
  chat('Write a short story about a lighthouse keeper.'),
  chat('Explain how photosynthesis works.'),
  chat('List ten ideas for a weekend trip.'),
]

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const fmt = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-')

function table(rows, cols) {
  const widths = cols.map((c) => Math.max(c.length, ...rows.map((r) => String(r[c]).length)))
  const line = (r) => cols.map((c, i) => String(r[c]).padStart(widths[i])).join('  ')
  console.log(line(Object.fromEntries(cols.map((c) => [c, c]))))
  for (const r of rows) console.log(line(r))
}

console.log(`machine: ${cpus().length} x ${cpus()[0].model}; threads ${THREADS}; ${N} tokens per run, median of ${REPEATS}`)

if (sections.has('binding')) {
  console.log('\n## binding overhead: complete() vs plain llama-cpp-2 (greedy, Q4_1)')
  execFileSync('cargo', ['build', '--release', '--example', 'plain_greedy'], { cwd: root, stdio: 'ignore' })
  const plainBin = join(root, 'target', 'release', 'examples', 'plain_greedy')
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: THREADS })
  const rows = []
  for (const [i, prompt] of FREE_PROMPTS.entries()) {
    const plain = []
    const addon = []
    for (let r = 0; r < REPEATS; r++) {
      // Interleaved so drift in machine load hits both sides alike.
      const out = execFileSync(plainBin, [TARGET, String(THREADS), String(N), prompt]).toString().trim()
      plain.push(JSON.parse(out).tok_s)
      const res = await engine.complete({ prompt, n_predict: N, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: { mode: 'off' } })
      addon.push(res.timings.predicted_per_second)
    }
    const p = median(plain)
    const a = median(addon)
    rows.push({ prompt: `free-${i + 1}`, 'plain tok/s': fmt(p), 'complete() tok/s': fmt(a), 'binding cost': `${fmt((1 - a / p) * 100)} %` })
  }
  table(rows, ['prompt', 'plain tok/s', 'complete() tok/s', 'binding cost'])
  await engine.dispose()
}
