// The main command: streams one completion to stdout, or holds a
// conversation (--interactive), with its flags from the engine's own list
// of request fields.
import { existsSync, readFileSync } from 'node:fs'
import { createInterface } from 'node:readline'
import { resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { createRequire } from 'node:module'
import { UsageError } from './table.mjs'
import { DEFAULT_MODEL, SIGNAL_EXIT, jsonOrFile, loadOptions, number, parsedOrExit, progressBar } from './common.mjs'

// Request fields become flags of the same name, from the engine's own list
// of them (name, kind, default, doc): --top_k N, --ignore_eos, --stop STR;
// the speculative ones as --n-max N (and --spec MODE for the mode). Those
// the CLI sets itself (the prompt, chat messages; lora: --lora loads adapters) are left out.
const { requestFields, drafters } = createRequire(import.meta.url)('../../index.js')
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

/** Runs the main command; resolves with the exit code. */
export async function run(argv) {
  const { stdout, stderr } = process
  const { cli, code } = parsedOrExit(parseCli, argv, { name: 'llama-engine', usage: USAGE })
  if (cli === undefined) return code
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
      ;({ LlamaEngine } = await import('../../index.mjs'))
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
