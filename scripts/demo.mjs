// `npm run demo`: stream a completion from the default fixture model, with
// the Q2_K draft model attached, fetching and building whatever is missing.
import { join } from 'node:path'
import { ensureReady } from './ensure-ready.mjs'
import { root } from './native.mjs'

ensureReady()
const { LlamaEngine } = await import('../index.mjs')

const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
const prompt =
  process.argv.slice(2).join(' ') ||
  '<|im_start|>user\nList the planets of the solar system in order, one per line.<|im_end|>\n<|im_start|>assistant\n'

let lastShown = -1
const engine = await LlamaEngine.load({
  modelPath: join(models, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
  draftModelPath: join(models, 'SmolLM2-135M-Instruct.Q2_K.gguf'),
  contextSize: 2048,
  onProgress: (f) => {
    const pct = Math.round(f * 100)
    if (pct % 25 === 0 && pct !== lastShown) {
      lastShown = pct
      process.stderr.write(`loading ${pct}%\n`)
    }
  },
})

const ac = new AbortController()
process.once('SIGINT', () => ac.abort())
const result = await engine.complete(
  { prompt, n_predict: 200, temperature: 0, speculative: { mode: 'auto' } },
  (event) => {
    if (event.type === 'token') process.stdout.write(event.content)
  },
  ac.signal,
)
const t = result.timings
const s = result.speculative
process.stdout.write('\n')
console.error(
  `\n${result.tokens_predicted} tokens, ${t.predicted_per_second.toFixed(1)} tok/s` +
    ` | speculative ${s.mode}: ${s.n_accepted}/${s.n_drafted} drafts accepted, ${s.target_passes} target passes` +
    (result.stopped_abort ? ' | aborted' : ''),
)
await engine.dispose()
