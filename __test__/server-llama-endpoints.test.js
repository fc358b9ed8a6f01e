// llama.cpp's introspection endpoints on the package's server, over the
// real model: GET /props, GET /slots, GET|POST /lora-adapters (llama.cpp's
// shapes), and the LoRA scales POST /lora-adapters sets reaching every
// protocol's requests.
const path = require('node:path')
const { requestFields } = require('..')
const { createServer } = require('../server')
const { loadTarget } = require('./helpers')
const { listen, close, until } = require('./server-helpers')

const PARALLEL = 2

const post = (base, route, body) =>
  fetch(base + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })
const get = async (base, route) => {
  const res = await fetch(base + route)
  return { status: res.status, body: await res.json() }
}

let engine
let server
let base
beforeAll(async () => {
  engine = await loadTarget({ contextSize: 1024, parallel: PARALLEL })
  server = createServer({ engine, signals: false })
  base = await listen(server)
})
afterAll(async () => {
  if (server) await close(server)
  if (engine) await engine.dispose()
})

// The engine's default of a request field (what a request without it gets).
const fieldDefault = (name) => requestFields.find((f) => f.name === name).default

describe('GET /props', () => {
  test("llama.cpp's fields, from the engine's status and the model file", async () => {
    const { status, body } = await get(base, '/props')
    expect(status).toBe(200)
    const st = engine.status()
    expect(body.default_generation_settings.n_ctx).toBe(st.contextSize)
    expect(body.total_slots).toBe(st.parallel)
    expect(body.total_slots).toBe(PARALLEL)
    expect(body.model_alias).toBe(st.model)
    expect(typeof body.model_path).toBe('string')
    expect(path.basename(body.model_path)).toBe(st.model)
    // SmolLM2's GGUF has a ChatML template.
    expect(typeof body.chat_template).toBe('string')
    expect(body.chat_template).toContain('<|im_start|>')
    expect(body.bos_token).toBe('<|im_start|>')
    expect(body.eos_token).toBe('<|im_end|>')
    expect(body.build_info).toMatch(/^b[\d.]+-llama-engine-\d+\.\d+\.\d+/)
    expect(body.modalities).toEqual({ vision: false, audio: false })
    expect(body).toMatchObject({ endpoint_slots: true, endpoint_props: false, endpoint_metrics: true })

    const params = body.default_generation_settings.params
    for (const name of ['temperature', 'top_k', 'top_p', 'min_p', 'n_predict', 'seed', 'repeat_penalty', 'repeat_last_n', 'presence_penalty', 'frequency_penalty']) {
      expect({ name, value: params[name] }).toEqual({ name, value: fieldDefault(name) })
      expect(typeof params[name]).toBe('number')
    }
    expect(params.stop).toEqual([])
    expect(params.lora).toEqual([])
  })

  test('other methods are 405; a path beside it is 404', async () => {
    expect((await post(base, '/props', {})).status).toBe(405)
    expect((await fetch(`${base}/slots`, { method: 'DELETE' })).status).toBe(405)
    expect((await fetch(`${base}/props/x`)).status).toBe(404)
  })
})

describe('GET /slots', () => {
  const slotShape = (slot) => {
    expect(slot).toEqual(
      expect.objectContaining({
        id: expect.any(Number),
        id_task: expect.any(Number),
        n_ctx: engine.status().contextSize,
        speculative: false,
        is_processing: expect.any(Boolean),
        params: expect.objectContaining({ temperature: fieldDefault('temperature') }),
      }),
    )
    expect(slot.next_token).toEqual([
      { has_next_token: expect.any(Boolean), has_new_line: expect.any(Boolean), n_remain: expect.any(Number), n_decoded: expect.any(Number) },
    ])
    // The prompt's text is never shown.
    expect(slot).not.toHaveProperty('prompt')
    expect(slot).not.toHaveProperty('generated')
  }

  test('idle: one entry per slot, none processing', async () => {
    await until(() => engine.status().active === 0, 10_000)
    const { status, body } = await get(base, '/slots')
    expect(status).toBe(200)
    expect(body.map((s) => s.id)).toEqual([0, 1])
    for (const slot of body) {
      slotShape(slot)
      expect(slot.is_processing).toBe(false)
    }
    // llama.cpp's ?fail_on_no_slot=1: 503 only when every slot is busy.
    expect((await fetch(`${base}/slots?fail_on_no_slot=1`)).status).toBe(200)
  })

  test('during a streamed request: one busy slot, its n_decoded growing', async () => {
    const ac = new AbortController()
    const res = await fetch(`${base}/completion`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once upon a time', n_predict: 400, ignore_eos: true, temperature: 0, stream: true }),
      signal: ac.signal,
    })
    expect(res.status).toBe(200)
    const reader = res.body.getReader()
    const decoder = new TextDecoder()
    let tokens = 0
    const readTokens = async (n) => {
      while (tokens < n) {
        const { value, done } = await reader.read()
        if (done) throw new Error(`the stream ended after ${tokens} token events`)
        tokens += (decoder.decode(value, { stream: true }).match(/^data: /gm) ?? []).length
      }
    }
    try {
      await readTokens(4)
      const first = (await get(base, '/slots')).body
      await readTokens(40)
      const second = (await get(base, '/slots')).body
      for (const slot of [...first, ...second]) slotShape(slot)
      expect(first.filter((s) => s.is_processing)).toHaveLength(1)
      expect(second.filter((s) => s.is_processing)).toHaveLength(1)
      const busy1 = first.find((s) => s.is_processing)
      const busy2 = second.find((s) => s.is_processing)
      expect(busy2.id).toBe(busy1.id)
      expect(busy1.next_token[0].n_decoded).toBeGreaterThan(0)
      expect(busy2.next_token[0].n_decoded).toBeGreaterThan(busy1.next_token[0].n_decoded)
      expect(busy1.next_token[0].has_next_token).toBe(true)
      expect(busy1.n_prompt_tokens).toBeGreaterThan(0)
      expect(busy1.id_task).toBeGreaterThanOrEqual(0)
    } finally {
      ac.abort()
      await reader.cancel().catch(() => {})
      await until(() => engine.status().active === 0, 10_000)
    }
  })
})

describe('/lora-adapters', () => {
  test('GET on an engine without adapters is []', async () => {
    expect(await get(base, '/lora-adapters')).toEqual({ status: 200, body: [] })
  })

  test('POST: an unknown id or a body that is not an array is a 400 in the error shape; [] is fine', async () => {
    const unknown = await post(base, '/lora-adapters', [{ id: 0, scale: 1 }])
    expect(unknown.status).toBe(400)
    expect(await unknown.json()).toEqual({
      error: { message: expect.stringContaining('no LoRA adapter has id 0'), type: 'invalid_request_error', param: '[0].id', code: 'INVALID_REQUEST' },
    })
    const notArray = await post(base, '/lora-adapters', { id: 0, scale: 1 })
    expect(notArray.status).toBe(400)
    expect((await notArray.json()).error.message).toMatch(/expected an array/)
    const empty = await post(base, '/lora-adapters', [])
    expect(empty.status).toBe(200)
    expect(await empty.json()).toEqual({ success: true })
    expect((await get(base, '/lora-adapters')).body).toEqual([])
  })

  // The engine as the server sees it, with two adapters in its status: the
  // requests the server hands it are recorded, then run without `lora` (the
  // real engine has no adapters).
  describe('the scales POST sets reach every protocol', () => {
    const LORAS = [
      { id: 0, path: '/adapters/a.gguf', scale: 1 },
      { id: 1, path: '/adapters/b.gguf', scale: 0.5 },
    ]
    let seen
    let spyServer
    let spyBase
    beforeAll(async () => {
      seen = []
      const spy = {
        status: () => ({ ...engine.status(), loras: LORAS }),
        complete(request, onEvent, signal) {
          seen.push(request)
          const { lora, ...rest } = request
          return engine.complete(rest, onEvent, signal)
        },
      }
      spyServer = createServer({ engine: spy, signals: false })
      spyBase = await listen(spyServer)
    })
    afterAll(async () => {
      if (spyServer) await close(spyServer)
    })

    const requests = [
      ['/completion', { prompt: 'Hi', n_predict: 2 }],
      ['/v1/completions', { prompt: 'Hi', max_tokens: 2 }],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }],
      ['/v1/responses', { input: 'Hi', max_output_tokens: 2 }],
      ['/v1/messages', { model: 'm', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }],
    ]
    const runAll = async () => {
      seen.length = 0
      for (const [route, body] of requests) {
        const res = await post(spyBase, route, body)
        expect({ route, status: res.status }).toEqual({ route, status: 200 })
        await res.arrayBuffer()
      }
      return seen.map((r) => r.lora)
    }

    test('before any POST, requests are left alone (the load scales apply)', async () => {
      expect(await runAll()).toEqual(requests.map(() => undefined))
      expect((await get(spyBase, '/lora-adapters')).body).toEqual(LORAS)
    })

    test('POST validates ids and scales', async () => {
      for (const [body, param] of [
        [[{ id: 2, scale: 1 }], '[0].id'],
        [[{ id: 0, scale: 1 }, { id: -1, scale: 1 }], '[1].id'],
        [[{ id: '0', scale: 1 }], '[0].id'],
        ['[{"id": 0, "scale": 1e999}]', '[0].scale'],
        [[{ id: 0, scale: '1' }], '[0].scale'],
        [[{ id: 0 }], '[0].scale'],
        [[{ id: 0, scale: 1000 }], '[0].scale'],
        [[7], '[0]'],
      ]) {
        const res = await post(spyBase, '/lora-adapters', body)
        expect({ body, status: res.status }).toEqual({ body, status: 400 })
        expect((await res.json()).error).toMatchObject({ type: 'invalid_request_error', param })
      }
      // Nothing was set by the refused ones.
      expect((await get(spyBase, '/lora-adapters')).body).toEqual(LORAS)
    })

    test('after POST: adapters not listed are 0, every request without `lora` gets the scales', async () => {
      const res = await post(spyBase, '/lora-adapters', [{ id: 1, scale: 0.25 }])
      expect(res.status).toBe(200)
      expect(await res.json()).toEqual({ success: true })
      const scales = [
        { id: 0, scale: 0 },
        { id: 1, scale: 0.25 },
      ]
      expect((await get(spyBase, '/lora-adapters')).body).toEqual([
        { id: 0, path: '/adapters/a.gguf', scale: 0 },
        { id: 1, path: '/adapters/b.gguf', scale: 0.25 },
      ])
      expect(await runAll()).toEqual(requests.map(() => scales))
      expect((await get(spyBase, '/props')).body.default_generation_settings.params.lora).toEqual(scales)
      expect((await get(spyBase, '/slots')).body[0].params.lora).toEqual(scales)
    })

    test("a request's own `lora` goes to the engine untouched", async () => {
      const own = [{ id: 0, scale: 0.75 }]
      seen.length = 0
      for (const [route, body] of requests) {
        const res = await post(spyBase, route, { ...body, lora: own })
        expect({ route, status: res.status }).toEqual({ route, status: 200 })
        await res.arrayBuffer()
      }
      expect(seen.map((r) => r.lora)).toEqual(requests.map(() => own))
    })
  })
})

test('/metrics counts the new endpoints', async () => {
  const text = await (await fetch(`${base}/metrics`)).text()
  for (const endpoint of ['/props', '/slots', '/lora-adapters']) {
    expect(text).toMatch(new RegExp(`llama_engine_http_requests_total\\{endpoint="${endpoint}",status="200"\\} [1-9]`))
  }
  expect(text).toMatch(/llama_engine_http_requests_total\{endpoint="\/lora-adapters",status="400"\} [1-9]/)
  expect(text).toMatch(/llama_engine_http_requests_total\{endpoint="\/props",status="405"\} 1/)
})
