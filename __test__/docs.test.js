// The README's API reference is checked against index.d.ts and the runtime
// class, so the three cannot drift apart silently.
const fs = require('node:fs')
const path = require('node:path')
const { LlamaEngine } = require('..')

const root = path.join(__dirname, '..')
const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8')
const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8')

function declaredMembers() {
  const body = dts.slice(dts.indexOf('export declare class LlamaEngine'))
  const cls = body.slice(0, body.indexOf('\n}\n'))
  return [...cls.matchAll(/^\s+(static\s+)?(\w+)\(/gm)].map((m) => ({ name: m[2], isStatic: Boolean(m[1]) })).filter((m) => m.name !== 'constructor')
}

function requestFields() {
  const body = dts.slice(dts.indexOf('export interface CompletionRequest'))
  const iface = body.slice(0, body.indexOf('\n}\n'))
  return [...iface.matchAll(/^\s+(\w+)\??:/gm)].map((m) => m[1])
}

test('every LlamaEngine member in index.d.ts exists and is in the README API table', () => {
  const members = declaredMembers()
  expect(members.map((m) => m.name)).toEqual(
    expect.arrayContaining(['load', 'tokenize', 'detokenize', 'complete', 'stream', 'cancel', 'status', 'saveNgramCache', 'dispose']),
  )
  for (const { name, isStatic } of members) {
    const target = isStatic ? LlamaEngine : LlamaEngine.prototype
    expect({ name, type: typeof target[name] }).toEqual({ name, type: 'function' })
    const row = isStatic ? `| \`LlamaEngine.${name}(` : `| \`${name}(`
    expect({ name, documented: readme.includes(row) }).toEqual({ name, documented: true })
  }
})

test('every request field in index.d.ts is in the README request table', () => {
  for (const field of requestFields()) {
    expect({ field, documented: readme.includes(`\`${field}\``) }).toEqual({ field, documented: true })
  }
})
