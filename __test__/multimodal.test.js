// Images in (issue "images and audio in"): the tiny random-weight gemma3
// projector `npm run models` writes for the real gemma-3-270m text model
// (scripts/mm-fixtures.mjs), checked against llama.cpp's own reference
// program, llama-mtmd-cli built from the vendored sources
// (scripts/mtmd-cli.mjs): the same greedy text for the same model,
// projector, image and prompt. Then the engine's guarantees with an image
// in the prompt: beside text requests in other slots, the same bits as
// alone; a second question about the same image prefills only the question
// and encodes nothing; speculation identical to `off`; every API of the
// server with the official clients; refusals with their cause for a
// text-only engine, another model's projector, damaged and hostile files
// (fuzzed in a child process).
const { execFile, execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { LlamaEngine, GEMMA, TARGET, FULL, model, tiers } = require('./helpers')
const { importEsm, listen, close } = require('./server-helpers')
const { createServer } = require('../server')

const MMPROJ = model('gemma-3-270m.mmproj-test.gguf')
const AUDIO_MMPROJ = model('gemma-3-270m.mmproj-audio-test.gguf')
const ROOT = path.join(__dirname, '..')
// The gemma-3-270m fixture has no chat template: llama.cpp's built-in
// `gemma` one (what mtmd-cli --chat-template gemma renders), in Jinja.
const GEMMA_TEMPLATE =
  "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n" +
  '{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}'
const QUESTION = 'Describe the image.'

// mtmd-cli is built for this machine's CPU class: on a forced other
// variant (npm run test:variant) its text is not what that variant owes.
// Against llama.cpp's mtmd-cli: test:full (7 s each), never on a forced variant.
const againstCli = process.env.LLAMA_ENGINE_CPU_VARIANT || !FULL ? test.skip : test
// What npm test leaves to npm run test:full (which CI runs): its 10 minutes.
const fullTest = FULL ? test : test.skip
const trace = (r) => JSON.stringify({ content: r.content, probs: r.completion_probabilities })
const ask = (image, extra = {}) => ({
  messages: [{ role: 'user', content: [{ type: 'image', data: image }, { type: 'text', text: QUESTION }] }],
  n_predict: 16,
  temperature: 0,
  n_probs: 3,
  ...extra,
})

let png // (w, h, seed) -> a deterministic PNG
let images // two test images, as llama.cpp's CLI reads them from files
let engine
let tmp
beforeAll(async () => {
  ;({ pngBytes: png } = await importEsm(path.join(ROOT, 'scripts', 'mm-fixtures.mjs')))
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-mm-'))
  images = [1, 2].map((seed) => {
    const file = path.join(tmp, `image-${seed}.png`)
    fs.writeFileSync(file, png(64, 64, seed))
    return { file, bytes: fs.readFileSync(file) }
  })
  engine = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 3 })
}, 120_000)
afterAll(async () => {
  await engine?.dispose()
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true })
})

test('status().media says what the projector reads; a text-only engine says null', async () => {
  expect(engine.status().media).toEqual({ vision: true, audio: false })
  const text = await LlamaEngine.load({ modelPath: TARGET, contextSize: 256, parallel: 1 })
  try {
    expect(text.status().media).toBeNull()
    // An image for an engine without a projector: refused by name, with the fix.
    const e = await text.complete(ask(images[0].bytes)).catch((e) => e)
    expect(e.code).toBe('INVALID_REQUEST')
    expect(e.message).toMatch(/^messages\[0\]\.content\[0\]: .*reads text only: load the engine with mmprojPath/)
  } finally {
    await text.dispose()
  }
})

againstCli("the same greedy text as llama.cpp's mtmd-cli for the same model, projector, image and prompt", async () => {
  const cli = execFileSync(process.execPath, [path.join(ROOT, 'scripts', 'mtmd-cli.mjs')], { encoding: 'utf8' }).trim()
  const outputs = []
  // And a baseline JPEG (of a third picture): the decoder path of photos.
  const { jpegBytes } = await importEsm(path.join(ROOT, 'scripts', 'mm-fixtures.mjs'))
  const photo = { file: path.join(tmp, 'photo.jpg'), bytes: jpegBytes(80, 56, 3) }
  fs.writeFileSync(photo.file, photo.bytes)
  for (const image of [...images, photo]) {
    // --no-repack: llama.cpp's AMX buffers (which the engine keeps off)
    // crash on this CPU class; the weights' bits are the same.
    const out = await new Promise((resolve, reject) =>
      execFile(
        cli,
        ['-m', GEMMA, '--mmproj', MMPROJ, '--image', image.file, '-p', QUESTION, '-n', '16', '--temp', '0', '--seed', '42', '-t', '2', '--no-repack', '--chat-template', 'gemma'],
        { encoding: 'utf8', maxBuffer: 1 << 24 },
        (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr.slice(-2000)}`)) : resolve(stdout)),
      ),
    )
    // mtmd-cli writes a newline before the generated text, two after it.
    const theirs = out.replace(/^\n/, '').replace(/\n\n$/, '')
    const ours = await engine.complete(ask(image.bytes, { n_probs: 0 }))
    expect(ours.tokens_predicted).toBe(16)
    expect(ours.content).toBe(theirs)
    outputs.push(ours.content)
  }
  // The image matters: the answers differ.
  expect(new Set(outputs).size).toBe(3)
}, 120_000)

// test:full only: npm test stays under its 10 minutes (CI runs it).
;(FULL ? test : test.skip)('an image request beside text requests: each the same bits as alone', async () => {
  const fresh = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 1 })
  const text = { messages: [{ role: 'user', content: 'Write a haiku about the sea.' }], n_predict: 24, temperature: 0, n_probs: 3 }
  let alone
  try {
    alone = { a: trace(await fresh.complete(ask(images[0].bytes))), b: trace(await fresh.complete(ask(images[1].bytes))) }
    alone.text = trace(await fresh.complete({ ...text, cache_prompt: false }))
  } finally {
    await fresh.dispose()
  }
  const together = await Promise.all([
    engine.complete({ ...text, cache_prompt: false }),
    engine.complete(ask(images[0].bytes, { cache_prompt: false })),
    engine.complete(ask(images[1].bytes, { cache_prompt: false })),
  ])
  expect(trace(together[0])).toBe(alone.text)
  expect(trace(together[1])).toBe(alone.a)
  expect(trace(together[2])).toBe(alone.b)
  expect(alone.a).not.toBe(alone.b)
}, 120_000)

test('a second question about the same image prefills only the question and encodes nothing', async () => {
  const first = await engine.complete(ask(images[0].bytes, { n_predict: 8 }))
  expect(first.timings.media_n).toBe(1)
  const follow = {
    messages: [
      { role: 'user', content: [{ type: 'image', data: images[0].bytes }, { type: 'text', text: QUESTION }] },
      { role: 'assistant', content: first.content },
      { role: 'user', content: 'What colour is it?' },
    ],
    n_predict: 8,
    temperature: 0,
    n_probs: 3,
  }
  const again = await engine.complete(follow)
  // The image's 16 tokens and the first turn came from the slot's cells.
  expect(again.tokens_cached).toBeGreaterThan(16)
  expect(again.timings.media_encode_ms).toBe(0)
  expect(again.timings.media_decode_ms).toBe(0)
  // The same bits as a fresh engine that computes everything.
  const fresh = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 1 })
  try {
    const cold = await fresh.complete(follow)
    expect(cold.tokens_cached).toBe(0)
    expect(cold.timings.media_encode_ms).toBeGreaterThan(0)
    expect(trace(again)).toBe(trace(cold))
    // Another image is not taken for the first: it is computed (only the
    // text before it, at most, comes from a slot).
    const other = await engine.complete(ask(png(64, 64, 3), { n_predict: 8 }))
    expect(other.tokens_cached).toBeLessThan(16)
    expect(other.timings.media_encode_ms).toBeGreaterThan(0)
  } finally {
    await fresh.dispose()
  }
}, 120_000)

test('speculation with an image in the prompt gives the same tokens and probabilities as off', async () => {
  const off = trace(await engine.complete(ask(images[1].bytes, { n_predict: 24, speculative: { mode: 'off' } })))
  for (const mode of ['ngram', 'auto']) {
    const r = await engine.complete(ask(images[1].bytes, { n_predict: 24, speculative: { mode, n_max: 8, n_min: 1, adaptive: false } }))
    expect(trace(r)).toBe(off)
  }
}, 120_000)

fullTest('the draft model drafts the text around an image: the same tokens and probabilities as off', async () => {
  // gemma-3-270m Q2_K drafts for the Q4_K_M target (one vocabulary); it reads
  // the conversation without the image, the target verifies.
  const drafted = await LlamaEngine.load({
    modelPath: GEMMA,
    draftModelPath: model('gemma-3-270m.Q2_K.gguf'),
    mmprojPath: MMPROJ,
    chatTemplate: GEMMA_TEMPLATE,
    contextSize: 512,
    parallel: 2,
  })
  try {
    const off = await drafted.complete(ask(images[0].bytes, { n_predict: 24, speculative: { mode: 'off' } }))
    for (const speculative of [
      { mode: 'draft', adaptive: false, n_max: 4, p_min: 0 },
      { mode: 'draft', adaptive: false, n_max: 6, n_parallel: 3, p_split: 0.05, p_min: 0 },
    ]) {
      const r = await drafted.complete(ask(images[0].bytes, { n_predict: 24, speculative }))
      expect(trace(r)).toBe(trace(off))
      expect(r.speculative.n_drafted).toBeGreaterThan(0)
    }
    // Beside a text request that drafts too: each the same as alone.
    const text = { messages: [{ role: 'user', content: 'Name three colours.' }], n_predict: 24, temperature: 0, n_probs: 3 }
    const textAlone = trace(await drafted.complete({ ...text, speculative: { mode: 'off' } }))
    const [a, b] = await Promise.all([
      drafted.complete(ask(images[0].bytes, { n_predict: 24, speculative: { mode: 'draft', adaptive: false, n_max: 4, p_min: 0 } })),
      drafted.complete({ ...text, speculative: { mode: 'draft', adaptive: false, n_max: 4, p_min: 0 } }),
    ])
    expect(trace(a)).toBe(trace(off))
    expect(trace(b)).toBe(textAlone)
  } finally {
    await drafted.dispose()
  }
}, 180_000)

// test:full only: npm test stays under its 10 minutes (CI runs it).
;(FULL ? test : test.skip)('embed() of text with an image: its own vector, the same bits alone, beside others and from a file', async () => {
  const parts = (image, text = 'A picture of shapes.') => [{ type: 'image', data: image }, { type: 'text', text }]
  const one = await engine.embed(parts(images[0].bytes))
  expect(one.embeddings).toHaveLength(1)
  const v = one.embeddings[0]
  expect(v.length).toBe(engine.status().embeddingSize)
  expect(v.every(Number.isFinite)).toBe(true)
  const textOnly = await engine.embed('A picture of shapes.')
  // The image's 16 tokens count; the vector is not the text's.
  expect(one.tokens).toBeGreaterThanOrEqual(textOnly.tokens + 16)
  expect(Buffer.from(v.buffer).equals(Buffer.from(textOnly.embeddings[0].buffer))).toBe(false)
  // Another image, another vector.
  const other = (await engine.embed(parts(images[1].bytes))).embeddings[0]
  expect(Buffer.from(other.buffer).equals(Buffer.from(v.buffer))).toBe(false)
  // In a list beside text and another image, while a completion streams, and by path: the same bits.
  const [listed, , byPath] = await Promise.all([
    engine.embed(['Some text first.', parts(images[1].bytes), parts(images[0].bytes)]),
    engine.complete({ prompt: 'Once upon a time', n_predict: 24, temperature: 0 }),
    engine.embed([{ type: 'image', path: images[0].file }, { type: 'text', text: 'A picture of shapes.' }]),
  ])
  expect(Buffer.from(listed.embeddings[2].buffer).equals(Buffer.from(v.buffer))).toBe(true)
  expect(Buffer.from(listed.embeddings[1].buffer).equals(Buffer.from(other.buffer))).toBe(true)
  expect(Buffer.from(byPath.embeddings[0].buffer).equals(Buffer.from(v.buffer))).toBe(true)
  // Refused by name: a damaged image, and media for a text-only engine.
  const bad = await engine.embed(['fine', [{ type: 'image', data: images[0].bytes.subarray(0, 40) }, { type: 'text', text: 'x' }]]).catch((e) => e)
  expect(bad.code).toBe('INVALID_REQUEST')
  expect(bad.message).toMatch(/^input\[1\]\[0\]/)
  const plain = await LlamaEngine.load({ modelPath: GEMMA, contextSize: 256, parallel: 1 })
  try {
    const e = await plain.embed(parts(images[0].bytes)).catch((err) => err)
    expect(e.code).toBe('INVALID_REQUEST')
    expect(e.message).toMatch(/^input: .*mmprojPath/)
  } finally {
    await plain.dispose()
  }
}, 120_000)

fullTest('the prompt cache and sessions hold with an image', async () => {
  const cold = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 1 })
  const file = path.join(tmp, 'image.session')
  try {
    const first = await cold.complete(ask(images[0].bytes))
    // Another prompt takes the only slot; the image's cells go to the prompt cache and come back.
    await cold.complete({ messages: [{ role: 'user', content: 'Count from one to twenty, in words, please: one, two,' }], n_predict: 8 })
    const back = await cold.complete(ask(images[0].bytes))
    expect(back.tokens_cached).toBe(back.tokens_evaluated - 1)
    expect(back.timings.media_decode_ms).toBe(0)
    expect(trace(back)).toBe(trace(first))
    // A session of the conversation, loaded into another engine: the image comes back with it.
    const conversation = { messages: [{ role: 'user', content: [{ type: 'image', data: images[0].bytes }, { type: 'text', text: QUESTION }] }] }
    const saved = await engine.saveSession(file, conversation)
    expect(saved.tokens).toBeGreaterThan(16)
    const fresh = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 1 })
    try {
      expect(await fresh.loadSession(file)).toMatchObject({ tokens: saved.tokens, exact: true })
      const resumed = await fresh.complete(ask(images[0].bytes))
      expect(resumed.tokens_cached).toBeGreaterThan(16)
      expect(resumed.timings.media_decode_ms).toBe(0)
      expect(trace(resumed)).toBe(trace(first))
    } finally {
      await fresh.dispose()
    }
  } finally {
    await cold.dispose()
  }
}, 240_000)

fullTest('process isolation and LoRA adapters hold with an image', async () => {
  const alone = await engine.complete(ask(images[0].bytes, { cache_prompt: false }))
  // In a child process, the same bits.
  const isolated = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 1, isolation: 'process' })
  try {
    expect(isolated.status().media).toEqual({ vision: true, audio: false })
    expect(trace(await isolated.complete(ask(images[0].bytes)))).toBe(trace(alone))
  } finally {
    await isolated.dispose()
  }
  // An adapter at scale 0 is the base; at scale 1 it changes the answer about the image.
  const lora = await LlamaEngine.load({
    modelPath: GEMMA,
    mmprojPath: MMPROJ,
    chatTemplate: GEMMA_TEMPLATE,
    contextSize: 512,
    parallel: 2,
    loras: [{ path: model('gemma-3-270m.lora-test.gguf'), scale: 0 }],
  })
  try {
    const base = trace(await lora.complete(ask(images[1].bytes, { cache_prompt: false })))
    const [zero, one] = await Promise.all([
      lora.complete(ask(images[1].bytes, { cache_prompt: false, lora: [{ id: 0, scale: 0 }] })),
      lora.complete(ask(images[1].bytes, { cache_prompt: false, lora: [{ id: 0, scale: 1 }] })),
    ])
    expect(trace(zero)).toBe(base)
    expect(trace(one)).not.toBe(base)
  } finally {
    await lora.dispose()
  }
}, 240_000)

fullTest('a full context ends an image request (never shifted through the image)', async () => {
  const small = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 64, parallel: 1 })
  try {
    const r = await small.complete(ask(images[1].bytes, { n_predict: 200, ignore_eos: true, n_probs: 0 }))
    expect(r.stopped_limit).toBe(true)
    expect(r.tokens_evaluated + r.tokens_predicted).toBeLessThanOrEqual(64)
    // A prompt with its image longer than the context is refused, not truncated.
    const long = await small.complete(ask(images[1].bytes, { messages: [{ role: 'user', content: [{ type: 'image', data: images[1].bytes }, { type: 'text', text: 'word '.repeat(80) }] }] })).catch((e) => e)
    expect(long.code).toBe('INVALID_REQUEST')
    expect(long.message).toMatch(/takes \d+ tokens; the context holds 64/)
  } finally {
    await small.dispose()
  }
}, 120_000)

test('damaged, hostile and mislabelled media are refused naming the part', async () => {
  const good = images[0].bytes
  const wide = Buffer.from(good)
  wide.writeUInt32BE(100_000, 16) // IHDR width
  const cases = [
    [good.subarray(0, 40), /messages\[0\]\.content\[0\]: cannot decode this png/],
    [wide, /messages\[0\]\.content\[0\]: a 100000x64 png: at most/],
    [Buffer.from('not an image at all'), /messages\[0\]\.content\[0\]: not an image or audio file/],
    ['%%%not base64', /messages\[0\]\.content\[0\]\.data: not base64/],
  ]
  for (const [data, message] of cases) {
    const e = await engine.complete(ask(data)).catch((e) => e)
    expect(e.code).toBe('INVALID_REQUEST')
    expect(e.message).toMatch(message)
  }
  // An image given as audio, a remote URL without the server's flag, text holding the media marker.
  const parts = [
    [{ type: 'audio', data: good }, /holds image data/],
    [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }, /--allow-remote-media/],
    [{ type: 'text', text: 'a <__llama_engine_media__> b' }, /must not contain/],
  ]
  for (const [part, message] of parts) {
    const e = await engine.complete({ messages: [{ role: 'user', content: [part, { type: 'text', text: 'Hi' }] }], n_predict: 1 }).catch((e) => e)
    expect(e.code).toBe('INVALID_REQUEST')
    expect(e.message).toMatch(message)
  }
  // The engine still answers.
  expect((await engine.complete(ask(good, { n_predict: 2 }))).tokens_predicted).toBe(2)
})

fullTest('a path part reads the host file; the CLI takes --mmproj and --image', async () => {
  const byPath = await engine.complete({
    messages: [{ role: 'user', content: [{ type: 'image', path: images[1].file }, { type: 'text', text: QUESTION }] }],
    n_predict: 16,
    temperature: 0,
  })
  const byBytes = await engine.complete(ask(images[1].bytes, { n_probs: 0 }))
  expect(byPath.content).toBe(byBytes.content)
  const template = path.join(tmp, 'gemma.jinja')
  fs.writeFileSync(template, GEMMA_TEMPLATE)
  const out = execFileSync(
    process.execPath,
    [path.join(ROOT, 'bin', 'llama-engine.mjs'), '-m', GEMMA, '--mmproj', MMPROJ, '--image', images[1].file, '--chat-template', template, '-p', QUESTION, '--n_predict', '16', '--temperature', '0', '-c', '512'],
    { encoding: 'utf8' },
  )
  expect(out).toBe(byBytes.content)
}, 120_000)

test('inspectModel describes a projector: what it reads, its image geometry, tokens per image', async () => {
  const { inspectModel } = require('..')
  const info = await inspectModel(MMPROJ)
  expect(info).toMatchObject({ kind: 'projector', projectorType: 'gemma3', vision: true, audio: false, imageSize: 64, patchSize: 8, embeddingLength: 640 })
  // What an image really takes.
  const r = await engine.complete(ask(images[0].bytes, { n_predict: 1, cache_prompt: false }))
  const text = await engine.complete({ messages: [{ role: 'user', content: QUESTION }], n_predict: 1, cache_prompt: false })
  // The image adds its tokens and the <start_of_image>/<end_of_image> around them (and the newlines mtmd puts there).
  expect(info.tokensPerImage).toBe(16)
  expect(r.tokens_evaluated - text.tokens_evaluated).toBeGreaterThanOrEqual(16)
  expect(info.weightBytes).toBeGreaterThan(0)
})

test('a projector for another model, or a damaged one, is refused with its cause', async () => {
  // The gemma projector (640 wide) for SmolLM2 (576).
  const wrong = await LlamaEngine.load({ modelPath: TARGET, mmprojPath: MMPROJ, contextSize: 256 }).catch((e) => e)
  expect(wrong.code).toBe('MODEL_LOAD_FAILED')
  expect(wrong.message).toMatch(/mmprojPath .*mismatch between text model \(n_embd = 576\) and mmproj \(n_embd = 640\)/)
  const bytes = fs.readFileSync(MMPROJ)
  const cut = path.join(tmp, 'cut.gguf')
  fs.writeFileSync(cut, bytes.subarray(0, Math.floor(bytes.length / 2)))
  const damaged = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: cut, contextSize: 256 }).catch((e) => e)
  expect(damaged.code).toBe('MODEL_LOAD_FAILED')
  expect(damaged.message).toMatch(/mmprojPath .*cut\.gguf: /)
  // A language model given as the projector.
  const notProjector = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: TARGET, contextSize: 256 }).catch((e) => e)
  expect(notProjector.code).toBe('MODEL_LOAD_FAILED')
  expect(notProjector.message).toMatch(/not a multimodal projector/)
}, 120_000)

test('fuzzed images and audio never crash the engine (in a child process)', async () => {
  const n = tiers(400, 120, 8)
  const { wavBytes, jpegBytes } = await importEsm(path.join(ROOT, 'scripts', 'mm-fixtures.mjs'))
  const clip = path.join(tmp, 'fuzz.wav')
  fs.writeFileSync(clip, wavBytes(0.5, 16000, 9))
  const photo = path.join(tmp, 'fuzz.jpg')
  fs.writeFileSync(photo, jpegBytes(40, 24, 5))
  const script = `
    const { LlamaEngine } = require(${JSON.stringify(path.join(ROOT, 'index.js'))})
    const fs = require('node:fs')
    const goods = [fs.readFileSync(${JSON.stringify(images[0].file)}), fs.readFileSync(${JSON.stringify(photo)})]
    let seed = 12345
    const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32)
    ;(async () => {
      const e = await LlamaEngine.load({ modelPath: ${JSON.stringify(GEMMA)}, mmprojPath: ${JSON.stringify(MMPROJ)}, chatTemplate: ${JSON.stringify(GEMMA_TEMPLATE)}, contextSize: 256, parallel: 1 })
      const codes = {}
      // PNG: flipped bytes, cuts, garbage after the header, hostile IHDR sizes.
      // JPEG: the same, its SOF0 height/width and DHT/DQT lengths for the sizes.
      for (let i = 0; i < 2 * ${n}; i++) {
        const jpeg = i >= ${n}
        const good = goods[jpeg ? 1 : 0]
        const b = Buffer.from(good)
        const kind = i % 4
        if (kind === 0) for (let k = 0; k < 1 + rnd() * 8; k++) b[Math.floor(rnd() * b.length)] = Math.floor(rnd() * 256)
        const head = jpeg ? 200 : 33
        const data = kind === 1 ? b.subarray(0, Math.floor(rnd() * b.length)) : kind === 2 ? Buffer.concat([b.subarray(0, head), Buffer.from(Array.from({ length: 200 }, () => Math.floor(rnd() * 256)))]) : b
        if (kind === 3 && !jpeg) b.writeUInt32BE(Math.floor(rnd() * 20000), 16 + Math.floor(rnd() * 2) * 4)
        if (kind === 3 && jpeg) {
          const at = [b.indexOf(Buffer.from([0xff, 0xc0])) + 5, b.indexOf(Buffer.from([0xff, 0xc0])) + 7, b.indexOf(Buffer.from([0xff, 0xc4])) + 2, b.indexOf(Buffer.from([0xff, 0xdb])) + 2]
          b.writeUInt16BE(Math.floor(rnd() * 65536), at[Math.floor(rnd() * at.length)])
        }
        const r = await e.complete({ messages: [{ role: 'user', content: [{ type: 'image', data }, { type: 'text', text: 'Hi' }] }], n_predict: 1 }).then(() => 'OK', (err) => err.code)
        codes[r] = (codes[r] || 0) + 1
      }
      await e.dispose()
      // WAV files: flipped bytes, cuts, hostile header fields (sizes, rates, channels).
      const a = await LlamaEngine.load({ modelPath: ${JSON.stringify(GEMMA)}, mmprojPath: ${JSON.stringify(AUDIO_MMPROJ)}, chatTemplate: ${JSON.stringify(GEMMA_TEMPLATE)}, contextSize: 256, parallel: 1 })
      const wav = fs.readFileSync(${JSON.stringify(clip)})
      for (let i = 0; i < ${n}; i++) {
        const b = Buffer.from(wav)
        const kind = i % 4
        if (kind === 0) for (let k = 0; k < 1 + rnd() * 8; k++) b[Math.floor(rnd() * 64)] = Math.floor(rnd() * 256)
        if (kind === 3) b.writeUInt32LE(Math.floor(rnd() * 2 ** 32), [4, 16, 24, 28, 40][Math.floor(rnd() * 5)])
        const data = kind === 1 ? b.subarray(0, Math.floor(rnd() * b.length)) : kind === 2 ? Buffer.concat([b.subarray(0, 44), Buffer.from(Array.from({ length: 300 }, () => Math.floor(rnd() * 256)))]) : b
        const r = await a.complete({ messages: [{ role: 'user', content: [{ type: 'audio', data }, { type: 'text', text: 'Hi' }] }], n_predict: 1 }).then(() => 'OK', (err) => err.code)
        codes[r] = (codes[r] || 0) + 1
      }
      await a.dispose()
      console.log(JSON.stringify(codes))
    })()`
  const out = await new Promise((resolve, reject) =>
    execFile(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 600_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`the child died: ${err.message}\n${stderr.slice(-2000)}`)) : resolve(stdout),
    ),
  )
  const codes = JSON.parse(out.trim().split('\n').pop())
  // Every request answered: decoded (a damaged pixel is still an image) or refused by name.
  expect(Object.keys(codes).every((c) => c === 'OK' || c === 'INVALID_REQUEST')).toBe(true)
  expect(Object.values(codes).reduce((a, b) => a + b, 0)).toBe(3 * n)
  expect(codes.INVALID_REQUEST).toBeGreaterThan(0)
}, 660_000)

// Audio: a tiny random-weight gemma4ua projector (frames of 40 ms, each one
// token, through one linear map) for the same gemma-3-270m.
describe('audio', () => {
  let audio
  let wav
  beforeAll(async () => {
    ;({ wavBytes: wav } = await importEsm(path.join(ROOT, 'scripts', 'mm-fixtures.mjs')))
    audio = await LlamaEngine.load({ modelPath: GEMMA, mmprojPath: AUDIO_MMPROJ, chatTemplate: GEMMA_TEMPLATE, contextSize: 512, parallel: 2 })
  }, 120_000)
  afterAll(async () => {
    await audio?.dispose()
  })
  const hear = (clip, extra = {}) => ({
    messages: [{ role: 'user', content: [{ type: 'audio', data: clip }, { type: 'text', text: 'Transcribe.' }] }],
    n_predict: 16,
    temperature: 0,
    ...extra,
  })

  againstCli("the same greedy text as mtmd-cli for two clips; OpenAI's input_audio the same", async () => {
    expect(audio.status().media).toEqual({ vision: false, audio: true })
    const cli = execFileSync(process.execPath, [path.join(ROOT, 'scripts', 'mtmd-cli.mjs')], { encoding: 'utf8' }).trim()
    const seen = []
    for (const seed of [1, 2]) {
      const file = path.join(tmp, `clip-${seed}.wav`)
      fs.writeFileSync(file, wav(1.5, 16000, seed))
      const out = execFileSync(
        cli,
        ['-m', GEMMA, '--mmproj', AUDIO_MMPROJ, '--audio', file, '-p', 'Transcribe.', '-n', '16', '--temp', '0', '--seed', '42', '-t', '2', '--no-repack', '--chat-template', 'gemma'],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
      )
      const ours = await audio.complete(hear(fs.readFileSync(file)))
      expect(ours.content).toBe(out.replace(/^\n/, '').replace(/\n\n$/, ''))
      expect(ours.timings.media_n).toBe(1)
      const openai = await audio.complete({
        messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: fs.readFileSync(file).toString('base64'), format: 'wav' } }, { type: 'text', text: 'Transcribe.' }] }],
        n_predict: 16,
        temperature: 0,
      })
      expect(openai.content).toBe(ours.content)
      seen.push(ours.content)
    }
    expect(seen[0]).not.toBe(seen[1])
  }, 120_000)

  test('a clip beside a text request: the same bits as alone; an image to an audio projector is refused', async () => {
    const clip = wav(1, 16000, 7)
    const text = { messages: [{ role: 'user', content: 'Name three birds.' }], n_predict: 16, temperature: 0, n_probs: 3, cache_prompt: false }
    const alone = [trace(await audio.complete(hear(clip, { n_probs: 3, cache_prompt: false }))), trace(await audio.complete(text))]
    const both = await Promise.all([audio.complete(hear(clip, { n_probs: 3, cache_prompt: false })), audio.complete(text)])
    expect(both.map(trace)).toEqual(alone)
    const e = await audio.complete(ask(images[0].bytes)).catch((e) => e)
    expect(e.code).toBe('INVALID_REQUEST')
    expect(e.message).toMatch(/^messages\[0\]\.content\[0\]: this model's projector reads no image/)
  }, 120_000)
})

// The second family: Qwen2-VL's projector and M-RoPE positions (an image's
// tokens span fewer positions than tokens; the text after it goes on from
// its last), on a tiny random-weight qwen2vl text model with the real
// Qwen2.5 tokenizer (written when the real coder models are there:
// `npm run models -- --real`, which CI runs).
const QWEN = model('qwen2vl-tiny.gguf')
const QWEN_MMPROJ = model('qwen2vl-tiny.mmproj-test.gguf')
const CHATML =
  '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
;(fs.existsSync(QWEN) && fs.existsSync(QWEN_MMPROJ) ? describe : describe.skip)('M-RoPE positions (Qwen2-VL)', () => {
  let qwen
  beforeAll(async () => {
    // llama.cpp's mtmd-cli renders the GGUF's template as plain ChatML (no Jinja).
    qwen = await LlamaEngine.load({ modelPath: QWEN, mmprojPath: QWEN_MMPROJ, chatTemplate: CHATML, contextSize: 1024, parallel: 2 })
  }, 120_000)
  afterAll(async () => {
    await qwen?.dispose()
  })

  againstCli("the same greedy text as mtmd-cli, square and non-square images; a repeat from the cache the same", async () => {
    const cli = execFileSync(process.execPath, [path.join(ROOT, 'scripts', 'mtmd-cli.mjs')], { encoding: 'utf8' }).trim()
    const seen = new Set()
    for (const [seed, w, h] of [[1, 64, 64], [2, 64, 64], [3, 96, 64]]) {
      const file = path.join(tmp, `qwen-${seed}.png`)
      fs.writeFileSync(file, png(w, h, seed))
      const out = execFileSync(
        cli,
        ['-m', QWEN, '--mmproj', QWEN_MMPROJ, '--image', file, '-p', QUESTION, '-n', '16', '--temp', '0', '--seed', '42', '-t', '2', '--no-repack'],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
      )
      const request = ask(fs.readFileSync(file), { n_probs: 1 })
      const first = await qwen.complete(request)
      expect(first.content).toBe(out.replace(/^\n/, '').replace(/\n\n$/, ''))
      // Again: the image and question from the slot's cells, positions and all.
      const again = await qwen.complete(request)
      expect(again.tokens_cached).toBe(first.tokens_evaluated - 1)
      expect(trace(again)).toBe(trace(first))
      seen.add(first.content)
    }
    expect(seen.size).toBe(3)
  }, 120_000)

  test('beside a text request, and with n-gram speculation, the same bits as alone', async () => {
    const image = png(96, 64, 4)
    const alone = trace(await qwen.complete(ask(image, { cache_prompt: false, n_predict: 24 })))
    const text = { messages: [{ role: 'user', content: 'Say something.' }], n_predict: 24, temperature: 0, n_probs: 3, cache_prompt: false }
    const textAlone = trace(await qwen.complete(text))
    const [a, b] = await Promise.all([qwen.complete(ask(image, { cache_prompt: false, n_predict: 24 })), qwen.complete(text)])
    expect(trace(a)).toBe(alone)
    expect(trace(b)).toBe(textAlone)
    const spec = await qwen.complete(ask(image, { n_predict: 24, speculative: { mode: 'ngram', n_max: 8, adaptive: false } }))
    expect(trace(spec)).toBe(alone)
  }, 120_000)

  test('embed() with an M-RoPE image: the same bits alone and beside another input', async () => {
    const parts = [{ type: 'image', data: png(96, 64, 6) }, { type: 'text', text: 'What is this?' }]
    const alone = (await qwen.embed(parts)).embeddings[0]
    const listed = await qwen.embed(['A text first.', parts])
    expect(Buffer.from(listed.embeddings[1].buffer).equals(Buffer.from(alone.buffer))).toBe(true)
    const other = (await qwen.embed([{ type: 'image', data: png(64, 96, 6) }, parts[1]])).embeddings[0]
    expect(Buffer.from(other.buffer).equals(Buffer.from(alone.buffer))).toBe(false)
  }, 120_000)

  fullTest('the prompt cache and sessions keep the cells at their M-RoPE positions', async () => {
    const image = png(96, 64, 5)
    const cold = await LlamaEngine.load({ modelPath: QWEN, mmprojPath: QWEN_MMPROJ, chatTemplate: CHATML, contextSize: 1024, parallel: 1 })
    const file = path.join(tmp, 'qwen.session')
    try {
      const first = await cold.complete(ask(image, { n_predict: 24 }))
      // Another prompt takes the only slot: the image's cells go to the prompt cache and come back.
      await cold.complete({ messages: [{ role: 'user', content: 'Count from one to twenty, in words: one, two,' }], n_predict: 8 })
      const back = await cold.complete(ask(image, { n_predict: 24 }))
      expect(back.tokens_cached).toBe(back.tokens_evaluated - 1)
      expect(back.timings.media_decode_ms).toBe(0)
      expect(trace(back)).toBe(trace(first))
      // A session of the conversation, loaded into another engine.
      const saved = await qwen.saveSession(file, { messages: ask(image).messages })
      // (Saved as the next request starts: without the assistant's opening.)
      expect(saved.tokens).toBeGreaterThan(first.tokens_evaluated - 8)
      const fresh = await LlamaEngine.load({ modelPath: QWEN, mmprojPath: QWEN_MMPROJ, chatTemplate: CHATML, contextSize: 1024, parallel: 1 })
      try {
        expect(await fresh.loadSession(file)).toMatchObject({ tokens: saved.tokens, exact: true })
        const resumed = await fresh.complete(ask(image, { n_predict: 24 }))
        expect(resumed.tokens_cached).toBe(saved.tokens)
        expect(resumed.timings.media_decode_ms).toBe(0)
        expect(trace(resumed)).toBe(trace(first))
      } finally {
        await fresh.dispose()
      }
      // The file records where the image's cells sit (checked against its
      // cells when read: crates/core/src/cache/session.rs).
      expect(fs.readFileSync(file).includes('"media_positions":[{"start":')).toBe(true)
    } finally {
      await cold.dispose()
    }
  }, 180_000)
})

describe('through the server', () => {
  let server
  let base
  const dataUrl = () => `data:image/png;base64,${images[1].bytes.toString('base64')}`
  let expected
  beforeAll(async () => {
    server = createServer({ engine, signals: false })
    base = await listen(server)
    expected = (await engine.complete(ask(images[1].bytes, { n_probs: 0 }))).content
  })
  afterAll(async () => {
    if (server) await close(server)
  })

  test("GET /props says what the model reads, as llama.cpp's server does", async () => {
    const props = await (await fetch(`${base}/props`)).json()
    expect(props.modalities).toEqual({ vision: true, audio: false })
  })

  test("embeddings of text with an image, as llama-server takes them: { prompt_string, multimodal_data } and OpenAI content parts; a file per marker, bad bytes refused", async () => {
    const b64 = images[1].bytes.toString('base64')
    const post = async (route, body) => {
      const res = await fetch(base + route, { method: 'POST', body: JSON.stringify(body) })
      return { status: res.status, body: await res.json() }
    }
    const direct = await engine.embed([
      [{ type: 'text', text: 'What is this: ' }, { type: 'image', data: images[1].bytes }, { type: 'text', text: '\n' }],
      'What is this: \n',
    ])
    const bits = (v) => Buffer.from(Float32Array.from(v).buffer).toString('hex')
    // llama-server's /embeddings: [{ index, embedding: [vector] }], the content the prompt objects.
    const native = await post('/embeddings', {
      content: [{ prompt_string: 'What is this: <__media__>\n', multimodal_data: [b64] }, { prompt_string: 'What is this: \n' }],
    })
    expect(native.status).toBe(200)
    expect(native.body.map((e) => e.index)).toEqual([0, 1])
    expect(bits(native.body[0].embedding[0])).toBe(bits(direct.embeddings[0]))
    expect(bits(native.body[1].embedding[0])).toBe(bits(direct.embeddings[1]))
    // OpenAI's content parts on /v1/embeddings: the same bits.
    const oai = await post('/v1/embeddings', {
      input: [{ content: [{ type: 'text', text: 'What is this: ' }, { type: 'image_url', image_url: { url: dataUrl() } }, { type: 'text', text: '\n' }] }],
      encoding_format: 'float',
    })
    expect(oai.status).toBe(200)
    expect(bits(oai.body.data[0].embedding)).toBe(bits(direct.embeddings[0]))
    // One file per marker; bytes that are no image (or no base64) refused.
    for (const [entry, param] of [
      [{ prompt_string: 'What is this:\n', multimodal_data: ['base64'] }, 'input.multimodal_data'],
      [{ prompt_string: 'What is this: <__media__>\n', multimodal_data: ['malformed'] }, /^input/],
      [{ prompt_string: 'A <__media__> B', multimodal_data: [Buffer.from('not an image at all').toString('base64')] }, /^input/],
    ]) {
      const res = await post('/embeddings', { content: entry })
      expect(res.status).toBe(400)
      expect(res.body.error.param ?? res.body.error.message).toMatch(param)
    }
  })

  test("/completion with llama-server's { prompt_string, multimodal_data }: the image where <__media__> stands, the answer of the same chat; a file per marker", async () => {
    const prompt_string = engine.applyChatTemplate([{ role: 'user', content: `<__media__>${QUESTION}` }])
    const post = async (body) => {
      const res = await fetch(`${base}/completion`, { method: 'POST', body: JSON.stringify({ n_predict: 16, temperature: 0, ...body }) })
      return { status: res.status, body: await res.json() }
    }
    const r = await post({ prompt: { prompt_string, multimodal_data: [images[1].bytes.toString('base64')] } })
    expect(r.status).toBe(200)
    expect(r.body.content).toBe(expected)
    expect((await post({ prompt: { prompt_string, multimodal_data: [] } })).status).toBe(400)
    expect((await post({ prompt: { prompt_string: 'no marker', multimodal_data: [images[1].bytes.toString('base64')] } })).body.error.message).toMatch(/one file per marker/)
  })

  test('OpenAI Chat image_url (a data: URL) with the openai client', async () => {
    const OpenAI = require('openai')
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'x', maxRetries: 0 })
    const r = await client.chat.completions.create({
      model: 'gemma',
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl() } }, { type: 'text', text: QUESTION }] }],
      max_tokens: 16,
      temperature: 0,
    })
    expect(r.choices[0].message.content).toBe(expected)
    // A remote URL without --allow-remote-media: 400 naming the part.
    const e = await client.chat.completions
      .create({ model: 'gemma', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://127.0.0.1:9/a.png' } }] }] })
      .catch((e) => e)
    expect(e.status).toBe(400)
    expect(e.message).toMatch(/--allow-remote-media/)
    // A client cannot make the server read its files.
    const p = await client.chat.completions
      .create({ model: 'gemma', messages: [{ role: 'user', content: [{ type: 'image', path: images[1].file }] }] })
      .catch((e) => e)
    expect(p.status).toBe(400)
    expect(p.message).toMatch(/path: files of the server are not read/)
  })

  test('Responses input_image with the openai client', async () => {
    const OpenAI = require('openai')
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'x', maxRetries: 0 })
    const r = await client.responses.create({
      model: 'gemma',
      input: [{ role: 'user', content: [{ type: 'input_image', image_url: dataUrl(), detail: 'auto' }, { type: 'input_text', text: QUESTION }] }],
      max_output_tokens: 16,
      temperature: 0,
      store: false,
    })
    expect(r.output_text).toBe(expected)
  })

  test('Anthropic image blocks (base64) with @anthropic-ai/sdk', async () => {
    const Anthropic = require('@anthropic-ai/sdk')
    const client = new Anthropic({ baseURL: base, apiKey: 'x', maxRetries: 0 })
    const r = await client.messages.create({
      model: 'gemma',
      max_tokens: 16,
      temperature: 0,
      messages: [
        {
          role: 'user',
          content: [
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: images[1].bytes.toString('base64') } },
            { type: 'text', text: QUESTION },
          ],
        },
      ],
    })
    expect(r.content.map((b) => b.text).join('')).toBe(expected)
  })

  test('with --allow-remote-media an http image URL is fetched (bounded) and read', async () => {
    const http = require('node:http')
    const files = http.createServer((req, res) => res.end(images[1].bytes))
    const filesBase = await listen(files)
    const remote = createServer({ engine, signals: false, allowRemoteMedia: true })
    const remoteBase = await listen(remote)
    try {
      const res = await fetch(`${remoteBase}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `${filesBase}/a.png` } }, { type: 'text', text: QUESTION }] }],
          max_tokens: 16,
          temperature: 0,
        }),
      })
      expect(res.status).toBe(200)
      expect((await res.json()).choices[0].message.content).toBe(expected)
    } finally {
      await close(remote)
      await close(files)
    }
  })
})
