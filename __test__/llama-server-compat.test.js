// `llama-engine serve` as a drop-in for llama-server: its command line
// (spellings, meanings, environment variables, the flags it lacks named in
// the error) and its HTTP behaviour (CORS, /apply-template,
// system_fingerprint, the first chat chunk, --no-slots, server-wide
// sampling defaults), against a real server started with a llama-server
// command line as llama.cpp's own test suite starts one.

const path = require('node:path')
const { spawn } = require('node:child_process')
const { TARGET, GEMMA, fullTest } = require('./helpers')
const { until, importEsm, startServer, stopServer } = require('./server-helpers')

const ROOT = path.join(__dirname, '..')
const CLI = path.join(ROOT, 'bin', 'llama-engine.mjs')
const cli = () => importEsm(CLI)

describe("serve reads llama-server's command line", () => {
  test('the flags of llama.cpp\'s test suite: each in its meaning', async () => {
    const { parseServe } = await cli()
    // As tools/server/tests/utils.py starts llama-server (the model substituted).
    const argv = ['--port', '8080', '--temp', '0.8', '--seed', '42', '--host', '127.0.0.1', '--model', TARGET, '--batch-size', '1024', '--ubatch-size', '512', '--no-slots', '--alias', 'tinyllama-2', '--ctx-size', '512', '--parallel', '2', '--n-predict', '64', '--no-jinja', '-fa', 'on', '--spec-draft-n-max', '8', '--spec-type', 'ngram-simple', '--threads', '-1', '--cors-origins', 'localhost', '--api-key', 'a,b']
    const { load, listen, server } = parseServe(argv, {})
    expect(listen).toEqual({ host: '127.0.0.1', port: 8080 })
    // -c is llama-server's: the whole KV cache, split over the -np slots.
    expect(load).toMatchObject({ modelPath: TARGET, contextSize: 256, parallel: 2, batchSize: 1024, isolation: 'process' })
    expect(load.threads).toBeUndefined()
    expect(server).toMatchObject({
      modelName: 'tinyllama-2',
      slots: false,
      cors: 'localhost',
      apiKey: ['a', 'b'],
      requestDefaults: { temperature: 0.8, seed: 42, n_predict: 64, speculative: { mode: 'ngram', n_max: 8 }, context_shift: false },
    })
  })

  test('short spellings of several letters, values after = and negative numbers', async () => {
    const { parseServe } = await cli()
    const { load, server } = parseServe(['-m', TARGET, '-np', '3', '-ub', '256', '-b', '128', '-c', '1024', '-n', '-1', '-s', '-1', '-ngl', '0', '--top-k=5', '-fa', '--cache-ram', '0', '-md', TARGET], {})
    expect(load).toMatchObject({ parallel: 3, batchSize: 128, contextSize: 341, gpuLayers: 0, promptCacheMB: 0, draftModelPath: TARGET })
    // With -np left to its default (llama-server's auto: unified) or --kv-unified, each request may fill -c: each slot has it.
    expect(parseServe(['-m', TARGET, '-c', '1024'], {}).load.contextSize).toBe(1024)
    expect(parseServe(['-m', TARGET, '-c', '1024', '-np', '4', '--kv-unified'], {}).load).toMatchObject({ contextSize: 1024, parallel: 4 })
    expect(parseServe(['-m', TARGET, '-c', '1024', '-np', '-1'], {}).load.contextSize).toBe(1024)
    expect(server.requestDefaults).toEqual({ n_predict: -1, seed: -1, top_k: 5, context_shift: false })
    // As llama-server: no context shift unless asked; /metrics and __verbose only when asked.
    expect(server).toMatchObject({ metrics: false })
    expect(server.verbose).toBeUndefined()
    const on = parseServe(['-m', TARGET, '--context-shift', '--metrics', '--verbose', '--alias', 'tinyllama-2,fim,code', '--tags', 'chat,fim,small'], {}).server
    expect(on).toMatchObject({ metrics: true, verbose: true, requestDefaults: { context_shift: true }, modelName: 'code', modelAliases: ['code', 'fim', 'tinyllama-2'], modelTags: ['chat', 'fim', 'small'] })
  })

  test('environment variables fill what the command line leaves out', async () => {
    const { parseServe } = await cli()
    const { load, listen, server } = parseServe(['--ctx-size', '256'], { LLAMA_ARG_MODEL: TARGET, LLAMA_ARG_CTX_SIZE: '2048', LLAMA_ARG_PORT: '9000', LLAMA_ARG_N_PARALLEL: '2', LLAMA_API_KEY: 'k', LLAMA_ARG_ENDPOINT_SLOTS: 'false' })
    expect(load).toMatchObject({ modelPath: TARGET, contextSize: 128, parallel: 2 })
    expect(listen.port).toBe(9000)
    expect(server).toMatchObject({ apiKey: 'k', slots: false })
  })

  test('-hf and -hff name a Hugging Face model; --chat-template takes Jinja, a built-in name or a file', async () => {
    const { parseServe } = await cli()
    expect(parseServe(['-hf', 'ggml-org/models', '-hff', 'tinyllamas/stories260K.gguf'], {}).load.modelPath).toBe('hf:ggml-org/models/tinyllamas/stories260K.gguf')
    expect(parseServe(['-hf', 'ggml-org/tinygemma3-GGUF:Q8_0'], {}).load.modelPath).toBe('hf:ggml-org/tinygemma3-GGUF:Q8_0')
    expect(parseServe(['-m', TARGET, '--chat-template', 'chatml'], {}).load.chatTemplate).toMatch(/<\|im_start\|>/)
    expect(parseServe(['-m', TARGET, '--chat-template', 'llama3'], {}).load.chatTemplate).toMatch(/<\|start_header_id\|>/)
    expect(parseServe(['-m', TARGET, '--reasoning', 'off'], {}).server.requestDefaults).toEqual({ chat_template_kwargs: { enable_thinking: false }, context_shift: false })
    expect(parseServe(['-m', TARGET, '--chat-template', '{{ messages[0].content }}'], {}).load.chatTemplate).toBe('{{ messages[0].content }}')
    const file = path.join(__dirname, 'fixtures', 'chat-templates', 'NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja')
    expect(parseServe(['-m', TARGET, '--chat-template-file', file], {}).load.chatTemplate).toMatch(/tool/)
  })

  test("each built-in template name renders llama.cpp's format (the cases of its test-chat-template.cpp); other text is a template", async () => {
    const { parseServe, UsageError } = await cli()
    const { BUILTIN_TEMPLATES } = await importEsm(path.join(ROOT, 'bin', 'cli', 'builtin-templates.mjs'))
    const fixture = require('./fixtures/chat-templates/builtin-names.json')
    expect(fixture.cases.map((c) => c.name).sort()).toEqual(Object.keys(BUILTIN_TEMPLATES).sort())
    // Rendered by the engine's template code over the vocabulary alone (what an isolated engine's parent keeps).
    const { NativeVocab } = require('../lib/addon/native.js').binding
    for (const { name, expected } of fixture.cases) {
      const chatTemplate = parseServe(['-m', TARGET, '--chat-template', name], {}).load.chatTemplate
      const vocab = await NativeVocab.load(JSON.stringify({ modelPath: TARGET, chatTemplate }))
      try {
        expect({ name, prompt: vocab.applyChatTemplate(JSON.stringify({ messages: fixture.messages }), true) }).toEqual({ name, prompt: expected })
      } finally {
        vocab.dispose()
      }
    }
    // llama-server renders any other text as a Jinja template; a missing file or an unknown name is an error here.
    expect(parseServe(['-m', TARGET, '--chat-template', 'This is not a chat template, it is'], {}).load.chatTemplate).toBe('This is not a chat template, it is')
    for (const text of ['command-r9', 'templates/missing.jinja']) expect(() => parseServe(['-m', TARGET, '--chat-template', text], {})).toThrow(UsageError)
  })

  test('a flag of llama-server this server lacks is an error naming it; unknown ones too', async () => {
    const { parseServe, UsageError } = await cli()
    for (const [argv, message] of [
      [['--swa-full'], /--swa-full: a full-size SWA cache is not supported/],
      [['-ctk', 'q8_0'], /-ctk: the KV cache is F16/],
      [['--reranking', '--pooling', 'mean'], /--reranking: a reranker's pooling is rank/],
      [['--no-such-flag'], /unknown option --no-such-flag/],
      [['--spec-type', 'draft-eagle3'], /--spec-type: "draft-eagle3" is not supported/],
      [['--flash-attn=sometimes'], /expected one of on, off, auto/],
      [['--port'], /--port: expected N/],
      [['--no-slots=1'], /takes no value/],
    ]) {
      let err
      try {
        parseServe(argv, {})
      } catch (e) {
        err = e
      }
      expect(err).toBeInstanceOf(UsageError)
      expect(err.message).toMatch(message)
    }
  })

  test('--help lists both spellings and what llama-server flags change nothing here', async () => {
    const { SERVE_USAGE } = await cli()
    expect(SERVE_USAGE).toMatch(/-ub, --ubatch-size/)
    expect(SERVE_USAGE).toMatch(/--cors, --cors-origins/)
    expect(SERVE_USAGE).toMatch(/llama-server's;\s+the\s+engine\s+sizes\s+its\s+own\s+batches/)
    // A flag it lacks is not offered.
    expect(SERVE_USAGE).not.toMatch(/--swa-full/)
    expect(SERVE_USAGE).toMatch(/--slot-save-path DIR/)
  })
})

describe("serve answers as llama-server does (a server started with llama-server's flags)", () => {
  let srv
  let base
  let log = ''
  beforeAll(async () => {
    srv = spawn(process.execPath, [CLI, 'serve', '-m', TARGET, '--port', '0', '-c', '1024', '-np', '2', '-b', '64', '--temp', '0', '--seed', '42', '-n', '6', '--no-slots', '--alias', 'tinyllama-2', '--tags', 'chat,small', '--metrics', '--isolation', 'none', '--no-jinja', '-fa', 'off'], {
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    srv.stderr.on('data', (d) => (log += d))
    expect(await until(() => /model loaded/.test(log), 60_000)).toBe(true)
    base = `http://127.0.0.1:${/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log)[1]}`
  })
  afterAll(() => srv?.kill())

  const post = (route, body, headers = {}) => fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) })

  test('CORS by default: any origin echoed with credentials, llama-server\'s methods and headers, on a 200 preflight', async () => {
    for (const origin of ['localhost', 'web.mydomain.fr']) {
      const res = await fetch(`${base}/completions`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'Authorization' } })
      expect(res.status).toBe(200)
      expect(res.headers.get('access-control-allow-origin')).toBe(origin)
      expect(res.headers.get('access-control-allow-credentials')).toBe('true')
      expect(res.headers.get('access-control-allow-methods')).toBe('GET, POST, DELETE, OPTIONS')
      expect(res.headers.get('access-control-allow-headers')).toBe('*')
    }
    const res = await post('/completion', { prompt: 'Hi' }, { origin: 'http://app.example' })
    expect(res.headers.get('access-control-allow-origin')).toBe('http://app.example')
    await res.arrayBuffer()
  })

  test('the server-wide defaults (-n 6, --temp 0, --seed 42) apply where a request says nothing; its own fields win; -n is also a limit', async () => {
    const a = await (await post('/completion', { prompt: 'Once upon a time', ignore_eos: true })).json()
    expect(a.tokens_predicted).toBe(6)
    expect(a.generation_settings).toMatchObject({ temperature: 0, seed: 42, n_predict: 6 })
    const b = await (await post('/completion', { prompt: 'Once upon a time', n_predict: 3, temperature: 0.5, ignore_eos: true })).json()
    expect(b.tokens_predicted).toBe(3)
    expect(b.generation_settings.temperature).toBe(0.5)
    const c = await (await post('/completion', { prompt: 'Once upon a time', n_predict: 50, ignore_eos: true })).json()
    expect(c.generation_settings.n_predict).toBe(6)
    // llama-server's logit_bias: [{ bias, token }]; ignore_eos shows the end-of-generation tokens it bans (bias null: -inf).
    const [eos] = (await (await post('/tokenize', { content: '<|im_end|>' })).json()).tokens
    expect(c.generation_settings.logit_bias).toEqual(expect.arrayContaining([{ bias: null, token: eos }]))
    expect(c.generation_settings.logit_bias.every((b) => b.bias === null)).toBe(true)
    const d = await (await post('/completion', { prompt: 'Once upon a time', n_predict: 2, logit_bias: [[5, 1.5]] })).json()
    expect(d.generation_settings.logit_bias).toEqual([{ bias: 1.5, token: 5 }])
  })

  test("/completion in llama-server's shape: tokens with return_tokens, has_new_line, stop_type, timings.cache_n; a stream adds up to the answer", async () => {
    const body = { prompt: 'I believe the meaning of life is', n_predict: 6, ignore_eos: true }
    const plain = await (await post('/completion', body)).json()
    expect(plain.tokens).toEqual([])
    expect(plain.stop_type).toBe('limit')
    expect(typeof plain.has_new_line).toBe('boolean')
    expect(plain.timings.prompt_n + plain.timings.cache_n).toBe(plain.tokens_evaluated)
    // The generation's rate is over its tokens after the first (that one came from the prompt's pass), as llama-server's.
    const t = plain.timings
    expect(t.predicted_per_second).toBeCloseTo(((t.predicted_n - 1) * 1000) / t.predicted_ms, 6)
    const one = (await (await post('/completion', { prompt: 'I believe', n_predict: 1 })).json()).timings
    expect(one).toMatchObject({ predicted_n: 1, predicted_per_second: 0, predicted_per_token_ms: 0 })
    const withTokens = await (await post('/completion', { ...body, return_tokens: true })).json()
    expect(withTokens.tokens).toHaveLength(6)
    expect(withTokens.tokens.every(Number.isInteger)).toBe(true)
    const res = await post('/completion', { ...body, stream: true })
    const events = (await res.text())
      .split('\n\n')
      .filter((l) => l.startsWith('data: {'))
      .map((l) => JSON.parse(l.slice(6)))
    const last = events.at(-1)
    expect(last).toMatchObject({ stop: true, content: '', stop_type: 'limit' })
    const streamed = events.slice(0, -1)
    expect(streamed.every((e) => e.stop === false && e.tokens.every(Number.isInteger))).toBe(true)
    expect(streamed.map((e) => e.content).join('')).toBe(plain.content)
    expect(streamed.flatMap((e) => e.tokens)).toEqual(withTokens.tokens)
    expect(streamed.flatMap((e) => e.token_details.map((t) => t.id))).toEqual(withTokens.tokens)
    // response_fields: only those, a nested one by its path.
    const picked = await (await post('/completion', { ...body, response_fields: ['content', 'generation_settings/n_predict', 'prompt'] })).json()
    expect(picked).toEqual({ content: plain.content, 'generation_settings/n_predict': 6, prompt: body.prompt })
  })

  test('POST /apply-template renders the chat without generating; add_generation_prompt and tools count', async () => {
    const messages = [{ role: 'user', content: 'What is today?' }]
    const withPrompt = await (await post('/apply-template', { messages })).json()
    const without = await (await post('/apply-template', { messages, add_generation_prompt: false })).json()
    expect(withPrompt.prompt).toContain('What is today?')
    expect(withPrompt.prompt.startsWith(without.prompt)).toBe(true)
    expect(withPrompt.prompt.length).toBeGreaterThan(without.prompt.length)
    const empty = await (await post('/apply-template', { messages, tools: [] })).json()
    expect(empty.prompt).toBe(withPrompt.prompt)
    const tool = { type: 'function', function: { name: 'get_weather', description: 'The weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }
    const withTools = await (await post('/apply-template', { messages, tools: [tool] })).json()
    expect(withTools.prompt).toContain('get_weather')
    const bad = await post('/apply-template', { messages: 'hello' })
    expect(bad.status).toBe(400)
    expect((await bad.json()).error.message).toMatch(/messages/)
  })

  test('system_fingerprint on every chat and completion result and chunk; the first chat chunk is the role with content null', async () => {
    const chat = await (await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }] })).json()
    expect(chat.system_fingerprint).toMatch(/^b/)
    expect(chat.model).toBe('tinyllama-2')
    const text = await (await post('/v1/completions', { prompt: 'Hi' })).json()
    expect(text.system_fingerprint).toBe(chat.system_fingerprint)
    const res = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], stream: true })
    const chunks = (await res.text())
      .split('\n\n')
      .filter((l) => l.startsWith('data: {'))
      .map((l) => JSON.parse(l.slice(6)))
    expect(chunks.length).toBeGreaterThan(1)
    expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: null })
    for (const c of chunks) expect(c.system_fingerprint).toBe(chat.system_fingerprint)
  })

  test('logit_bias keyed by text and a prompt of ids with strings among them are tokenized, as llama-server does', async () => {
    const tokenize = async (content) => (await (await post('/tokenize', { content })).json()).tokens
    const ids = [...(await tokenize('Once upon')), ...(await tokenize(' a time'))]
    const byIds = await (await post('/completion', { prompt: ids, return_tokens: true })).json()
    const mixed = await (await post('/completion', { prompt: [...(await tokenize('Once upon')), ' a time'], return_tokens: true })).json()
    expect(mixed.tokens).toEqual(byIds.tokens)
    // The first token it wrote, banned by its text, in both of llama-server's shapes.
    const first = (await (await post('/detokenize', { tokens: [byIds.tokens[0]] })).json()).content
    for (const logit_bias of [[[first, false]], { [first]: -100 }]) {
      const banned = await (await post('/completion', { prompt: ids, return_tokens: true, logit_bias })).json()
      expect(banned.tokens[0]).not.toBe(byIds.tokens[0])
    }
  })

  // (Each block's data line; the Responses API names its events on an `event:` line before it.)
  const events = async (res) =>
    (await res.text())
      .split('\n\n')
      .map((block) => block.split('\n').find((l) => l.startsWith('data: {')))
      .filter(Boolean)
      .map((l) => JSON.parse(l.slice(6)))

  test("n_probs in llama-server's shape: the token's own logprob (or prob) and its top list, streamed and not", async () => {
    const body = { prompt: 'I believe the meaning of life is', n_probs: 10, temperature: 0, n_predict: 5, ignore_eos: true }
    const plain = await (await post('/completion', body)).json()
    expect(plain.completion_probabilities).toHaveLength(5)
    for (const tok of plain.completion_probabilities) {
      expect(tok).toEqual({ id: expect.any(Number), token: expect.any(String), bytes: expect.any(Array), logprob: expect.any(Number), top_logprobs: expect.any(Array) })
      expect(tok.logprob).toBeLessThanOrEqual(0)
      expect(Buffer.from(tok.bytes).toString()).toBe(tok.token)
      expect(tok.top_logprobs).toHaveLength(10)
      // Greedy: the chosen token is the most probable, with the same logprob.
      expect(tok.top_logprobs[0]).toEqual({ id: tok.id, token: tok.token, bytes: tok.bytes, logprob: tok.logprob })
    }
    const streamed = (await events(await post('/completion', { ...body, stream: true }))).filter((e) => !e.stop)
    expect(streamed.flatMap((e) => e.completion_probabilities)).toEqual(plain.completion_probabilities)
    const post_ = await (await post('/completion', { ...body, temperature: 1, seed: 1, post_sampling_probs: true })).json()
    for (const tok of post_.completion_probabilities) {
      expect(tok.prob).toBeGreaterThan(0)
      expect(tok.prob).toBeLessThanOrEqual(1)
      for (const p of tok.top_probs) expect(p.prob).toBeGreaterThan(0)
      if (tok.top_probs.length < 10) expect(tok.top_probs.reduce((s, p) => s + p.prob, 0)).toBeCloseTo(1, 5)
    }
  })

  test("Chat Completions' logprobs and top_logprobs: the tokens add up to the answer, streamed and not", async () => {
    const ask = { messages: [{ role: 'system', content: 'Book' }, { role: 'user', content: 'What is the best book' }], max_tokens: 5, logprobs: true, top_logprobs: 3 }
    const r = await (await post('/v1/chat/completions', ask)).json()
    const content = r.choices[0].logprobs.content
    expect(content.map((t) => t.token).join('')).toBe(r.choices[0].message.content)
    for (const t of content) {
      expect(t.logprob).toBeLessThanOrEqual(0)
      expect(t.top_logprobs).toHaveLength(3)
    }
    const chunks = await events(await post('/v1/chat/completions', { ...ask, stream: true }))
    let text = ''
    let tokens = ''
    for (const c of chunks.slice(1)) {
      const choice = c.choices[0]
      if (!choice || choice.finish_reason !== null) continue
      expect(choice.delta.role).toBeUndefined()
      text += choice.delta.content ?? ''
      expect(choice.logprobs.content.length).toBeGreaterThan(0)
      tokens += choice.logprobs.content.map((t) => t.token).join('')
    }
    expect(tokens).toBe(text)
    expect(text).toBe(r.choices[0].message.content)
    expect((await post('/v1/chat/completions', { ...ask, logprobs: false })).status).toBe(400)
  })

  test("--metrics: llama-server's llamacpp:* counters and gauges, the process start time; a request counted as its timings say", async () => {
    const scrape = async () => {
      const res = await fetch(`${base}/metrics`)
      expect(res.status).toBe(200)
      expect(Number(res.headers.get('process-start-time-unix'))).toBeGreaterThan(1.7e9)
      const text = await res.text()
      const types = Object.fromEntries([...text.matchAll(/^# TYPE (llamacpp:\S+) (\w+)$/gm)].map((m) => [m[1], m[2]]))
      const values = Object.fromEntries([...text.matchAll(/^(llamacpp:\S+) (\S+)$/gm)].map((m) => [m[1], Number(m[2])]))
      for (const name of Object.keys(values)) expect(text).toContain(`# HELP ${name} `)
      return { types, values }
    }
    const before = await scrape()
    for (const name of ['prompt_tokens_total', 'prompt_tokens_cached_total', 'prompt_seconds_total', 'tokens_predicted_total', 'tokens_predicted_seconds_total', 'n_decode_total', 'n_tokens_max', 'spec_decode_num_draft_tokens_total', 'spec_decode_num_accepted_tokens_total', 'spec_decode_num_drafts_total']) {
      expect([name, before.types[`llamacpp:${name}`]]).toEqual([name, 'counter'])
    }
    for (const name of ['prompt_tokens_seconds', 'predicted_tokens_seconds', 'requests_processing', 'requests_deferred', 'n_busy_slots_per_decode']) {
      expect([name, before.types[`llamacpp:${name}`]]).toEqual([name, 'gauge'])
    }
    const r = await (await post('/completion', { prompt: 'the quick brown fox jumps over the lazy dog', n_predict: 4, ignore_eos: true })).json()
    const after = (await scrape()).values
    const delta = (name) => after[`llamacpp:${name}`] - before.values[`llamacpp:${name}`]
    expect(delta('prompt_tokens_total')).toBe(r.timings.prompt_n)
    expect(delta('prompt_tokens_cached_total')).toBe(r.timings.cache_n)
    expect(delta('tokens_predicted_total')).toBe(r.timings.predicted_n)
    expect(delta('n_decode_total')).toBeGreaterThanOrEqual(r.timings.predicted_n - 1)
    expect(after['llamacpp:requests_processing']).toBe(0)
    expect(after['llamacpp:n_tokens_max']).toBeGreaterThanOrEqual(r.tokens_evaluated + r.tokens_predicted)
    // An embedding's pass of the model counts among the decodes too.
    expect((await post('/v1/embeddings', { input: 'hello world' })).status).toBe(200)
    const embedded = (await scrape()).values
    expect(embedded['llamacpp:n_decode_total'] - after['llamacpp:n_decode_total']).toBeGreaterThanOrEqual(1)
  })

  test('__verbose with verbose: true: the prompt the model read and the /completion result; absent otherwise', async () => {
    const messages = [{ role: 'system', content: 'Book' }, { role: 'user', content: 'What is the best book' }]
    const rendered = (await (await post('/apply-template', { messages })).json()).prompt
    const r = await (await post('/v1/chat/completions', { messages, max_tokens: 2, ignore_eos: true, verbose: true })).json()
    expect(r.__verbose).toMatchObject({ prompt: rendered, stop: true, stop_type: 'limit', tokens_predicted: 2 })
    expect(r.timings.predicted_n).toBe(2)
    expect((await (await post('/v1/chat/completions', { messages, max_tokens: 2 })).json()).__verbose).toBeUndefined()
    expect((await (await post('/completion', { prompt: 'Hi', n_predict: 1, verbose: true })).json()).__verbose.prompt).toBe('Hi')
  })

  test('a last assistant message is continued (prefill); continue_final_message says so, with add_generation_prompt false', async () => {
    const messages = [{ role: 'system', content: 'Book' }, { role: 'user', content: 'What is the best book' }]
    const before = (await (await post('/apply-template', { messages })).json()).prompt
    const prefill = [...messages, { role: 'assistant', content: 'Whill' }]
    const a = await (await post('/v1/chat/completions', { messages: prefill, max_tokens: 2, verbose: true })).json()
    expect(a.__verbose.prompt).toBe(before + 'Whill')
    const b = await (await post('/v1/chat/completions', { messages: prefill, max_tokens: 2, verbose: true, add_generation_prompt: false, continue_final_message: true })).json()
    expect(b.__verbose.prompt).toBe(a.__verbose.prompt)
    expect((await (await post('/apply-template', { messages: prefill })).json()).prompt).toBe(before + 'Whill')
    // Given in text parts, it is continued with them joined by a blank line, as llama-server joins them.
    const parts = [...messages, { role: 'assistant', content: [{ type: 'text', text: 'Wh' }, { type: 'text', text: 'ill' }] }]
    expect((await (await post('/v1/chat/completions', { messages: parts, max_tokens: 2, verbose: true })).json()).__verbose.prompt).toBe(before + 'Wh\n\nill')
    const both = await post('/v1/chat/completions', { messages: prefill, max_tokens: 2, add_generation_prompt: true, continue_final_message: true })
    expect(both.status).toBe(400)
    const twice = await post('/v1/chat/completions', { messages: [...prefill, { role: 'assistant', content: 'x' }], max_tokens: 2 })
    expect(twice.status).toBe(400)
  })

  test('a prompt longer than a slot\'s context: 400 exceed_context_size_error with the counts, streamed or not', async () => {
    const messages = Array.from({ length: 100 }, () => [{ role: 'system', content: 'Book' }, { role: 'user', content: 'What is the best book' }]).flat()
    for (const stream of [false, true]) {
      const res = await post('/v1/chat/completions', { messages, stream })
      expect(res.status).toBe(400)
      const { error } = await res.json()
      expect(error.type).toBe('exceed_context_size_error')
      // A slot's: -c 1024 over -np 2.
      expect(error.n_ctx).toBe(512)
      expect(error.n_prompt_tokens).toBeGreaterThan(512)
      expect(error.message).toMatch(/exceeds the available context size/)
    }
  })

  test('return_progress: where the prompt is as it is evaluated in chunks of -b, with its timings, before the tokens', async () => {
    const prompt = 'The history of the printing press begins in the fifteenth century. '.repeat(15)
    const all = await events(await post('/completion', { prompt, n_predict: 2, stream: true, return_progress: true, cache_prompt: false }))
    const progress = all.filter((e) => e.prompt_progress).map((e) => e.prompt_progress)
    expect(progress.length).toBeGreaterThanOrEqual(3)
    expect(progress[0].processed).toBe(progress[0].cache)
    for (let i = 1; i < progress.length; i++) {
      expect(progress[i].total).toBe(progress[0].total)
      expect(progress[i].processed).toBeGreaterThan(progress[i - 1].processed)
      expect(progress[i].processed - progress[i - 1].processed).toBeLessThanOrEqual(64)
    }
    expect(progress.at(-1).processed).toBe(progress[0].total)
    // Each with llama-server's timings of the prompt so far: none before the first chunk, never going back.
    const timings = all.filter((e) => e.prompt_progress).map((e) => e.timings)
    expect(timings[0]).toMatchObject({ prompt_n: 0, prompt_ms: 0, predicted_n: 0, predicted_ms: 0 })
    for (let i = 1; i < timings.length; i++) {
      for (const v of Object.values(timings[i])) expect(v).toBeGreaterThanOrEqual(0)
      expect(timings[i].prompt_ms).toBeGreaterThanOrEqual(timings[i - 1].prompt_ms)
      expect(timings[i].prompt_n).toBe(progress[i].processed - progress[i].cache)
    }
    expect(timings.at(-1).prompt_ms).toBeGreaterThan(0)
    // Every progress event comes before the first token.
    const firstToken = all.findIndex((e) => e.content)
    expect(all.findLastIndex((e) => e.prompt_progress)).toBeLessThan(firstToken)
    const chat = await events(await post('/v1/chat/completions', { messages: [{ role: 'user', content: prompt }], max_tokens: 2, stream: true, return_progress: true }))
    const chatProgress = chat.filter((c) => c.prompt_progress)
    expect(chatProgress.length).toBeGreaterThanOrEqual(2)
    for (const c of chatProgress) expect(c.choices[0].delta).toEqual({ role: 'assistant', content: null })
  })

  test("Responses' llama.cpp telemetry: return_progress as response.in_progress events with prompt_progress, timings_per_token on the deltas and the end", async () => {
    const prompt = 'The history of the printing press begins in the fifteenth century. '.repeat(15)
    const all = await events(await post('/v1/responses', { input: prompt, max_output_tokens: 4, stream: true, return_progress: true, timings_per_token: true }))
    const progress = all.filter((e) => e.prompt_progress)
    expect(progress.length).toBeGreaterThanOrEqual(2)
    for (const e of progress) expect(e).toMatchObject({ type: 'response.in_progress', response: { status: 'in_progress' } })
    expect(progress.at(-1).prompt_progress.processed).toBe(progress[0].prompt_progress.total)
    const deltas = all.filter((e) => e.type === 'response.output_text.delta')
    expect(deltas.length).toBeGreaterThan(0)
    for (const d of deltas) expect(d.timings).toMatchObject({ prompt_n: expect.any(Number), predicted_n: expect.any(Number), predicted_per_second: expect.any(Number) })
    expect(deltas.at(-1).timings.predicted_n).toBeGreaterThanOrEqual(deltas[0].timings.predicted_n)
    const end = all.at(-1)
    expect(['response.completed', 'response.incomplete']).toContain(end.type)
    expect(end.timings.predicted_n).toBe(end.response.usage.output_tokens)
    // Without them, OpenAI's stream as it is.
    const plain = await events(await post('/v1/responses', { input: 'Hi', max_output_tokens: 2, stream: true }))
    expect(plain.some((e) => e.prompt_progress || e.timings)).toBe(false)
  })

  test('n choices: each its own generation, in its own index; the usage counts the prompt once, every choice\'s tokens', async () => {
    const ask = { messages: [{ role: 'system', content: 'Book' }, { role: 'user', content: 'What is the best book' }], max_tokens: 4, ignore_eos: true, n: 2 }
    const one = await (await post('/v1/chat/completions', { ...ask, n: 1 })).json()
    const r = await (await post('/v1/chat/completions', ask)).json()
    expect(r.choices.map((c) => [c.index, c.message.role, c.finish_reason])).toEqual([
      [0, 'assistant', 'length'],
      [1, 'assistant', 'length'],
    ])
    // --temp 0: both are the greedy answer.
    for (const c of r.choices) expect(c.message.content).toBe(one.choices[0].message.content)
    expect(r.usage).toMatchObject({ prompt_tokens: one.usage.prompt_tokens, completion_tokens: 8 })
    const chunks = await events(await post('/v1/chat/completions', { ...ask, stream: true, stream_options: { include_usage: true } }))
    for (const index of [0, 1]) {
      const mine = chunks.filter((c) => c.choices[0]?.index === index)
      expect(mine[0].choices[0].delta).toEqual({ role: 'assistant', content: null })
      expect(mine.map((c) => c.choices[0].delta.content ?? '').join('')).toBe(one.choices[0].message.content)
      expect(mine.at(-1).choices[0].finish_reason).toBe('length')
    }
    expect(chunks.at(-1).usage.completion_tokens).toBe(8)
    const text = await (await post('/v1/completions', { prompt: 'Once upon a time', max_tokens: 3, n: 3 })).json()
    expect(text.choices.map((c) => c.index)).toEqual([0, 1, 2])
    expect((await post('/v1/chat/completions', { ...ask, n: 17 })).status).toBe(400)
  })

  test("GET /v1/models: aliases, tags, capabilities and the model's sizes; /v1/health; the input_tokens counts of Chat Completions and Responses", async () => {
    const models = await (await fetch(`${base}/v1/models`)).json()
    expect(models.data[0]).toMatchObject({ id: 'tinyllama-2', aliases: ['tinyllama-2'], tags: ['chat', 'small'], capabilities: ['completion'], meta: { n_ctx: 512 } })
    expect(models.models[0]).toMatchObject({ name: 'tinyllama-2', capabilities: ['completion'] })
    expect((await fetch(`${base}/v1/health`)).status).toBe(200)
    const messages = [{ role: 'user', content: 'What is the best book' }]
    const { input_tokens } = await (await post('/v1/chat/completions/input_tokens', { messages })).json()
    const rendered = (await (await post('/apply-template', { messages })).json()).prompt
    const tokens = (await (await post('/tokenize', { content: rendered })).json()).tokens
    expect(input_tokens).toBe(tokens.length)
    // The Responses API's count of the same conversation.
    const responses = await (await post('/v1/responses/input_tokens', { input: 'What is the best book' })).json()
    expect(responses).toEqual({ object: 'response.input_tokens', input_tokens: tokens.length })
  })

  test('POST /infill reads its fields as /completion does (the fill itself: test:real, on a code model)', async () => {
    const missing = await post('/infill', { input_prefix: 'x = ' })
    expect(missing.status).toBe(400)
    expect((await missing.json()).error.message).toMatch(/input_suffix/)
  })

  test('--no-slots: GET /slots is 501; so are the rerank endpoints on a model that is no reranker', async () => {
    const res = await fetch(`${base}/slots`)
    expect(res.status).toBe(501)
    expect((await res.json()).error.type).toBe('not_supported_error')
    for (const route of ['/rerank', '/v1/rerank', '/v1/reranking']) {
      const r = await post(route, { query: 'q', documents: ['a'] })
      expect([route, r.status]).toEqual([route, 501])
      expect((await r.json()).error.message).toMatch(/does not support reranking: its model is not a reranker/)
    }
  })
})

describe('--cors-origins localhost, several API keys, --reasoning off', () => {
  let srv
  let base
  let log = ''
  beforeAll(async () => {
    const qwen3 = path.join(__dirname, 'fixtures', 'chat-templates', 'Qwen-Qwen3-0.6B.jinja')
    srv = spawn(process.execPath, [CLI, 'serve', '-m', TARGET, '--port', '0', '-c', '512', '--isolation', 'none', '--cors-origins', 'localhost', '--api-key', 'first,second', '--jinja', '--chat-template-file', qwen3, '--reasoning', 'off'], { stdio: ['ignore', 'ignore', 'pipe'] })
    srv.stderr.on('data', (d) => (log += d))
    expect(await until(() => /model loaded/.test(log), 60_000)).toBe(true)
    base = `http://127.0.0.1:${/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log)[1]}`
  })
  afterAll(() => srv?.kill())

  const preflight = (origin) => fetch(`${base}/completions`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'Authorization' } })

  test('origins on this machine are echoed, others answered without the header', async () => {
    for (const origin of ['http://localhost', 'http://localhost:8080', 'http://127.0.0.1', 'http://127.0.0.1:3000', 'http://[::1]', 'http://[::1]:3000']) {
      const res = await preflight(origin)
      expect(res.status).toBe(200)
      expect(res.headers.get('access-control-allow-origin')).toBe(origin)
    }
    for (const origin of ['http://web.mydomain.fr', 'http://evil.com', 'http://notlocalhost', 'http://localhost.evil.com']) {
      const res = await preflight(origin)
      expect(res.status).toBe(200)
      expect(res.headers.get('access-control-allow-origin')).toBeNull()
    }
  })

  test('without --metrics, GET /metrics is 501 (as llama-server)', async () => {
    const res = await fetch(`${base}/metrics`, { headers: { authorization: 'Bearer first' } })
    expect(res.status).toBe(501)
    expect((await res.json()).error.type).toBe('not_supported_error')
  })

  test("--reasoning off reaches every rendering of the chat: /apply-template and the token counts (Qwen3's template closes its thinking)", async () => {
    const headers = { authorization: 'Bearer first', 'content-type': 'application/json' }
    const messages = [{ role: 'user', content: 'What is today?' }]
    const render = async (body) => (await (await fetch(`${base}/apply-template`, { method: 'POST', headers, body: JSON.stringify(body) })).json()).prompt
    expect(await render({ messages })).toMatch(/<\|im_start\|>assistant\n<think>\n\n<\/think>\n\n$/)
    expect(await render({ messages, tools: [] })).toMatch(/<\/think>\n\n$/)
    // A request's own kwargs win over the server's.
    expect(await render({ messages, chat_template_kwargs: { enable_thinking: true } })).toMatch(/<\|im_start\|>assistant\n$/)
    const count = async (kwargs) => (await (await fetch(`${base}/v1/chat/completions/input_tokens`, { method: 'POST', headers, body: JSON.stringify({ messages, chat_template_kwargs: kwargs }) })).json()).input_tokens
    expect(await count(undefined)).toBeGreaterThan(await count({ enable_thinking: true }))
    const anthropic = await (await fetch(`${base}/v1/messages/count_tokens`, { method: 'POST', headers, body: JSON.stringify({ model: 'm', messages }) })).json()
    expect(anthropic.input_tokens).toBe(await count(undefined))
  })

  test('each of the keys opens the server; another does not', async () => {
    for (const key of ['first', 'second']) expect((await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).status).toBe(200)
    const res = await fetch(`${base}/v1/models`, { headers: { authorization: 'Bearer third' } })
    expect(res.status).toBe(401)
    expect((await res.json()).error.type).toBe('authentication_error')
  })
})

test("a chat's template gets llama-server's date_string (today) unless the request sets it; the library API renders as transformers", async () => {
  const fs = require('node:fs')
  const chatTemplate = fs.readFileSync(path.join(__dirname, 'fixtures', 'chat-templates', 'meta-llama-Llama-3.3-70B-Instruct.jinja'), 'utf8')
  const s = await startServer({}, { contextSize: 512, chatTemplate })
  try {
    const messages = [{ role: 'user', content: 'What is today?' }]
    const render = async (body) => (await (await fetch(`${s.base}/apply-template`, { method: 'POST', body: JSON.stringify(body) })).json()).prompt
    const now = new Date()
    const today = `${String(now.getDate()).padStart(2, '0')} ${now.toLocaleString('en-US', { month: 'short' })} ${now.getFullYear()}`
    const http = await render({ messages })
    // (A render across midnight reads yesterday's date.)
    expect(http.includes(`Today Date: ${today}`) || new Date().getDate() !== now.getDate()).toBe(true)
    expect(await render({ messages, chat_template_kwargs: { date_string: '01 Jan 2030' } })).toContain('Today Date: 01 Jan 2030')
    expect(s.engine.applyChatTemplate(messages)).toContain('Today Date: 26 Jul 2024')
  } finally {
    await stopServer(s)
  }
})

test('sleepIdleMs (--sleep-idle-seconds): idle, the engine is disposed; read-only endpoints answer asleep; a request wakes it and gets the same answer', async () => {
  const { createServer } = require('../server')
  const { listen, close } = require('./server-helpers')
  const server = createServer({ model: TARGET, engineOptions: { contextSize: 512, parallel: 1 }, sleepIdleMs: 300, metrics: true, signals: false })
  const base = await listen(server)
  try {
    const props = async () => (await (await fetch(`${base}/props`)).json()).is_sleeping
    const eventually = async (predicate, ms) => {
      for (const deadline = Date.now() + ms; Date.now() < deadline; await new Promise((r) => setTimeout(r, 50))) if (await predicate()) return true
      return false
    }
    const answer = async () => (await (await fetch(`${base}/completion`, { method: 'POST', body: JSON.stringify({ prompt: 'The capital of France is', n_predict: 6, temperature: 0 }) })).json()).content
    expect(await eventually(async () => (await fetch(`${base}/health`)).status === 200, 60_000)).toBe(true)
    const first = await answer()
    const awake = await (await fetch(`${base}/metrics`)).text()
    expect(await eventually(props, 10_000)).toBe(true)
    // Asleep: these answer without loading the model again.
    for (const route of ['/health', '/v1/models', '/slots', '/props']) expect([route, (await fetch(base + route)).status]).toEqual([route, 200])
    expect(await (await fetch(`${base}/metrics`)).text()).toBe(awake)
    expect(await props()).toBe(true)
    // A request wakes it: loaded again, the same answer.
    expect(await answer()).toBe(first)
    expect(await props()).toBe(false)
    // And it sleeps again once idle; a token count wakes it too.
    expect(await eventually(props, 10_000)).toBe(true)
    const count = await (await fetch(`${base}/v1/chat/completions/input_tokens`, { method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }) })).json()
    expect(count.input_tokens).toBeGreaterThan(0)
    expect(await props()).toBe(false)
  } finally {
    await close(server)
  }
})

test('--host A,B: each address listened on, at the same port, served alike (the command line over LLAMA_ARG_HOST)', async () => {
  const net = require('node:net')
  const v6 = await new Promise((resolve) => {
    const probe = net.createServer().once('error', () => resolve(false))
    probe.listen(0, '::1', () => probe.close(() => resolve(true)))
  })
  if (!v6) return console.warn('skipped: no IPv6 loopback here')
  const srv = spawn(process.execPath, [CLI, 'serve', '-m', TARGET, '--port', '0', '-c', '512', '--host', '127.0.0.1,::1', '--api-key', 'k', '--isolation', 'none'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, LLAMA_ARG_HOST: '192.0.2.1' },
  })
  let log = ''
  srv.stderr.on('data', (d) => (log += d))
  try {
    expect(await until(() => /model loaded/.test(log), 60_000)).toBe(true)
    const [, v4, v6url] = /listening on (http:\/\/127\.0\.0\.1:\d+) and (http:\/\/\[::1\]:\d+),/.exec(log)
    expect(v4.split(':').at(-1)).toBe(v6url.split(':').at(-1))
    for (const base of [v4, v6url]) {
      expect((await fetch(`${base}/health`)).status).toBe(200)
      expect((await fetch(`${base}/v1/completions`, { method: 'POST', body: '{}' })).status).toBe(401)
      const res = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { authorization: 'Bearer k' }, body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 4 }) })
      expect(res.status).toBe(200)
    }
  } finally {
    srv.kill()
  }
})

test('--media-path: file:// image URLs read under the directory only (no .., no link out, no missing file); refused without it', async () => {
  const fs = require('node:fs')
  const os = require('node:os')
  const { serverMedia } = require('../server/media.js')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-media-'))
  const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-outside-'))
  try {
    fs.mkdirSync(path.join(dir, 'mtmd'))
    fs.writeFileSync(path.join(dir, 'mtmd', 'a.png'), Buffer.from([1, 2, 3]))
    fs.writeFileSync(path.join(outside, 'secret.png'), Buffer.from([9]))
    fs.symlinkSync(path.join(outside, 'secret.png'), path.join(dir, 'link.png'))
    const request = (url) => ({ messages: [{ role: 'user', content: [{ type: 'text', text: 'x' }, { type: 'image_url', image_url: { url } }] }] })
    const read = async (url, mediaPath = dir) => (await serverMedia(request(url), { mediaPath })).messages[0].content[1].image_url.url
    const refused = (url, mediaPath = dir) => serverMedia(request(url), { mediaPath }).then(() => 'read', (e) => `${e.status} ${e.message}`)
    expect(await read('file://mtmd/a.png')).toBe('data:image/png;base64,AQID')
    expect(await read('file:////mtmd//a.png')).toBe('data:image/png;base64,AQID')
    expect(await refused('file://../mtmd/a.png')).toMatch(/^400 .*not a file under the media directory/)
    expect(await refused(`file://${path.relative(dir, path.join(outside, 'secret.png'))}`)).toMatch(/^400 /)
    expect(await refused('file://link.png')).toMatch(/^400 .*not a file under the media directory/)
    expect(await refused('file://mtmd/none.png')).toMatch(/^400 .*no such file/)
    expect(await refused('file://mtmd')).toMatch(/^400 .*not a file/)
    expect(await refused('file://mtmd/a.png', null)).toMatch(/^400 .*serve --media-path/)
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
    fs.rmSync(outside, { recursive: true, force: true })
  }
})

// test:full (14 s: gemma's inspection and load).
fullTest('a model without a chat template chats in ChatML, as with llama-server', async () => {
  // gemma-3-270m's GGUF has no tokenizer.chat_template.
  const srv = spawn(process.execPath, [CLI, 'serve', '-m', GEMMA, '--port', '0', '-c', '512', '-np', '1', '--isolation', 'none'], { stdio: ['ignore', 'ignore', 'pipe'] })
  let log = ''
  srv.stderr.on('data', (d) => (log += d))
  try {
    expect(await until(() => /model loaded/.test(log), 60_000)).toBe(true)
    const base = `http://127.0.0.1:${/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log)[1]}`
    expect((await (await fetch(`${base}/props`)).json()).chat_template).toMatch(/<\|im_start\|>/)
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, verbose: true }),
    })
    expect(res.status).toBe(200)
    expect((await res.json()).__verbose.prompt).toBe('<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n')
  } finally {
    srv.kill()
  }
})

test("--slot-save-path: POST /slots/ID?action=save, restore and erase, as llama-server's; file names only; 501 without it", async () => {
  const fs = require('node:fs')
  const os = require('node:os')
  const { createServer } = require('../server')
  const { listen, close } = require('./server-helpers')
  const { LlamaEngine } = require('..')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-slots-'))
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 2 })
  const server = createServer({ engine, slotSavePath: dir, signals: false })
  const bare = createServer({ engine, signals: false })
  const base = await listen(server)
  const bareBase = await listen(bare)
  try {
    const post = (b, route, body) => fetch(b + route, { method: 'POST', body: body === undefined ? undefined : JSON.stringify(body) })
    const prompt = 'What is the capital of France? It is'
    const first = await (await post(base, '/completion', { prompt, id_slot: 1, n_predict: 4, temperature: 0 })).json()
    const held = engine.status().slots[1].cachedTokens
    expect(held).toBeGreaterThanOrEqual(first.tokens_evaluated)
    const saved = await (await post(base, '/slots/1?action=save', { filename: 'slot1.bin' })).json()
    expect(saved).toMatchObject({ id_slot: 1, filename: 'slot1.bin', n_saved: held, n_written: fs.statSync(path.join(dir, 'slot1.bin')).size, timings: { save_ms: expect.any(Number) } })
    const restored = await (await post(base, '/slots/0?action=restore', { filename: 'slot1.bin' })).json()
    expect(restored).toMatchObject({ id_slot: 0, filename: 'slot1.bin', n_restored: held, n_read: saved.n_written })
    // Slot 0 now holds it: only what differs is evaluated there.
    const again = await (await post(base, '/completion', { prompt, id_slot: 0, n_predict: 4, temperature: 0 })).json()
    expect(again.timings.cache_n).toBeGreaterThan(0)
    expect(again.content).toBe(first.content)
    expect(await (await post(base, '/slots/1?action=erase')).json()).toEqual({ id_slot: 1, n_erased: held })
    for (const [route, body, status] of [
      ['/slots/0?action=save', { filename: '../escape.bin' }, 400],
      ['/slots/0?action=save', { filename: 'a/b.bin' }, 400],
      ['/slots/0?action=restore', { filename: 'none.bin' }, 400],
      ['/slots/0?action=fly', { filename: 'x.bin' }, 400],
      ['/slots/x?action=save', { filename: 'x.bin' }, 400],
      ['/slots/9?action=save', { filename: 'x.bin' }, 400],
    ]) {
      expect([route, body, (await post(base, route, body)).status]).toEqual([route, body, status])
    }
    expect(fs.readdirSync(dir).sort()).toEqual(['slot1.bin'])
    expect((await post(bareBase, '/slots/0?action=erase')).status).toBe(501)
  } finally {
    await close(server)
    await close(bare)
    await engine.dispose()
    fs.rmSync(dir, { recursive: true, force: true })
  }
})
