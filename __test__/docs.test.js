// The engine's own lists — request fields and error codes, exported by the
// addon — are checked against index.d.ts and the API reference
// (docs/api.md), and its member table against the runtime class, so none of
// them can drift apart.
const fs = require('node:fs')
const path = require('node:path')
const { LlamaEngine, requestFields, errorCodes, drafters } = require('..')
const { loadNative } = require('../lib/addon/loader.js')

const root = path.join(__dirname, '..')
const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8')
const bindingDts = fs.readFileSync(path.join(root, 'binding.d.ts'), 'utf8')
// The API reference (docs/api.md; the README sums it up and links to it).
const reference = fs.readFileSync(path.join(root, 'docs', 'api.md'), 'utf8')

/** The body of `export interface NAME { … }` in index.d.ts. */
function iface(name) {
  const body = dts.slice(dts.indexOf(`export interface ${name} `))
  return body.slice(0, body.indexOf('\n}\n'))
}

const members = (body) => [...body.matchAll(/^\s{2}(\w+)\??:/gm)].map((m) => m[1])

function declaredMethods() {
  const body = dts.slice(dts.indexOf('export declare class LlamaEngine'))
  const cls = body.slice(0, body.indexOf('\n}\n'))
  return [...cls.matchAll(/^\s+(static\s+)?(\w+)\(/gm)].map((m) => ({ name: m[2], isStatic: Boolean(m[1]) })).filter((m) => m.name !== 'constructor')
}

/** The rows of the reference's table that follows `heading`: first-column cells. */
function tableAfter(heading) {
  const at = reference.indexOf(heading)
  expect(at).toBeGreaterThanOrEqual(0)
  const lines = reference.slice(at).split('\n').slice(1)
  const start = lines.findIndex((l) => l.startsWith('|'))
  const rows = []
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break
    rows.push(line.split('|')[1].trim())
  }
  return rows
}

/** Field names in a first-column cell such as "`top_k`, `top_p`". */
const namesIn = (cells) => cells.flatMap((c) => [...c.matchAll(/`(\w+)`/g)].map((m) => m[1]))

test('every LlamaEngine member in index.d.ts exists and is in the API reference', () => {
  const methods = declaredMethods()
  expect(methods.map((m) => m.name)).toEqual(
    expect.arrayContaining(['load', 'tokenize', 'detokenize', 'complete', 'stream', 'cancel', 'status', 'saveNgramCache', 'dispose']),
  )
  for (const { name, isStatic } of methods) {
    const target = isStatic ? LlamaEngine : LlamaEngine.prototype
    expect({ name, type: typeof target[name] }).toEqual({ name, type: 'function' })
    const row = isStatic ? `| \`LlamaEngine.${name}(` : `| \`${name}(`
    expect({ name, documented: reference.includes(row) }).toEqual({ name, documented: true })
  }
})

test('the request fields of index.d.ts and of the reference’s tables are the engine’s own list', () => {
  const engine = requestFields.map((f) => f.name).sort()
  expect(members(iface('CompletionRequest')).sort()).toEqual(engine)
  expect(namesIn(tableAfter('## Request fields')).sort()).toEqual(engine)
  const spec = requestFields.find((f) => f.name === 'speculative').fields.map((f) => f.name).sort()
  expect(members(iface('SpeculativeOptions')).sort()).toEqual(spec)
  expect(namesIn(tableAfter('## `speculative`')).sort()).toEqual(spec)
})

test('every field has a documented kind, and ranges where it is a number', () => {
  for (const f of requestFields) {
    expect(typeof f.doc).toBe('string')
    expect(['int', 'float', 'bool', 'string', 'choice', 'object', 'other']).toContain(f.kind)
    if (f.kind === 'int') expect(Number.isInteger(f.min) && Number.isInteger(f.max)).toBe(true)
  }
  const mode = requestFields.find((f) => f.name === 'speculative').fields.find((f) => f.name === 'mode')
  expect(dts).toContain(`export type SpeculativeMode = ${mode.choices.map((c) => `'${c}'`).join(' | ')}`)
})

test('the token sources and speculative modes of index.d.ts are the drafter table’s', () => {
  const union = /export type TokenSource = ([^\n]+)/.exec(dts)[1]
  expect([...union.matchAll(/'([\w+]+)'/g)].map((m) => m[1])).toEqual(['target', ...drafters.map((d) => d.name)])
  const named = drafters.filter((d) => d.runs === 'named').map((d) => d.name)
  const mode = requestFields.find((f) => f.name === 'speculative').fields.find((f) => f.name === 'mode')
  for (const name of named) expect(mode.choices).toContain(name)
  expect(mode.choices).toContain(named.join('+'))
  for (const d of drafters) expect(Object.keys(d).sort()).toEqual(members(iface('Drafter')).sort())
})

// Members index.js adds to what the addon emits, each with its reason.
const ADDED_IN_JS = {
  TokenEvent: ['type'], // 'token', beside the 'done' event of stream()
  ProgressEvent: ['type'], // 'progress'
  EngineStatus: ['addon', 'isolation'], // which addon file; the engine's process
}

test('the result and event interfaces of index.d.ts are the shapes the Rust side emits', () => {
  const { binding } = loadNative()
  const shapes = binding.wireShapes()
  expect(Object.keys(shapes).length).toBeGreaterThanOrEqual(8)
  for (const [name, keys] of Object.entries(shapes)) {
    expect({ name, members: members(iface(name)).sort() }).toEqual({ name, members: [...keys, ...(ADDED_IN_JS[name] || [])].sort() })
  }
})

test('EngineStatus of index.d.ts is what status() returns', async () => {
  const engine = await LlamaEngine.load({ modelPath: path.join(root, 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf'), contextSize: 256, parallel: 1 })
  try {
    const status = engine.status()
    const body = iface('EngineStatus')
    const declared = members(body)
    const required = [...body.matchAll(/^\s{2}(\w+):/gm)].map((m) => m[1])
    for (const key of Object.keys(status)) expect({ key, declared: declared.includes(key) }).toEqual({ key, declared: true })
    for (const key of required) expect({ key, emitted: key in status }).toEqual({ key, emitted: true })
  } finally {
    await engine.dispose()
  }
})

test('the error codes of index.d.ts and of the reference’s table are the engine’s own list', () => {
  const union = /export type ErrorCode = ([^\n]+)/.exec(dts)[1]
  expect([...union.matchAll(/'(\w+)'/g)].map((m) => m[1])).toEqual([...errorCodes])
  expect(namesIn(tableAfter('## Errors'))).toEqual([...errorCodes])
})

test('binding.d.ts declares everything the native addon exports', () => {
  const { binding } = loadNative()
  for (const name of Object.keys(binding)) {
    expect({ name, declared: new RegExp(`export declare (class|function|const) ${name}\\b`).test(bindingDts) }).toEqual({ name, declared: true })
  }
  for (const name of Object.getOwnPropertyNames(binding.NativeEngine.prototype).filter((n) => n !== 'constructor')) {
    expect({ name, declared: new RegExp(`^\\s+${name}\\(`, 'm').test(bindingDts) }).toEqual({ name, declared: true })
  }
})

test("serve's flags table in docs/server.md is the options table's (scripts/cli-docs.mjs)", () => {
  const { execFileSync } = require('node:child_process')
  // Throws (exit 1, saying what to run) when they differ.
  execFileSync(process.execPath, [path.join(root, 'scripts', 'cli-docs.mjs'), '--check'], { stdio: 'pipe' })
})
