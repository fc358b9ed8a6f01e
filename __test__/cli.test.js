const path = require('node:path')
const { spawn } = require('node:child_process')
const { TARGET, user, loadTarget } = require('./helpers')

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

  test("reads the prompt from stdin when there is no --prompt; --chat and --system render it with the model's template", async () => {
    const engine = await loadTarget({ contextSize: 1024 })
    const rendered = (messages) => engine.tokenize(engine.applyChatTemplate(messages), { special: true }).length
    try {
      const r = await cli([...BASE, '--n_predict', '16', '--chat', '--json'], { input: 'Name a colour.' })
      expect(r.code).toBe(0)
      const done = parseLines(r.stdout).pop()
      expect(done.type).toBe('done')
      expect(done.tokens_predicted).toBeGreaterThan(0)
      expect(done.tokens_evaluated).toBe(rendered(user('Name a colour.')))
      const s = await cli([...BASE, '--n_predict', '4', '--system', 'Be terse.', '--json', '--prompt', 'Name a colour.'])
      expect(parseLines(s.stdout).pop().tokens_evaluated).toBe(rendered([{ role: 'system', content: 'Be terse.' }, ...user('Name a colour.')]))
    } finally {
      await engine.dispose()
    }
  })

  test('--interactive holds a conversation: each turn reuses the cached history; end of input quits', async () => {
    const r = await cli([...BASE, '--interactive', '--system', 'Answer in one short sentence.', '--spec', 'off'], {
      input: 'What is the capital of France?\nAnd of Italy?\n',
    })
    expect(r.code).toBe(0)
    expect(r.stdout).toMatch(/Paris[\s\S]*Rome/)
    const turns = [...r.stderr.matchAll(/prompt (\d+) tokens, (\d+) from cache/g)].map((m) => [Number(m[1]), Number(m[2])])
    expect(turns).toHaveLength(2)
    expect(turns[0][1]).toBe(0)
    // The second turn evaluates only its new message: the first turn, answer included, is cached.
    const firstAnswer = Number(/^\[(\d+) tokens/m.exec(r.stderr)[1])
    expect(turns[1][1]).toBeGreaterThanOrEqual(turns[0][0] + firstAnswer - 1)
    expect(r.stderr).toMatch(/2 turns/)
    const bad = await cli(['--interactive', '--prompt', 'x'])
    expect(bad.code).toBe(2)
  })

  test('--interactive on a terminal: Ctrl-C stops the answer, the conversation goes on, Ctrl-D quits', async () => {
    // `script` gives the CLI a real pseudo-terminal (readline in raw mode, keys as bytes).
    const cmd = [process.execPath, CLI, ...BASE, '--interactive', '--n_predict', '2000', '--ignore_eos'].map((a) => `'${a}'`).join(' ')
    const child = spawn('script', ['-qfec', cmd, '/dev/null'], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, TERM: 'dumb' } })
    let out = ''
    child.stdout.setEncoding('utf8')
    child.stdout.on('data', (d) => (out += d))
    const waitFor = async (re, from = 0) => {
      for (let i = 0; i < 600 && !re.test(out.slice(from)); i++) await new Promise((r) => setTimeout(r, 50))
      return re.test(out.slice(from))
    }
    const exited = new Promise((resolve) => child.on('close', resolve))
    try {
      expect(await waitFor(/> /)).toBe(true)
      child.stdin.write('Tell me a long story.\r')
      const mark = out.length
      expect(await waitFor(/\w{3,}/, mark + 40)).toBe(true) // the answer is being written
      child.stdin.write('\x03') // Ctrl-C: stop this answer only
      expect(await waitFor(/from cache; .*stopped\]/)).toBe(true)
      child.stdin.write('\x03') // Ctrl-C at the prompt: a hint, nothing else
      expect(await waitFor(/Ctrl-D to quit/)).toBe(true)
      child.stdin.write('\x04') // Ctrl-D: leave
      expect(await exited).toBe(0)
      expect(out).toMatch(/1 turn\b/)
    } finally {
      child.kill()
    }
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
