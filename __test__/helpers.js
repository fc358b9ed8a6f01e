const path = require('node:path')
const { LlamaEngine } = require('..')

const MODELS = process.env.LLAMA_ENGINE_MODELS_DIR || path.join(__dirname, '..', 'models')
const model = (name) => path.join(MODELS, name)
const TARGET = model('SmolLM2-135M-Instruct.Q4_1.gguf')
const DRAFT = model('SmolLM2-135M-Instruct.Q2_K.gguf')
const F16 = model('SmolLM2-135M-Instruct.F16.gguf')
const GEMMA = model('gemma-3-270m-q4_k_m.gguf')

/**
 * Three cuts of the bigger matrices. \`npm test\` runs a quick one (every
 * behaviour, fewer models, prompts and seeds); \`npm run test:full\` (CI)
 * every case but those that repeat what another case in CI already proves
 * (a quant type at a second prompt length, a second seed…);
 * \`npm run test:release\` (LLAMA_ENGINE_TEST_RELEASE=1) all of them.
 */
const RELEASE = process.env.LLAMA_ENGINE_TEST_RELEASE === '1'
const FULL = RELEASE || process.env.LLAMA_ENGINE_TEST_FULL === '1'

/** \`all\` under test:full and test:release, \`quick\` under \`npm test\`. */
const matrix = (all, quick) => (FULL ? all : quick)
/** \`release\` under test:release, \`full\` under test:full (CI), \`quick\` under \`npm test\`. */
const tiers = (release, full, quick) => (RELEASE ? release : FULL ? full : quick)
/** A test run by test:full and test:release (and a release-only one). */
const fullTest = FULL ? test : test.skip
const releaseTest = RELEASE ? test : test.skip

/** A one-message conversation, for `messages`: rendered with the model's own chat template. */
function user(text) {
  return [{ role: 'user', content: text }]
}

/** Runs a completion and collects its events. */
async function run(engine, request, signal) {
  const events = []
  const result = await engine.complete(request, (e) => events.push(e), signal)
  return { events, result, tokens: events.flatMap((e) => (e.type === 'token' ? e.tokens : [])) }
}

function loadTarget(extra = {}) {
  return LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: 2, ...extra })
}

module.exports = { LlamaEngine, TARGET, DRAFT, F16, GEMMA, MODELS, FULL, RELEASE, matrix, tiers, fullTest, releaseTest, model, user, run, loadTarget }
