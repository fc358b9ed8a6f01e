// Command-line options from one table, as llama.cpp's common/arg.cpp keeps
// them: each option once, with every spelling (ours and llama-server's),
// its environment variable, the kind of value it takes, its default and
// help. parseTable() reads argv (and the environment) by the table;
// helpText() and markdownTable() write --help and the docs from it.

export class UsageError extends Error {}

/**
 * One option:
 *   key        the name the parsed values use (the long spelling without --)
 *   names      every spelling: ours first, then llama-server's (`-ub`, `--ubatch-size`)
 *   negations  spellings that turn a boolean off (`--no-slots`)
 *   kind       'bool' | 'string' | 'int' | 'float' | 'choice'
 *   arg        what the value is called in the help (N, PATH…)
 *   choices    for 'choice'
 *   optional   a value the option takes when none follows (`-fa` alone means `-fa on`)
 *   multiple   repeats collect into an array
 *   env        the environment variable read when the flag is absent
 *   def        the default, as the help says it
 *   help       one line (or a few) of help
 *   group      the help's section
 *   accepted   the option is llama-server's and changes nothing here: the help says why
 *   missing    the option is llama-server's and this server lacks the feature: an error saying so
 * @typedef {object} OptionRow
 */

const isFlag = (a) => typeof a === 'string' && a.startsWith('-') && a.length > 1 && !/^-\d|^-\.\d/.test(a)

/** A boolean from an environment variable's text (llama.cpp's: 1, true, on, enabled; 0, false, off, disabled). */
function envBool(name, text) {
  const t = String(text).trim().toLowerCase()
  if (['1', 'true', 'on', 'enabled', 'yes'].includes(t)) return true
  if (['0', 'false', 'off', 'disabled', 'no'].includes(t)) return false
  throw new UsageError(`${name}: expected true or false, got ${JSON.stringify(text)}`)
}

/**
 * Reads `argv` by `table`: `{ values, given }`, values keyed by each
 * option's key (strings as typed; booleans true/false; arrays for
 * `multiple`), `given` the spelling each came from (for messages).
 * Flags may be `--name value`, `--name=value` or `-short value`; a value
 * may start with a dash (`--seed -1`). Environment variables fill what the
 * command line leaves out.
 */
export function parseTable(argv, table, env = {}) {
  const byName = new Map()
  for (const row of table) {
    for (const n of row.names) byName.set(n, { row, on: true })
    for (const n of row.negations ?? []) byName.set(n, { row, on: false })
  }
  const values = {}
  const given = {}
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i]
    if (!isFlag(arg)) throw new UsageError(`unexpected argument ${JSON.stringify(arg)}`)
    let inline
    const eq = arg.indexOf('=')
    if (arg.startsWith('--') && eq > 0) {
      inline = arg.slice(eq + 1)
      arg = arg.slice(0, eq)
    }
    const hit = byName.get(arg)
    if (!hit) throw new UsageError(`unknown option ${arg}`)
    const { row, on } = hit
    if (row.missing) throw new UsageError(`${arg}: ${row.missing}`)
    given[row.key] = arg
    if (row.kind === 'bool') {
      if (inline !== undefined) throw new UsageError(`${arg}: takes no value`)
      values[row.key] = on
      continue
    }
    let value = inline
    if (value === undefined) {
      const next = argv[i + 1]
      if (row.optional !== undefined) {
        if (next !== undefined && !isFlag(next) && (!row.choices || row.choices.includes(next))) value = argv[++i]
        else value = row.optional
      } else {
        if (next === undefined) throw new UsageError(`${arg}: expected ${row.arg ?? 'a value'}`)
        value = argv[++i]
      }
    }
    if (row.kind === 'choice' && !row.choices.includes(value)) {
      throw new UsageError(`${arg}: expected one of ${row.choices.join(', ')}, got ${JSON.stringify(value)}`)
    }
    if (row.multiple) (values[row.key] ??= []).push(value)
    else values[row.key] = value
  }
  for (const row of table) {
    if (values[row.key] !== undefined || !row.env) continue
    for (const name of [].concat(row.env)) {
      const text = env[name]
      if (text === undefined || text === '') continue
      if (row.missing) throw new UsageError(`${name}: ${row.missing}`)
      given[row.key] = name
      if (row.kind === 'bool') values[row.key] = envBool(name, text)
      else if (row.kind === 'choice' && !row.choices.includes(text)) throw new UsageError(`${name}: expected one of ${row.choices.join(', ')}, got ${JSON.stringify(text)}`)
      else values[row.key] = row.multiple ? [text] : text
      break
    }
  }
  return { values, given }
}

/** A number from an option's text (`kind` int or float), or a UsageError naming the option. */
export function numberOf(flag, text, kind = 'float') {
  const value = typeof text === 'string' && text.trim() !== '' ? Number(text) : typeof text === 'number' ? text : NaN
  if (!Number.isFinite(value)) throw new UsageError(`${flag}: expected a number, got ${JSON.stringify(text)}`)
  if (kind === 'int' && !Number.isInteger(value)) throw new UsageError(`${flag}: expected an integer, got ${JSON.stringify(text)}`)
  return value
}

/** The left column of an option: its spellings and its value. */
function spelling(row) {
  const names = [...row.names, ...(row.negations ?? [])].join(', ')
  const arg = row.kind === 'bool' ? '' : ` ${row.optional !== undefined ? `[${row.arg}]` : row.arg ?? 'X'}`
  return `${names}${arg}`
}

/** The help of one option, with its default and environment variable. */
function describe(row) {
  let text = row.help
  if (row.accepted) text += ` (llama-server's; ${row.accepted})`
  if (row.def !== undefined) text += ` (default: ${row.def})`
  if (row.env) text += ` (env: ${[].concat(row.env).join(', ')})`
  return text
}

/** `--help`'s sections, each option's spellings and help wrapped to 100 columns. */
export function helpText(table, groups) {
  const out = []
  for (const group of groups) {
    const rows = table.filter((r) => r.group === group && !r.missing)
    if (rows.length === 0) continue
    out.push(`${group}:`)
    for (const row of rows) {
      const left = `  ${spelling(row)}`
      const words = describe(row).split(/\s+/)
      const lines = []
      let line = ''
      for (const w of words) {
        if (line && line.length + 1 + w.length > 66) {
          lines.push(line)
          line = w
        } else line = line ? `${line} ${w}` : w
      }
      if (line) lines.push(line)
      if (left.length <= 32) {
        out.push(`${left.padEnd(34)}${lines[0]}`)
        for (const l of lines.slice(1)) out.push(`${' '.repeat(34)}${l}`)
      } else {
        out.push(left)
        for (const l of lines) out.push(`${' '.repeat(34)}${l}`)
      }
    }
    out.push('')
  }
  return out.join('\n')
}

/** The table as Markdown (docs): spellings, environment variable, what it does. */
export function markdownTable(table, groups) {
  const esc = (s) => s.replace(/\|/g, '\\|')
  const lines = []
  for (const group of groups) {
    const rows = table.filter((r) => r.group === group)
    if (rows.length === 0) continue
    lines.push(`**${group}**`, '', '| flag | env | what it does |', '|---|---|---|')
    for (const row of rows) {
      const flag = esc(spelling(row))
        .split(', ')
        .map((s) => `\`${s}\``)
        .join(', ')
      const env = row.env ? [].concat(row.env).map((e) => `\`${e}\``).join(', ') : ''
      let what = row.missing ? `**not supported**: ${row.missing}` : row.help
      if (row.accepted) what += ` — accepted, changes nothing here: ${row.accepted}`
      if (row.def !== undefined && !row.missing) what += ` (default: ${row.def})`
      lines.push(`| ${flag} | ${env} | ${esc(what)} |`)
    }
    lines.push('')
  }
  return lines.join('\n')
}
