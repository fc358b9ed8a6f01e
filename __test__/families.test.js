// The tool-call and reasoning formats of current model families, read by
// parseChatOutput as the engine reads its own answers: the cases of
// llama.cpp's tests/test-chat.cpp (ported by scripts/port-chat-cases.mjs
// into fixtures/chat-outputs.json: raw outputs and the message each must
// parse to), per template; and for each family, an answer streamed out of a
// real generation (SmolLM2 made to write it with a grammar) adds up to the
// one-shot reading.

const fs = require('node:fs')
const path = require('node:path')
const { fork } = require('node:child_process')
const { LlamaEngine, TARGET, FULL, tiers, matrix, run } = require('./helpers')

const FIXTURES = path.join(__dirname, 'fixtures')
const { cases, total } = JSON.parse(fs.readFileSync(path.join(FIXTURES, 'chat-outputs.json'), 'utf8'))
const template = (name) => fs.readFileSync(path.join(FIXTURES, 'chat-templates', name), 'utf8')

/** Arguments compared as JSON values (formatting aside), as test-chat.cpp does. */
const args = (text) => {
  try {
    return JSON.parse(text || '{}')
  } catch {
    return text
  }
}

function reading(out) {
  return {
    content: out.content,
    reasoning: out.reasoning_content ?? '',
    calls: (out.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: args(c.function.arguments) })),
  }
}

const expected = (e) => ({ content: e.content, reasoning: e.reasoning, calls: e.calls.map((c) => ({ name: c.name, arguments: args(c.arguments) })) })

// The families the issue names, one template each, for the streaming check.
// test:full adds one of each other reader (DeepSeek's, MiniMax's, Seed's,
// Command R's, functionary's); test:release every family the issue named.
const STREAMED = [
  'openai-gpt-oss-120b.jinja',
  'Qwen3-Coder.jinja',
  'GLM-4.7-Flash.jinja',
  ...tiers(
    [
      'deepseek-ai-DeepSeek-V3.2.jinja',
      'MiniMax-M2.jinja',
      'ByteDance-Seed-OSS.jinja',
      'CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja',
      'LFM2.5-8B-A1B.jinja',
      'Qwen3.5-4B.jinja',
      'NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja',
      'Kimi-K2-Thinking.jinja',
      'Apertus-8B-Instruct.jinja',
      'meetkai-functionary-medium-v3.2.jinja',
      'Spark2.5.jinja',
      'deepseek-ai-DeepSeek-V4.jinja',
      'MiniMax-M3.jinja',
      'NVIDIA-Nemotron-Nano-v2.jinja',
      'GigaChat3.1-10B-A1.8B.jinja',
    ],
    [
      'deepseek-ai-DeepSeek-V3.2.jinja',
      'MiniMax-M2.jinja',
      'ByteDance-Seed-OSS.jinja',
      'CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja',
      'meetkai-functionary-medium-v3.2.jinja',
    ],
    [],
  ),
]

// Cases read differently from llama.cpp's expectation, with the reason
// (docs/tools.md): template → the inputs' beginnings.
const KNOWN = {
  // Our own Hermes reader keeps the line break before `</think>`.
  'Reka-Edge.jinja': ["I'm\nthinking\n</think>", 'Hello, world!\nWhat'],
  // llama.cpp's parser leaves `<response>` (its test expects it removed).
  'ibm-granite-granite-3.3-2B-Instruct.jinja': ["<think>I'm\nthinking</think><response>"],
  // The template does not show tools: the model is given our preamble and syntax.
  'deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja': ['<｜tool▁calls▁begin｜>'],
  // The case expects the white space of an empty thought; we trim it.
  'Qwen3.5-4B.jinja': ['<think>\n\n</think>'],
  // The [CALL_ID] form is not derived from this template by llama.cpp's auto-parser.
  'Mistral-Small-3.2-24B-Instruct-2506.jinja': ['[TOOL_CALLS]special_function[CALL_ID]'],
}
const known = (name, input) => (KNOWN[name] ?? []).some((k) => input.startsWith(k))

test(`the ported cases: ${total} from test-chat.cpp`, () => {
  expect(total).toBeGreaterThan(100)
  const skipped = Object.entries(cases).reduce((n, [name, cs]) => n + cs.filter((c) => known(name, c.input)).length, 0)
  expect(skipped).toBeLessThanOrEqual(10)
})

// npm test reads a third of the templates' cases (each template is an engine
// to load) and every streamed one; test:full reads them all.
const PARSED = FULL ? Object.keys(cases) : Object.keys(cases).filter((name, i) => i % 3 === 0 || STREAMED.includes(name))

describe.each(PARSED)('%s', (name) => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1, chatTemplate: template(name) })
  })
  afterAll(() => engine?.dispose())

  test('every ported case parses to its message', () => {
    const wrong = []
    for (const c of cases[name]) {
      if (known(name, c.input)) continue
      const out = engine.parseChatOutput(c.input, {
        tools: c.tools.length ? c.tools : undefined,
        parallelToolCalls: c.parallel_tool_calls,
        chat_template_kwargs: { enable_thinking: c.enable_thinking },
        reasoning_format: c.reasoning_format,
      })
      const got = reading(out)
      const want = expected(c.expect)
      if (JSON.stringify(got) !== JSON.stringify(want)) wrong.push({ input: c.input, got, want })
    }
    expect(wrong).toEqual([])
  })

  if (STREAMED.includes(name)) {
    test('an answer streamed from a generation adds up to its one-shot reading', async () => {
      // The longest case with a call: the model is made to write it exactly
      // (a GBNF of its text; the family's calls bring no constraint).
      const c = [...cases[name]].filter((x) => x.expect.calls.length).sort((a, b) => b.input.length - a.input.length)[0] ?? cases[name][0]
      const gbnf = `root ::= ${JSON.stringify(c.input).replace(/\\u([0-9a-f]{4})/g, (_, h) => String.fromCodePoint(parseInt(h, 16)))}`
      const request = {
        messages: [{ role: 'user', content: 'Call the function.' }],
        tools: c.tools.length ? c.tools : undefined,
        parallel_tool_calls: c.parallel_tool_calls,
        chat_template_kwargs: { enable_thinking: c.enable_thinking },
        reasoning_format: c.reasoning_format,
        grammar: gbnf,
        temperature: 0,
        n_predict: 400,
      }
      let content = ''
      let reasoning = ''
      const calls = []
      const tokens = []
      const result = await engine.complete(request, (e) => {
        if (e.type !== 'token') return
        expect(e.content).not.toMatch(/<\|?(tool_call|function|channel|START_ACTION|｜)/)
        content += e.content
        reasoning += e.reasoning ?? ''
        tokens.push(...e.tokens.map((t) => t.id))
        for (const d of e.tool_calls ?? []) {
          if (d.index === calls.length) calls.push({ name: d.name, arguments: '' })
          calls[d.index].arguments += d.arguments ?? ''
        }
      })
      expect(engine.detokenize(tokens)).toBe(c.input)
      const options = { tools: request.tools, parallelToolCalls: c.parallel_tool_calls, chat_template_kwargs: request.chat_template_kwargs, reasoning_format: c.reasoning_format }
      const once = reading(engine.parseChatOutput(c.input, options))
      expect({ content, reasoning, calls: calls.map((x) => ({ name: x.name, arguments: args(x.arguments) })) }).toEqual(once)
      expect(reading(result)).toEqual(once)
      expect(result.stopped_tool_calls).toBe(true)
      expect(once.calls.length).toBeGreaterThan(0)
    })
  }
})

test('status() names the family read from each template', async () => {
  const names = {
    'openai-gpt-oss-120b.jinja': 'gpt-oss',
    'Qwen3-Coder.jinja': 'qwen3-coder',
    'GLM-4.6.jinja': 'glm',
    'deepseek-ai-DeepSeek-V3.2.jinja': 'deepseek-v3.2',
    'MiniMax-M2.jinja': 'minimax-m2',
    'ByteDance-Seed-OSS.jinja': 'seed-oss',
  }
  for (const [file, family] of Object.entries(FULL ? names : Object.fromEntries(Object.entries(names).slice(0, 3)))) {
    const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1, chatTemplate: template(file) })
    try {
      expect({ file, family: engine.status().toolCallFormat }).toEqual({ file, family })
      // The template shows the tools itself: no preamble of ours.
      const prompt = engine.applyChatTemplate([{ role: 'user', content: 'Hi' }], { tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather.', parameters: { type: 'object', properties: {} } } }] })
      expect(prompt).toContain('get_weather')
      expect(prompt).not.toContain('You can call the following tools')
    } finally {
      await engine.dispose()
    }
  }
})

// Hostile answers: read in bounded time and memory, in a child process so
// that a crash is seen as one; nothing printed.
test('hostile output: unterminated tags, deep nesting, many calls, broken UTF-8', async () => {
  const child = fork(path.join(FIXTURES, 'parse-child.js'), [], { stdio: ['ignore', 'pipe', 'pipe', 'ipc'] })
  let out = ''
  child.stdout.on('data', (d) => (out += d))
  child.stderr.on('data', (d) => (out += d))
  const results = await new Promise((resolve, reject) => {
    child.on('message', resolve)
    child.on('exit', (code, signal) => reject(new Error(`the child died: ${code ?? signal}: ${out}`)))
    child.send({ target: TARGET, templates: STREAMED.map((f) => template(f)) })
  })
  child.kill()
  expect(out).toBe('')
  expect(results.errors).toEqual([])
  expect(results.cases).toBeGreaterThan(40)
})

test('a GBNF grammar with tools: refused where the tools bring a constraint (our families), allowed where they do not', async () => {
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1 })
  try {
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }]
    await expect(engine.complete({ messages: [{ role: 'user', content: 'hi' }], tools, grammar: 'root ::= "a"', n_predict: 2 })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'grammar' })
    await expect(engine.complete({ messages: [{ role: 'user', content: 'hi' }], response_format: { type: 'json_object' }, grammar: 'root ::= "a"', n_predict: 2 })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'grammar' })
  } finally {
    await engine.dispose()
  }
})

// A required (or named) call is forced in the family's own syntax: llama.cpp's
// grammar for it, followed by llguidance. SmolLM2 knows none of these
// syntaxes; forced, it writes a call each family's reader reads back.
const weatherTool = {
  type: 'function',
  function: { name: 'get_weather', description: 'Get the weather in a city.', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
}
const timeTool = {
  type: 'function',
  function: { name: 'get_time', description: 'Get the time in a city.', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
}
// (Templates whose generation prompt opens thinking whatever is asked —
// MiniMax-M2, Kimi — or whose argument syntax SmolLM2 misspells forever
// are left out: forced, it thinks or writes until its budget ends.)
// test:full adds three more families' syntaxes; test:release all of them.
const CONSTRAINED = [
  ['Qwen3.5-4B.jinja', 'qwen3-coder'],
  ['GLM-4.6.jinja', 'glm'],
  ...tiers(
    [
      ['ByteDance-Seed-OSS.jinja', 'seed-oss'],
      ['LFM2.5-8B-A1B.jinja', 'lfm2'],
      ['Apertus-8B-Instruct.jinja', 'apertus'],
      ['meetkai-functionary-medium-v3.2.jinja', 'functionary'],
      ['fireworks-ai-llama-3-firefunction-v2.jinja', 'firefunction'],
      ['meetkai-functionary-medium-v3.1.jinja', 'functionary-v3.1'],
      ['tencent-Hy3.jinja', 'auto'],
      ['MiniMax-M1.jinja', 'auto'],
    ],
    [
      ['ByteDance-Seed-OSS.jinja', 'seed-oss'],
      ['meetkai-functionary-medium-v3.2.jinja', 'functionary'],
      ['tencent-Hy3.jinja', 'auto'],
    ],
    [],
  ),
]

describe.each(CONSTRAINED)('a required call with %s', (file, family) => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, parallel: 1, chatTemplate: template(file) })
  })
  afterAll(() => engine?.dispose())
  const ask = {
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    chat_template_kwargs: { enable_thinking: false },
    parallel_tool_calls: false,
    temperature: 0,
    n_predict: 120,
  }

  test(`is forced in ${family}'s syntax and read back`, async () => {
    expect(engine.status().toolCallFormat).toBe(family)
    const free = await engine.complete({ ...ask, tools: [weatherTool] })
    const forced = await engine.complete({ ...ask, tools: [weatherTool], tool_choice: 'required' })
    // Only the forced request is constrained (its grammar drafts).
    expect(free.speculative.drafters.grammar).toBeUndefined()
    expect(forced.speculative.drafters.grammar.n_drafted).toBeGreaterThan(0)
    expect(forced.tool_calls.length).toBeGreaterThan(0)
    for (const call of forced.tool_calls) {
      expect(call.function.name).toBe('get_weather')
      expect(typeof JSON.parse(call.function.arguments).city).toBe('string')
    }
    // Reasoning left in the content changes how the answer is read, not
    // what is forced (llama.cpp's grammar for it had no thinking block).
    const none = await engine.complete({ ...ask, tools: [weatherTool], tool_choice: 'required', reasoning_format: 'none' })
    expect(none.speculative.drafters.grammar.n_drafted).toBeGreaterThan(0)
    expect(none.tool_calls.map((c) => c.function)).toEqual(forced.tool_calls.map((c) => c.function))
  })

  test('cut by the token limit: stopped_limit, the call as far as the model wrote it, the deltas the same', async () => {
    // Where the call starts and ends in this machine's greedy answer, then
    // the same request cut half-way through its arguments.
    const trace = async (n_predict) => {
      let tokens = 0
      let announcedAt = null
      const deltas = []
      const r = await engine.complete({ ...ask, tools: [weatherTool], tool_choice: 'required', n_predict }, (ev) => {
        if (ev.type !== 'token') return
        tokens += ev.tokens.length
        if (ev.tool_calls?.length) {
          announcedAt ??= tokens
          deltas.push(...ev.tool_calls)
        }
      })
      const assembled = []
      for (const d of deltas) {
        assembled[d.index] ??= { id: '', name: '', arguments: '' }
        if (d.id) assembled[d.index].id = d.id
        if (d.name) assembled[d.index].name = d.name
        assembled[d.index].arguments += d.arguments ?? ''
      }
      return { r, tokens, announcedAt, assembled }
    }
    const whole = await trace(120)
    expect(whole.r.stopped_tool_calls).toBe(true)
    const n = Math.floor((whole.announcedAt + whole.tokens) / 2)
    expect(n).toBeLessThan(whole.tokens)
    const cut = await trace(n)
    expect(cut.r).toMatchObject({ stopped_limit: true, stopped_tool_calls: false, tokens_predicted: n })
    expect(cut.r.tool_calls).toHaveLength(1)
    const call = cut.r.tool_calls[0].function
    expect(call.name).toBe('get_weather')
    // The model's text so far: a beginning of the whole call's arguments (not JSON yet, perhaps).
    expect(whole.r.tool_calls[0].function.arguments.startsWith(call.arguments)).toBe(true)
    expect(cut.assembled).toEqual([{ id: cut.r.tool_calls[0].id, name: call.name, arguments: call.arguments }])
  })

  test('a named function is the one called', async () => {
    const r = await engine.complete({ ...ask, tools: [weatherTool, timeTool], tool_choice: { type: 'function', function: { name: 'get_time' } } })
    expect(r.tool_calls.length).toBeGreaterThan(0)
    expect(r.tool_calls.every((c) => c.function.name === 'get_time')).toBe(true)
  })
})

// A value of an XML-ish family ends at its first closing tag, with or
// without the line break llama.cpp's delimiter has before it: read so by
// parseChatOutput (and by the streamed reading, which is the same parser).
test('a value closed without its line break is read as closed (qwen3-coder, glm)', async () => {
  const cases = [
    ['Qwen3.5-4B.jinja', '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</parameter>\n</function>\n</tool_call>'],
    ['Qwen3-Coder.jinja', '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</parameter>\n</function>\n</tool_call>'],
    ['Qwen3-Coder.jinja', '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>'],
    ['GLM-4.6.jinja', '<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value></tool_call>'],
  ]
  for (const [file, text] of cases) {
    const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1, chatTemplate: template(file) })
    try {
      const out = engine.parseChatOutput(text, { tools: [weatherTool], chat_template_kwargs: { enable_thinking: false } })
      expect([file, out.tool_calls?.map((c) => [c.function.name, JSON.parse(c.function.arguments)])]).toEqual([file, [['get_weather', { city: 'Paris' }]]])
      expect(out.content).toBe('')
    } finally {
      await engine.dispose()
    }
  }
})

// Forced, SmolLM2 used to leave a qwen3-coder value unclosed and write
// "</function></tool_call>" and two more calls into it (only </parameter>
// ended a value): a value now holds no closing tag of its call.
test('a forced qwen3-coder call: no value swallows the end of its call or the calls after it', async () => {
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, parallel: 1, chatTemplate: template('Qwen3-Coder.jinja') })
  try {
    const r = await engine.complete({
      messages: [{ role: 'user', content: 'Weather for the city of Lyon?' }],
      tools: [weatherTool],
      tool_choice: 'required',
      temperature: 0,
      n_predict: 200,
    })
    expect(r.tool_calls.length).toBeGreaterThan(0)
    for (const call of r.tool_calls) {
      expect(call.function.name).toBe('get_weather')
      const { city } = JSON.parse(call.function.arguments)
      expect(city).not.toMatch(/<\/(function|tool_call|parameter)>|<tool_call>/)
    }
  } finally {
    await engine.dispose()
  }
})

// The grammar drafter on families that are not Hermes: what their call
// grammar forces is drafted, and the output is plain decoding's, token for
// token and probability for probability.
describe.each(matrix([['GLM-4.6.jinja'], ['deepseek-ai-DeepSeek-V3.2.jinja']], [['GLM-4.6.jinja']]))('the grammar drafter with %s', (file) => {
  test('greedy: identical to mode "off", and it drafts', async () => {
    const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, parallel: 1, chatTemplate: template(file) })
    try {
      const request = {
        messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
        tools: [weatherTool, timeTool],
        tool_choice: 'required',
        chat_template_kwargs: { enable_thinking: false },
        temperature: 0,
        n_probs: 3,
        n_predict: 96,
      }
      const trace = (r) => ({ ids: r.tokens.map((t) => t.id), probs: r.tokens.map((t) => t.probs), calls: r.result.tool_calls.map((c) => c.function) })
      const off = await run(engine, { ...request, speculative: { mode: 'off' } })
      const auto = await run(engine, { ...request, speculative: { mode: 'auto' } })
      expect(trace(auto)).toEqual(trace(off))
      expect(auto.result.speculative.drafters.grammar.n_accepted).toBeGreaterThan(0)
      expect(auto.tokens.filter((t) => t.source === 'grammar').length).toBe(auto.result.speculative.drafters.grammar.n_accepted)
      expect(off.result.tool_calls.length).toBeGreaterThan(0)
    } finally {
      await engine.dispose()
    }
  })
})

// reasoning_budget: at the budget the family's end of thinking is forced
// and the answer goes on. DeepSeek V3.1's template (read by our reader) and
// MiniMax M2's (read by llama.cpp's) open the thinking in the prompt.
describe.each([
  ['deepseek-ai-DeepSeek-V3.1.jinja', '</think>'],
  ['MiniMax-M2.jinja', '</think>'],
])('reasoning_budget with %s', (file, end) => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, parallel: 1, chatTemplate: template(file) })
  })
  afterAll(() => engine?.dispose())
  const ask = { messages: [{ role: 'user', content: 'Think about Paris, then answer.' }], temperature: 0, n_predict: 48 }

  test.each(FULL ? [0, 5, 12] : [0, 12])('a budget of %i tokens: that much thinking, then the end is forced and the answer goes on', async (budget) => {
    const { tokens, result } = await run(engine, { ...ask, reasoning_budget: budget })
    const ids = tokens.map((t) => t.id)
    const endIds = engine.tokenize(end, { special: true })
    expect(ids.slice(budget, budget + endIds.length)).toEqual(endIds)
    expect(result.reasoning_content ?? '').toBe(engine.detokenize(ids.slice(0, budget)).trim())
    expect(result.content.length).toBeGreaterThan(0)
  })

  test('no budget: the model thinks on; -1 is the same', async () => {
    const free = await run(engine, ask)
    const minusOne = await run(engine, { ...ask, reasoning_budget: -1 })
    expect(minusOne.tokens.map((t) => t.id)).toEqual(free.tokens.map((t) => t.id))
    expect(free.result.reasoning_content.length).toBeGreaterThan((await run(engine, { ...ask, reasoning_budget: 5 })).result.reasoning_content.length)
  })

  test('speculation changes nothing: the forced end is the same with drafts', async () => {
    for (const mode of ['auto', 'ngram']) {
      const off = await run(engine, { ...ask, reasoning_budget: 7, n_probs: 2, speculative: { mode: 'off' } })
      const on = await run(engine, { ...ask, reasoning_budget: 7, n_probs: 2, speculative: { mode, adaptive: false, n_max: 6 } })
      expect(on.tokens.map((t) => [t.id, t.probs])).toEqual(off.tokens.map((t) => [t.id, t.probs]))
    }
  })
})

test('reasoning_budget is checked, and needs messages', async () => {
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, parallel: 1 })
  try {
    for (const bad of [-2, 1.5, 'ten', 2 ** 31]) {
      await expect(engine.complete({ messages: [{ role: 'user', content: 'hi' }], reasoning_budget: bad, n_predict: 1 })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'reasoning_budget' })
    }
    await expect(engine.complete({ prompt: 'hi', reasoning_budget: 4, n_predict: 1 })).rejects.toMatchObject({ code: 'INVALID_REQUEST', field: 'reasoning_budget' })
  } finally {
    await engine.dispose()
  }
})
