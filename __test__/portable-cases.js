'use strict'
// Portable mode's golden cases, shared by __test__/portable.test.js (Jest,
// on this machine and under every x86-64 variant) and
// scripts/portable-platform-checks.cjs (plain Node under qemu-aarch64 and
// wine, `npm run test:platforms -- --portable`): the requests, how a
// completion becomes a trace of token ids and probability bits, and how two
// traces are compared. No dependencies, CommonJS, so it runs on every
// platform's Node as it is.

const PROMPT = 'The history of the printing press'
const STORY = 'Once upon a time, in a small village by the sea,'
const EMBED = 'The quick brown fox jumps over the lazy dog.'
// Greedy, and seeded with the request defaults (top-k 40, top-p 0.95,
// min-p 0.05: llama.cpp's samplers, patched to portable exp and log).
const greedy = (prompt, n) => ({ prompt, n_predict: n, temperature: 0, n_probs: 2, ignore_eos: true })
const seeded = (prompt, n) => ({ prompt, n_predict: n, temperature: 0.9, seed: 7, n_probs: 2, ignore_eos: true })

const SMOL = 'SmolLM2-135M-Instruct.Q4_1.gguf'
const GEMMA = 'gemma-3-270m-q4_k_m.gguf'

// [name, model file, request]: the quick set (npm test: SmolLM2 only), the
// variant set (+ gemma-3: every CPU variant and platform), the full set
// (test:full: every other fixture quantization, LoRA, a JSON schema).
const QUICK = [
  ['SmolLM2 Q4_1 greedy', SMOL, greedy(PROMPT, 24)],
  ['SmolLM2 Q4_1 seeded', SMOL, seeded(STORY, 24)],
]
const VARIANT = [
  ['gemma-3 Q4_K_M greedy', GEMMA, greedy(PROMPT, 16)],
  ['gemma-3 Q4_K_M seeded', GEMMA, seeded(STORY, 16)],
]
const FULL = [
  ['SmolLM2 F16 greedy', 'SmolLM2-135M-Instruct.F16.gguf', greedy(PROMPT, 16)],
  ['SmolLM2 F32 greedy', 'SmolLM2-135M-Instruct.F32.gguf', greedy(PROMPT, 16)],
  ['SmolLM2 Q8_0 greedy', 'SmolLM2-135M-Instruct.Q8_0.gguf', greedy(PROMPT, 16)],
  ['SmolLM2 Q4_0 greedy', 'SmolLM2-135M-Instruct.Q4_0.gguf', greedy(PROMPT, 16)],
  ['gemma-3 Q5_K_M greedy', 'gemma-3-270m.Q5_K_M.gguf', greedy(PROMPT, 16)],
  ['gemma-3 Q6_K greedy', 'gemma-3-270m.Q6_K.gguf', greedy(PROMPT, 16)],
  ['gemma-3 Q8_0 seeded', 'gemma-3-270m.Q8_0.gguf', seeded(STORY, 16)],
  ['SmolLM2 Q4_1 + LoRA greedy', SMOL, { ...greedy(PROMPT, 16), lora: [{ id: 0, scale: 1 }] }],
  ['SmolLM2 Q4_1 JSON schema', SMOL, { ...greedy('A person as JSON:', 24), json_schema: { type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' } }, required: ['name', 'age'] } }],
]
const LORA = 'SmolLM2-135M-Instruct.lora-test.gguf'

/** The engine options every case loads with (a LoRA case adds the adapter). */
const loadOptions = (modelPath, loraPath) => ({
  modelPath,
  determinism: 'portable',
  contextSize: 1024,
  threads: 2,
  parallel: 2,
  ...(loraPath ? { loras: [{ path: loraPath, scale: 0 }] } : {}),
})

/** f32 bits of a probability, as hex (the engine's numbers are f32s, printed shortest). */
const bits = (p) => {
  const f = new Float32Array([p])
  return new Uint32Array(f.buffer)[0].toString(16).padStart(8, '0')
}
/** Per generated token: [id, [[id, bits], …] of its top probabilities]. */
const trace = (tokens) => tokens.map((t) => [t.id, (t.probs || []).map((p) => [p.id, bits(p.prob)])])

/** The first position where two traces differ, in words (null: identical). */
function firstDifference(got, want) {
  for (let i = 0; i < Math.max(got.length, want.length); i++) {
    if (JSON.stringify(got[i]) !== JSON.stringify(want[i])) {
      return `first difference at generated token ${i}: ${JSON.stringify(got[i] ?? null)} here, ${JSON.stringify(want[i] ?? null)} in the golden file`
    }
  }
  return null
}

/** The first differing value of an embedding's bits (-1: identical). */
const firstDifferingValue = (got, want) => (got.length !== want.length ? Math.min(got.length, want.length) : got.findIndex((b, i) => b !== want[i]))

/** The kernels whose digest differs from the golden file's. */
const differingOps = (ops, golden) => Object.keys(golden).filter((op) => ops[op] !== golden[op])

module.exports = { PROMPT, STORY, EMBED, greedy, seeded, QUICK, VARIANT, FULL, LORA, SMOL, GEMMA, loadOptions, bits, trace, firstDifference, firstDifferingValue, differingOps }
