#!/usr/bin/env node
// llama-engine command line: streams one completion to stdout, holds a
// conversation, or serves the model over HTTP.
//
//   llama-engine --prompt "The capital of France is" --n_predict 16 --temperature 0
//   echo "Summarise: ..." | llama-engine --chat --draft models/SmolLM2-135M-Instruct.Q2_K.gguf
//   llama-engine --interactive --system "You are terse."
//   llama-engine serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8080
//
// Sampling flags carry the request field names (--top_k, --n_predict, ...);
// speculative flags map to request.speculative. See --help.
//
// Exit codes: 0 done, 1 engine error (printed as "error CODE: message"),
// 2 bad command line, 130 interrupted by Ctrl-C (143 for SIGTERM).
// Importable: `main(argv)` runs the CLI and resolves with the exit code
// (scripts/demo.mjs uses it).
import { realpathSync } from 'node:fs'
import { pathToFileURL } from 'node:url'
import { inspect } from './cli/inspect.mjs'
import { pull } from './cli/pull.mjs'
import { rpcWorker } from './cli/rpc-worker.mjs'
import { run } from './cli/run.mjs'
import { serve } from './cli/serve.mjs'

// One module per command, in bin/cli/; what the tests and scripts import is here.
export { UsageError } from './cli/table.mjs'
export { USAGE, parseCli, summary } from './cli/run.mjs'
export { SERVE_USAGE, parseServe } from './cli/serve.mjs'
export { describeInspection } from './cli/inspect.mjs'
export { RPC_WORKER_USAGE, parseRpcWorker } from './cli/rpc-worker.mjs'

const COMMANDS = { serve, pull, inspect, 'rpc-worker': rpcWorker }

/** Runs the CLI; resolves with the exit code. */
export async function main(argv = process.argv.slice(2)) {
  const command = Object.hasOwn(COMMANDS, argv[0]) ? COMMANDS[argv[0]] : null
  return command ? command(argv.slice(1)) : run(argv)
}

function isMain() {
  if (!process.argv[1]) return false
  try {
    return import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href
  } catch {
    return false
  }
}

if (isMain()) {
  main().then(
    (code) => {
      // Let stdout drain and exit naturally: an idle, disposed engine keeps nothing alive.
      process.exitCode = code
    },
    (e) => {
      process.stderr.write(`error INTERNAL: ${e && e.stack ? e.stack : e}\n`)
      process.exitCode = 1
    },
  )
}
