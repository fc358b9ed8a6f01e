// `npm run test:prebuilt`: installs the prebuilt addon as a user would, on a
// machine that cannot compile anything. Packs the root package and the
// platform package (npm/<triple>/, made by `npm run prebuild`, run first if
// missing) with `npm pack`, then in fresh directories whose PATH holds only
// node, npm and sh (no compiler, cargo or cmake), with an empty npm cache
// and --offline:
//   1. installs both tarballs and runs a greedy completion from CommonJS and
//      from ESM, checking that the platform package was loaded, which CPU
//      variant, and that the load-time self-check passed;
//   2. the same with --ignore-scripts (package managers that do not run
//      install scripts);
//   3. the root package alone: the install must fail and name what a source
//      build needs.
// Prints the tarball sizes and install times. Exit code 0 when all held.
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { root } from './native.mjs'

const { platformTriple } = (await import('../lib/addon/loader.js')).default
const triple = platformTriple()
const pkgDir = join(root, 'npm', triple)
const platformPkg = `llama-engine-${triple}`
const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
const model = join(models, 'SmolLM2-135M-Instruct.Q4_1.gguf')
if (!existsSync(model)) {
  console.error(`${model} is missing: npm run models`)
  process.exit(1)
}
if (!existsSync(join(pkgDir, `llama-engine.${triple}.node`))) {
  execFileSync(process.execPath, [join(root, 'scripts', 'prebuild.mjs')], { stdio: 'inherit' })
}

const work = mkdtempSync(join(tmpdir(), 'llama-engine-prebuilt-'))
const failures = []
const check = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`)
  if (!ok) failures.push(what)
}

// A PATH with node, npm and sh only.
const bin = join(work, 'bin')
mkdirSync(bin)
symlinkSync(process.execPath, join(bin, 'node'))
const npmCli = realpathSync(execFileSync('sh', ['-c', 'command -v npm'], { encoding: 'utf8' }).trim())
symlinkSync(npmCli, join(bin, 'npm'))
symlinkSync('/bin/sh', join(bin, 'sh'))
const env = { HOME: join(work, 'home'), PATH: bin, npm_config_cache: join(work, 'npm-cache'), npm_config_update_notifier: 'false' }
mkdirSync(env.HOME)
for (const tool of ['cc', 'gcc', 'clang', 'c++', 'cargo', 'rustc', 'cmake', 'make']) {
  check(spawnSync(tool, ['--version'], { env, stdio: 'ignore' }).error?.code === 'ENOENT', `no ${tool} on the install PATH`)
}

// Pack both packages.
const tarballs = join(work, 'tarballs')
mkdirSync(tarballs)
const pack = (dir) => {
  const out = execFileSync('npm', ['pack', '--json', '--pack-destination', tarballs], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
  const info = JSON.parse(out)[0]
  return { file: join(tarballs, info.filename), size: info.size, unpacked: info.unpackedSize, entries: info.entryCount }
}
const rootTgz = pack(root)
const platTgz = pack(pkgDir)
const mib = (n) => `${(n / 1048576).toFixed(1)} MiB`
console.log(`root package: ${rootTgz.file} ${mib(rootTgz.size)} (${mib(rootTgz.unpacked)} unpacked, ${rootTgz.entries} files)`)
console.log(`platform package: ${platTgz.file} ${mib(platTgz.size)} (${mib(platTgz.unpacked)} unpacked, ${platTgz.entries} files)`)

function install(name, tgzs, extra = []) {
  const dir = join(work, name)
  mkdirSync(dir)
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, version: '1.0.0', private: true }))
  const t0 = Date.now()
  const r = spawnSync('npm', ['install', '--offline', '--no-audit', '--no-fund', ...extra, ...tgzs], { cwd: dir, env, encoding: 'utf8' })
  const seconds = (Date.now() - t0) / 1000
  return { dir, status: r.status, output: `${r.stdout}\n${r.stderr}`, seconds }
}

const cjs = `
const { LlamaEngine } = require('llama-engine')
;(async () => {
  const engine = await LlamaEngine.load({ modelPath: ${JSON.stringify(model)}, contextSize: 512 })
  const r = await engine.complete({ prompt: 'The capital of France is', n_predict: 12, temperature: 0 })
  const s = engine.status()
  await engine.dispose()
  console.log(JSON.stringify({ addon: s.addon, cpuBackend: s.cpuBackend, batchInvariant: s.batchInvariant, content: r.content, tokens: r.tokens_predicted }))
})().catch((e) => { console.error(e); process.exit(1) })
`
const esm = `
import { LlamaEngine } from 'llama-engine'
const engine = await LlamaEngine.load({ modelPath: ${JSON.stringify(model)}, contextSize: 512 })
let streamed = ''
const r = await engine.complete({ prompt: 'The capital of France is', n_predict: 12, temperature: 0 }, (e) => { if (e.type === 'token') streamed += e.content })
const s = engine.status()
await engine.dispose()
console.log(JSON.stringify({ addon: s.addon, cpuBackend: s.cpuBackend, batchInvariant: s.batchInvariant, content: r.content, streamed, tokens: r.tokens_predicted }))
`
function run(dir, args, code) {
  const r = spawnSync('node', [...args, code], { cwd: dir, env, encoding: 'utf8' })
  if (r.status !== 0) return { error: `${r.stdout}${r.stderr}`.trim().split('\n').slice(-5).join('\n') }
  return { ...JSON.parse(r.stdout.trim().split('\n').pop()), stderr: r.stderr }
}

// 1. Both packages, install scripts on.
const a = install('app', [rootTgz.file, platTgz.file])
check(a.status === 0, `npm install --offline of both tarballs (${a.seconds.toFixed(1)} s)${a.status ? `\n${a.output}` : ''}`)
check(!existsSync(join(a.dir, 'node_modules', 'llama-engine', `llama-engine.${triple}.node`)), 'nothing was built from source')
check(existsSync(join(a.dir, 'node_modules', platformPkg)), `${platformPkg} installed as the optional dependency`)
const viaCjs = run(a.dir, ['-e'], cjs)
check(viaCjs.addon === platformPkg, `CommonJS: loaded ${viaCjs.addon ?? viaCjs.error}`)
check(typeof viaCjs.cpuBackend === 'string' && !viaCjs.cpuBackend.startsWith('none'), `CommonJS: CPU variant ${viaCjs.cpuBackend}`)
check(viaCjs.batchInvariant === true, `CommonJS: self-check batchInvariant ${viaCjs.batchInvariant}`)
check(viaCjs.tokens > 0, `CommonJS: completion ${JSON.stringify(viaCjs.content)}`)
check(viaCjs.stderr === '', `nothing on stderr while loading the CPU back end, generating and disposing${viaCjs.stderr ? `: ${JSON.stringify(viaCjs.stderr.slice(0, 200))}` : ''}`)
const viaEsm = run(a.dir, ['--input-type=module', '-e'], esm)
check(viaEsm.addon === platformPkg && viaEsm.tokens > 0 && viaEsm.streamed === viaEsm.content, `ESM: loaded ${viaEsm.addon ?? viaEsm.error}, streamed ${JSON.stringify(viaEsm.streamed)}`)
check(viaEsm.content === viaCjs.content, 'ESM and CommonJS give the same greedy text')

// Every CPU variant this machine can run, forced in turn: the self-check
// passes and greedy n-gram speculation (fixed drafts of 16) gives
// bit-identical probabilities to plain decoding, on the K-quant gemma and on
// SmolLM2 Q4_1.
const gemma = join(models, 'gemma-3-270m-q4_k_m.gguf')
const exact = `
const { LlamaEngine } = require('llama-engine')
;(async () => {
  const out = {}
  for (const model of ${JSON.stringify([gemma, model])}) {
    const engine = await LlamaEngine.load({ modelPath: model, contextSize: 512 })
    const req = { prompt: 'Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.', n_predict: 48, temperature: 0, n_probs: 1 }
    const off = await engine.complete({ ...req, speculative: { mode: 'off' } })
    const spec = await engine.complete({ ...req, speculative: { mode: 'ngram', adaptive: false, n_max: 16 } })
    const s = engine.status()
    await engine.dispose()
    out[model.split('/').pop()] = { invariant: s.batchInvariant, same: JSON.stringify(off.completion_probabilities) === JSON.stringify(spec.completion_probabilities), drafted: spec.speculative.n_drafted, variant: s.cpuBackend }
  }
  console.log(JSON.stringify(out))
})().catch((e) => { console.error(e.message); process.exit(1) })
`
const variants = readdirSync(pkgDir).filter((f) => f.startsWith('libggml-cpu-')).map((f) => f.slice(12, -3))
const ran = []
for (const v of variants) {
  const r = spawnSync('node', ['-e', exact], { cwd: a.dir, env: { ...env, LLAMA_ENGINE_CPU_VARIANT: v }, encoding: 'utf8' })
  if (r.status !== 0) {
    console.log(`     ${v}: not runnable here (${(r.stderr || '').trim().split('\n').pop()})`)
    continue
  }
  const res = JSON.parse(r.stdout.trim().split('\n').pop())
  const rows = Object.values(res)
  ran.push(v)
  check(rows.every((x) => x.variant === v && x.invariant && x.same && x.drafted > 0), `variant ${v}: ${Object.entries(res).map(([m, x]) => `${m} batchInvariant ${x.invariant}, ngram probabilities ${x.same ? 'bit-identical' : 'DIFFER'} (${x.drafted} drafted)`).join('; ')}`)
}
check(ran.length > 0 && ran.includes(viaCjs.cpuBackend), `${ran.length} of ${variants.length} variants run on this CPU, the chosen one (${viaCjs.cpuBackend}) among them`)

// 2. Install scripts disabled.
const b = install('app-ignore-scripts', [rootTgz.file, platTgz.file], ['--ignore-scripts'])
check(b.status === 0, `npm install --offline --ignore-scripts (${b.seconds.toFixed(1)} s)`)
const noScripts = run(b.dir, ['-e'], cjs)
check(noScripts.addon === platformPkg && noScripts.content === viaCjs.content, `--ignore-scripts: completion via ${noScripts.addon ?? noScripts.error}`)

// 3. No platform package and no compiler: the install names what is missing.
const c = install('app-no-prebuilt', [rootTgz.file])
check(c.status !== 0 && /cmake/.test(c.output) && /cargo/.test(c.output), 'without the platform package the install fails naming cargo and cmake')
const why = c.output.split('\n').find((l) => l.includes('missing'))
if (why) console.log(`     ${why.trim()}`)

console.log(
  `install: ${a.seconds.toFixed(1)} s with scripts, ${b.seconds.toFixed(1)} s without; tarballs: root ${mib(rootTgz.size)}, ${platformPkg} ${mib(platTgz.size)}; ` +
    `CPU variant ${viaCjs.cpuBackend}; ${variants.length} variants shipped, ${ran.length} checked bit-exact here`,
)
if (!process.env.KEEP) rmSync(work, { recursive: true, force: true })
else console.log(`kept ${work}`)
if (failures.length) {
  console.error(`${failures.length} check(s) failed`)
  process.exit(1)
}
