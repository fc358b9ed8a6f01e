// Fill-in-the-middle on a real code model (npm run test:real): Qwen2.5-Coder-
// 0.5B-Instruct, whose vocabulary has the prefix/suffix/middle tokens and the
// repo-level ones (<|repo_name|>, <|file_sep|>).
//
// The prompt is checked against llama.cpp's own recipe (its server's
// format_infill), restated here from its rules and built from the engine's
// tokenizer: the engine's infill must give exactly what a completion of that
// token sequence gives, token for token and probability for probability.
const OpenAI = require('openai')
const { LlamaEngine, model } = require('../helpers')
const { listen, close, sseEvents } = require('../server-helpers')
const { createServer } = require('../../server')

const QWEN = model('Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf')
const CONTEXT = 1024
const BATCH = 128

/**
 * llama.cpp's format_infill, as its server builds the /infill prompt:
 * [REP]myproject\n ([SEP]name\n text)* [SEP]filename\n — of which the last
 * n_ctx − n_batch − 2·n_predict tokens — then [BOS?][PRE] the prefix's last
 * 3·n_batch/4 tokens, the prompt, [SUF] the suffix's first
 * n_batch/4 − 2 − |prompt| tokens, [MID].
 */
function llamaCppInfill(engine, { input_prefix, input_suffix, input_extra = [], prompt = '' }, nPredict) {
  const plain = (text) => engine.tokenize(text, { special: false })
  const special = (text) => {
    const ids = engine.tokenize(text, { special: true })
    if (ids.length !== 1) throw new Error(`${text} is not one token`)
    return ids[0]
  }
  const [pre, suf, mid, rep, sep] = ['<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>', '<|repo_name|>', '<|file_sep|>'].map(special)
  const extra = [rep, ...plain('myproject\n')]
  for (const chunk of input_extra) extra.push(sep, ...plain(`${chunk.filename ?? 'tmp'}\n`), ...plain(chunk.text))
  extra.push(sep, ...plain('filename\n'))
  const promptTokens = engine.tokenize(prompt, { special: true })
  const prefix = plain(input_prefix)
  const suffix = plain(input_suffix)
  const nPrefix = Math.min(prefix.length, 3 * Math.floor(BATCH / 4))
  const nSuffix = Math.min(suffix.length, Math.max(0, Math.floor(BATCH / 4) - (2 + promptTokens.length)))
  const nExtra = Math.min(Math.max(0, CONTEXT - BATCH - 2 * nPredict), extra.length)
  return [...extra.slice(extra.length - nExtra), pre, ...prefix.slice(prefix.length - nPrefix), ...promptTokens, suf, ...suffix.slice(0, nSuffix), mid]
}

const GREEDY = { temperature: 0, n_probs: 3, speculative: { mode: 'off' } }

// What a test compares: every token with its probabilities, and how it ended.
const trace = (result) => ({
  content: result.content,
  probs: result.completion_probabilities,
  eos: result.stopped_eos,
  limit: result.stopped_limit,
})

const LINES = (n, f) => Array.from({ length: n }, (_, i) => f(i)).join('')

const CASES = {
  'a function body': {
    input_prefix: 'function isEven(n) {\n  return ',
    input_suffix: '\n}\n\nmodule.exports = { isEven }\n',
  },
  'with project files and a prompt': {
    input_prefix: 'import math\n\ndef area(r):\n',
    input_suffix: '\n\nif __name__ == "__main__":\n    print(area(2.0))\n',
    input_extra: [
      { filename: 'geometry/util.py', text: 'def square(x):\n    return x * x\n' },
      { text: 'PI = 3.14159\n' },
    ],
    prompt: '    return',
  },
  'a prefix and suffix longer than the batch allows, special texts in code': {
    input_prefix: LINES(60, (i) => `x${i} = "<|fim_middle|>" + str(${i})\n`),
    input_suffix: LINES(60, (i) => `print(x${i})  # <|endoftext|>\n`),
  },
  'extra files beyond what the context leaves': {
    input_prefix: 'def total(xs):\n',
    input_suffix: '\n',
    input_extra: Array.from({ length: 12 }, (_, i) => ({ filename: `m${i}.py`, text: LINES(12, (j) => `def f${i}_${j}(a):\n    return a + ${j}\n`) })),
  },
}

describe('fill-in-the-middle on Qwen2.5-Coder-0.5B', () => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: QWEN, contextSize: CONTEXT, batchSize: BATCH, threads: 2, parallel: 2 })
  })
  afterAll(() => engine?.dispose())

  for (const [name, input] of Object.entries(CASES)) {
    test(`the prompt is llama.cpp's format_infill: ${name}`, async () => {
      const nPredict = 6
      const tokens = llamaCppInfill(engine, input, nPredict)
      const viaInfill = await engine.infill({ ...input, ...GREEDY, n_predict: nPredict, cache_prompt: false })
      const viaTokens = await engine.complete({ prompt: tokens, ...GREEDY, n_predict: nPredict, cache_prompt: false })
      expect(viaInfill.tokens_evaluated).toBe(tokens.length)
      expect(trace(viaInfill)).toEqual(trace(viaTokens))
    })
  }

  test('the middle of a function is filled and the model ends it', async () => {
    const result = await engine.infill({ ...CASES['a function body'], temperature: 0, n_predict: 48 })
    expect(result.stopped_eos).toBe(true)
    expect(result.content.trim()).not.toBe('')
    expect(result.content).not.toMatch(/<\|fim_|<\|file_sep\|>|<\|endoftext\|>/)
  })

  test('drafting from the suffix and the project files changes nothing', async () => {
    // A gap whose text is in the extra file: the n-gram drafters copy it.
    const helper = 'def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n        return high\n    return value\n'
    const input = {
      input_prefix: 'def clamp(value, low, high):\n',
      input_suffix: '\n\ndef clamp01(value):\n    return clamp(value, 0.0, 1.0)\n',
      input_extra: [{ filename: 'old/clamp.py', text: helper }],
      n_predict: 40,
      temperature: 0,
      n_probs: 2,
    }
    const off = await engine.infill({ ...input, speculative: { mode: 'off' } })
    for (const mode of ['auto', 'ngram']) {
      const on = await engine.infill({ ...input, speculative: { mode } })
      expect({ mode, ...trace(on) }).toEqual({ mode, ...trace(off) })
      if (mode === 'ngram') expect(on.speculative.n_accepted).toBeGreaterThan(0)
    }
  })

  test('sampled infill with a seed is the same as its token sequence sampled', async () => {
    const input = CASES['a function body']
    const tokens = llamaCppInfill(engine, input, 12)
    const sampled = { temperature: 0.9, seed: 7, n_predict: 12, n_probs: 2 }
    expect(trace(await engine.infill({ ...input, ...sampled }))).toEqual(trace(await engine.complete({ prompt: tokens, ...sampled })))
  })

  describe('over HTTP', () => {
    let server
    let base
    beforeAll(async () => {
      server = createServer({ engine, signals: false, modelName: 'qwen' })
      base = await listen(server)
    })
    afterAll(() => server && close(server))

    const post = (path, body) => fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

    test('POST /infill answers as infill(), whole and streamed', async () => {
      const input = { ...CASES['with project files and a prompt'], temperature: 0, n_predict: 24 }
      const expected = await engine.infill(input)
      const whole = await post('/infill', input)
      expect(whole.status).toBe(200)
      const body = await whole.json()
      expect(body.content).toBe(expected.content)
      expect(body.stopped_eos).toBe(expected.stopped_eos)

      const streamed = await post('/infill', { ...input, stream: true })
      expect(streamed.status).toBe(200)
      const events = sseEvents(await streamed.text()).map((e) => e.data)
      const last = events.at(-1)
      expect(last.stop).toBe(true)
      expect(events.filter((e) => e.stop === false).map((e) => e.content).join('')).toBe(expected.content)
    })

    test('POST /infill without input_suffix is a 400 naming it; a model field error names the field', async () => {
      const missing = await post('/infill', { input_prefix: 'x = ' })
      expect(missing.status).toBe(400)
      expect(JSON.stringify(await missing.json())).toMatch(/input_suffix/)
      const bad = await post('/infill', { input_prefix: 'x = ', input_suffix: '', input_extra: [{ filename: 3, text: '' }] })
      expect(bad.status).toBe(400)
      expect(JSON.stringify(await bad.json())).toMatch(/input_extra\[0\]/)
    })

    test('/v1/completions with suffix (the openai client) is the same fill', async () => {
      const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 })
      const { input_prefix, input_suffix } = CASES['a function body']
      const expected = await engine.infill({ input_prefix, input_suffix, temperature: 0, n_predict: 32 })
      const answer = await client.completions.create({ model: 'qwen', prompt: input_prefix, suffix: input_suffix, temperature: 0, max_tokens: 32 })
      expect(answer.choices[0].text).toBe(expected.content)
      expect(answer.choices[0].finish_reason).toBe(expected.stopped_eos ? 'stop' : 'length')
      const stream = await client.completions.create({ model: 'qwen', prompt: input_prefix, suffix: input_suffix, temperature: 0, max_tokens: 32, stream: true })
      let text = ''
      for await (const chunk of stream) text += chunk.choices[0]?.text ?? ''
      expect(text).toBe(expected.content)
    })
  })
})
