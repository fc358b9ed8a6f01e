// What the commands share: where the models are, numbers and JSON from
// flags, the engine's load options from the model flags (the main command
// and serve), chat templates by name or file, the load progress bar, and
// the exit codes of signals.
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { UsageError, numberOf } from './table.mjs'
import { BUILTIN_TEMPLATES } from './builtin-templates.mjs'

export { BUILTIN_TEMPLATES }

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
export const DEFAULT_MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf'

/** A flag's number (`--flag`: the name without its dashes). */
export const number = (flag, text, kind) => numberOf(`--${flag}`, text, kind)

/** A structured value: JSON given inline, or the JSON file it names (`--tools tools.json`). */
export function jsonOrFile(flag, text) {
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

/** `--lora PATH[:SCALE]` (the scale after the last colon, when it is a number). */
function loraOption(spec, where) {
  const m = /^(.*):(-?\d+(?:\.\d*)?|-?\.\d+)$/.exec(spec)
  const path = m && m[1] !== '' ? m[1] : spec
  const scale = m && m[1] !== '' ? Number(m[2]) : undefined
  if (path === '') throw new UsageError('--lora: expected PATH[:SCALE]')
  return scale === undefined ? { path: where(path) } : { path: where(path), scale }
}

/** The engine's load options from the model flags both commands share. */
export function loadOptions(v, env) {
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

function templateFile(flag, file) {
  try {
    return readFileSync(file, 'utf8')
  } catch (e) {
    throw new UsageError(`--${flag}: cannot read ${file} (${e.code || e.message})`)
  }
}

/**
 * `--chat-template`: one of llama.cpp's built-in names, the file it names
 * (ours before), or else the template's Jinja text (llama.cpp's meaning:
 * any text, even one without a tag, is a template). A path that does not
 * exist is an error rather than a template.
 */
export function chatTemplateOption(text) {
  if (Object.hasOwn(BUILTIN_TEMPLATES, text)) return BUILTIN_TEMPLATES[text]
  if (/\{[{%]/.test(text)) return text
  if (existsSync(text)) return templateFile('chat-template', text)
  if (/^\S+$/.test(text) && (/[\\/]/.test(text) || /\.(jinja2?|j2|txt)$/i.test(text))) throw new UsageError(`--chat-template: cannot read ${text} (ENOENT)`)
  if (/^[\w.-]+$/.test(text)) {
    throw new UsageError(`--chat-template: "${text}" is not a built-in template name (${Object.keys(BUILTIN_TEMPLATES).join(', ')})`)
  }
  return text
}

export function progressBar(stream) {
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

export const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143 }

/**
 * A command's flags read by `parse(argv)`, or how the command ends: a usage
 * error is printed on stderr with the command's usage (exit code 2), `--help`
 * prints the usage on stdout (0). Returns `{ cli }` or `{ code }`.
 */
export function parsedOrExit(parse, argv, { name, usage }) {
  let cli
  try {
    cli = parse(argv)
  } catch (e) {
    if (!(e instanceof UsageError)) throw e
    process.stderr.write(`${name}: ${e.message}\n\n${usage}`)
    return { code: 2 }
  }
  if (cli.help) {
    process.stdout.write(usage)
    return { code: 0 }
  }
  return { cli }
}

/**
 * The flags and one positional of a subcommand (`pull`, `inspect`), or the
 * exit code when they are wrong or --help was asked (`usage` written).
 */
export function parseCommand(name, argv, options, expected, usage) {
  const { stdout, stderr } = process
  let parsed
  try {
    parsed = parseArgs({ args: argv, allowPositionals: true, options: { ...options, help: { type: 'boolean', short: 'h' } } })
  } catch (e) {
    stderr.write(`llama-engine ${name}: ${e.message}\n\n${usage}`)
    return 2
  }
  if (parsed.values.help) {
    stdout.write(usage)
    return 0
  }
  if (parsed.positionals.length !== 1) {
    stderr.write(`llama-engine ${name}: expected ${expected}\n\n${usage}`)
    return 2
  }
  return parsed
}
