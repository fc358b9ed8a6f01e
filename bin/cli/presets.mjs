// `serve --models-preset FILE`: llama-server's INI presets (and ours in
// JSON). INI: a section per model, `[*]` the settings every model shares;
// each key a flag of serve's table without its dashes (`ctx-size`, `c`) or
// its environment variable (`LLAMA_ARG_CTX_SIZE`); the model by `model`
// (a path, relative to the working directory as llama-server reads it),
// `hf-repo` (with `hf-file`) or, for a section named after a model of the
// cache, that model. Preset-only keys: `load-on-startup`, `stop-timeout`,
// `dedup-cache-models` (the cache's entry of a model a preset names is left
// out of the list). A key that is not a flag is an error naming it.
import { readFileSync } from 'node:fs'
import { dirname, resolve } from 'node:path'
import { UsageError, parseTable } from './table.mjs'

const PRESET_ONLY = new Set(['load-on-startup', 'stop-timeout', 'dedup-cache-models'])
const TRUE = /^(1|true|on|yes|enabled)$/i
const FALSE = /^(0|false|off|no|disabled)$/i

/** The INI text's sections: `{ global: {key: value}, sections: [{ name, values }] }`. */
export function parseIni(text, file) {
  const global = {}
  const sections = []
  let current = global
  const lines = text.split(/\r?\n/)
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim()
    if (line === '' || line.startsWith(';') || line.startsWith('#')) continue
    const section = /^\[(.+)\]$/.exec(line)
    if (section) {
      const name = section[1].trim()
      if (name === '*') current = global
      else {
        if (sections.some((s) => s.name === name)) throw new UsageError(`--models-preset: ${file}:${i + 1}: [${name}] twice`)
        current = {}
        sections.push({ name, values: current })
      }
      continue
    }
    const kv = /^([^=]+?)\s*=\s*(.*)$/.exec(line)
    if (!kv) throw new UsageError(`--models-preset: ${file}:${i + 1}: expected [SECTION] or KEY = VALUE, got ${JSON.stringify(line)}`)
    let value = kv[2]
    if (/^"(.*)"$/.test(value) || /^'(.*)'$/.test(value)) value = value.slice(1, -1)
    current[kv[1]] = value
  }
  return { global, sections }
}

/** A section's keys as serve's argv (the table's spellings), its preset-only keys apart. */
function argvOf(values, table, where) {
  const argv = []
  const extra = {}
  for (const [key, value] of Object.entries(values)) {
    if (key === 'version' && where === '[*]') continue
    if (PRESET_ONLY.has(key)) {
      extra[key] = value
      continue
    }
    const row = table.find((r) => r.names.includes(`--${key}`) || r.names.includes(`-${key}`) || r.env === key)
    if (!row) throw new UsageError(`--models-preset: ${where}: ${key} is not an option of serve`)
    const name = row.names.find((n) => n === `--${key}` || n === `-${key}`) ?? row.names.find((n) => n.startsWith('--'))
    if (row.kind === 'bool') {
      if (TRUE.test(value)) argv.push(name)
      else if (FALSE.test(value)) {
        if (row.negations?.length) argv.push(row.negations[0])
      } else throw new UsageError(`--models-preset: ${where}: ${key}: expected true or false, got ${JSON.stringify(value)}`)
    } else argv.push(name, value)
  }
  return { argv, extra }
}

/**
 * The models of an INI preset: `[{ name, uri?, argv, loadOnStartup, dedup }]`
 * (argv: the section's flags over `[*]`'s, for serve to read as a model's
 * load options; `uri` unset for a section that names a model of the cache).
 */
export function readIniPreset(text, file, table) {
  const { global, sections } = parseIni(text, file)
  const shared = argvOf(global, table, '[*]')
  return sections.map(({ name, values }) => {
    const own = argvOf(values, table, `[${name}]`)
    const { values: v } = parseTable([...shared.argv, ...own.argv], table, {})
    const extra = { ...shared.extra, ...own.extra }
    let uri
    if (v.model !== undefined) uri = /^(hf:|https?:\/\/)/i.test(v.model[0]) ? v.model[0] : resolve(v.model[0])
    else if (v['hf-repo'] !== undefined) uri = v['hf-file'] !== undefined ? `hf:${v['hf-repo'].replace(/:[^/]*$/, '')}/${v['hf-file']}` : `hf:${v['hf-repo']}`
    const onOff = (key) => {
      if (extra[key] === undefined) return false
      if (TRUE.test(extra[key])) return true
      if (FALSE.test(extra[key])) return false
      throw new UsageError(`--models-preset: [${name}]: ${key}: expected true or false, got ${JSON.stringify(extra[key])}`)
    }
    return { name, uri, argv: [...shared.argv, ...own.argv], loadOnStartup: onOff('load-on-startup'), dedup: onOff('dedup-cache-models') }
  })
}

/** Ours: `{ ALIAS: { model, pinned?, options? } }`, paths relative to the file. */
export function readJsonPreset(preset, file) {
  if (preset === null || typeof preset !== 'object' || Array.isArray(preset)) throw new UsageError('--models-preset: expected a JSON object of ALIAS: { model, pinned?, options? }')
  const base = dirname(resolve(file))
  const out = []
  for (const [name, m] of Object.entries(preset)) {
    if (m === null || typeof m !== 'object' || typeof m.model !== 'string' || m.model === '') throw new UsageError(`--models-preset: ${name}: expected { "model": PATH|URI, … }`)
    if (m.options != null && (typeof m.options !== 'object' || Array.isArray(m.options))) throw new UsageError(`--models-preset: ${name}.options: expected an object of EngineOptions`)
    const uri = /^(hf:|https?:\/\/)/i.test(m.model) ? m.model : resolve(base, m.model)
    out.push({ name, uri, pinned: m.pinned === true, ...(m.options ? { options: m.options } : {}) })
  }
  return out
}

/** The preset file: JSON (ours) when it parses as JSON, else llama-server's INI. */
export function readPresetFile(file, table) {
  let text
  try {
    text = readFileSync(file, 'utf8')
  } catch (e) {
    throw new UsageError(`--models-preset: cannot read ${file} (${e.code || e.message})`)
  }
  let json
  try {
    json = JSON.parse(text)
  } catch {
    return { kind: 'ini', models: readIniPreset(text, file, table) }
  }
  return { kind: 'json', models: readJsonPreset(json, file) }
}
