// `npm test` and `npm run test:full`: makes the tree ready (dependencies, the
// addon, the fixtures), then runs the decoding core's tests (cargo, no Node)
// and the public API's (Jest, on the real models). `--full` runs every
// matrix in full (all quantization types, prompts and seeds, the
// chi-square runs): what CI runs. `npm run test:real` runs the real-model
// suites instead (__test__/real/*.real.js and the agent clients on
// Qwen2.5-Coder-0.5B-Instruct, LLAMA_ENGINE_CLIENTS_MODEL for another; `npm run models -- --real` fetches them, and
// this does when they are missing). `npm run test:variant` runs the suites
// whose assertions rest on what a model writes again on another CPU class:
// the portable addon built with one x86-64 variant (`npm run prebuild --
// --variants`), forced with LLAMA_ENGINE_CPU_VARIANT: AVX2 (`haswell`) on an
// AVX-512 machine, AVX (`sandybridge`) on an AVX2 one; and portable mode's
// golden file (__test__/portable.test.js) under every other x86-64 variant
// this machine can run (baseline SSE2, AVX, AVX2, AVX-512, AVX-512 VNNI),
// built into the same addon. Extra arguments go to Jest.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ensureReady } from './ensure-ready.mjs'
import { root } from './native.mjs'

const args = process.argv.slice(2)
const full = args.includes('--full')
const real = args.includes('--real')
const variant = args.includes('--variant')
// `--variant --build-only`: only the addon test:variant runs on (CI builds it
// beside the other suites).
const buildOnly = args.includes('--build-only')
const jestArgs = args.filter((a) => !['--full', '--real', '--variant', '--build-only'].includes(a))
// What test:variant runs on the other CPU class (quick matrices): every suite
// that reads what the model wrote (calls, structured output, chats, fills),
// the bit-exactness of speculation, which each variant owes itself, and
// status() naming the variant that computed (LLAMA_ENGINE_TEST_VARIANT_SUITES
// names others; LLAMA_ENGINE_TEST_VARIANTS the variants built).
const VARIANT_SUITES = process.env.LLAMA_ENGINE_TEST_VARIANT_SUITES ? process.env.LLAMA_ENGINE_TEST_VARIANT_SUITES.split(',') : ['portable', 'install', 'exactness', 'families', 'tools', 'chat', 'structured', 'complete', 'parallel', 'controller', 'lora', 'responses', 'openai', 'anthropic', 'infill', 'multimodal']
const REAL_CLIENTS_MODEL = join(process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models'), 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf')

function run(cmd, argv, env = {}) {
  const r = spawnSync(cmd, argv, { cwd: root, stdio: 'inherit', env: { ...process.env, ...env } })
  if (r.status !== 0) process.exit(r.status ?? 1)
}

if (buildOnly && !variant) {
  console.error('--build-only: with --variant')
  process.exit(1)
}
if (!buildOnly) await ensureReady({ real })
const variantInfo = variant ? variantAddon() : null
if (buildOnly) process.exit(0)
const variantEnv = variantInfo ? variantInfo.env : {}
// The three crates' tests, the workspace at once: built alone, the decoding
// core would unify its dependencies' features differently and rebuild them
// (2 min 17 s, measured), where the workspace reuses the addon's (55 s).
if (!real && !variant) run('cargo', ['test', '--release', '--lib', '--example', 'ngram_ceiling'])
// The self-check's verdicts kept across the run's processes, in a directory
// of its own: each run starts from none (what the user's cache holds does
// not change what the suites see).
const cache = process.env.LLAMA_ENGINE_CACHE_DIR ? null : mkdtempSync(join(tmpdir(), 'llama-engine-test-cache-'))
const env = {
  ...(full ? { LLAMA_ENGINE_TEST_FULL: '1' } : {}),
  ...(cache ? { LLAMA_ENGINE_CACHE_DIR: cache } : {}),
  ...(real ? { LLAMA_ENGINE_CLIENTS_MODEL: process.env.LLAMA_ENGINE_CLIENTS_MODEL || REAL_CLIENTS_MODEL } : {}),
}
const select = real
  ? ['--testMatch', '**/__test__/real/**/*.real.js', '**/__test__/clients.test.js']
  : variant && !jestArgs.some((a) => !a.startsWith('-'))
    ? VARIANT_SUITES.map((name) => `__test__/${name}\\.test\\.js$`)
    : []
const jestRun = (sel, extraEnv) =>
  spawnSync(process.execPath, [join(root, 'node_modules', 'jest', 'bin', 'jest.js'), '--runInBand', ...sel, ...jestArgs], {
    cwd: root,
    stdio: 'inherit',
    env: { ...process.env, ...env, ...variantEnv, ...extraEnv },
  })
let status = jestRun(select, {}).status
// The golden file of portable mode under the addon's other variants (its
// other guarantees, speculation and the rest, ran on the first variant).
for (const other of variant && status === 0 && !jestArgs.some((a) => !a.startsWith('-')) ? variantInfo.others : []) {
  console.log(`llama-engine: portable mode's golden file on CPU variant ${other}`)
  status = jestRun(['__test__/portable\\.test\\.js$', '-t', 'the golden file'], { LLAMA_ENGINE_CPU_VARIANT: other }).status
  if (status !== 0) break
}
if (cache) rmSync(cache, { recursive: true, force: true })
if (status !== 0) process.exit(status ?? 1)

/**
 * Builds the portable addon with the CPU variants this machine can run; the
 * environment that loads it on one below this machine's best, and the others.
 */
function variantAddon() {
  if (process.arch !== 'x64' || process.platform !== 'linux') {
    console.error('npm run test:variant: x86-64 Linux only (the other platforms are checked by npm run test:platforms)')
    process.exit(1)
  }
  const flags = (readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:(.*)$/m) || ['', ''])[1].split(/\s+/)
  const has = (...f) => f.every((x) => flags.includes(x))
  const tag = process.env.LLAMA_ENGINE_TEST_VARIANT || (flags.includes('avx512f') ? 'haswell' : flags.includes('avx2') ? 'sandybridge' : 'x64')
  // Every variant this CPU can run, for portable mode's golden file (ggml's tags and their ISAs).
  const runnable = [
    ['x64', true],
    ['sandybridge', has('avx')],
    ['haswell', has('avx2', 'fma', 'f16c', 'bmi2')],
    ['skylakex', has('avx512f', 'avx512bw', 'avx512vl', 'avx512dq')],
    ['icelake', has('avx512f', 'avx512vbmi', 'avx512_vnni')],
  ]
    .filter(([, ok]) => ok)
    .map(([t]) => t)
  const tags = process.env.LLAMA_ENGINE_TEST_VARIANTS ? process.env.LLAMA_ENGINE_TEST_VARIANTS.split(',') : [...new Set([tag, ...runnable])]
  const dir = tags.join('-')
  run(process.execPath, [join(root, 'scripts', 'prebuild.mjs'), '--variants', tags.join(',')])
  const addon = join(root, 'target', `prebuilt-${dir}`, 'package', 'llama-engine.linux-x64-gnu.node')
  console.log(`llama-engine: the suites on CPU variant ${tag} (${addon}); portable mode also on ${tags.filter((t) => t !== tag).join(', ') || 'no other variant'}`)
  return { env: { LLAMA_ENGINE_ADDON: addon, LLAMA_ENGINE_CPU_VARIANT: tag }, others: tags.filter((t) => t !== tag) }
}
