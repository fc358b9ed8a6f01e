'use strict'
// Portable mode's golden file on another platform: what
// `npm run test:platforms -- --portable` runs under the platform's own Node
// (qemu-aarch64, wine), with the cross-built addon named by
// LLAMA_ENGINE_ADDON and a CPU variant forced by LLAMA_ENGINE_CPU_VARIANT.
// It computes the golden cases (__test__/portable-cases.js) and the kernel
// digests, and compares them with __test__/fixtures/portable-golden.json:
// a mismatch names the case, the first differing position and the kernels
// whose digests differ. Plain CommonJS, no dependencies but the repository's
// own JavaScript, which is the same on every platform. Writes its results
// as JSON to PLATFORM_CHECKS_OUT (Node under wine cannot write to a pipe).
//
//   node portable-platform-checks.cjs <models dir> <repository root>
//   PORTABLE_CHECKS_FULL=1: every case of the golden file (test:full's set)
const fs = require('node:fs')
const path = require('node:path')

// A POSIX path seen from Windows (wine maps the root to Z:).
const native = (p) => (process.platform === 'win32' && p.startsWith('/') ? `Z:${p.replace(/\//g, '\\')}` : p)
const [models, root] = process.argv.slice(2).map(native)
const out = process.env.PLATFORM_CHECKS_OUT
const results = []
const check = (name, ok, detail) => results.push({ name, ok: Boolean(ok), detail })
let status = null

async function main() {
  const { LlamaEngine } = require(path.join(root, 'index.js'))
  const { binding } = require(path.join(root, 'lib', 'addon', 'native.js'))
  const cases = require(path.join(root, '__test__', 'portable-cases.js'))
  const golden = JSON.parse(fs.readFileSync(path.join(root, '__test__', 'fixtures', 'portable-golden.json'), 'utf8'))
  const all = [...cases.QUICK, ...cases.VARIANT, ...(process.env.PORTABLE_CHECKS_FULL === '1' ? cases.FULL : [])]

  // The kernels first: when a completion differs, they say which op.
  const d = binding.portableDigest()
  const ops = cases.differingOps(d.ops, golden.digests)
  check('kernel digests', ops.length === 0 && d.mismatches.length === 0, ops.length ? `differ: ${ops.join(', ')}` : `${Object.keys(d.ops).length} kernels equal to the golden file's`)
  const which = ops.length ? `; kernels differing: ${ops.join(', ')}` : ''

  const engines = new Map()
  const engineFor = async (file, lora) => {
    const key = file + (lora ? '+lora' : '')
    if (!engines.has(key)) {
      const t0 = Date.now()
      const e = await LlamaEngine.load(cases.loadOptions(path.join(models, file), lora ? path.join(models, cases.LORA) : null))
      const s = e.status()
      status = status ?? s
      check(`load ${file}`, s.determinism === 'portable' && s.batchInvariant === true, `${((Date.now() - t0) / 1000).toFixed(1)} s; CPU ${s.cpuBackend}; determinism ${s.determinism}; self-check batchInvariant ${s.batchInvariant}${s.batchInvariant ? '' : ` (${s.batchInvariance})`}`)
      engines.set(key, e)
    }
    return engines.get(key)
  }
  try {
    for (const [name, file, request] of all) {
      const engine = await engineFor(file, Boolean(request.lora))
      const tokens = []
      const r = await engine.complete(request, (e) => {
        if (e.type === 'token') tokens.push(...e.tokens)
      })
      const diff = cases.firstDifference(cases.trace(tokens), golden.cases[name] ?? [])
      check(name, diff === null, diff === null ? `${tokens.length} tokens and their probability bits equal (${r.timings.predicted_per_second.toFixed(1)} tokens/s)` : `${diff}${which}`)
    }
    const engine = await engineFor(cases.SMOL, false)
    const { embeddings } = await engine.embed(cases.EMBED)
    const at = cases.firstDifferingValue(Array.from(embeddings[0], cases.bits), golden.cases.embedding)
    check('embedding', at === -1, at === -1 ? `${embeddings[0].length} values, bits equal` : `first differing value at ${at}${which}`)
  } finally {
    for (const e of engines.values()) await e.dispose()
  }
}

main()
  .catch((e) => check('no exception', false, `${e.code ?? ''} ${e.stack ?? e}`))
  .finally(() => {
    fs.writeFileSync(out, JSON.stringify({ checks: results, status: status ? { cpuBackend: status.cpuBackend, batchInvariant: status.batchInvariant, determinism: status.determinism } : null }, null, 1))
  })
