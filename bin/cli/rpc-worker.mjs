// `llama-engine rpc-worker`: this machine's CPU for engines loaded with --rpc.
import { mkdirSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { createRequire } from 'node:module'
import { UsageError } from './table.mjs'
import { number, parsedOrExit } from './common.mjs'

export const RPC_WORKER_USAGE = `Usage: llama-engine rpc-worker [options]

Serves this machine's CPU back end to engines loaded with --rpc HOST:PORT
(EngineOptions.rpc): llama.cpp's RPC back end (ggml-rpc). The engine sends
the weights of its layers here and computes them here, with the same CPU
kernels as a local run.

The protocol has no authentication and no encryption: anyone who can
connect can make it compute, allocate memory and read what it holds. It
listens on 127.0.0.1 unless --allow-network is given; run it on a private
network only.

  --host ADDR         address to listen on (default 127.0.0.1)
  --port N            port (default 50052)
  -t, --threads N     threads (default: available parallelism)
  --mem MB            memory it offers (the share of layers it gets), at most what is free
  --cache DIR         keep tensors it was sent in DIR, so a reload sends only their hashes
  --allow-network     listen on an address other than loopback
  -h, --help          this help
`

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|localhost|::1|\[::1\])$/

/** Parses `rpc-worker`'s flags into { help, endpoint, threads, mem, cache }. Throws UsageError. */
export function parseRpcWorker(argv) {
  let v
  try {
    ;({ values: v } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        host: { type: 'string' },
        port: { type: 'string' },
        threads: { type: 'string', short: 't' },
        mem: { type: 'string' },
        cache: { type: 'string' },
        'allow-network': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }))
  } catch (e) {
    const unknown = /^Unknown option '([^']*)'/.exec(e.message)
    throw new UsageError(unknown ? `unknown option ${unknown[1]}` : e.message)
  }
  const host = v.host ?? '127.0.0.1'
  if (!LOOPBACK.test(host) && !v['allow-network']) {
    throw new UsageError(`--host ${host}: the RPC protocol has no authentication; listening beyond loopback needs --allow-network`)
  }
  const port = number('port', v.port ?? '50052', 'int')
  if (port < 1 || port > 65535) throw new UsageError(`--port: expected 1..65535, got ${port}`)
  const threads = v.threads === undefined ? undefined : number('threads', v.threads, 'int')
  if (threads !== undefined && threads < 1) throw new UsageError('--threads: expected a positive integer')
  const mem = v.mem === undefined ? undefined : number('mem', v.mem, 'int')
  if (mem !== undefined && mem < 1) throw new UsageError('--mem: expected a positive number of MB')
  const bare = host.replace(/^\[(.*)\]$/, '$1')
  return { help: Boolean(v.help), endpoint: bare.includes(':') ? `[${bare}]:${port}` : `${bare}:${port}`, threads, mem, cache: v.cache }
}

/** `llama-engine rpc-worker`: serves until killed; resolves with an exit code only when it cannot start. */
export async function rpcWorker(argv) {
  const { stderr } = process
  const { cli, code } = parsedOrExit(parseRpcWorker, argv, { name: 'llama-engine rpc-worker', usage: RPC_WORKER_USAGE })
  if (cli === undefined) return code
  const require = createRequire(import.meta.url)
  const { binding } = require('../../lib/addon/native.js')
  if (typeof binding.rpcAvailable !== 'function' || !binding.rpcAvailable()) {
    stderr.write('llama-engine rpc-worker: this build of llama-engine has no RPC back end\n')
    return 1
  }
  // What the worker reports as free memory: llama.cpp gives each worker a
  // share of the layers in proportion to it (read by ggml-rpc, patch 0011).
  if (cli.mem !== undefined) process.env.LLAMA_ENGINE_RPC_MEM_BYTES = String(cli.mem * 1024 * 1024)
  if (cli.cache !== undefined) {
    // ggml writes the tensors it is sent into the directory: it must exist.
    try {
      mkdirSync(cli.cache, { recursive: true })
    } catch (e) {
      stderr.write(`llama-engine rpc-worker: --cache ${cli.cache}: ${e.code || e.message}\n`)
      return 1
    }
  }
  const { availableParallelism } = await import('node:os')
  try {
    await binding.rpcServe(cli.endpoint, cli.threads ?? availableParallelism(), cli.cache)
  } catch (e) {
    stderr.write(`llama-engine rpc-worker: ${e.message}\n`)
  }
  return 1
}
