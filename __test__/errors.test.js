const { run, loadTarget } = require('./helpers')

let engine
beforeAll(async () => {
  engine = await loadTarget()
})
afterAll(() => engine.dispose())

const MALFORMED = [
  [{}, 'prompt'],
  [{ prompt: 42 }, 'prompt'],
  [{ prompt: [[1, 2]] }, 'prompt'],
  [{ prompt: ['ok', -1] }, 'prompt[1]'],
  [{ prompt: [10_000_000] }, 'prompt[0]'],
  [{ prompt: 'x', n_predict: 'ten' }, 'n_predict'],
  [{ prompt: 'x', n_predict: -2 }, 'n_predict'],
  [{ prompt: 'x', n_predict: 1.5 }, 'n_predict'],
  [{ prompt: 'x', temperature: NaN }, 'temperature'],
  [{ prompt: 'x', temperature: Infinity }, 'temperature'],
  [{ prompt: 'x', top_p: 1.5 }, 'top_p'],
  [{ prompt: 'x', min_p: -0.1 }, 'min_p'],
  [{ prompt: 'x', mirostat: 3 }, 'mirostat'],
  [{ prompt: 'x', stop: [1, 2] }, 'stop'],
  [{ prompt: 'x', logit_bias: [[999999999, 1]] }, 'logit_bias'],
  [{ prompt: 'x', logit_bias: [[1, true]] }, 'logit_bias'],
  [{ prompt: 'x', n_probs: -1 }, 'n_probs'],
  [{ prompt: 'x', seed: 'abc' }, 'seed'],
  [{ prompt: 'x', ignore_eos: 'yes' }, 'ignore_eos'],
  [{ prompt: 'x', speculative: { mode: 'warp' } }, 'speculative.mode'],
  [{ prompt: 'x', speculative: { n_max: -3 } }, 'speculative.n_max'],
  [{ prompt: 'x', speculative: 'fast' }, 'speculative'],
  [{ prompt: 'x', grammar: 'root ::= "a"', json_schema: { type: 'string' } }, 'json_schema'],
  [{ prompt: 'x', n_keep: -5 }, 'n_keep'],
  [{ prompt: 'x', repeat_last_n: -7 }, 'repeat_last_n'],
  [{ prompt: 'x', cache_prompt: 1 }, 'cache_prompt'],
  [{ prompt: 'x', grammar: 'root ::= nothing-defined' }, 'grammar'],
  [{ prompt: 'x', json_schema: '{not json' }, 'json_schema'],
  [{ prompt: 'x', top_k: 10n }, 'top_k'],
  ['{"prompt": "unterminated', 'request'],
]

describe('malformed requests', () => {
  test.each(MALFORMED)('%j is rejected with INVALID_REQUEST naming %s', async (request, field) => {
    const events = []
    await expect(engine.complete(request, (e) => events.push(e))).rejects.toMatchObject({
      code: 'INVALID_REQUEST',
      message: expect.stringMatching(new RegExp(`^${field.replace(/[[\].]/g, '\\$&')}`)),
    })
    expect(events).toEqual([])
  })

  test('non-object requests and bad callbacks are rejected', async () => {
    for (const bad of [null, 42, [1, 2], true]) {
      await expect(engine.complete(bad)).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
    }
    await expect(engine.complete({ prompt: 'x' }, 'not a function')).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
    await expect(engine.complete({ prompt: 'x' }, null, { aborted: 'nope' })).rejects.toMatchObject({ code: 'INVALID_REQUEST' })
  })

  test('unknown fields are ignored', async () => {
    const { result } = await run(engine, { prompt: 'Hi', n_predict: 2, temperature: 0, tfs_z: 1, stream: true, whatever: { a: 1 } })
    expect(result.tokens_predicted).toBe(2)
  })

  test('the engine still works after all of them', async () => {
    const { result } = await run(engine, { prompt: 'The capital of France is', n_predict: 4, temperature: 0 })
    expect(result.tokens_predicted).toBe(4)
    expect(engine.status()).toMatchObject({ queued: 0, busy: false })
  })
})

describe('a throwing onEvent', () => {
  test('rejects that request only, with the thrown error', async () => {
    const boom = new Error('boom')
    let calls = 0
    const bad = engine.complete({ prompt: 'Once upon a time', n_predict: 200, temperature: 0, ignore_eos: true }, () => {
      calls++
      throw boom
    })
    const good = engine.complete({ prompt: 'Hello there', n_predict: 5, temperature: 0 })
    await expect(bad).rejects.toBe(boom)
    expect(calls).toBe(1)
    const r = await good
    expect(r.tokens_predicted).toBe(5)
  })

  test('throwing on the done event also rejects', async () => {
    const err = new Error('late')
    await expect(
      engine.complete({ prompt: 'Hi', n_predict: 2, temperature: 0 }, (e) => {
        if (e.type === 'done') throw err
      }),
    ).rejects.toBe(err)
  })
})

describe('a panic on the engine thread', () => {
  // Jest gives tests a copy of process.env, so the fault-injection switch is
  // set on a child process.
  test('rejects that request with INTERNAL naming the panic; the engine keeps serving the same answers', () => {
    const { execFileSync } = require('node:child_process')
    const path = require('node:path')
    const { TARGET } = require('./helpers')
    const script = `
      const { LlamaEngine } = require(${JSON.stringify(path.join(__dirname, '..'))});
      (async () => {
        const engine = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 256 });
        const req = { prompt: 'The sky is', n_predict: 6, temperature: 0 };
        const before = await engine.complete(req);
        const queued = engine.complete(req);
        const err = await engine.complete({ prompt: '__llama_engine_panic__' }).catch((e) => e);
        const after = [(await queued).content, (await engine.complete(req)).content];
        // Past its own guard: the job goes with the panic, its promise still says why.
        const placing = await engine.complete({ prompt: '__llama_engine_panic_placing__' }).catch((e) => e);
        after.push((await engine.complete(req)).content);
        await engine.dispose();
        console.log(JSON.stringify({ code: err.code, message: err.message, placing: [placing.code, placing.message], before: before.content, after }));
      })();`
    const env = { ...process.env, LLAMA_ENGINE_FAULT_INJECTION: '1' }
    const out = execFileSync(process.execPath, ['-e', script], { env, timeout: 60000, stdio: ['ignore', 'pipe', 'ignore'] }).toString()
    const r = JSON.parse(out.trim().split('\n').at(-1))
    expect(r.code).toBe('INTERNAL')
    expect(r.message).toMatch(/recovered from a panic/)
    expect(r.placing[0]).toBe('INTERNAL')
    expect(r.placing[1]).toMatch(/recovered from a panic while handling this request: fault injected by __llama_engine_panic_placing__ \(at .*admit\.rs:\d+\)/)
    expect(r.after).toEqual([r.before, r.before, r.before])
  })
})

describe('process lifetime', () => {
  test('an idle engine does not keep node alive', () => {
    const { execFileSync } = require('node:child_process')
    const path = require('node:path')
    const { TARGET } = require('./helpers')
    const script = `
      const { LlamaEngine } = require(${JSON.stringify(path.join(__dirname, '..'))});
      LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 256 }).then(async (e) => {
        const r = await e.complete({ prompt: 'Hi', n_predict: 3, temperature: 0 });
        console.log('done', r.tokens_predicted);
      });`
    const out = execFileSync(process.execPath, ['-e', script], { timeout: 60000 }).toString()
    expect(out.trim()).toBe('done 3')
  })

  test('a pending request keeps node alive until it finishes', () => {
    const { execFileSync } = require('node:child_process')
    const path = require('node:path')
    const { TARGET } = require('./helpers')
    const script = `
      const { LlamaEngine } = require(${JSON.stringify(path.join(__dirname, '..'))});
      (async () => {
        const e = await LlamaEngine.load({ modelPath: ${JSON.stringify(TARGET)}, contextSize: 256 });
        e.complete({ prompt: 'Hi', n_predict: 20, temperature: 0, ignore_eos: true }).then((r) => console.log('finished', r.tokens_predicted));
      })();`
    const out = execFileSync(process.execPath, ['-e', script], { timeout: 60000 }).toString()
    expect(out.trim()).toBe('finished 20')
  })
})
