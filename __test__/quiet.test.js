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
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } } }]
  await attempt('tools', () => engine.complete({ ...base, messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools, tool_choice: 'required' }))
  await attempt('response_format', () => engine.complete({ ...base, messages: [{ role: 'user', content: 'JSON' }], response_format: { type: 'json_object' } }))
  await attempt('bad tool schema', () => engine.complete({ ...base, messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'strin' } } } } }] }))
  await attempt('panic', () => engine.complete({ ...base, prompt: '__llama_engine_panic__' }))
  await attempt('n-gram cache', () => engine.saveNgramCache(${JSON.stringify(path.join(os.tmpdir(), `quiet-${process.pid}.lcd`))}))
  await engine.dispose()
  process.stdout.write(JSON.stringify(outcomes))
})().catch((e) => { process.stdout.write(JSON.stringify({ failed: String(e && e.stack || e) })) })
`

test('nothing reaches stdout or stderr but what the host writes: load, requests, tools, bad grammars and schemas, a panic, dispose', () => {
  const env = { ...process.env, LLAMA_ENGINE_FAULT_INJECTION: '1' }
  delete env.LLAMA_ENGINE_LOG // the debug option that lets llama.cpp's log through
  const child = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000, env })
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
  expect(byName.tools.code).toBe('ok')
  expect(byName.response_format.code).toBe('ok')
  expect(byName['bad tool schema']).toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^tools\[0\]\.function\.parameters\.properties\.a: cannot be compiled/) })
  // A panic on the engine thread is an INTERNAL rejection with its message, and prints nothing.
  expect(byName.panic).toMatchObject({ code: 'INTERNAL', message: expect.stringContaining('fault injected') })
  expect(stderr).toBe('')
})
