'use strict'
// The checks `npm run test:platforms` runs inside an app that installed a
// platform package, under that platform's Node (qemu-aarch64, wine, or this
// machine's Node for the Vulkan build). Plain CommonJS with no dependencies
// but llama-engine, so it runs the same everywhere. Writes its results as
// JSON to the file named by PLATFORM_CHECKS_OUT (Node under wine cannot
// write to a pipe), one entry per check: { name, ok, detail }.
//
//   node platform-checks.cjs <models dir>
const fs = require('node:fs')
const path = require('node:path')

const out = process.env.PLATFORM_CHECKS_OUT
const dir = process.argv[2]
// A POSIX path seen from Windows (wine maps the root to Z:).
const native = (p) => (process.platform === 'win32' && p.startsWith('/') ? `Z:${p.replace(/\//g, '\\')}` : p)
const model = native(path.posix.join(dir, 'SmolLM2-135M-Instruct.Q4_1.gguf'))
const kquant = native(path.posix.join(dir, 'gemma-3-270m-q4_k_m.gguf'))
const gpuLayers = Number(process.env.PLATFORM_CHECKS_GPU_LAYERS || 0)

const results = []
const check = (name, ok, detail) => results.push({ name, ok: Boolean(ok), detail })
const save = () => fs.writeFileSync(out, JSON.stringify(results, null, 1))

async function main() {
  const { LlamaEngine } = require('llama-engine')
  const t0 = Date.now()
  const engine = await LlamaEngine.load({ modelPath: model, contextSize: 1024, parallel: 2, gpuLayers })
  const s = engine.status()
  check('load', true, `${((Date.now() - t0) / 1000).toFixed(1)} s; addon ${s.addon}; CPU ${s.cpuBackend}; devices ${JSON.stringify(s.devices ?? s.gpu ?? null)}`)
  check('self-check', typeof s.batchInvariant === 'boolean', `batchInvariant ${s.batchInvariant}`)
  results.status = s

  const prompt = 'The capital of France is'
  const greedy = await engine.complete({ prompt, n_predict: 16, temperature: 0 })
  check('complete (prompt)', greedy.tokens_predicted > 0, `${JSON.stringify(greedy.content)}; ${greedy.timings.predicted_per_second.toFixed(1)} tokens/s`)

  const chat = await engine.complete({ messages: [{ role: 'user', content: 'Say hello.' }], n_predict: 12, temperature: 0 })
  check('complete (chat)', chat.tokens_predicted > 0, JSON.stringify(chat.content))

  let streamed = ''
  let events = 0
  const again = await engine.complete({ prompt, n_predict: 16, temperature: 0 }, (e) => {
    if (e.type === 'token') {
      streamed += e.content
      events++
    }
  })
  check('stream', events > 0 && streamed === again.content && again.content === greedy.content, `${events} token events, text equal to the result and to the unstreamed run`)

  const ac = new AbortController()
  let seen = 0
  const aborted = await engine.complete({ prompt: 'Once upon a time, in a land far away,', n_predict: 400, temperature: 0 }, (e) => {
    if (e.type === 'token' && ++seen === 3) ac.abort()
  }, ac.signal)
  check('abort', aborted.stopped_abort === true && aborted.tokens_predicted < 400, `stopped_abort ${aborted.stopped_abort} after ${aborted.tokens_predicted} tokens`)

  // Speculation equal to `off`, probabilities bit for bit, on a Q4_1 and a
  // K-quant model: n-gram drafts of a fixed length, and two requests side by side.
  const req = { prompt: 'Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.', n_predict: 40, temperature: 0, n_probs: 2 }
  const same = (a, b) => JSON.stringify(a.completion_probabilities) === JSON.stringify(b.completion_probabilities)
  // A GPU whose self-check found it is not batch-invariant (lavapipe) makes
  // these checks informational, and on lavapipe each token takes over a
  // second: with PLATFORM_CHECKS_LIGHT (`--quick`), one short speculative
  // run shows speculation works there, and the rest is left to the full run.
  if (process.env.PLATFORM_CHECKS_LIGHT === '1' && gpuLayers > 0 && s.batchInvariant === false) {
    // What such a device computes differs from the CPU (the greedy text
    // too), so the drafts come from a schema that forces the text: they are
    // made whatever the device computes, and verified on it.
    const forced = { type: 'string', enum: ['the quick brown fox jumps over the lazy dog'] }
    const light = await engine.complete({ ...req, n_predict: 12, json_schema: forced, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } })
    check('speculative run (light: not batch-invariant here, so exactness is not compared)', light.tokens_predicted > 0 && light.speculative.n_drafted > 0, `${light.speculative.n_drafted} drafted, ${light.speculative.n_accepted} accepted; ${JSON.stringify(light.content)}`)
    await engine.dispose()
    return
  }
  const off = await engine.complete({ ...req, speculative: { mode: 'off' } })
  const spec = await engine.complete({ ...req, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } })
  check('speculation = off (Q4_1)', same(off, spec) && spec.speculative.n_drafted > 0, `${spec.speculative.n_drafted} drafted, ${spec.speculative.n_accepted} accepted; tokens ${off.content === spec.content ? 'equal' : 'DIFFER'}, probabilities ${same(off, spec) ? 'bit-identical' : 'DIFFER'}; off ${off.timings.predicted_per_second.toFixed(1)} tokens/s, ngram ${spec.timings.predicted_per_second.toFixed(1)} tokens/s`)
  const [p1, p2] = await Promise.all([engine.complete({ ...req, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } }), engine.complete({ prompt, n_predict: 16, temperature: 0 })])
  check('parallel requests', same(off, p1) && p2.content === greedy.content, `two requests in one batch equal their solo runs: ${same(off, p1) && p2.content === greedy.content} (tokens ${p1.content === off.content && p2.content === greedy.content ? 'equal' : 'DIFFER'})`)
  await engine.dispose()
  let code = null
  try {
    await engine.complete({ prompt, n_predict: 4 })
  } catch (e) {
    code = e.code
  }
  check('dispose', code === 'DISPOSED', `a call after dispose() rejects ${code}`)

  if (fs.existsSync(kquant)) {
    const k = await LlamaEngine.load({ modelPath: kquant, contextSize: 512, gpuLayers })
    const koff = await k.complete({ ...req, speculative: { mode: 'off' } })
    const kspec = await k.complete({ ...req, speculative: { mode: 'ngram', adaptive: false, n_max: 8 } })
    const ks = k.status()
    await k.dispose()
    check('speculation = off (Q4_K_M)', same(koff, kspec) && kspec.speculative.n_drafted > 0, `batchInvariant ${ks.batchInvariant}; ${kspec.speculative.n_drafted} drafted; tokens ${koff.content === kspec.content ? 'equal' : 'DIFFER'}, probabilities ${same(koff, kspec) ? 'bit-identical' : 'DIFFER'}`)
  }
}

main()
  .catch((e) => check('no exception', false, `${e.code ?? ''} ${e.stack ?? e}`))
  .finally(() => {
    const s = results.status
    fs.writeFileSync(out, JSON.stringify({ checks: results, status: s ? { addon: s.addon, cpuBackend: s.cpuBackend, batchInvariant: s.batchInvariant, backend: s.backend, gpu: s.gpu, devices: s.devices } : null }, null, 1))
  })
