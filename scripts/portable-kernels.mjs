// `npm run test:portable-kernels`: portable mode's kernels (patch 0012,
// ggml-cpu/portable.c) compiled for every instruction set and platform the
// packages ship for, each run on fixed inputs, and their digests (a hash of
// every op's output bits) compared with the golden file's
// (__test__/fixtures/portable-golden.json, written on the reference machine):
//
//   x86-64 Linux   gcc: baseline SSE2, AVX, AVX2 (haswell), AVX-512
//                  (skylake-avx512), AVX-512 VNNI (icelake); clang AVX2
//   arm64 Linux    aarch64-linux-gnu-gcc: armv8-a (NEON), armv8.2-a with dot
//                  product and fp16, armv8.6-a with SVE and i8mm, armv9-a
//                  with SVE2; under qemu-aarch64 -cpu max
//   Windows x64    MinGW-w64: baseline and AVX2; under wine
//
// The kernels are compiled as the build compiles them (-O3, -ffp-contract=off)
// with ggml's base library (types, row sizes) and a driver
// (scripts/portable-digest.c) that prints each op's digest. The whole model
// (tokens and probabilities) is checked under every x86 variant by
// `npm run test:variant`, and on arm64 and Windows by `npm run
// test:platforms` before a release. Installs the cross compilers, qemu and
// wine with apt-get when they are missing (as root). A mismatch names the
// platform, the flags and the op. An x86-64 build for instructions this CPU
// lacks (AVX-512 on an AVX2 machine) is compiled and listed as not run.
// About two minutes, most of it wine starting.
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ensureVendored } from './vendor.mjs'
import { root } from './native.mjs'

ensureVendored()
const ggml = join(root, 'vendor', 'llama-cpp-sys-2', 'llama.cpp', 'ggml')
const golden = JSON.parse(readFileSync(join(root, '__test__', 'fixtures', 'portable-golden.json'), 'utf8')).digests
const work = join(tmpdir(), 'llama-engine-portable-kernels')
mkdirSync(work, { recursive: true })
// ggml.c includes the version header CMake writes.
writeFileSync(join(work, 'ggml-version.h'), '#pragma once\n#define GGML_VERSION "portable-digest"\n#define GGML_COMMIT "portable-digest"\n')

// The x86-64 builds run on this CPU itself (wine too): one it lacks the
// instructions for is compiled, not run, and said so (SIGILL otherwise; no
// emulator here runs AVX-512). A machine with AVX-512 runs them all.
const cpuFlags = new Set(
  existsSync('/proc/cpuinfo')
    ? (readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:(.*)$/m)?.[1] ?? '').trim().split(/\s+/)
    : [],
)
const NEEDS = {
  '-march=x86-64 -mavx': ['avx'],
  '-march=haswell': ['avx2', 'fma', 'f16c', 'bmi2'],
  '-march=skylake-avx512': ['avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512cd'],
  '-march=icelake-server': ['avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512cd', 'avx512vnni', 'avx512vbmi', 'avx512_vbmi2'],
}
const lacking = (flags) => (NEEDS[flags] ?? []).filter((f) => !cpuFlags.has(f))
const skipped = []

const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0
const TARGETS = [
  {
    name: 'x86-64 Linux',
    cc: 'gcc',
    out: 'digest-x64',
    run: (exe) => [exe],
    x86: true,
    flags: ['-march=x86-64', '-march=x86-64 -mavx', '-march=haswell', '-march=skylake-avx512', '-march=icelake-server'],
    apt: {},
  },
  {
    name: 'x86-64 Linux (clang)',
    cc: 'clang',
    out: 'digest-x64-clang',
    run: (exe) => [exe],
    x86: true,
    flags: ['-march=haswell'],
    apt: { clang: 'clang' },
  },
  {
    name: 'arm64 Linux (qemu)',
    cc: 'aarch64-linux-gnu-gcc',
    out: 'digest-arm64',
    run: (exe) => ['qemu-aarch64', '-cpu', 'max', '-L', '/usr/aarch64-linux-gnu', exe],
    flags: ['-march=armv8-a', '-march=armv8.2-a+dotprod+fp16', '-march=armv8.6-a+sve+i8mm', '-march=armv9-a+sve2'],
    apt: { 'aarch64-linux-gnu-gcc': 'gcc-aarch64-linux-gnu', 'qemu-aarch64': 'qemu-user' },
    aptFiles: { '/usr/aarch64-linux-gnu/include/stdio.h': 'libc6-dev-arm64-cross' },
  },
  {
    name: 'Windows x64 (wine)',
    cc: 'x86_64-w64-mingw32-gcc-posix',
    out: 'digest-win64.exe',
    run: (exe) => ['wine', exe],
    x86: true,
    flags: ['-march=x86-64', '-march=haswell'],
    apt: { 'x86_64-w64-mingw32-gcc-posix': 'gcc-mingw-w64-x86-64-posix', wine: 'wine64' },
  },
]

const missing = new Set()
for (const t of TARGETS) {
  for (const [cmd, pkg] of Object.entries(t.apt)) if (!has(cmd)) missing.add(pkg)
  for (const [file, pkg] of Object.entries(t.aptFiles ?? {})) if (!existsSync(file)) missing.add(pkg)
}
if (missing.size) {
  console.log(`portable-kernels: installing ${[...missing].join(' ')}`)
  execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit' })
  execFileSync('apt-get', ['install', '-y', '-qq', ...missing], { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } })
}

const includes = ['-I', work, '-I', join(ggml, 'include'), '-I', join(ggml, 'src'), '-I', join(ggml, 'src', 'ggml-cpu')]
const failures = []
let runs = 0
const compile = (cc, args) => {
  const r = spawnSync(cc, args, { encoding: 'utf8' })
  return r.status === 0 ? null : r.stderr.split('\n').filter((l) => /error/.test(l)).slice(0, 5).join('\n') || `exit ${r.status}`
}
// A control that must differ: clang's -ffp-contract=fast fuses multiply-adds
// whatever the file's pragmas say, so the comparison must see it.
TARGETS.push({ ...TARGETS[1], name: 'control: clang fma', out: 'digest-control', flags: ['-march=haswell -ffp-contract=fast'], control: true })
for (const t of TARGETS) {
  // ggml's base (types, row sizes) once per toolchain; the kernels per flags
  const base = []
  for (const src of ['ggml.c', 'ggml-quants.c']) {
    const obj = join(work, `${t.out}-${src}.o`)
    const err = compile(t.cc, ['-O2', '-c', ...includes, join(ggml, 'src', src), '-o', obj])
    if (err) failures.push(`${t.name}: ${src} did not compile\n${err}`)
    base.push(obj)
  }
  for (const flags of t.flags) {
    const exe = join(work, `${flags.replace(/[^a-z0-9.+-]/gi, '_')}-${t.out}`)
    const args = ['-O3', ...(t.control ? [] : ['-ffp-contract=off']), ...flags.split(' '), ...includes, join(root, 'scripts', 'portable-digest.c'), join(ggml, 'src', 'ggml-cpu', 'portable.c'), ...base, '-o', exe]
    if (!t.cc.includes('mingw')) args.push('-lm', '-lpthread')
    const err = compile(t.cc, args)
    if (err) {
      failures.push(`${t.name} ${flags}: did not compile\n${err}`)
      continue
    }
    const lacks = t.x86 ? lacking(flags) : []
    if (lacks.length) {
      const line = `${t.name.padEnd(22)} ${flags.padEnd(30)} compiled, not run: this CPU lacks ${lacks.join(', ')}`
      console.log(line)
      skipped.push(line)
      continue
    }
    const [cmd, ...rest] = t.run(exe)
    const r = spawnSync(cmd, rest, { encoding: 'utf8', env: { ...process.env, WINEDEBUG: '-all', WINEPREFIX: join(work, 'wine') }, timeout: 600_000 })
    const got = Object.fromEntries(
      (r.stdout || '')
        .split(/\r?\n/)
        .filter(Boolean)
        .map((l) => l.split('\t')),
    )
    const differ = Object.keys(golden).filter((op) => got[op] !== golden[op])
    if (t.control) {
      console.log(`${t.name.padEnd(22)} ${flags.padEnd(30)} ${differ.length} ops differ, as they must`)
      if (!differ.length) failures.push(`${t.name}: fused multiply-adds went unseen: the comparison cannot fail`)
      continue
    }
    runs++
    const line = `${t.name.padEnd(22)} ${flags.padEnd(30)} ${Object.keys(got).length} ops, ${differ.length ? `DIFFER: ${differ.join(', ')}` : 'the golden digests'}`
    console.log(line)
    if (r.status !== 0 || differ.length) failures.push(line + (r.status !== 0 ? ` (exit ${r.status}: ${(r.stderr || '').slice(0, 300)})` : ''))
  }
}
if (failures.length) {
  console.error(`\nportable-kernels: ${failures.length} of the builds compute other bits than the reference machine:\n${failures.join('\n')}`)
  process.exit(1)
}
console.log(`portable-kernels: ${runs} builds, every op's bits as on the reference machine`)
if (skipped.length) console.log(`portable-kernels: ${skipped.length} compiled, not run on this CPU (run them on one that has the instructions):\n${skipped.join('\n')}`)
