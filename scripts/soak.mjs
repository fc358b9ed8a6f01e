// `npm run soak [-- --requests 1000 --concurrency 6]`: 1,000 mixed requests
// (streamed, aborted, bad, speculative and not) through one engine with 4
// slots, more in flight than slots so all four stay busy and some wait. Reports
// resident memory at start, after 100 and at the end, checks that every
// promise settled the way it should and that the engine still answers
// correctly at the end. Not a test: it takes minutes. Exit code 1 on failure.
import { LlamaEngine } from '../index.mjs'
import { ensureReady } from './ensure-ready.mjs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const MODELS = process.env.LLAMA_ENGINE_MODELS_DIR || path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'models')

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 ? Number(process.argv[i + 1]) : dflt
}
const TOTAL = arg('requests', 1000)
const CONCURRENCY = arg('concurrency', 6)
const PARALLEL = 4
// Bound on resident-memory growth between request 100 (caches warm) and the end.
const BOUND_MB = arg('bound-mb', 64)

await ensureReady()
const engine = await LlamaEngine.load({
  modelPath: path.join(MODELS, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
  draftModelPath: path.join(MODELS, 'SmolLM2-135M-Instruct.Q2_K.gguf'),
  contextSize: 1024,
  threads: 2,
  parallel: PARALLEL,
})

// Chat messages, rendered with the model's own template; one bad message in the bad requests.
const user = (text) => [{ role: 'user', content: text }]
const CHECK = { messages: user('Name three colours.'), n_predict: 24, temperature: 0, speculative: { mode: 'off' } }
const reference = (await engine.complete(CHECK)).content

const topics = ['the sea', 'a red bicycle', 'bread', 'the moon', 'a library', 'winter', 'a robot', 'tea']
const passage = 'Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do.'
const modes = ['off', 'auto', 'ngram', 'draft', 'ngram+draft']
const bad = [
  { prompt: [1e9] }, { prompt: 'x', temperature: 'hot' }, { prompt: 'x', grammar: 'root ::= [' },
  { prompt: 'x', n_predict: -7 }, { prompt: 'x', speculative: { mode: 'fast' } }, { prompt: 'x', logit_bias: [[-3, 1]] },
  { prompt: 'x', json_schema: { type: 'nonsense' } }, { prompt: 'x', stop: [1] },
  { messages: [{ role: 'user', content: 42 }] }, { prompt: 'x', messages: user('x') },
]

function request(i) {
  const kind = ['stream', 'complete', 'abort', 'queued-abort', 'bad', 'complete', 'stream', 'grammar', 'sampled', 'complete'][i % 10]
  const mode = modes[Math.floor(i / 10) % modes.length]
  const base = {
    messages: i % 3 === 0 ? user(`Repeat exactly: ${passage}`) : user(`Write one sentence about ${topics[i % topics.length]}.`),
    n_predict: 8 + (i % 17),
    temperature: 0,
    speculative: { mode },
  }
  switch (kind) {
    case 'bad': return { kind, req: { ...bad[Math.floor(i / 10) % bad.length] } }
    case 'grammar': return { kind, req: { ...base, grammar: 'root ::= ("yes" | "no") " " [a-z]+' } }
    case 'sampled': return { kind, req: { ...base, temperature: 0.8, seed: i } }
    default: return { kind, req: base }
  }
}

async function one(i) {
  const { kind, req } = request(i)
  const ac = new AbortController()
  let events = 0
  let text = ''
  const onEvent = (e) => {
    events++
    if (e.type === 'token') text += e.content
    if (kind === 'abort' && events === 2) ac.abort()
  }
  try {
    if (kind === 'stream') {
      let done
      for await (const e of engine.stream(req)) { onEvent(e); if (e.type === 'done') done = e }
      if (!done) return 'stream ended without done'
      return text === done.content ? 'ok' : 'stream text mismatch'
    }
    if (kind === 'queued-abort') setImmediate(() => ac.abort())
    const r = await engine.complete(req, onEvent, ac.signal)
    if (kind === 'bad') return 'bad request served'
    if (text !== r.content) return 'event text differs from result'
    if (kind === 'abort' && !r.stopped_abort && r.tokens_predicted > 2) return 'abort ignored'
    return 'ok'
  } catch (err) {
    if (kind === 'bad' && err.code === 'INVALID_REQUEST') return 'ok'
    return `unexpected ${err.code}: ${err.message}`
  }
}

const rss = () => Math.round(process.memoryUsage.rss() / 2 ** 20)
const marks = [{ after: 0, rssMb: rss() }]
const failures = []
let settled = 0
const t0 = Date.now()
let next = 0
async function worker() {
  while (next < TOTAL) {
    const i = next++
    const outcome = await one(i)
    settled++
    if (outcome !== 'ok') failures.push({ i, kind: request(i).kind, outcome })
    if (settled === 100 || settled % 250 === 0 || settled === TOTAL) {
      marks.push({ after: settled, rssMb: rss() })
      process.stderr.write(`soak: ${settled}/${TOTAL} settled, rss ${rss()} MB, ${((Date.now() - t0) / 1000).toFixed(0)} s\n`)
    }
  }
}
// How many slots were busy at once, sampled as the soak runs.
let maxActive = 0
const sampler = setInterval(() => (maxActive = Math.max(maxActive, engine.status().active)), 10)
await Promise.all(Array.from({ length: CONCURRENCY }, worker))
clearInterval(sampler)

const final = (await engine.complete(CHECK)).content
const status = engine.status()
await engine.dispose()
const at100 = marks.find((m) => m.after === 100)?.rssMb ?? marks[0].rssMb
const end = marks.at(-1).rssMb
const growth = end - at100
const ok = settled === TOTAL && failures.length === 0 && final === reference && growth <= BOUND_MB && status.queued === 0 && maxActive === Math.min(PARALLEL, CONCURRENCY)
console.log(JSON.stringify({
  requests: TOTAL, concurrency: CONCURRENCY, parallel: PARALLEL, maxActive, settled, failures: failures.slice(0, 20), failureCount: failures.length,
  rssMb: marks, growthAfter100Mb: growth, boundMb: BOUND_MB, sameAnswerAtEnd: final === reference,
  seconds: Math.round((Date.now() - t0) / 1000), ok,
}, null, 2))
process.exit(ok ? 0 : 1)
