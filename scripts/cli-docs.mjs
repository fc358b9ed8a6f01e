// Writes `serve`'s flags table in docs/server.md from the options table
// (bin/cli/serve-options.mjs), between its markers; `--check` only says
// whether the docs match (docs.test.js runs it).
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { SERVE_GROUPS, SERVE_TABLE } from '../bin/cli/serve-options.mjs'
import { markdownTable } from '../bin/cli/table.mjs'
import { root } from './native.mjs'

const START = '<!-- serve-flags: written by scripts/cli-docs.mjs from bin/cli/serve-options.mjs -->'
const END = '<!-- /serve-flags -->'

export function serveFlagsDoc() {
  const file = join(root, 'docs', 'server.md')
  const text = readFileSync(file, 'utf8')
  const a = text.indexOf(START)
  const b = text.indexOf(END)
  if (a < 0 || b < a) throw new Error(`docs/server.md: the markers ${START} … ${END} are missing`)
  const want = `${text.slice(0, a + START.length)}\n\n${markdownTable(SERVE_TABLE, SERVE_GROUPS)}\n${text.slice(b)}`
  return { file, text, want }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { file, text, want } = serveFlagsDoc()
  if (process.argv.includes('--check')) {
    if (text !== want) {
      console.error('docs/server.md: the serve flags table differs from bin/cli/serve-options.mjs; run node scripts/cli-docs.mjs')
      process.exit(1)
    }
  } else if (text !== want) writeFileSync(file, want)
}
