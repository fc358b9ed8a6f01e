// `npm run demo`: fetches and builds whatever is missing, then runs the CLI
// (bin/llama-engine.mjs) on the fixture models — the Q4_1 target with the Q2_K
// draft attached, speculative mode auto, greedy — on a prompt where
// speculation shows: repeating a given passage, which n-gram drafting
// (prompt lookup) predicts almost token for token. On a terminal the tokens
// are coloured by where they came from, and the summary on stderr shows the
// acceptance rate and target passes per token.
//
// Extra arguments go to the CLI and win over these defaults:
//   npm run demo -- --spec off            (compare: one target pass per token)
//   npm run demo -- --prompt "Write a haiku about autumn."
import { join } from 'node:path'
import { ensureReady } from './ensure-ready.mjs'
import { root } from './native.mjs'

const TARGET = 'SmolLM2-135M-Instruct.Q4_1.gguf'
const DRAFT = 'SmolLM2-135M-Instruct.Q2_K.gguf'
await ensureReady({ models: [TARGET, DRAFT], npmDeps: false })
const { main } = await import('../bin/llama-engine.mjs')

const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
const passage =
  'The lighthouse stood at the edge of the cliff for more than a hundred years. ' +
  'Every night its keeper climbed the narrow stairs, trimmed the wick and polished the great glass lens until it shone. ' +
  'Ships far out at sea watched for its steady beam, and sailors said that as long as the light turned, ' +
  'no storm could keep them from home. When the keeper grew old, his daughter took the lamp, ' +
  'and the light has never once gone dark.'

const defaults = [
  '--model', join(models, TARGET),
  '--draft', join(models, DRAFT),
  '--ctx-size', '2048',
  '--spec', 'auto',
  '--chat',
  '--temperature', '0',
  '--n_predict', '200',
  '--prompt', `Repeat the following passage exactly:\n\n${passage}`,
]

process.exitCode = await main([...defaults, ...process.argv.slice(2)])
