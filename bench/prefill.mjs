// One long-prompt run in a process of its own, for `npm run bench` section
// `prefill`: time to first token on a never-seen prompt, then greedy decoding
// after it.
//
//   node bench/prefill.mjs engine|node-llama-cpp MODEL PROMPT_FILE N_GEN
//   node bench/prefill.mjs engine-sequence MODEL FILE,FILE,... N_GEN
//
// `engine-sequence` (section `sequence`): the prompts one after the other in
// one process and one engine (4,096-cell context, default batch), after a
// 4-token warm-up; one JSON line per prompt. Each prompt must take about as
// long as the others: the second once took twice as long (the thread
// governor's trial of one thread ran its whole prefill).
//
// `engine` loads this repository (LLAMA_ENGINE_ADDON picks another addon);
// `node-llama-cpp` loads the package bench/package.json installs. Both get
// 2 threads (BENCH_THREADS), an 8,192-cell context (BENCH_CONTEXT) and
// 512-token batches;
// the prompt is plain text without cache. Prints one JSON line:
// { impl, prompt_tokens, ttft_ms, prefill_tps, decode_tps }.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const [impl, model, file, nGenArg] = process.argv.slice(2)
const prompt = impl === 'engine-sequence' ? '' : readFileSync(file, 'utf8')
const nGen = Number(nGenArg || 128)
const threads = Number(process.env.BENCH_THREADS || 2)
const contextSize = Number(process.env.BENCH_CONTEXT || 8192)
const here = dirname(fileURLToPath(import.meta.url))

function report(promptTokens, ttft, total, generated) {
  console.log(
    JSON.stringify({
      impl,
      prompt_tokens: promptTokens,
      ttft_ms: Math.round(ttft * 10) / 10,
      prefill_tps: Math.round((promptTokens / ttft) * 1e5) / 100,
      decode_tps: Math.round(((generated - 1) / (total - ttft)) * 1e5) / 100,
    }),
  )
}

if (impl === 'engine') {
  const { LlamaEngine } = createRequire(import.meta.url)(join(here, '..'))
  const engine = await LlamaEngine.load({ modelPath: model, contextSize, threads, batchSize: 512 })
  const start = performance.now()
  let first = 0
  const res = await engine.complete(
    { prompt, n_predict: nGen, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: { mode: 'off' } },
    (ev) => {
      if (!first && ev.type === 'token') first = performance.now() - start
    },
  )
  report(res.tokens_evaluated, first, performance.now() - start, res.tokens_predicted)
  await engine.dispose()
} else if (impl === 'engine-sequence') {
  const { LlamaEngine } = createRequire(import.meta.url)(join(here, '..'))
  const engine = await LlamaEngine.load({ modelPath: model, contextSize: 4096, threads })
  await engine.complete({ prompt: 'Hi', n_predict: 4, temperature: 0 })
  for (const f of file.split(',')) {
    const start = performance.now()
    let first = 0
    const res = await engine.complete(
      { prompt: readFileSync(f, 'utf8'), n_predict: nGen, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: { mode: 'off' } },
      (ev) => {
        if (!first && ev.type === 'token') first = performance.now() - start
      },
    )
    report(res.tokens_evaluated, first, performance.now() - start, res.tokens_predicted)
  }
  await engine.dispose()
} else if (impl === 'node-llama-cpp') {
  const { getLlama, LlamaCompletion } = await import(createRequire(join(here, 'package.json')).resolve('node-llama-cpp'))
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' })
  const m = await llama.loadModel({ modelPath: model })
  const ctx = await m.createContext({ contextSize, threads, batchSize: 512, sequences: 1 })
  const completion = new LlamaCompletion({ contextSequence: ctx.getSequence() })
  const promptTokens = m.tokenize(prompt).length
  const start = performance.now()
  let first = 0
  let generated = 0
  await completion.generateCompletion(prompt, {
    maxTokens: nGen,
    temperature: 0,
    onToken: (tokens) => {
      if (!first) first = performance.now() - start
      generated += tokens.length
    },
  })
  report(promptTokens, first, performance.now() - start, generated)
  await ctx.dispose()
  await m.dispose()
} else {
  throw new Error(`unknown implementation ${impl}: engine, engine-sequence or node-llama-cpp`)
}
