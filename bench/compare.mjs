// One speculation scenario in one process, for before/after comparisons of
// two builds: `node bench/compare.mjs <scenario>` with the addon to measure in
// LLAMA_ENGINE_ADDON (default: this checkout's). Prints one JSON line:
// { scenario, addon, modes: { name: { tps, drafted, accepted, same } } },
// `same` meaning the text equals `off`'s. bench/compare.sh alternates two
// addons. Scenarios: pair (F32 target, Q4_1 draft), q2k (Q4_1 target, Q2_K
// draft), free (no draft model), ngram (a verbatim-repeat prompt), grammar
// (a JSON schema), par4 and par8 (4 and 8 requests at once, Q2_K draft;
// COMPARE_ALL_MODES=1 adds the draft and fixed-3 modes to par4).
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { LlamaEngine } from '../index.mjs'
const M = (process.env.LLAMA_ENGINE_MODELS_DIR || path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'models')) + '/'
const scenario = process.argv[2]
const chat = (u) => ({ messages: [{ role: 'user', content: u }] })
const FREE = [chat('Write a short story about a lighthouse keeper.'), chat('Explain how photosynthesis works.'), chat('List ten ideas for a weekend trip.')]
const PASSAGE = 'The lighthouse stood at the edge of the cliff for more than a hundred years. Every night its keeper climbed the narrow stairs, trimmed the wick and polished the great glass lens until it shone. Ships far out at sea watched for its steady beam, and sailors said that as long as the light turned, no storm could keep them from home.'
const person = { type: 'object', properties: { name: { type: 'string', maxLength: 16 }, age: { type: 'integer', minimum: 0, maximum: 120 }, city: { type: 'string', enum: ['Paris', 'London', 'Tokyo'] }, languages: { type: 'array', items: { type: 'string', enum: ['English', 'French', 'Japanese'] }, maxItems: 3 } }, required: ['name', 'age', 'city', 'languages'], additionalProperties: false }
const N = 96
const S = {
  pair: { load: { modelPath: M + 'SmolLM2-135M-Instruct.F32.gguf', draftModelPath: M + 'SmolLM2-135M-Instruct.Q4_1.gguf' }, prompts: FREE, modes: { off: { mode: 'off' }, auto: { mode: 'auto' }, draft: { mode: 'draft' }, fixed3: { mode: 'draft', adaptive: false, n_max: 3, p_min: 0 }, fixed5: { mode: 'draft', adaptive: false, n_max: 5, p_min: 0 }, fixed8: { mode: 'draft', adaptive: false, n_max: 8, p_min: 0 } } },
  q2k: { load: { modelPath: M + 'SmolLM2-135M-Instruct.Q4_1.gguf', draftModelPath: M + 'SmolLM2-135M-Instruct.Q2_K.gguf' }, prompts: FREE, modes: { off: { mode: 'off' }, auto: { mode: 'auto' } } },
  ngram: { load: { modelPath: M + 'SmolLM2-135M-Instruct.Q4_1.gguf' }, prompts: [chat(`Repeat the following passage verbatim, word for word.\n\n${PASSAGE}`)], modes: { off: { mode: 'off' }, auto: { mode: 'auto' } } },
  grammar: { load: { modelPath: M + 'SmolLM2-135M-Instruct.Q4_1.gguf' }, prompts: [{ ...chat('Describe a person as JSON.'), response_format: { type: 'json_schema', json_schema: { name: 'p', schema: person } }, ignore_eos: false }], modes: { off: { mode: 'off' }, auto: { mode: 'auto' } } },
}
S.par4 = { load: { modelPath: M + 'SmolLM2-135M-Instruct.Q4_1.gguf', draftModelPath: M + 'SmolLM2-135M-Instruct.Q2_K.gguf', parallel: 4 }, prompts: [...FREE, chat('Name five rivers and one fact about each.')], modes: { off: { mode: 'off' }, auto: { mode: 'auto' }, ...(process.env.COMPARE_ALL_MODES ? { draft: { mode: 'draft' }, fixed3: { mode: 'draft', adaptive: false, n_max: 3, p_min: 0 }, auto2: { mode: 'auto' } } : {}) }, concurrent: true }
S.par8 = { ...S.par4, load: { ...S.par4.load, parallel: 8 }, prompts: [...S.par4.prompts, chat('Describe the water cycle.'), chat('Give three tips for learning to cook.'), chat('What makes a good password?'), chat('Summarise the plot of a heist film you invent.')] }
S.free = { load: { modelPath: M + 'SmolLM2-135M-Instruct.Q4_1.gguf' }, prompts: FREE, modes: { off: { mode: 'off' }, auto: { mode: 'auto' } } }
const s = S[scenario]
if (!s) throw new Error(`unknown scenario ${scenario}; one of ${Object.keys(S).join(', ')}`)
const e = await LlamaEngine.load({ ...s.load, threads: 2, contextSize: 2048 })
await e.complete({ prompt: 'Hello there.', n_predict: 8, temperature: 0, speculative: { mode: 'off' } })
const out = {}
const t0 = Date.now()
for (const [name, spec] of Object.entries(s.modes)) {
  if (s.concurrent) {
    const t = performance.now()
    const rs = await Promise.all(s.prompts.map((p) => e.complete({ ignore_eos: true, ...p, n_predict: N, temperature: 0, cache_prompt: false, speculative: spec })))
    const wall = performance.now() - t
    out[name] = { tps: (rs.reduce((a, r) => a + r.tokens_predicted, 0) / wall) * 1000, drafted: rs.reduce((a, r) => a + r.speculative.n_drafted, 0), accepted: rs.reduce((a, r) => a + r.speculative.n_accepted, 0), contents: rs.map((r) => r.content) }
    continue
  }
  let tokens = 0, ms = 0, drafted = 0, accepted = 0
  const contents = []
  for (const p of s.prompts) {
    const t = performance.now()
    const r = await e.complete({ ignore_eos: true, ...p, n_predict: N, temperature: 0, cache_prompt: false, speculative: spec })
    ms += performance.now() - t - r.timings.prompt_ms
    tokens += r.tokens_predicted
    drafted += r.speculative.n_drafted
    accepted += r.speculative.n_accepted
    contents.push(r.content)
  }
  out[name] = { tps: (tokens / ms) * 1000, drafted, accepted, contents }
}
for (const v of Object.values(out)) v.same = v.contents.every((c, i) => c === out.off.contents[i])
for (const v of Object.values(out)) delete v.contents
console.log(JSON.stringify({ scenario, addon: process.env.LLAMA_ENGINE_ADDON || 'current', s: (Date.now() - t0) / 1000, modes: out }))
await e.dispose()
