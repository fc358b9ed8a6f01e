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
import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync } from 'node:fs'
import { createInterface } from 'node:readline'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { createRequire } from 'node:module'
import { UsageError, helpText, numberOf, parseTable } from './cli/table.mjs'
import { SERVE_GROUPS, SERVE_TABLE, modelFromHub, serveExtras } from './cli/serve-options.mjs'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..')
const DEFAULT_MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'

// Request fields become flags of the same name, from the engine's own list
// of them (name, kind, default, doc): --top_k N, --ignore_eos, --stop STR;
// the speculative ones as --n-max N (and --spec MODE for the mode). Those
// the CLI sets itself (the prompt, chat messages; lora: --lora loads adapters) are left out.
const { requestFields, drafters } = createRequire(import.meta.url)('../index.js')
const OWN = new Set(['prompt', 'messages', 'speculative', 'lora'])
const REQUEST_FLAGS = requestFields.filter((f) => !OWN.has(f.name))
const SPECULATIVE_FLAGS = requestFields.find((f) => f.name === 'speculative').fields.map((f) => ({
  ...f,
  flag: f.name === 'mode' ? 'spec' : f.name.replace(/_/g, '-'),
}))

// A colour per drafter of the engine's table, in its order (grammar
// magenta, ngram yellow, draft cyan, then the rest); target tokens plain.
const PALETTE = [['\x1b[35m', 'magenta'], ['\x1b[33m', 'yellow'], ['\x1b[36m', 'cyan'], ['\x1b[32m', 'green'], ['\x1b[34m', 'blue'], ['\x1b[31m', 'red']]
const COLORS = Object.fromEntries(drafters.map((d, i) => [d.name, PALETTE[i % PALETTE.length][0]]))
const COLOR_NAMES = drafters.map((d, i) => `${d.name} ${PALETTE[i % PALETTE.length][1]}`)

/** A boolean field with default true is turned off with --no-NAME; one with default false is a plain flag. */
const boolFlag = (name, field) => (field.default === true ? `no-${name}` : name)

function fieldOption(flag, field) {
  if (field.kind === 'bool') return [boolFlag(flag, field), { type: 'boolean' }]
  return [flag, { type: 'string', multiple: field.name === 'stop' }]
}

const OPTIONS = {
  model: { type: 'string', short: 'm' },
  draft: { type: 'string' },
  mmproj: { type: 'string' },
  rpc: { type: 'string' },
  portable: { type: 'boolean' },
  image: { type: 'string', multiple: true },
  lora: { type: 'string', multiple: true },
  ...Object.fromEntries(SPECULATIVE_FLAGS.map((f) => fieldOption(f.flag, f))),
  ...Object.fromEntries(REQUEST_FLAGS.map((f) => fieldOption(f.name, f))),
  'ctx-size': { type: 'string', short: 'c' },
  threads: { type: 'string', short: 't' },
  chat: { type: 'boolean' },
  system: { type: 'string' },
  interactive: { type: 'boolean', short: 'i' },
  session: { type: 'string' },
  'chat-template': { type: 'string' },
  'chat-template-file': { type: 'string' },
  prompt: { type: 'string', short: 'p' },
  json: { type: 'boolean' },
  'json-schema': { type: 'string' },
  'tool-call-format': { type: 'string' },
  'no-color': { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
}
OPTIONS.n_predict.short = 'n'

/** The help line of one field's flag. */
function fieldHelp(flag, f) {
  const choices = (f.choices || []).join('|')
  const arg = { int: ' N', float: ' X', string: ' TEXT', choice: choices.length <= 12 ? ` ${choices}` : ' MODE', other: ' JSON' }[f.kind] ?? ''
  const name = f.kind === 'bool' ? boolFlag(flag, f) : flag
  const left = `      --${name}${f.name === 'stop' ? ' STR' : arg}`
  const off = f.kind === 'bool' && f.default === true ? 'turn off: ' : ''
  const one = f.kind === 'choice' && arg === ' MODE' ? ` (${choices})` : ''
  const def = f.default !== undefined && f.kind !== 'bool' ? ` (default ${JSON.stringify(f.default)})` : ''
  return `${left.padEnd(32)}${off}${f.doc}${one}${def}`
}

export const USAGE = `Usage: llama-engine [options] [--prompt TEXT]   (the prompt is read from stdin without --prompt)
       llama-engine serve [options]             an HTTP server (see llama-engine serve --help)
       llama-engine pull URI [--offline] [--cache-dir DIR]
                                                fetch a model into the cache and print its path
                                                (URI: hf:OWNER/REPO:QUANT, hf:OWNER/REPO/FILE.gguf, https://…)
       llama-engine inspect PATH|URI [--json] [--ctx N] [--parallel N] [--offline]
                                                what a GGUF holds, and the memory a context of N
                                                tokens takes (without loading the weights)
       llama-engine rpc-worker [--host 127.0.0.1] [--port 50052] [--threads N] [--mem MB]
                                                serve this machine's CPU to engines loaded with
                                                --rpc (llama.cpp's RPC back end; see rpc-worker --help)

Models:
  -m, --model PATH          target GGUF model (default: models/${DEFAULT_MODEL},
                            or $LLAMA_ENGINE_MODELS_DIR/${DEFAULT_MODEL})
      --draft PATH          draft model for speculative decoding (same vocabulary)
      --mmproj PATH         the model's multimodal projector (mmproj GGUF): images in --chat
      --image FILE          an image (or audio file) for the first user message; repeats
      --lora PATH[:SCALE]   a LoRA adapter (GGUF) applied at SCALE (default 1); repeats
      --rpc HOST:PORT,…     the model's layers on these RPC workers (llama-engine rpc-worker)
      --portable            determinism 'portable': the same tokens and probabilities on
                            every CPU (slower kernels; docs/testing.md)
  -c, --ctx-size N          context size (default 4096, capped at the model's)
  -t, --threads N           threads (default: available parallelism)

Prompt and output:
  -p, --prompt TEXT         the prompt
      --chat                send the prompt as a user message, rendered with the model's
                            own chat template (tokenizer.chat_template in the GGUF)
      --system TEXT         a system message before it (implies --chat)
  -i, --interactive         a conversation: type a message, read the answer, go on
                            (the whole history is kept and its KV cache reused);
                            Ctrl-C stops the answer being written, Ctrl-D quits
      --session FILE        with --interactive: resume the conversation saved in FILE
                            (its KV cells too, when FILE is for this model) and save
                            it there after every answer
      --chat-template FILE  a Jinja chat template to use instead of the GGUF's
      --tools FILE          tools the model may call (a JSON file, or JSON inline); the
                            calls are printed as JSON lines after the answer
      --json-schema FILE    the answer as JSON matching this schema (a file, or inline)
      --tool-call-format F  auto | hermes | llama3 | mistral | generic (default: from the template)
      --json                print every event as one JSON line on stdout (the last is "done")
      --no-color            do not colour tokens by source (also: NO_COLOR=1)
  -h, --help                this help

Speculative decoding (request.speculative):
${SPECULATIVE_FLAGS.map((f) => fieldHelp(f.flag, f)).join('\n')}

Request fields (the names of the request; --stop repeats; JSON values for the structured ones):
${REQUEST_FLAGS.map((f) => fieldHelp(f.name, f)).join('\n')}

On a terminal, tokens accepted from a drafter are coloured by drafter
(${COLOR_NAMES.join(', ')}); the target model's own tokens are plain.
Ctrl-C stops the generation and prints the summary (exit code 130).
`

export { UsageError }

/** A flag's number (`--flag`: the name without its dashes). */
const number = (flag, text, kind) => numberOf(`--${flag}`, text, kind)

/** A structured value: JSON given inline, or the JSON file it names (`--tools tools.json`). */
function jsonOrFile(flag, text) {
  const inline = /^\s*[[{"]/.test(text) || /^\s*(true|false|null|-?\d)/.test(text)
  let source = text
  if (!inline) {
    try {
      source = readFileSync(text, 'utf8')
    } catch (e) {
      throw new UsageError(`--${flag}: cannot read ${text} (${e.code || e.message})`)
    }
  }
  try {
    return JSON.parse(source)
  } catch (e) {
    throw new UsageError(`--${flag}: ${inline ? '' : `${text} is `}not valid JSON (${e.message})`)
  }
}

/** A field's value from its flag, converted by the field's kind (ranges are the engine's to check). */
function fieldValue(flag, f, v) {
  if (f.kind === 'bool') {
    const name = boolFlag(flag, f)
    return v[name] ? name !== flag ? false : true : undefined
  }
  const text = v[flag]
  if (text === undefined) return undefined
  switch (f.kind) {
    case 'int':
    case 'float':
      return number(flag, text, f.kind)
    case 'choice':
      if (!f.choices.includes(text)) throw new UsageError(`--${flag}: expected one of ${f.choices.join(', ')}, got ${JSON.stringify(text)}`)
      return text
    case 'other':
      if (f.name === 'stop') return text
      // --tool_choice auto|none|required, or the name of one function.
      if (f.name === 'tool_choice' && !/^\s*[{"]/.test(text)) {
        return ['auto', 'none', 'required'].includes(text) ? text : { type: 'function', function: { name: text } }
      }
      return jsonOrFile(flag, text)
    default:
      return text
  }
}

// parseArgs in strict mode reads "--seed -1" as a missing value followed by
// an unknown option "-1"; join such negative numbers onto their flag.
function joinNegativeNumbers(argv) {
  const out = []
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    const name = arg.startsWith('--') ? arg.slice(2) : null
    const next = argv[i + 1]
    if (name && OPTIONS[name]?.type === 'string' && typeof next === 'string' && /^-(\d|\.\d)/.test(next)) {
      out.push(`${arg}=${next}`)
      i++
    } else {
      out.push(arg)
    }
  }
  return out
}

/** `--lora PATH[:SCALE]` (the scale after the last colon, when it is a number). */
function loraOption(spec, where) {
  const m = /^(.*):(-?\d+(?:\.\d*)?|-?\.\d+)$/.exec(spec)
  const path = m && m[1] !== '' ? m[1] : spec
  const scale = m && m[1] !== '' ? Number(m[2]) : undefined
  if (path === '') throw new UsageError('--lora: expected PATH[:SCALE]')
  return scale === undefined ? { path: where(path) } : { path: where(path), scale }
}

/** The engine's load options from the model flags both commands share. */
function loadOptions(v, env) {
  const modelsDir = env.LLAMA_ENGINE_MODELS_DIR || join(ROOT, 'models')
  // hf: and https: models stay URIs: load() fetches them (resolveModel).
  const where = (m) => (/^(hf:|https?:\/\/)/i.test(m) ? m : resolve(m))
  const load = { modelPath: v.model !== undefined ? where(v.model) : join(modelsDir, DEFAULT_MODEL) }
  if (v.draft !== undefined) load.draftModelPath = where(v.draft)
  if (v.mmproj !== undefined) load.mmprojPath = where(v.mmproj)
  if (v.rpc !== undefined) {
    load.rpc = v.rpc.split(',').map((w) => w.trim())
    if (load.rpc.some((w) => w === '')) throw new UsageError('--rpc: expected HOST:PORT[,HOST:PORT…]')
  }
  if (v.portable) load.determinism = 'portable'
  if (v.lora !== undefined) load.loras = v.lora.map((spec) => loraOption(spec, where))
  if (v['ctx-size'] !== undefined) load.contextSize = number('ctx-size', v['ctx-size'], 'int')
  if (v.threads !== undefined) load.threads = number('threads', v.threads, 'int')
  if (v.parallel !== undefined) load.parallel = number('parallel', v.parallel, 'int')
  if (v['tool-call-format'] !== undefined) load.toolCallFormat = v['tool-call-format']
  if (v['chat-template-file'] !== undefined) load.chatTemplate = templateFile('chat-template-file', v['chat-template-file'])
  else if (v['chat-template'] !== undefined) load.chatTemplate = chatTemplateOption(v['chat-template'])
  return load
}

// llama.cpp's built-in chat templates by name (--chat-template NAME), as Jinja.
const BUILTIN_TEMPLATES = {
  chatml: "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  llama3: "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
}

function templateFile(flag, file) {
  try {
    return readFileSync(file, 'utf8')
  } catch (e) {
    throw new UsageError(`--${flag}: cannot read ${file} (${e.code || e.message})`)
  }
}

/**
 * `--chat-template`: the template's Jinja text (llama.cpp's meaning), one
 * of llama.cpp's built-in names, or the file it names (ours before).
 */
function chatTemplateOption(text) {
  if (Object.hasOwn(BUILTIN_TEMPLATES, text)) return BUILTIN_TEMPLATES[text]
  if (/\{[{%]/.test(text)) return text
  if (existsSync(text)) return templateFile('chat-template', text)
  throw new UsageError(
    `--chat-template: ${JSON.stringify(text)} is neither a Jinja template, a file, nor a built-in name (${Object.keys(BUILTIN_TEMPLATES).join(', ')})`,
  )
}

/** Parses the command line into { help, json, color, chat, prompt, load, request }. Throws UsageError. */
export function parseCli(argv, env = process.env) {
  let parsed
  try {
    parsed = parseArgs({ args: joinNegativeNumbers(argv), options: OPTIONS, strict: true, allowPositionals: true })
  } catch (e) {
    // Node's own wording for an unknown flag goes on about positionals; keep its first sentence.
    const unknown = /^Unknown option '([^']*)'/.exec(e.message)
    throw new UsageError(unknown ? `unknown option ${unknown[1]}` : e.message)
  }
  const { values: v, positionals } = parsed
  if (positionals.length > 0) {
    throw new UsageError(`unexpected argument ${JSON.stringify(positionals[0])} (pass the prompt with --prompt TEXT or on stdin)`)
  }

  const request = {}
  for (const f of REQUEST_FLAGS) {
    const value = fieldValue(f.name, f, v)
    if (value !== undefined) request[f.name] = value
  }
  const speculative = {}
  for (const f of SPECULATIVE_FLAGS) {
    const value = fieldValue(f.flag, f, v)
    if (value !== undefined) speculative[f.name] = value
  }
  if (Object.keys(speculative).length > 0) request.speculative = speculative
  if (v['json-schema'] !== undefined) request.json_schema = jsonOrFile('json-schema', v['json-schema'])
  if ((request.tools || request.tool_choice) && !v.chat && v.system === undefined && !v.interactive) {
    throw new UsageError('--tools and --tool_choice go with a chat: add --chat (or --system, --interactive)')
  }

  const load = loadOptions(v, env)
  if (v.interactive && (v.prompt !== undefined || v.json)) {
    throw new UsageError('--interactive reads its messages from the terminal: it takes no --prompt or --json')
  }
  if (v.session !== undefined && !v.interactive) {
    throw new UsageError('--session FILE keeps an --interactive conversation: add --interactive')
  }

  return {
    help: Boolean(v.help),
    json: Boolean(v.json),
    noColor: Boolean(v['no-color']) || Boolean(env.NO_COLOR),
    chat: Boolean(v.chat) || v.system !== undefined || Boolean(v.interactive) || v.image !== undefined,
    images: (v.image ?? []).map((f) => resolve(f)),
    system: v.system,
    interactive: Boolean(v.interactive),
    session: v.session,
    prompt: v.prompt,
    load,
    request,
  }
}

/** The opening messages of a chat: the system message, if any. */
function opening(cli) {
  return cli.system !== undefined ? [{ role: 'system', content: cli.system }] : []
}

const RESET = '\x1b[0m'
const paint = (on, source, text) => (on && COLORS[source] ? COLORS[source] + text + RESET : text)

const fixed = (x, digits = 1) => (Number.isFinite(x) ? x.toFixed(digits) : 'n/a')
const percent = (num, den) => (den > 0 ? `${((100 * num) / den).toFixed(1)}%` : 'n/a')

function stopReason(r, signal) {
  if (r.stopped_abort) return signal === 'SIGINT' ? 'aborted (Ctrl-C)' : signal ? `aborted (${signal})` : 'aborted'
  if (r.stopped_word) return `stop string ${JSON.stringify(r.stopping_word)}`
  if (r.stopped_eos) return 'end of generation (EOS)'
  if (r.stopped_limit) return `n_predict limit (${r.tokens_predicted} tokens)`
  return 'context full'
}

/** The closing summary (stderr). */
export function summary(r, { signal = null, color = false } = {}) {
  const t = r.timings || {}
  const s = r.speculative || {}
  const n = r.tokens_predicted
  const lines = [
    `${n} tokens in ${fixed((t.predicted_ms || 0) / 1000, 2)} s, ${fixed(n > 0 ? t.predicted_per_second : NaN)} tokens/s` +
      ` (prompt: ${t.prompt_n ?? 0} tokens at ${fixed(t.prompt_n > 0 ? t.prompt_per_second : NaN)} tokens/s, ${r.tokens_cached} cached${r.truncated ? ', truncated' : ''})`,
    `speculative ${s.mode}: ${s.n_accepted ?? 0}/${s.n_drafted ?? 0} drafted tokens accepted (acceptance ${percent(s.n_accepted, s.n_drafted)}),` +
      ` ${s.target_passes ?? 0} target passes = ${n > 0 ? fixed(s.target_passes / n, 2) : 'n/a'} per token`,
  ]
  for (const [name, d] of Object.entries(s.drafters || {})) {
    lines.push(`  ${paint(color, name, name)}: drafted ${d.n_drafted}, accepted ${d.n_accepted} (${percent(d.n_accepted, d.n_drafted)})`)
  }
  lines.push(`stopped: ${stopReason(r, signal)}`)
  return lines.join('\n') + '\n'
}

async function readStdin() {
  const chunks = []
  for await (const chunk of process.stdin) chunks.push(chunk)
  return Buffer.concat(chunks).toString('utf8')
}

function progressBar(stream) {
  if (!stream.isTTY) return { update: undefined, clear() {} }
  let last = -1
  return {
    update(fraction) {
      const pct = Math.max(0, Math.min(100, Math.floor(fraction * 100)))
      if (pct === last) return
      last = pct
      const width = 30
      const filled = Math.round((pct / 100) * width)
      stream.write(`\rloading [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${String(pct).padStart(3)}%`)
    },
    clear() {
      if (last >= 0) stream.write('\r\x1b[K')
    },
  }
}

const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143 }

export const SERVE_USAGE = `Usage: llama-engine serve [options]

An HTTP server over one model (or several): OpenAI's Chat Completions,
Completions, Responses and embeddings APIs, Anthropic's Messages API,
llama.cpp's endpoints, /health and Prometheus /metrics. It takes
llama-server's command line: its spellings mean what they mean there
(docs/server.md, "Coming from llama-server").

${helpText(SERVE_TABLE, SERVE_GROUPS)}
With several models (--models, --model ALIAS=URI, --models-preset), the request's
"model" picks; each loads on demand in its own child process; GET /v1/models lists
them with their state. The model flags (--ctx-size, --parallel, --threads, --draft,
--lora, …) apply to every model. POST /models/load and /models/unload { "model": ALIAS }.

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
  const listen = { host: v.host ?? '127.0.0.1', port }
  const hub = modelFromHub(v)
  if (hub !== undefined && v.model !== undefined) throw new UsageError(`${given['hf-repo'] ?? given['model-url']}: a model is named by --model already`)
  const models = v.model ?? (hub !== undefined ? [hub] : [])
  Object.assign(v, serveLoadValues(v, given))
  const aliased = models.filter((m) => isAlias(m))
  const many = v.models !== undefined || v['models-preset'] !== undefined || aliased.length > 0
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
  const router = { models: [], dir: v.models, engineOptions: { ...shared, isolation } }
  const add = (name, uri, extra = {}) => {
    if (router.models.some((m) => m.name === name)) throw new UsageError(`the model ${JSON.stringify(name)} is named twice`)
    router.models.push({ name, uri, ...extra })
  }
  for (const m of aliased) {
    const i = m.indexOf('=')
    add(m.slice(0, i), uriOf(m.slice(i + 1)))
  }
  if (v['models-preset'] !== undefined) for (const [name, m] of Object.entries(readPreset(v['models-preset']))) add(name, m.uri, m)
  if (v['models-max'] !== undefined) router.modelsMax = positive('models-max', v['models-max'])
  if (v['memory-max'] !== undefined) router.memoryMax = bytesFlag('memory-max', v['memory-max'])
  if (v['idle-unload'] !== undefined) router.idleUnloadMs = positive('idle-unload', v['idle-unload']) * 1000
  router.pin = v.pin ?? []
  return { help: Boolean(v.help), router, listen, server }
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
  if (v['ctx-size'] !== undefined && numberOf(given['ctx-size'], v['ctx-size'], 'int') === 0) out['ctx-size'] = String(1 << 20)
  if (v.lora !== undefined) out.lora = v.lora.flatMap((l) => l.split(',')).filter((l) => l !== '')
  return out
}

/** The load options only serve has. */
function serveLoad(v, given) {
  const load = {}
  if (v['batch-size'] !== undefined) load.batchSize = numberOf(given['batch-size'], v['batch-size'], 'int')
  if (v.offline) load.offline = true
  if (v['n-gpu-layers'] !== undefined) {
    const t = v['n-gpu-layers']
    if (t === 'all') load.gpuLayers = 99
    else if (t !== 'auto') load.gpuLayers = numberOf(given['n-gpu-layers'], t, 'int')
  }
  if (v.pooling !== undefined) {
    if (v.pooling === 'none' || v.pooling === 'rank') throw new UsageError(`${given.pooling}: ${v.pooling} is not supported yet (mean, cls, last)`)
    load.pooling = v.pooling
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

/** A presets file: `{ ALIAS: { model, pinned?, options? } }`, paths relative to the file. */
function readPreset(file) {
  let preset
  try {
    preset = JSON.parse(readFileSync(file, 'utf8'))
  } catch (e) {
    throw new UsageError(`--models-preset: cannot read ${file} (${e.code || e.message})`)
  }
  if (preset === null || typeof preset !== 'object' || Array.isArray(preset)) throw new UsageError('--models-preset: expected a JSON object of ALIAS: { model, pinned?, options? }')
  const base = dirname(resolve(file))
  const out = {}
  for (const [name, m] of Object.entries(preset)) {
    if (m === null || typeof m !== 'object' || typeof m.model !== 'string' || m.model === '') throw new UsageError(`--models-preset: ${name}: expected { "model": PATH|URI, … }`)
    if (m.options != null && (typeof m.options !== 'object' || Array.isArray(m.options))) throw new UsageError(`--models-preset: ${name}.options: expected an object of EngineOptions`)
    const uri = /^(hf:|https?:\/\/)/i.test(m.model) ? m.model : resolve(base, m.model)
    out[name] = { uri, pinned: m.pinned === true, ...(m.options ? { options: m.options } : {}) }
  }
  return out
}

/**
 * The models of `--models DIR`: every GGUF in it that is a model (not a
 * projector or a LoRA adapter), named by its file without `.gguf`, with
 * inspect's estimate of its memory for the context and slots asked.
 */
async function modelsIn(dir, inspectModel, load) {
  let names
  try {
    names = readdirSync(dir)
      .filter((f) => /\.gguf$/i.test(f))
      .sort()
  } catch (e) {
    throw new UsageError(`--models: cannot read ${dir} (${e.code || e.message})`)
  }
  const out = []
  for (const f of names) {
    const path = join(resolve(dir), f)
    let info
    try {
      info = await inspectModel(path, { contextSize: load.contextSize ?? 4096, parallel: load.parallel ?? 4 })
    } catch {
      continue // not a GGUF this build reads: not served
    }
    if (info.kind !== 'model') continue
    out.push({ name: f.replace(/\.gguf$/i, ''), uri: path, bytes: typeof info.memory?.total === 'number' ? info.memory.total : info.fileBytes })
  }
  return out
}

/** `llama-engine serve`: listens at once (/health says "loading" meanwhile); resolves with the exit code. */
async function serve(argv) {
  const { stdout, stderr } = process
  let cli
  try {
    cli = parseServe(argv)
  } catch (e) {
    if (!(e instanceof UsageError)) throw e
    stderr.write(`llama-engine serve: ${e.message}\n\n${SERVE_USAGE}`)
    return 2
  }
  if (cli.help) {
    stdout.write(SERVE_USAGE)
    return 0
  }
  const require = createRequire(import.meta.url)
  const { LlamaEngine, inspectModel } = require('../index.js')
  const { createServer } = require('../server/index.js')
  // A line on stderr for every answer the server failed (5xx), with its cause.
  const onError = (e, r) => stderr.write(`${new Date().toISOString()} ${r.status} ${r.method} ${r.path}${r.streaming ? ' (mid-stream)' : ''}: ${e.code}: ${e.message}\n`)
  if (!cli.router) {
    const loading = LlamaEngine.load(cli.load)
    loading.catch(() => {})
    const server = createServer({ ...cli.server, engine: loading, signals: false, onError })
    return runServer(server, cli.listen, { serving: `loading ${cli.load.modelPath}`, loading, disposed: 'engine disposed' })
  }
  // Many models: the directory's, the aliases' and the preset's, pinned as asked.
  const { router } = cli
  let models = router.models
  let server
  try {
    if (router.dir !== undefined) {
      for (const m of await modelsIn(router.dir, inspectModel, router.engineOptions)) {
        if (!models.some((x) => x.name === m.name)) models = [...models, m]
      }
    }
    if (models.length === 0) throw new UsageError(`--models: no model GGUF in ${router.dir}`)
    for (const name of router.pin) {
      const m = models.find((x) => x.name === name)
      if (!m) throw new UsageError(`--pin: no model named ${JSON.stringify(name)} (${models.map((x) => x.name).join(', ')})`)
      m.pinned = true
    }
    const { modelsMax, memoryMax, idleUnloadMs, engineOptions } = router
    server = createServer({ ...cli.server, models, modelsMax, memoryMax, idleUnloadMs, engineOptions, signals: false, onError })
  } catch (e) {
    if (!(e instanceof UsageError) && !(e instanceof TypeError)) throw e
    stderr.write(`llama-engine serve: ${e.message}\n\n${SERVE_USAGE}`)
    return 2
  }
  const names = models.map((m) => m.name + (m.pinned ? ' (pinned)' : '')).join(', ')
  return runServer(server, cli.listen, { serving: `${models.length} models: ${names}`, loading: null, disposed: 'engines disposed' })
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
  const host = address.includes(':') ? `[${address}]` : address
  stderr.write(`listening on http://${host}:${port}, ${serving}\n`)
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

/** Runs the CLI; resolves with the exit code. */
/**
 * The flags and one positional of a subcommand (`pull`, `inspect`), or the
 * exit code when they are wrong or --help was asked (usage written).
 */
function parseCommand(name, argv, options, expected) {
  const { stdout, stderr } = process
  let parsed
  try {
    parsed = parseArgs({ args: argv, allowPositionals: true, options: { ...options, help: { type: 'boolean', short: 'h' } } })
  } catch (e) {
    stderr.write(`llama-engine ${name}: ${e.message}\n\n${USAGE}`)
    return 2
  }
  if (parsed.values.help) {
    stdout.write(USAGE)
    return 0
  }
  if (parsed.positionals.length !== 1) {
    stderr.write(`llama-engine ${name}: expected ${expected}\n\n${USAGE}`)
    return 2
  }
  return parsed
}

// `llama-engine pull URI`: resolveModel with a progress bar (speed and ETA)
// on a TTY, a line per 10 % otherwise; prints the local path on stdout.
async function pull(argv) {
  const { stdout, stderr } = process
  const parsed = parseCommand('pull', argv, { offline: { type: 'boolean' }, 'cache-dir': { type: 'string' } }, 'one URI')
  if (typeof parsed === 'number') return parsed
  const { values: v, positionals } = parsed
  const { resolveModel } = await import('../index.mjs')
  const started = Date.now()
  const tty = Boolean(stderr.isTTY)
  let lastTenth = -1
  let drew = false
  const mb = (n) => (n / 2 ** 20).toFixed(1)
  const onProgress = ({ file, downloaded, total }) => {
    const fraction = total > 0 ? downloaded / total : 0
    if (tty) {
      const secs = (Date.now() - started) / 1000
      const speed = secs > 0 ? downloaded / secs : 0
      const eta = speed > 0 ? Math.max(0, (total - downloaded) / speed) : 0
      const width = 24
      const filled = Math.round(fraction * width)
      stderr.write(`\r${file} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${mb(downloaded)}/${mb(total)} MB ${mb(speed)} MB/s ETA ${eta.toFixed(0)} s\x1b[K`)
      drew = true
    } else {
      const tenth = Math.floor(fraction * 10)
      if (tenth !== lastTenth) {
        lastTenth = tenth
        stderr.write(`${file}: ${tenth * 10}% (${mb(downloaded)} of ${mb(total)} MB)\n`)
      }
    }
  }
  const ac = new AbortController()
  const onSigint = () => ac.abort(new Error('interrupted'))
  process.once('SIGINT', onSigint)
  try {
    const file = await resolveModel(positionals[0], { offline: Boolean(v.offline), cacheDir: v['cache-dir'], signal: ac.signal, onProgress })
    if (drew) stderr.write('\n')
    stdout.write(`${file}\n`)
    return 0
  } catch (e) {
    if (drew) stderr.write('\n')
    stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
    return ac.signal.aborted ? SIGNAL_EXIT.SIGINT : 1
  } finally {
    process.off('SIGINT', onSigint)
  }
}

const bytes = (n) => {
  if (typeof n !== 'number') return '?'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < units.length - 1) (n /= 1024), i++
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`
}

/** The lines `llama-engine inspect` prints for a description from inspectModel. */
export function describeInspection(info) {
  const row = (k, v) => `${`${k}:`.padEnd(18)}${v}`
  const lines = [row('file', `${info.path} (${bytes(info.fileBytes)})`)]
  if (info.kind === 'adapter') {
    lines.push(row('kind', `LoRA adapter (${info.adapterType}) for ${info.architecture}`))
    lines.push(row('rank / alpha', `${info.rank} / ${info.alpha}`))
    lines.push(row('tensors', `${info.tensors} (${info.parameters.toLocaleString('en-US')} parameters)`))
    return lines
  }
  if (info.kind === 'projector') {
    const reads = [info.vision && 'images', info.audio && 'audio'].filter(Boolean).join(' and ')
    lines.push(row('kind', `multimodal projector (${info.projectorType}) reading ${reads}, for mmprojPath`))
    if (info.vision) {
      const tokens = info.tokensPerImage != null ? `${info.tokensPerImage} tokens per image` : 'tokens per image by its size'
      lines.push(row('images', `${info.imageSize} px, patches of ${info.patchSize} px; ${tokens}`))
    }
    lines.push(row('projects to', `embedding ${info.embeddingLength ?? '?'} (the text model's)`))
    lines.push(row('tensors', `${info.tensors} (${info.parameters.toLocaleString('en-US')} parameters, ${bytes(info.weightBytes)})`))
    return lines
  }
  const params = info.parameters >= 1e9 ? `${(info.parameters / 1e9).toFixed(2)} B` : `${(info.parameters / 1e6).toFixed(1)} M`
  lines.push(row('architecture', `${info.architecture}${info.name ? ` (${info.name})` : ''}`))
  lines.push(row('parameters', params))
  lines.push(row('quantization', `${info.quantization ?? '?'}; tensors: ${info.tensorTypes.map((t) => `${t.type} ×${t.tensors}`).join(', ')}`))
  lines.push(row('context length', `${info.contextLength} (trained)`))
  const shape = [`${info.layers} layers`, `embedding ${info.embeddingLength}`]
  if (info.heads != null) shape.push(`${info.heads} heads (${info.kvHeads ?? info.heads} KV)`)
  if (info.slidingWindow) shape.push(`sliding window ${info.slidingWindow}`)
  if (info.experts) shape.push(`${info.experts} experts`)
  lines.push(row('layers', shape.join(', ')))
  lines.push(row('vocabulary', `${info.vocabSize} tokens`))
  lines.push(
    row('chat template', info.chatTemplate ? `yes; tool calls: ${info.toolCallFormat}` : info.chatTemplateError ? `unusable (${info.chatTemplateError})` : 'none'),
  )
  const m = info.memory
  if (m && m.error) lines.push(row('memory', `not computed (${m.error})`))
  else if (m) {
    lines.push(
      row(
        'memory',
        `${bytes(m.total)} for ${m.contextSize} tokens × ${m.parallel} slots: weights ${bytes(m.weights)}, KV cache ${bytes(m.kvCache)}, compute ${bytes(m.compute)}`,
      ),
    )
    lines.push(row('available', `${bytes(m.available)}: ${m.fits ? 'fits' : 'does NOT fit'}`))
  }
  return lines
}

// `llama-engine inspect PATH|URI`: what a GGUF is and what it needs.
async function inspect(argv) {
  const { stdout, stderr } = process
  const parsed = parseCommand(
    'inspect',
    argv,
    { json: { type: 'boolean' }, ctx: { type: 'string' }, parallel: { type: 'string' }, offline: { type: 'boolean' }, 'cache-dir': { type: 'string' } },
    'one PATH or URI',
  )
  if (typeof parsed === 'number') return parsed
  const { values: v, positionals } = parsed
  const { inspectModel } = await import('../index.mjs')
  try {
    const options = { offline: Boolean(v.offline), cacheDir: v['cache-dir'] }
    if (v.ctx !== undefined) options.contextSize = number('ctx', v.ctx, 'int')
    if (v.parallel !== undefined) options.parallel = number('parallel', v.parallel, 'int')
    const where = /^(hf:|https?:\/\/)/i.test(positionals[0]) ? positionals[0] : resolve(positionals[0])
    const info = await inspectModel(where, options)
    stdout.write(v.json ? `${JSON.stringify(info, null, 2)}\n` : `${describeInspection(info).join('\n')}\n`)
    return 0
  } catch (e) {
    stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
    return e instanceof UsageError ? 2 : 1
  }
}

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
async function rpcWorker(argv) {
  const { stdout, stderr } = process
  let cli
  try {
    cli = parseRpcWorker(argv)
  } catch (e) {
    if (!(e instanceof UsageError)) throw e
    stderr.write(`llama-engine rpc-worker: ${e.message}\n\n${RPC_WORKER_USAGE}`)
    return 2
  }
  if (cli.help) {
    stdout.write(RPC_WORKER_USAGE)
    return 0
  }
  const require = createRequire(import.meta.url)
  const { binding } = require('../lib/addon/native.js')
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

export async function main(argv = process.argv.slice(2)) {
  if (argv[0] === 'serve') return serve(argv.slice(1))
  if (argv[0] === 'pull') return pull(argv.slice(1))
  if (argv[0] === 'inspect') return inspect(argv.slice(1))
  if (argv[0] === 'rpc-worker') return rpcWorker(argv.slice(1))
  const { stdout, stderr } = process
  let cli
  try {
    cli = parseCli(argv)
  } catch (e) {
    if (!(e instanceof UsageError)) throw e
    stderr.write(`llama-engine: ${e.message}\n\n${USAGE}`)
    return 2
  }
  if (cli.help) {
    stdout.write(USAGE)
    return 0
  }
  if (cli.prompt === undefined && process.stdin.isTTY && !cli.interactive) {
    stderr.write(`llama-engine: no prompt: pass --prompt TEXT or pipe it on stdin\n\n${USAGE}`)
    return 2
  }

  // First Ctrl-C: abort the generation (the completion resolves with
  // stopped_abort, and the summary still prints). A second one: leave now.
  const ac = new AbortController()
  let signal = null
  let phase = 'start'
  const onSignal = (name) => {
    if (signal !== null || phase === 'start') process.exit(SIGNAL_EXIT[name])
    signal = name
    ac.abort()
  }
  const onSigint = () => onSignal('SIGINT')
  const onSigterm = () => onSignal('SIGTERM')
  process.on('SIGINT', onSigint)
  process.on('SIGTERM', onSigterm)

  // A closed stdout (EPIPE: piped into `head`, say) ends the generation quietly.
  let stdoutClosed = false
  const onStdoutError = () => {
    stdoutClosed = true
    ac.abort()
  }
  stdout.on('error', onStdoutError)
  const write = (text) => {
    if (!stdoutClosed && text) stdout.write(text)
  }

  let engine = null
  try {
    const prompt = cli.interactive ? null : (cli.prompt ?? (await readStdin()))
    phase = 'load'

    let LlamaEngine
    try {
      ;({ LlamaEngine } = await import('../index.mjs'))
    } catch (e) {
      stderr.write(`error INTERNAL: cannot load the native addon (${e.message})\n`)
      return 1
    }

    const bar = progressBar(stderr)
    try {
      engine = await LlamaEngine.load({ ...cli.load, onProgress: bar.update })
    } catch (e) {
      bar.clear()
      stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
      return 1
    }
    bar.clear()
    if (signal) {
      stderr.write(`stopped: aborted while loading\n`)
      return SIGNAL_EXIT[signal]
    }

    phase = 'generate'
    const color = !cli.json && !cli.noColor && Boolean(stdout.isTTY)
    const onEvent = (event) => {
      if (cli.json) return write(JSON.stringify(event) + '\n')
      if (event.type !== 'token') return
      // Reasoning goes to stderr, so stdout stays the answer.
      if (event.reasoning) stderr.write(color ? `\x1b[2m${event.reasoning}\x1b[0m` : event.reasoning)
      // Colour per token only when the pieces are exactly the printable text;
      // otherwise (held-back stop-string prefix, split UTF-8) print content as is.
      if (color && event.tokens.map((t) => t.piece).join('') === event.content) {
        write(event.tokens.map((t) => paint(true, t.source, t.piece)).join(''))
      } else {
        write(event.content)
      }
    }
    if (cli.interactive) {
      process.off('SIGINT', onSigint) // the conversation handles Ctrl-C itself
      return await converse(engine, cli, onEvent, write)
    }
    const content = cli.images.length ? [...cli.images.map((path) => ({ type: /\.(wav|mp3|flac)$/i.test(path) ? 'audio' : 'image', path })), { type: 'text', text: prompt }] : prompt
    const input = cli.chat ? { messages: [...opening(cli), { role: 'user', content }] } : { prompt }
    let result
    try {
      result = await engine.complete({ ...cli.request, ...input }, onEvent, ac.signal)
    } catch (e) {
      stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
      return 1
    }
    // Keep the terminal prompt off the last line; piped output stays exactly the content.
    if (!cli.json && stdout.isTTY && result.content && !result.content.endsWith('\n')) write('\n')
    // Tool calls, one JSON line each, after the answer.
    if (!cli.json && result.tool_calls) {
      if (result.content && !result.content.endsWith('\n')) write('\n')
      for (const call of result.tool_calls) write(JSON.stringify({ tool_call: call }) + '\n')
    }
    // A blank line first, so the summary stands apart when stderr and stdout share a terminal or pipe.
    stderr.write((cli.json ? '' : '\n') + summary(result, { signal: signal ?? (stdoutClosed ? 'stdout closed' : null), color: color && Boolean(stderr.isTTY) }))
    return signal ? SIGNAL_EXIT[signal] : 0
  } finally {
    if (engine) await engine.dispose().catch(() => {})
    process.off('SIGINT', onSigint)
    process.off('SIGTERM', onSigterm)
    stdout.off('error', onStdoutError)
  }
}

/**
 * --interactive: reads messages line by line (a terminal, or any stdin),
 * answers each with the whole conversation so far, and keeps the answer in
 * the history. Every turn after the first evaluates only what is new: the
 * engine's KV cache still holds the conversation. Ctrl-C stops the answer
 * being written (what was written stays in the history); at the prompt it
 * says how to leave. Ctrl-D (end of input) quits with 0.
 */
async function converse(engine, cli, onEvent, write) {
  const { stdin, stdout, stderr } = process
  const terminal = Boolean(stdin.isTTY && stdout.isTTY)
  const rl = createInterface({ input: stdin, output: terminal ? stdout : undefined, terminal, prompt: '> ' })
  const history = opening(cli)
  let answering = null // the AbortController of the answer being written
  const interrupt = () => {
    if (answering) answering.abort()
    else if (terminal) {
      stdout.write('\n(Ctrl-D to quit)\n')
      rl.prompt()
    }
  }
  rl.on('SIGINT', interrupt) // a terminal: readline sees Ctrl-C as a key
  process.on('SIGINT', interrupt) // piped input: a real signal
  const lines = rl[Symbol.asyncIterator]()
  let turns = 0
  if (cli.session !== undefined) {
    let resumed
    try {
      resumed = await resume(engine, cli.session)
    } catch {
      rl.close()
      return 1 // said why; the file is left as it is
    }
    if (resumed) {
      history.length = 0
      history.push(...resumed)
    }
  }
  try {
    for (;;) {
      if (terminal) rl.prompt()
      const { value: line, done } = await lines.next()
      if (done) break
      if (line.trim() === '') continue
      history.push({ role: 'user', content: line })
      answering = new AbortController()
      let result
      try {
        result = await engine.complete({ ...cli.request, messages: history }, onEvent, answering.signal)
      } catch (e) {
        stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
        history.pop()
        continue
      } finally {
        answering = null
      }
      history.push({ role: 'assistant', content: result.content })
      turns++
      if (cli.session !== undefined) {
        await engine.saveSession(cli.session, { messages: history }).catch((e) => {
          stderr.write(`--session: cannot save to ${cli.session}: ${e.message}\n`)
        })
      }
      if (!result.content.endsWith('\n')) write('\n')
      const t = result.timings
      stderr.write(
        `[${result.tokens_predicted} tokens, ${fixed(t.predicted_per_second)} tokens/s; prompt ${result.tokens_evaluated} tokens, ` +
          `${result.tokens_cached} from cache; ${result.speculative.n_accepted}/${result.speculative.n_drafted} drafted accepted` +
          `${result.stopped_abort ? '; stopped' : ''}]\n`,
      )
    }
  } finally {
    process.off('SIGINT', interrupt)
    rl.close()
  }
  if (terminal) stdout.write('\n')
  stderr.write(`${turns} turn${turns === 1 ? '' : 's'}\n`)
  return 0
}

/**
 * --session FILE: the conversation saved there, if FILE exists. Its cells
 * go back into the engine when the file is for this model; a file for
 * another model (or an older one) still gives its messages, evaluated again.
 */
async function resume(engine, file) {
  const { stderr } = process
  if (!existsSync(file)) return null
  try {
    const loaded = await engine.loadSession(file)
    if (!Array.isArray(loaded.messages)) throw new Error('it holds a prompt, not a conversation')
    stderr.write(`[resumed ${loaded.messages.length} messages from ${file}: ${loaded.tokens} tokens, none evaluated again]\n`)
    return loaded.messages
  } catch (e) {
    const messages = e.code === 'INVALID_SESSION' ? readMessages(file) : null
    if (messages) {
      stderr.write(`[resumed ${messages.length} messages from ${file}; its cells are not for this engine (${e.message}): evaluating again]\n`)
      return messages
    }
    stderr.write(`--session: cannot resume ${file}: ${e.message}\n`)
    throw e
  }
}

/** The messages in a session file's header, without its cells (another model's file). */
function readMessages(file) {
  try {
    const bytes = readFileSync(file)
    if (bytes.subarray(0, 8).toString('latin1') !== 'LLESESS\x1a') return null
    const length = bytes.readUInt32LE(12)
    const header = JSON.parse(bytes.subarray(16, 16 + length).toString('utf8'))
    return Array.isArray(header.conversation?.messages) ? header.conversation.messages : null
  } catch {
    return null
  }
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
