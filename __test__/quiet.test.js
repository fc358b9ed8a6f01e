// The addon prints nothing the host did not ask for: no llama.cpp or ggml
// text on stdout or stderr while loading, serving requests (good and bad)
// and disposing. Run in a child process so its real file descriptors are
// captured, not just what Node's console writes.
const { spawnSync } = require('node:child_process')
const os = require('node:os')
const path = require('node:path')
const { TARGET, DRAFT } = require('./helpers')

const script = `
const { LlamaEngine } = require(${JSON.stringify(path.join(__dirname, '..'))})
const outcomes = []
async function attempt(name, fn) {
  try {
    await fn()
    outcomes.push([name, 'ok'])
  } catch (e) {
    outcomes.push([name, e.code, e.message])
  }
}
;(async () => {
  const engine = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, draftModelPath: ${JSON.stringify(DRAFT)}, contextSize: 512, threads: 2, parallel: 2 })
  const base = { n_predict: 8, temperature: 0 }
  await attempt('prompt', () => engine.complete({ ...base, prompt: 'Hello' }))
  await attempt('chat', () => engine.complete({ ...base, messages: [{ role: 'user', content: 'Hi' }] }))
  await attempt('grammar', () => engine.complete({ ...base, prompt: 'Yes or no?', grammar: 'root ::= "yes" | "no"' }))
  await attempt('json_schema', () => engine.complete({ ...base, prompt: 'JSON:', json_schema: { type: 'object', properties: { a: { type: 'integer' } } } }))
  await attempt('bad grammar syntax', () => engine.complete({ ...base, prompt: 'x', grammar: 'root ::= "unterminated' }))
  await attempt('undefined rule', () => engine.complete({ ...base, prompt: 'x', grammar: 'root ::= missing' }))
  await attempt('left recursion', () => engine.complete({ ...base, prompt: 'x', grammar: 'root ::= root "a" | "b"' }))
  await attempt('no root', () => engine.complete({ ...base, prompt: 'x', grammar: 'start ::= "a"' }))
  await attempt('unknown token', () => engine.complete({ ...base, prompt: 'x', grammar: 'root ::= <|no-such-token|>' }))
  await attempt('bad json_schema', () => engine.complete({ ...base, prompt: 'x', json_schema: { type: 'object', properties: { a: { $ref: '#/nowhere' } } } }))
  await attempt('bad template', () => LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, chatTemplate: '{% if %}' }))
  await attempt('missing model', () => LlamaEngine.load({ modelPath: '/nonexistent.gguf' }))
  await attempt('n-gram cache', () => engine.saveNgramCache(${JSON.stringify(path.join(os.tmpdir(), `quiet-${process.pid}.lcd`))}))
  await engine.dispose()
  process.stdout.write(JSON.stringify(outcomes))
})().catch((e) => { process.stdout.write(JSON.stringify({ failed: String(e && e.stack || e) })) })
`

test('nothing reaches stdout or stderr but what the host writes: load, requests, bad grammars and schemas, dispose', () => {
  const child = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000 })
  const { stdout, stderr } = child
  expect({ status: child.status, stdoutStart: stdout.slice(0, 2) }).toEqual({ status: 0, stdoutStart: '[[' })
  const outcomes = JSON.parse(stdout)
  const byName = Object.fromEntries(outcomes.map(([name, code, message]) => [name, { code, message }]))
  expect(byName.prompt.code).toBe('ok')
  expect(byName.chat.code).toBe('ok')
  expect(byName.grammar.code).toBe('ok')
  expect(byName.json_schema.code).toBe('ok')
  // Bad grammars are rejected with their reason (and where) in the message.
  expect(byName['bad grammar syntax']).toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^grammar: line 1, column \d+: unexpected end of input/) })
  expect(byName['undefined rule']).toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('undefined rule: missing') })
  expect(byName['left recursion']).toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('left recursion') })
  expect(byName['no root']).toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('root') })
  expect(byName['unknown token']).toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringContaining('not a token of this model') })
  expect(byName['bad json_schema'].code).toBe('INVALID_REQUEST')
  expect(byName['bad template'].code).toBe('INVALID_REQUEST')
  expect(byName['missing model'].code).toBe('MODEL_LOAD_FAILED')
  expect(byName['n-gram cache'].code).toBe('ok')
  expect(stderr).toBe('')
})
