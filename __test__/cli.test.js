const path = require('node:path')
const { spawn } = require('node:child_process')
const { TARGET } = require('./helpers')

const CLI = path.join(__dirname, '..', 'bin', 'llama-engine.mjs')
const BASE = ['--model', TARGET, '--ctx-size', '1024', '--threads', '2', '--temperature', '0']

/** Runs the CLI to its end; resolves with { code, signal, stdout, stderr }. */
function cli(args, { input, onStdout } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { stdio: ['pipe', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.setEncoding('utf8')
    child.stderr.setEncoding('utf8')
    child.stdout.on('data', (d) => {
      stdout += d
      if (onStdout) onStdout(child, d)
    })
    child.stderr.on('data', (d) => (stderr += d))
    child.on('error', reject)
    child.on('close', (code, signal) => resolve({ code, signal, stdout, stderr }))
    if (input !== undefined) child.stdin.end(input)
    else child.stdin.end()
  })
}

const parseLines = (stdout) =>
  stdout
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l))

describe('llama-engine CLI', () => {
  test('--prompt streams the completion to stdout and a summary to stderr', async () => {
    const args = [...BASE, '--n_predict', '24', '--prompt', 'The capital of France is']
    const plain = await cli(args)
    expect(plain.code).toBe(0)
    expect(plain.stdout.length).toBeGreaterThan(0)
    expect(plain.stderr).toMatch(/24 tokens/)
    expect(plain.stderr).toMatch(/tokens\/s/)
    expect(plain.stderr).toMatch(/target passes/)
    expect(plain.stderr).toMatch(/stopped: n_predict limit/)
    // Greedy and exact: stdout is the completion's content, nothing else.
    const json = await cli([...args, '--json'])
    const done = parseLines(json.stdout).pop()
    expect(done.type).toBe('done')
    expect(plain.stdout).toBe(done.content)
  })

  test('reads the prompt from stdin when there is no --prompt, and --chat wraps it', async () => {
    const r = await cli([...BASE, '--n_predict', '16', '--chat', '--json'], { input: 'Name a colour.' })
    expect(r.code).toBe(0)
    const done = parseLines(r.stdout).pop()
    expect(done.type).toBe('done')
    expect(done.tokens_predicted).toBeGreaterThan(0)
    // The ChatML wrapping: user turn + assistant header, well over the 4 words typed.
    expect(done.tokens_evaluated).toBeGreaterThan(8)
  })

  test('--json prints one JSON event per line, the last is done, contents add up', async () => {
    const r = await cli([...BASE, '--n_predict', '32', '--spec', 'ngram', '--stop', 'zzz', '--seed', '-1', '--json', '--prompt', 'One, two, three, four,'])
    expect(r.code).toBe(0)
    const events = parseLines(r.stdout)
    expect(events.length).toBeGreaterThan(1)
    const done = events.pop()
    expect(done.type).toBe('done')
    expect(events.every((e) => e.type === 'token')).toBe(true)
    expect(events.map((e) => e.content).join('')).toBe(done.content)
    expect(done.generation_settings.speculative.mode).toBe('ngram')
    expect(done.generation_settings.stop).toEqual(['zzz'])
    // The summary goes to stderr, stdout stays JSON.
    expect(r.stderr).toMatch(/stopped:/)
  })

  test('an unknown flag exits 2 with the usage on stderr', async () => {
    const r = await cli(['--warp-speed', '--prompt', 'x'])
    expect(r.code).toBe(2)
    expect(r.stdout).toBe('')
    expect(r.stderr).toMatch(/--warp-speed/)
    expect(r.stderr).toMatch(/Usage: llama-engine/)
  })

  test('a bad --spec value exits 2 with the usage on stderr', async () => {
    const r = await cli(['--spec', 'warp', '--prompt', 'x'])
    expect(r.code).toBe(2)
    expect(r.stderr).toMatch(/--spec/)
    expect(r.stderr).toMatch(/Usage: llama-engine/)
  })

  test('a non-numeric number exits 2', async () => {
    const r = await cli(['--top_k', 'many', '--prompt', 'x'])
    expect(r.code).toBe(2)
    expect(r.stderr).toMatch(/--top_k/)
  })

  test('a missing model exits 1 with MODEL_LOAD_FAILED', async () => {
    const missing = path.join(__dirname, 'no-such-model.gguf')
    const r = await cli(['--model', missing, '--prompt', 'x'])
    expect(r.code).toBe(1)
    expect(r.stderr).toMatch(/^error MODEL_LOAD_FAILED: /m)
    expect(r.stderr).toContain('no-such-model.gguf')
  })

  test('an invalid request value exits 1 with INVALID_REQUEST naming the field', async () => {
    const r = await cli([...BASE, '--top_p', '5', '--prompt', 'x'])
    expect(r.code).toBe(1)
    expect(r.stderr).toMatch(/^error INVALID_REQUEST: top_p/m)
  })

  test('SIGINT mid-generation aborts, prints the summary and exits 130', async () => {
    let sent = false
    const r = await cli([...BASE, '--n_predict', '2000', '--ignore_eos', '--prompt', 'Once upon a time'], {
      onStdout: (child) => {
        if (!sent) {
          sent = true
          child.kill('SIGINT')
        }
      },
    })
    expect(sent).toBe(true)
    expect(r.code).toBe(130)
    expect(r.stderr).toMatch(/stopped: aborted/)
    const n = Number(/(\d+) tokens in/.exec(r.stderr)[1])
    expect(n).toBeGreaterThan(0)
    expect(n).toBeLessThan(2000)
  })
})
