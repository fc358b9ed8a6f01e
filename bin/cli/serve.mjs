// `llama-engine serve`: its flags (llama-server's, from the options table
// in serve-options.mjs), one model or many behind the router, and the
// server's life: listening, signals, shutdown.
import { existsSync, mkdirSync } from 'node:fs'
import { resolve } from 'node:path'
import { createRequire } from 'node:module'
import net from 'node:net'
import { UsageError, helpText, numberOf, parseTable } from './table.mjs'
import { SERVE_GROUPS, SERVE_TABLE, modelFromHub, serveExtras } from './serve-options.mjs'
import { SIGNAL_EXIT, loadOptions, number, parsedOrExit } from './common.mjs'
import { presetModels, routerModels, withChatTemplate } from './router-models.mjs'

export const SERVE_USAGE = `Usage: llama-engine serve [options]

An HTTP server over one model (or several): OpenAI's Chat Completions,
Completions, Responses and embeddings APIs, Anthropic's Messages API,
llama.cpp's endpoints, /health and Prometheus /metrics (--metrics). It takes
llama-server's command line: its spellings mean what they mean there
(docs/server.md, "Coming from llama-server").

${helpText(SERVE_TABLE, SERVE_GROUPS)}
Without a model, llama-server's router over the models of the Hugging Face cache
(LLAMA_CACHE, else HF_HUB_CACHE, else ~/.cache/huggingface/hub), named OWNER/REPO:TAG.
With several models (the cache's, --models DIR, --model ALIAS=URI, --models-preset),
the request's "model" picks; each loads on demand in its own child process; GET
/v1/models lists them with their state (?reload=1 reads them again). The model flags
(--ctx-size, --parallel, --threads, --draft, --lora, …) apply to every model.
POST /models/load and /models/unload { "model": ALIAS }.

SIGTERM or SIGINT: queued requests get 503, running ones finish (or are
aborted after the grace period), the engine is disposed; exit code 143/130.
`

/** Parses `serve`'s flags into { help, load, listen: { host, port }, server }. Throws UsageError. */
export function parseServe(argv, env = process.env) {
  const { values: v, given } = parseTable(argv, SERVE_TABLE, env)
  const nonNegative = (flag, text) => {
    const n = number(flag, text, 'int')
    if (n < 0) throw new UsageError(`--${flag}: expected a non-negative integer, got ${JSON.stringify(text)}`)
    return n
  }
  const server = serveExtras(v, given, env)
  if (v['max-queue'] !== undefined) server.maxQueue = nonNegative('max-queue', v['max-queue'])
  if (v['allow-remote-media']) server.allowRemoteMedia = true
  if (v['sleep-idle-seconds'] !== undefined) {
    const n = number('sleep-idle-seconds', v['sleep-idle-seconds'], 'int')
    if (n < -1) throw new UsageError(`--sleep-idle-seconds: expected -1 (never) or a number of seconds, got ${JSON.stringify(v['sleep-idle-seconds'])}`)
    if (n > 0) server.sleepIdleMs = n * 1000
  }
  if (v['slot-save-path'] !== undefined) {
    mkdirSync(v['slot-save-path'], { recursive: true })
    server.slotSavePath = resolve(v['slot-save-path'])
  }
  if (v['media-path'] !== undefined) {
    if (!existsSync(v['media-path'])) throw new UsageError(`--media-path: ${v['media-path']} does not exist`)
    server.mediaPath = resolve(v['media-path'])
  }
  if (v['headers-timeout'] !== undefined) server.headersTimeoutMs = nonNegative('headers-timeout', v['headers-timeout'])
  if (v['request-timeout'] !== undefined) server.requestTimeoutMs = nonNegative('request-timeout', v['request-timeout'])
  if (v['shutdown-grace'] !== undefined) server.shutdownGraceMs = nonNegative('shutdown-grace', v['shutdown-grace'])
  if (v['responses-max'] !== undefined) server.responsesMax = nonNegative('responses-max', v['responses-max'])
  if (v['responses-max-bytes'] !== undefined) server.responsesMaxBytes = nonNegative('responses-max-bytes', v['responses-max-bytes'])
  if (v['responses-file'] !== undefined) {
    if (v['responses-file'] === '') throw new UsageError('--responses-file: expected a path')
    server.responsesFile = v['responses-file']
  }
  const port = nonNegative('port', v.port ?? '8080')
  if (port > 65535) throw new UsageError(`--port: expected 0..65535, got ${port}`)
  const isolation = v.isolation ?? 'process'
  // llama-server's --host takes several addresses, comma-separated: each listened on, at the same port.
  const hosts = (v.host ?? '127.0.0.1').split(',').map((h) => h.trim().replace(/^\[(.*)\]$/, '$1'))
  if (hosts.some((h) => h === '')) throw new UsageError(`--host: expected ADDR[,ADDR…], got ${JSON.stringify(v.host)}`)
  const listen = { host: hosts[0], port, ...(hosts.length > 1 ? { hosts } : {}) }
  const hub = modelFromHub(v)
  if (hub !== undefined && v.model !== undefined) throw new UsageError(`${given['hf-repo'] ?? given['model-url']}: a model is named by --model already`)
  const models = v.model ?? (hub !== undefined ? [hub] : [])
  Object.assign(v, serveLoadValues(v, given))
  const aliased = models.filter((m) => isAlias(m))
  // No model: llama-server's router, over the models in the cache.
  const many = v.models !== undefined || v['models-preset'] !== undefined || aliased.length > 0 || models.length === 0
  if (!many) {
    for (const flag of ['models-max', 'memory-max', 'idle-unload', 'pin']) {
      if (v[flag] !== undefined) throw new UsageError(`--${flag} goes with many models: --models DIR, --model ALIAS=URI or --models-preset FILE`)
    }
    if (models.length > 1) throw new UsageError('--model: one model, or several as --model ALIAS=URI')
    const load = { ...loadOptions({ ...v, model: models[0] }, env), ...serveLoad(v, given), isolation }
    return { help: Boolean(v.help), load, listen, server }
  }
  if (aliased.length !== models.length) throw new UsageError('--model: with several models, each is ALIAS=URI')
  const { modelPath, ...shared } = { ...loadOptions({ ...v, model: undefined }, env), ...serveLoad(v, given) }
  // The cache's models are listed as llama-server lists them, unless the
  // models are ours (ALIAS=URI).
  // A preset section's flags as a model's load options (serve's meanings).
  const loadOf = (argv) => {
    const { values, given: g } = parseTable(argv, SERVE_TABLE, {})
    Object.assign(values, serveLoadValues(values, g))
    const { modelPath, ...load } = { ...loadOptions({ ...values, model: undefined }, env), ...serveLoad(values, g) }
    return load
  }
  const router = { models: [], dir: v.models, preset: v['models-preset'], cache: aliased.length === 0, engineOptions: { ...shared, isolation }, loadOf }
  for (const m of aliased) {
    const i = m.indexOf('=')
    const name = m.slice(0, i)
    if (router.models.some((x) => x.name === name)) throw new UsageError(`the model ${JSON.stringify(name)} is named twice`)
    router.models.push({ name, uri: uriOf(m.slice(i + 1)) })
  }
  // The preset is read now (its errors are usage errors) and again on reload.
  if (router.preset !== undefined) presetModels(router)
  // llama-server's default: 4 at once (0: no limit).
  const max = v['models-max'] === undefined ? 4 : number('models-max', v['models-max'], 'int')
  if (max < 0) throw new UsageError(`--models-max: expected 0 (no limit) or a positive integer, got ${JSON.stringify(v['models-max'])}`)
  if (max > 0) router.modelsMax = max
  if (v['models-autoload'] === false) router.autoload = false
  if (v['memory-max'] !== undefined) router.memoryMax = bytesFlag('memory-max', v['memory-max'])
  if (v['idle-unload'] !== undefined) router.idleUnloadMs = positive('idle-unload', v['idle-unload']) * 1000
  router.pin = v.pin ?? []
  // Over many models, sleeping is unloading each after as long idle.
  if (server.sleepIdleMs !== undefined) {
    router.idleUnloadMs ??= server.sleepIdleMs
    delete server.sleepIdleMs
  }
  // (load: the options every model of the router loads with.)
  return { help: Boolean(v.help), router, load: router.engineOptions, listen, server }
}

/**
 * llama-server's spellings of the shared model flags, as loadOptions reads
 * them: -1 threads and slots are the defaults, -c 0 the model's context,
 * --lora's comma-separated list.
 */
function serveLoadValues(v, given) {
  const out = {}
  if (v.threads !== undefined && numberOf(given.threads, v.threads, 'int') === -1) out.threads = undefined
  if (v.parallel !== undefined && numberOf(given.parallel, v.parallel, 'int') === -1) out.parallel = undefined
  const c = v['ctx-size'] !== undefined ? numberOf(given['ctx-size'], v['ctx-size'], 'int') : undefined
  if (c === 0) out['ctx-size'] = String(1 << 20)
  // llama-server's -c is the whole KV cache. With slots named (-np N) and
  // no --kv-unified it is split over them: each slot's context is c / N.
  // With -np left to its default (auto: 4, unified) or --kv-unified, each
  // request may fill c: here, each slot gets c (its own cells).
  const np = v.parallel !== undefined ? numberOf(given.parallel, v.parallel, 'int') : -1
  if (c > 0 && np > 0 && v['kv-unified'] !== true) {
    if (c < np) throw new UsageError(`${given['ctx-size']} ${c}: less than a token per slot over ${np} slots`)
    out['ctx-size'] = String(Math.floor(c / np))
  }
  if (v.lora !== undefined) out.lora = v.lora.flatMap((l) => l.split(',')).filter((l) => l !== '')
  return out
}

/** The load options only serve has. */
function serveLoad(v, given) {
  const load = {}
  if (v['batch-size'] !== undefined) load.batchSize = numberOf(given['batch-size'], v['batch-size'], 'int')
  if (v.offline) load.offline = true
  if (v['draft-hf'] !== undefined) {
    if (v.draft !== undefined) throw new UsageError(`${given['draft-hf']}: a draft model is named by --draft already`)
    load.draftModelPath = `hf:${v['draft-hf']}`
  }
  if (v['n-gpu-layers'] !== undefined) {
    const t = v['n-gpu-layers']
    if (t === 'all') load.gpuLayers = 99
    else if (t !== 'auto') load.gpuLayers = numberOf(given['n-gpu-layers'], t, 'int')
  }
  if (v.pooling !== undefined) {
    load.pooling = v.pooling
  }
  if (v.reranking === true) {
    if (v.pooling !== undefined && v.pooling !== 'rank') throw new UsageError(`${given.reranking}: a reranker's pooling is rank, not ${v.pooling}`)
    load.pooling = 'rank'
  }
  if (v['cache-ram'] !== undefined) {
    const mib = numberOf(given['cache-ram'], v['cache-ram'], 'int')
    if (mib < -1) throw new UsageError(`${given['cache-ram']}: expected -1, 0 or a number of MiB`)
    load.promptCacheMB = mib === -1 ? 1 << 20 : mib
  }
  return load
}

/** `ALIAS=URI`: a name without a path separator before the first `=`. */
const isAlias = (spec) => /^[^=/\\]+=./.test(spec) && !existsSync(spec)
// hf: and https: models stay URIs: load() fetches them (resolveModel).
const uriOf = (m) => (/^(hf:|https?:\/\/)/i.test(m) ? m : resolve(m))

function positive(flag, text) {
  const n = number(flag, text, 'int')
  if (n <= 0) throw new UsageError(`--${flag}: expected a positive integer, got ${JSON.stringify(text)}`)
  return n
}

/** Bytes with an optional K, M, G or T suffix (powers of 1024). */
function bytesFlag(flag, text) {
  const m = /^(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?$/i.exec(String(text).trim())
  if (!m) throw new UsageError(`--${flag}: expected bytes (e.g. 8G, 512M, 1073741824), got ${JSON.stringify(text)}`)
  const power = { K: 1, M: 2, G: 3, T: 4 }[(m[2] ?? 'B')[0].toUpperCase()] ?? 0
  const n = Math.floor(Number(m[1]) * 1024 ** power)
  if (!(n > 0) || !Number.isSafeInteger(n)) throw new UsageError(`--${flag}: expected a positive size, got ${JSON.stringify(text)}`)
  return n
}

/** `llama-engine serve`: listens at once (/health says "loading" meanwhile); resolves with the exit code. */
export async function serve(argv) {
  const { stderr } = process
  const { cli, code } = parsedOrExit(parseServe, argv, { name: 'llama-engine serve', usage: SERVE_USAGE })
  if (cli === undefined) return code
  const require = createRequire(import.meta.url)
  const { LlamaEngine, inspectModel } = require('../../index.js')
  const { createServer } = require('../../server/index.js')
  // A line on stderr for every answer the server failed (5xx), with its cause.
  const onError = (e, r) => stderr.write(`${new Date().toISOString()} ${r.status} ${r.method} ${r.path}${r.streaming ? ' (mid-stream)' : ''}: ${e.code}: ${e.message}\n`)
  if (!cli.router) {
    const load = withChatTemplate(cli.load, inspectModel)
    const loading = load.then((o) => LlamaEngine.load(o))
    loading.catch(() => {})
    // --sleep-idle-seconds: a request after the sleep loads it again.
    const reloadEngine = () => load.then((o) => LlamaEngine.load(o))
    const server = createServer({ ...cli.server, engine: loading, reloadEngine, signals: false, onError })
    return runServer(server, cli.listen, { serving: `loading ${cli.load.modelPath}`, loading, disposed: 'engine disposed' })
  }
  // Many models: the aliases', the preset's, the directory's and the cache's, pinned as asked.
  const { router } = cli
  const { listCachedModels, resolveModel, removeCachedModel } = require('../../lib/models/resolve.js')
  // llama-server's POST and DELETE /models: the cache's models added (downloaded) and removed.
  const cacheAdmin = router.cache
    ? {
        downloadModel: (name, { onProgress, signal }) => resolveModel(`hf:${name}`, { onProgress, signal }),
        removeModel: async (name, { check = false } = {}) => (check ? listCachedModels().some((m) => m.name === name) : (await removeCachedModel(name)).length > 0),
      }
    : {}
  const list = async () => {
    const models = await routerModels(router, inspectModel, listCachedModels, resolveModel)
    for (const m of models) if (router.pin.includes(m.name)) m.pinned = true
    return models
  }
  let models
  let server
  try {
    models = await list()
    if (models.length === 0 && router.dir !== undefined && !router.cache) throw new UsageError(`--models: no model GGUF in ${router.dir}`)
    for (const name of router.pin) {
      if (!models.some((x) => x.name === name)) throw new UsageError(`--pin: no model named ${JSON.stringify(name)} (${models.map((x) => x.name).join(', ')})`)
    }
    const { modelsMax, memoryMax, idleUnloadMs, engineOptions, autoload } = router
    server = createServer({ ...cli.server, models, modelsMax, memoryMax, idleUnloadMs, engineOptions, modelsAutoload: autoload, reloadModels: list, ...cacheAdmin, signals: false, onError })
    // load-on-startup: loaded now, unloaded as any other later.
    for (const m of models) if (m.preload && !m.pinned) server.router.load(m.name).catch(() => {})
  } catch (e) {
    if (!(e instanceof UsageError) && !(e instanceof TypeError)) throw e
    stderr.write(`llama-engine serve: ${e.message}\n\n${SERVE_USAGE}`)
    return 2
  }
  const names = models.map((m) => m.name + (m.pinned ? ' (pinned)' : '')).join(', ')
  return runServer(server, cli.listen, { serving: `${models.length} models${models.length ? `: ${names}` : ''}`, loading: null, disposed: 'engines disposed' })
}

/**
 * Listens, shuts down on SIGTERM/SIGINT (a second one ends the process at
 * once) and resolves with the exit code: 0 when closed, 128 + the signal's
 * number after one, 1 when it cannot listen or `loading` (the one model's
 * load, if any) fails.
 */
async function runServer(server, listen, { serving, loading, disposed }) {
  const { stderr } = process
  const closed = new Promise((r) => server.on('close', r))
  let signal = null
  const onSignal = (name) => {
    if (signal !== null) process.exit(SIGNAL_EXIT[name]) // a second one: now
    signal = name
    stderr.write(`${name}: shutting down (queued requests get 503, running ones may finish)\n`)
    server.shutdown({ dispose: true }).then(() => stderr.write(`stopped; ${disposed}\n`))
  }
  const onSigint = () => onSignal('SIGINT')
  const onSigterm = () => onSignal('SIGTERM')
  process.on('SIGINT', onSigint)
  process.on('SIGTERM', onSigterm)
  try {
    await new Promise((resolve, reject) => {
      server.once('error', reject)
      server.listen(listen.port, listen.host, resolve)
    })
  } catch (e) {
    stderr.write(`error: cannot listen on ${listen.host}:${listen.port} (${e.code || e.message})\n`)
    await server.shutdown({ graceMs: 0, dispose: true })
    return 1
  }
  const { address, port } = server.address()
  const url = (a) => `http://${a.includes(':') ? `[${a}]` : a}:${port}`
  // The other addresses (--host A,B): their connections served by the same server.
  const others = []
  for (const h of listen.hosts?.slice(1) ?? []) {
    const other = net.createServer((socket) => server.emit('connection', socket))
    try {
      await new Promise((resolve, reject) => {
        other.once('error', reject)
        other.listen(port, h, resolve)
      })
    } catch (e) {
      stderr.write(`error: cannot listen on ${h}:${port} (${e.code || e.message})\n`)
      for (const o of others) o.close()
      await server.shutdown({ graceMs: 0, dispose: true })
      return 1
    }
    others.push(other)
  }
  server.on('close', () => others.forEach((o) => o.close()))
  stderr.write(`listening on ${[url(address), ...others.map((o) => url(o.address().address))].join(' and ')}, ${serving}\n`)
  if (server.responses.loadError) stderr.write(`warning: --responses-file ${server.responses.loadError}\n`)
  else if (server.responses.file && server.responses.size) stderr.write(`${server.responses.size} kept responses read from ${server.responses.file}\n`)
  if (loading) {
    try {
      await loading
      stderr.write('model loaded\n')
    } catch (e) {
      stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
      await server.shutdown({ graceMs: 0 })
      return 1
    }
  }
  await closed
  await server.shutdown({ dispose: true })
  process.off('SIGINT', onSigint)
  process.off('SIGTERM', onSigterm)
  return signal ? SIGNAL_EXIT[signal] : 0
}

