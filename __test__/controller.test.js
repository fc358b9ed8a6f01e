// The draft controller learns acceptance instead of assuming it: a fresh
// engine drafts on its first request where drafting can pay (the demo's
// verbatim-repeat prompt; the same-model, cheaper-quant pair F32 + Q4_1),
// and what it drafts never changes the output.
const { LlamaEngine, TARGET, DRAFT, model, user, FULL } = require('./helpers')

const F32 = model('SmolLM2-135M-Instruct.F32.gguf')
const Q4_1 = TARGET

// scripts/demo.mjs's prompt.
const PASSAGE =
  'The lighthouse stood at the edge of the cliff for more than a hundred years. ' +
  'Every night its keeper climbed the narrow stairs, trimmed the wick and polished the great glass lens until it shone. ' +
  'Ships far out at sea watched for its steady beam, and sailors said that as long as the light turned, ' +
  'no storm could keep them from home. When the keeper grew old, his daughter took the lamp, ' +
  'and the light has never once gone dark.'

const trace = (r) => ({ content: r.content, probs: r.completion_probabilities })

test("the demo's prompt drafts on a fresh engine's first request", async () => {
  const engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 2048, threads: 2 })
  try {
    const r = await engine.complete({ messages: user(`Repeat the following passage exactly:\n\n${PASSAGE}`), n_predict: 120, temperature: 0 })
    expect(r.speculative.n_drafted).toBeGreaterThan(0)
    expect(r.speculative.n_accepted).toBeGreaterThan(0)
  } finally {
    await engine.dispose()
  }
})

// test:full only: npm test stays under its 10 minutes (CI runs it).
;(FULL ? test : test.skip)('F32 target with its Q4_1 draft: drafts from the first request, output identical to off bit for bit', async () => {
  const engine = await LlamaEngine.load({ modelPath: F32, draftModelPath: Q4_1, contextSize: 2048, threads: 2 })
  try {
    const req = (mode) => ({ messages: user('Explain how photosynthesis works.'), n_predict: 48, temperature: 0, ignore_eos: true, n_probs: 2, cache_prompt: false, speculative: { mode } })
    const draft = await engine.complete(req('draft'))
    const off = await engine.complete(req('off'))
    const auto = await engine.complete(req('auto'))
    expect(draft.speculative.drafters.draft.n_drafted).toBeGreaterThan(0)
    expect(trace(draft)).toEqual(trace(off))
    expect(trace(auto)).toEqual(trace(off))
    // The estimates the controller uses are in status().
    const st = engine.status()
    expect(st.batchCostMs[1]).toBeGreaterThan(0)
    expect(st.draftStepMs).toBeGreaterThan(0)
  } finally {
    await engine.dispose()
  }
})
