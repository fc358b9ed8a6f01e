// Chat requests: `messages` rendered with the model's own Jinja chat template
// (or `chatTemplate` given at load), everything a prompt request does, the
// errors bad input gets, bounded hostile templates, multi-turn cache reuse.
const { LlamaEngine, GEMMA, TARGET, DRAFT, user, run } = require('./helpers')

// SmolLM2-135M-Instruct's GGUF template inserts this turn when the first
// message is not a system message.
const SMOL_SYSTEM = '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n'

// A template in gemma's turn format (gemma-3-270m's GGUF has none): BOS
// written by the template, the system message folded into the first user
// turn, roles other than user/assistant refused.
const GEMMA_TEMPLATE = `{{ bos_token }}
{%- set system = messages[0].content if messages[0].role == 'system' else '' %}
{% for m in messages if m.role != 'system' %}
{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('gemma turns are user or assistant, not ' ~ m.role) }}{% endif %}
<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}
{% if loop.first and system %}{{ system }}

{% endif %}{{ m.content | trim }}<end_of_turn>
{% endfor %}
{% if add_generation_prompt %}<start_of_turn>model
{% endif %}`

const joined = (events) => events.filter((e) => e.type === 'token').map((e) => e.content).join('')

describe('SmolLM2 with the template in its GGUF', () => {
  let engine
  beforeAll(async () => {
    engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: 2048, threads: 2 })
  })
  afterAll(() => engine.dispose())

  test('renders exactly as its Jinja says: a default system turn only when the first message is not a system message', () => {
    expect(engine.applyChatTemplate(user('Hi'))).toBe(`${SMOL_SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n`)
    const withSystem = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello.' }]
    expect(engine.applyChatTemplate(withSystem, { addGenerationPrompt: false })).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n',
    )
    // Text parts are joined; extra fields and roles pass through to the template.
    const parts = [{ role: 'user', content: [{ type: 'text', text: 'Hello, ' }, { type: 'text', text: 'world' }], name: 'ann' }]
    expect(engine.applyChatTemplate(parts)).toBe(`${SMOL_SYSTEM}<|im_start|>user\nHello, world<|im_end|>\n<|im_start|>assistant\n`)
    // Its template has no tool turn: tool results come as user turns (the generic tool format).
    expect(engine.applyChatTemplate([{ role: 'tool', content: '42' }], { addGenerationPrompt: false })).toBe(
      `${SMOL_SYSTEM}<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n`,
    )
    // With tools, the generic format's preamble is the system turn.
    const tools = [{ type: 'function', function: { name: 'add', description: 'Adds.', parameters: { type: 'object', properties: { a: { type: 'number' } } } } }]
    const withTools = engine.applyChatTemplate(parts, { tools })
    expect(withTools).toMatch(/^<\|im_start\|>system\n[^]*"name": ?"add"[^]*<\|im_end\|>\n<\|im_start\|>user\nHello, world/)
    expect(engine.applyChatTemplate(parts, { tools, tool_choice: 'none' })).toBe(engine.applyChatTemplate(parts))
    expect(() => engine.applyChatTemplate(parts, { tools: 5 })).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
    expect(() => engine.applyChatTemplate(parts, { temperature: 1 })).toThrow(/options\.temperature: not an option/)
  })

  test('messages evaluate what applyChatTemplate renders, and generation stops at the end of turn without leaking it', async () => {
    const messages = user('What is the capital of France? Answer in one word.')
    const rendered = engine.applyChatTemplate(messages)
    const viaMessages = await run(engine, { messages, n_predict: 64, temperature: 0, cache_prompt: false })
    const viaPrompt = await run(engine, { prompt: rendered, n_predict: 64, temperature: 0, cache_prompt: false })
    expect(viaMessages.result.content).toBe(viaPrompt.result.content)
    expect(viaMessages.result.tokens_evaluated).toBe(engine.tokenize(rendered, { special: true }).length)
    expect(viaMessages.result.stopped_eos).toBe(true)
    expect(viaMessages.result.content).toMatch(/Paris/)
    expect(viaMessages.result.content).not.toMatch(/<\|im_(end|start)\|>/)
    expect(joined(viaMessages.events)).toBe(viaMessages.result.content)
    // Even when the end-of-turn token is the very first one generated.
    const eot = engine.tokenize('<|im_end|>', { special: true })[0]
    const forced = await run(engine, { messages, n_predict: 8, temperature: 0, logit_bias: [[eot, 100]] })
    expect(forced.result).toMatchObject({ content: '', stopped_eos: true, tokens_predicted: 0 })
  })

  test('everything a prompt request does works with messages: speculation, grammar, json_schema, stop, seed, events, abort', async () => {
    const messages = user('Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.')
    const base = { messages, n_predict: 40, temperature: 0, n_probs: 2 }
    const off = await run(engine, { ...base, speculative: { mode: 'off' } })
    for (const speculative of [{ mode: 'ngram', adaptive: false, n_max: 8 }, { mode: 'draft', adaptive: false, n_max: 4, p_min: 0 }, { mode: 'auto' }]) {
      const r = await run(engine, { ...base, speculative })
      expect({ speculative, probs: r.result.completion_probabilities }).toEqual({ speculative, probs: off.result.completion_probabilities })
    }
    const g = await run(engine, { messages: user('Is the sky blue?'), n_predict: 8, temperature: 0, grammar: 'root ::= ("yes" | "no") "."' })
    expect(['yes.', 'no.']).toContain(g.result.content)
    const schema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }
    const j = await run(engine, { messages: user('Name a city as JSON.'), n_predict: 64, temperature: 0, json_schema: schema })
    expect(typeof JSON.parse(j.result.content).city).toBe('string')
    const s = await run(engine, { ...base, stop: ['lazy'] })
    expect(s.result.stopped_word).toBe(true)
    expect(s.result.content).not.toMatch(/lazy/)
    const sampled = { messages: user('Write a word.'), n_predict: 12, temperature: 1, seed: 99 }
    expect((await run(engine, sampled)).result.content).toBe((await run(engine, sampled)).result.content)
    const ac = new AbortController()
    const aborted = await engine.complete({ messages: user('Tell me a long story.'), n_predict: 500, ignore_eos: true }, (e) => {
      if (e.type === 'token') ac.abort()
    }, ac.signal)
    expect(aborted.stopped_abort).toBe(true)
  })

  test('a second turn reuses the KV cache of the whole first turn, and n-gram drafting sees it', async () => {
    const first = user('Describe a lighthouse in two sentences.')
    const r1 = await engine.complete({ messages: first, n_predict: 80, temperature: 0, speculative: { mode: 'off' } })
    expect(r1.stopped_eos).toBe(true)
    const second = [...first, { role: 'assistant', content: r1.content }, { role: 'user', content: 'Repeat your answer word for word.' }]
    const r2 = await engine.complete({ messages: second, n_predict: 80, temperature: 0, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } })
    // The first turn's prompt and answer (all but at most the last token,
    // which re-tokenizes with what follows it) come from the cache.
    expect(r2.tokens_cached).toBeGreaterThanOrEqual(r1.tokens_evaluated + r1.tokens_predicted - 1)
    expect(r2.tokens_cached).toBeLessThan(r2.tokens_evaluated)
    expect(r2.speculative.n_accepted).toBeGreaterThan(10)
  })

  test('bad messages are INVALID_REQUEST naming the field', async () => {
    const cases = [
      [{ messages: 'hi' }, /^messages: expected an array/],
      [{ messages: [] }, /^messages: must contain/],
      [{ messages: [{ role: 'user' }] }, /^messages\[0\]\.content: required/],
      [{ messages: [{ role: 'user', content: 7 }] }, /^messages\[0\]\.content: expected a string or an array/],
      [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, /^messages\[0\]\.content\[0\]\.image_url\.url: expected a data: URL/],
      [{ messages: [{ role: 'user', content: [{ type: 'video', data: 'x' }] }] }, /^messages\[0\]\.content\[0\]\.type: expected "text", "image"/],
      [{ messages: [{ content: 'x' }] }, /^messages\[0\]\.role: required/],
      [{ prompt: 'x', messages: user('x') }, /^messages: give either prompt or messages/],
    ]
    for (const [request, message] of cases) {
      const err = await engine.complete(request).catch((e) => e)
      expect({ request, code: err.code, message: err.message }).toEqual({ request, code: 'INVALID_REQUEST', message: expect.stringMatching(message) })
    }
    expect(() => engine.applyChatTemplate({ role: 'user' })).toThrow(expect.objectContaining({ code: 'INVALID_REQUEST' }))
    expect(() => engine.applyChatTemplate(user('x'), { addGenerationPrompt: 'yes' })).toThrow(/addGenerationPrompt/)
    expect((await engine.complete({ messages: user('Hi'), n_predict: 4, temperature: 0 })).tokens_predicted).toBe(4)
  })
})

describe('chatTemplate at load', () => {
  test('overrides the GGUF (gemma, which has none): BOS written once, end of turn never in the text', async () => {
    const e = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 1024, threads: 2, chatTemplate: GEMMA_TEMPLATE })
    try {
      const messages = [{ role: 'system', content: 'Answer in one word.' }, { role: 'user', content: 'What colour is the sky?' }]
      const rendered = e.applyChatTemplate(messages)
      expect(rendered).toBe('<bos><start_of_turn>user\nAnswer in one word.\n\nWhat colour is the sky?<end_of_turn>\n<start_of_turn>model\n')
      const r = await e.complete({ messages, n_predict: 8, temperature: 0 })
      // The template wrote <bos>: tokenized with special tokens, no second BOS.
      const ids = e.tokenize(rendered, { special: true })
      expect(ids.filter((t) => t === ids[0])).toHaveLength(1)
      expect(r.tokens_evaluated).toBe(ids.length)
      const eot = e.tokenize('<end_of_turn>', { special: true })
      expect(eot).toHaveLength(1)
      const forced = await e.complete({ messages, n_predict: 8, temperature: 0, logit_bias: [[eot[0], 100]] })
      expect(forced).toMatchObject({ content: '', stopped_eos: true })
      // A template that knows no tool role gets tool results as user turns
      // (the generic tool-calling fallback), not its exception.
      expect(e.applyChatTemplate([{ role: 'tool', tool_call_id: 'a', content: 'x' }])).toBe(
        '<bos><start_of_turn>user\n<tool_response>\nx\n</tool_response><end_of_turn>\n<start_of_turn>model\n',
      )
      // Its own exception for what it refuses.
      const strict = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 256, threads: 2, chatTemplate: GEMMA_TEMPLATE.replace("['user', 'assistant']", "['user']") })
      // (A last assistant message would be continued, not rendered: one in the middle.)
      await expect(strict.complete({ messages: [{ role: 'user', content: 'x' }, { role: 'assistant', content: 'y' }, { role: 'user', content: 'z' }] })).rejects.toMatchObject({
        code: 'INVALID_REQUEST',
        message: 'messages: the chat template rejected them: gemma turns are user or assistant, not assistant',
      })
      await strict.dispose()
      // A role no chat has is refused before any template sees it.
      await expect(e.complete({ messages: [{ role: 'robot', content: 'x' }] })).rejects.toMatchObject({
        code: 'INVALID_REQUEST',
        message: expect.stringMatching(/^messages\[0\]\.role: expected "system", "user", "assistant" or "tool", got "robot"/),
      })
      // A template without {{ bos_token }} gets the model's BOS added.
      const plain = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 256, threads: 2, chatTemplate: '{% for m in messages %}{{ m.content }}{% endfor %}' })
      const p = await plain.complete({ messages: user('Hello there'), n_predict: 1, temperature: 0 })
      expect(p.tokens_evaluated).toBe(plain.tokenize('Hello there', { addBos: true }).length)
      await plain.dispose()
    } finally {
      await e.dispose()
    }
  })

  test('a model without a chat template says so and names the option', async () => {
    const e = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 256, threads: 2 })
    try {
      await expect(e.complete({ messages: user('Hi') })).rejects.toMatchObject({
        code: 'INVALID_REQUEST',
        message: expect.stringMatching(/^messages: this model has no chat template .*chatTemplate/),
      })
      expect(() => e.applyChatTemplate(user('Hi'))).toThrow(/chatTemplate/)
      expect((await e.complete({ prompt: 'Hi', n_predict: 2 })).tokens_predicted).toBe(2)
    } finally {
      await e.dispose()
    }
  })

  test('a template that does not parse rejects load naming chatTemplate', async () => {
    for (const chatTemplate of ['{% for m in messages %}{{ m.content }}', '{{ messages[0', 42]) {
      await expect(LlamaEngine.load({ modelPath: TARGET, contextSize: 256, chatTemplate })).rejects.toMatchObject({
        code: 'INVALID_REQUEST',
        message: expect.stringMatching(/^chatTemplate: /),
      })
    }
  })

  test('hostile templates are bounded: an endless loop and a flood of output are errors, and the engine goes on', async () => {
    const loop = await LlamaEngine.load({
      modelPath: TARGET,
      contextSize: 256,
      threads: 2,
      chatTemplate: '{% for i in range(100000) %}{% for j in range(100000) %}{{ "" }}{% endfor %}{% endfor %}',
    })
    await expect(loop.complete({ messages: user('x') })).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^messages: .*ran for more than/) })
    expect(() => loop.applyChatTemplate(user('x'))).toThrow(/ran for more than/)
    expect((await loop.complete({ prompt: 'Hi', n_predict: 2 })).tokens_predicted).toBe(2)
    await loop.dispose()
    const flood = await LlamaEngine.load({ modelPath: TARGET, contextSize: 256, threads: 2, chatTemplate: '{% for i in range(1000) %}{{ "x" * 100000 }}{% endfor %}' })
    await expect(flood.complete({ messages: user('x') })).rejects.toMatchObject({ code: 'INVALID_REQUEST', message: expect.stringMatching(/wrote more than/) })
    await flood.dispose()
    const raising = await LlamaEngine.load({ modelPath: TARGET, contextSize: 256, threads: 2, chatTemplate: "{{ raise_exception('no chats today') }}" })
    await expect(raising.complete({ messages: user('x') })).rejects.toMatchObject({ message: 'messages: the chat template rejected them: no chats today' })
    await raising.dispose()
  })
})
