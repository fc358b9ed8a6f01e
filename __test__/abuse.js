// The hostile suite a server must take without falling over: bad bodies of
// every protocol (broken JSON, wrong types, huge and deep values, invalid
// UTF-8), a flood of connections past the queue, and streams cut by their
// clients. `abuse(base)` runs it against a server and returns the statuses
// it got; nothing it sends may get a 5xx (429 past the queue is the answer).

const MODEL = 'local'
const big = (n) => 'word '.repeat(n / 5)
const user = (content) => [{ role: 'user', content }]

const ROUTES = [
  '/v1/chat/completions',
  '/v1/completions',
  '/completion',
  '/v1/responses',
  '/v1/messages',
  '/v1/messages/count_tokens',
  '/v1/embeddings',
  '/tokenize',
  '/detokenize',
  '/lora-adapters',
]

/** Bodies every route gets: broken, wrong or huge, as raw bytes. */
function rawBodies() {
  return [
    '',
    'null',
    '[]',
    '"a string"',
    '{',
    '{"messages": [',
    'x'.repeat(10_000),
    Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), // {"\xff\xfe":1}
    '['.repeat(100_000) + ']'.repeat(100_000),
    JSON.stringify({ messages: 'hello', prompt: {}, input: 7, content: [], tokens: 'abc' }),
    JSON.stringify({ model: MODEL, messages: [1, 2, 3], max_tokens: -1 }),
    JSON.stringify({ model: MODEL, messages: [{ role: 'alien', content: 'x' }] }),
    JSON.stringify({ model: MODEL, messages: user('\ud800 lone surrogate'), temperature: 'hot', stop: 1 }),
    JSON.stringify({ model: MODEL, prompt: big(1_000_000), input: big(1_000_000), content: big(1_000_000), max_tokens: 2, n_predict: 2 }),
    JSON.stringify({ model: MODEL, messages: Array.from({ length: 100_000 }, () => ({ role: 'user', content: 'hi' })), max_tokens: 2 }),
    JSON.stringify({ model: MODEL, messages: user(Array.from({ length: 10_000 }, () => ({ type: 'text', text: 'part' }))), max_tokens: 2 }),
    JSON.stringify({ model: MODEL, messages: user('hi'), tools: [{ type: 'function', function: { name: 'x'.repeat(100_000) } }] }),
    JSON.stringify({ model: MODEL, messages: user('hi'), tools: Array.from({ length: 2000 }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })), max_tokens: 2 }),
    JSON.stringify({ model: MODEL, prompt: 'x', n_predict: 2, logit_bias: Array.from({ length: 100_000 }, (_, i) => [i, -1]) }),
    JSON.stringify({ model: MODEL, prompt: 'x', n_predict: 2, n_probs: 1_000_000, max_tokens: 1e12 }),
    JSON.stringify({ model: MODEL, messages: user('hi'), max_tokens: 2, stream: true, temperature: -5, top_p: 7 }),
    JSON.stringify({ model: MODEL, input: Array.from({ length: 5000 }, () => 'text') }),
    JSON.stringify({ tokens: [-1, 1e12, 'a'] }),
    JSON.stringify({ tokens: Array.from({ length: 200_000 }, (_, i) => i % 1000) }),
  ]
}

async function post(base, route, body, headers = {}) {
  try {
    const res = await fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body })
    await res.arrayBuffer()
    return res.status
  } catch (e) {
    return `error: ${e.cause?.code || e.message}`
  }
}

/**
 * Runs the suite against `base` (the bad bodies on `routes`, every route
 * unless told); resolves with { statuses: Map<status,
 * count>, fiveHundreds: [route, body, status][] }.
 */
async function abuse(base, routes = ROUTES) {
  const statuses = new Map()
  const fiveHundreds = []
  const note = (route, what, status) => {
    statuses.set(status, (statuses.get(status) || 0) + 1)
    if (typeof status !== 'number' || (status >= 500 && status !== 503)) fiveHundreds.push([route, what, status])
  }
  // Bad bodies, every route, a few at a time.
  const bodies = rawBodies()
  for (const route of routes) {
    for (let i = 0; i < bodies.length; i += 4) {
      await Promise.all(bodies.slice(i, i + 4).map(async (b, j) => note(route, `body ${i + j}`, await post(base, route, b))))
    }
  }
  // A body over the limit.
  note('/v1/chat/completions', 'oversize', await post(base, '/v1/chat/completions', Buffer.alloc(17 * 1024 * 1024, 0x20)))
  // A flood: 120 connections at once, past the queue.
  const flood = await Promise.all(
    Array.from({ length: 120 }, (_, i) =>
      post(base, '/v1/chat/completions', JSON.stringify({ model: MODEL, messages: user(`Flood ${i}: say hi.`), max_tokens: 4, temperature: 0 })),
    ),
  )
  flood.forEach((s, i) => note('/v1/chat/completions', `flood ${i}`, s))
  // Streams cut by their clients after the first chunk, in waves.
  for (let wave = 0; wave < 6; wave++) {
    await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const ac = new AbortController()
        try {
          const res = await fetch(base + (i % 2 ? '/v1/messages' : '/v1/chat/completions'), {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: MODEL, messages: user(`Cut ${wave}.${i}: tell a long story.`), max_tokens: 500, stream: true }),
            signal: ac.signal,
          })
          note('stream', `cut ${wave}.${i}`, res.status)
          await res.body.getReader().read()
        } catch {}
        ac.abort()
      }),
    )
  }
  return { statuses, fiveHundreds }
}

module.exports = { abuse, ROUTES }
