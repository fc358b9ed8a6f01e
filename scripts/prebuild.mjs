// `npm run prebuild`: the portable addon for this platform, in the platform
// package folder npm/<triple>/ (napi-rs's layout), ready for `npm pack`.
//
// Unlike the source build (`npm run build`, -C target-cpu=native), it is
// built for no particular CPU: cargo feature `prebuilt` turns on
// llama-cpp-sys-2's `dynamic-backends` (ggml's GGML_BACKEND_DL +
// GGML_CPU_ALL_VARIANTS: the CPU back end once per x86-64 level, sse42 …
// sapphirerapids, as shared libraries) and leaves OpenMP out (ggml's own
// thread pool; no libgomp needed at run time). The addon finds llama.cpp's
// libraries beside itself ($ORIGIN rpath, build.rs) and at load picks the
// best CPU variant (crates/engine/src/ggml_setup.rs). The exactness settings are
// the source build's: llamafile and repacking off (.cargo/config.toml [env]
// applies to every build), extra buffers off at run time; the tiled K-quant
// path is on where a variant has AVX2 with FMA or AVX-512 VNNI (patch 0006).
//
// Its own cargo target dir (target/prebuilt), so the source build is kept.
// About 30 minutes on 2 cores the first time: llama.cpp's CPU code is
// compiled once per variant.
import { execFileSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, relative } from 'node:path'
import { compilerCacheEnv, ensurePrerequisites, root } from './native.mjs'
import { ensureVendored } from './vendor.mjs'

// npm runs a script named `prebuild` before `build` as its "pre" hook, so
// `npm run build` would start this too. Only a direct `npm run prebuild` (or
// `node scripts/prebuild.mjs`) builds: the npm process that started us says
// which it was.
function startedAsHookOfBuild() {
  if (process.env.npm_lifecycle_event !== 'prebuild') return false
  let pid = process.ppid
  for (let depth = 0; depth < 6 && pid > 1; depth++) {
    let args, parent
    try {
      args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')
      parent = Number(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')[1])
    } catch {
      try {
        const line = execFileSync('ps', ['-o', 'ppid=,args=', '-p', String(pid)], { encoding: 'utf8' }).trim()
        const m = /^(\d+)\s+(.*)$/.exec(line)
        if (!m) return false
        parent = Number(m[1])
        args = m[2].split(/\s+/)
      } catch {
        return false
      }
    }
    // npm sets its title to "npm run build"; started by node, it is "node …/npm-cli.js run build".
    args = args.flatMap((a) => a.split(/\s+/)).filter(Boolean)
    if (args.some((a) => /(^|[/\\])npm(-cli\.js)?$/.test(a))) return !args.includes('prebuild')
    pid = parent
  }
  return false
}
if (startedAsHookOfBuild()) process.exit(0)

// `--target <rust triple>` cross-builds another platform's package
// (`npm run test:platforms` does, with the Debian cross compilers).
const TARGETS = {
  'x86_64-unknown-linux-gnu': 'linux-x64-gnu',
  'aarch64-unknown-linux-gnu': 'linux-arm64-gnu',
  'x86_64-pc-windows-gnu': 'win32-x64-gnu',
}
const { platformTriple } = (await import('../lib/addon/loader.js')).default
const targetArg = process.argv.indexOf('--target')
const rustTarget = targetArg > 0 ? process.argv[targetArg + 1] : null
const triple = rustTarget ? TARGETS[rustTarget] : platformTriple()
if (rustTarget && !triple) {
  console.error(`npm run prebuild -- --target: one of ${Object.keys(TARGETS).join(', ')}`)
  process.exit(1)
}
if (!rustTarget && triple !== 'linux-x64-gnu' && triple !== 'linux-arm64-gnu') {
  console.log(`npm run prebuild builds linux-x64-gnu (and linux-arm64-gnu on an arm64 host); for ${triple} see docs/packaging.md`)
  process.exit(0)
}
const windows = triple.startsWith('win32')
// `--variants haswell[,…]`: only these CPU variants (patch 0008), in a
// target dir and an addon folder of their own (target/prebuilt-<tags>/package),
// never the package folder: CI's suites on the AVX2 variant of an AVX-512
// machine, without compiling llama.cpp's CPU code once per variant.
const variantsArg = process.argv.indexOf('--variants')
const only = variantsArg > 0 ? process.argv[variantsArg + 1] || '' : null
if (only !== null && !/^[a-z0-9_.]+(,[a-z0-9_.]+)*$/.test(only)) {
  console.error('npm run prebuild -- --variants: comma-separated CPU variant tags (haswell, skylakex, …; docs/packaging.md)')
  process.exit(1)
}
// (a cross build's: target/prebuilt-<platform>-<tags>/package)
const targetDir = join(root, 'target', only ? `prebuilt-${rustTarget ? `${triple}-` : ''}${only.replace(/,/g, '-')}` : 'prebuilt')
const pkgDir = only ? join(targetDir, 'package') : join(root, 'npm', triple)
const releaseDir = rustTarget ? join(targetDir, rustTarget, 'release') : join(targetDir, 'release')

// What a cross build needs from the Debian cross toolchains: the C/C++
// compilers llama.cpp's CMake build uses, the linker, and a sysroot for
// bindgen's libclang.
const cross = crossEnv(rustTarget)
function crossEnv(target) {
  if (!target || target === 'x86_64-unknown-linux-gnu') return {}
  const key = target.replace(/-/g, '_')
  const KEY = key.toUpperCase()
  // Compiler wrappers: a shell script per compiler, in the target dir.
  const wrap = join(targetDir, 'cross-bin')
  mkdirSync(wrap, { recursive: true })
  // Written only when it changes: ccache knows a compiler by its file's time.
  const wrapper = (name, command) => {
    const file = join(wrap, name)
    const text = `#!/bin/sh\nexec ${command}\n`
    if (!existsSync(file) || readFileSync(file, 'utf8') !== text) writeFileSync(file, text, { mode: 0o755 })
    return file
  }
  if (target === 'aarch64-unknown-linux-gnu') {
    // clang, not Debian 12's aarch64 gcc 12, which does not know the
    // -march of ggml's armv9.2 variants (+sme). Wrapped so the Debian cross
    // triple (whose binutils and libraries clang finds) comes last.
    return {
      [`CC_${key}`]: wrapper('aarch64-clang', 'clang "$@" --target=aarch64-linux-gnu'),
      [`CXX_${key}`]: wrapper('aarch64-clang++', 'clang++ "$@" --target=aarch64-linux-gnu'),
      [`AR_${key}`]: 'aarch64-linux-gnu-ar',
      [`CARGO_TARGET_${KEY}_LINKER`]: 'aarch64-linux-gnu-gcc',
      [`BINDGEN_EXTRA_CLANG_ARGS_${key}`]: '--sysroot=/usr/aarch64-linux-gnu',
    }
  }
  // MinGW-w64 with POSIX threads (std::thread and std::mutex in llama.cpp),
  // wrapped to force-include the declarations Debian 12's headers lack.
  const compat = join(root, 'scripts', 'mingw-compat.h')
  // napi-build links MinGW builds against `libnode.dll` (MSYS2's Node). The
  // addon resolves every N-API function from the host process at load
  // (napi-sys's dyn-symbols), so an empty DLL of that name satisfies the
  // linker and nothing imports from it (checked below).
  const stub = join(wrap, 'libnode', 'libnode.dll')
  if (!existsSync(stub)) {
    mkdirSync(dirname(stub), { recursive: true })
    writeFileSync(join(wrap, 'libnode', 'stub.c'), 'void llama_engine_libnode_stub(void) {}\n')
    execFileSync('x86_64-w64-mingw32-gcc-posix', ['-shared', '-o', stub, join(wrap, 'libnode', 'stub.c')])
  }
  return {
    [`CC_${key}`]: wrapper('mingw-gcc', `x86_64-w64-mingw32-gcc-posix -include ${compat} "$@"`),
    [`CXX_${key}`]: wrapper('mingw-g++', `x86_64-w64-mingw32-g++-posix -include ${compat} "$@"`),
    [`AR_${key}`]: 'x86_64-w64-mingw32-ar',
    [`CARGO_TARGET_${KEY}_LINKER`]: 'x86_64-w64-mingw32-gcc-posix',
    [`BINDGEN_EXTRA_CLANG_ARGS_${key}`]: '--sysroot=/usr/x86_64-w64-mingw32',
    LIBNODE_PATH: dirname(stub),
  }
}

ensurePrerequisites()
ensureVendored()
const t0 = Date.now()
// llama-cpp-sys-2 0.1.160 hard-links llama.cpp's shared libraries into the
// target dir when its build script runs, and fails (EEXIST) on the dangling
// links a previous run left there: remove them first.
for (const sub of ['', 'deps', 'examples']) {
  const dir = join(releaseDir, sub)
  for (const f of existsSync(dir) ? readdirSync(dir) : []) {
    if (/^(lib)?(llama|ggml|mtmd)[^_]*\.(so|dll)/.test(f)) rmSync(join(dir, f))
  }
}
const cargoArgs = ['build', '--release', '--lib', '--no-default-features', '--features', 'prebuilt', '--target-dir', targetDir]
if (rustTarget) cargoArgs.push('--target', rustTarget)
console.log(`llama-engine: building the portable addon for ${triple} (cargo ${cargoArgs.join(' ')})`)
execFileSync('cargo', cargoArgs, {
  cwd: root,
  stdio: 'inherit',
  // RUSTFLAGS replaces .cargo/config.toml's -C target-cpu=native: no
  // machine-specific code in the addon or in llama.cpp (GGML_NATIVE=OFF).
  // No OpenSSL either: llama.cpp's common library would link libssl for
  // downloads the engine never makes.
  env: { ...buildEnv(), ...compilerCacheEnv(), ...cross, RUSTFLAGS: '', CMAKE_DISABLE_FIND_PACKAGE_OpenSSL: 'TRUE' },
})
function buildEnv() {
  const env = { ...process.env }
  delete env.GGML_CPU_VARIANTS
  if (only) env.GGML_CPU_VARIANTS = only
  return env
}

// llama-cpp-sys-2's output: lib/ or bin/ (libllama, libggml, libggml-base,
// …) and backends/ (the CPU back end per variant), from the newest build.
const buildRoot = join(releaseDir, 'build')
const outs = readdirSync(buildRoot)
  .filter((d) => d.startsWith('llama-cpp-sys-2-') && existsSync(join(buildRoot, d, 'out', 'backends')))
  .map((d) => join(buildRoot, d, 'out'))
  .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)
if (!outs.length) throw new Error(`no llama-cpp-sys-2 output with backends/ under ${buildRoot}`)
const out = outs[0]
// MinGW's C++ runtime DLLs, shipped in the Windows package (a Windows
// machine has none of them): found where the cross compiler keeps them.
const mingwDirs = windows
  ? execFileSync('sh', ['-c', 'dirname "$(x86_64-w64-mingw32-g++-posix -print-file-name=libstdc++-6.dll)"; dirname "$(x86_64-w64-mingw32-gcc-posix -print-file-name=libwinpthread-1.dll)"'], { encoding: 'utf8' })
      .split('\n')
      .filter(Boolean)
  : []
const libDirs = [...['lib', 'lib64', 'bin'].map((d) => join(out, d)), ...mingwDirs].filter(existsSync)
const isLib = (f) => f.endsWith('.node') || f.includes('.so') || f.endsWith('.dll')

function needed(file) {
  if (windows) {
    const text = execFileSync('x86_64-w64-mingw32-objdump', ['-p', file], { encoding: 'utf8', maxBuffer: 1 << 26 })
    return [...text.matchAll(/DLL Name: (.+)/g)].map((m) => m[1].trim())
  }
  const text = execFileSync('readelf', ['-d', file], { encoding: 'utf8' })
  return [...text.matchAll(/\(NEEDED\)\s+Shared library: \[(.+?)\]/g)].map((m) => m[1])
}

// Clean the package folder but keep its package.json and README.
for (const f of existsSync(pkgDir) ? readdirSync(pkgDir) : []) {
  if (isLib(f)) rmSync(join(pkgDir, f))
}
mkdirSync(pkgDir, { recursive: true })

const addon = join(pkgDir, `llama-engine.${triple}.node`)
copyFileSync(join(releaseDir, windows ? 'llama_engine.dll' : 'libllama_engine.so'), addon)

// Every shared library the addon needs from llama.cpp's build, under the
// name it is asked for (its soname; npm pack does not keep symlinks).
const copied = new Set()
const queue = [addon]
while (queue.length) {
  for (const name of needed(queue.pop())) {
    if (copied.has(name)) continue
    const src = libDirs.map((d) => join(d, name)).find(existsSync)
    if (!src) continue // a system library (libc, libstdc++, libm, …)
    copyFileSync(realpathSync(src), join(pkgDir, name))
    copied.add(name)
    queue.push(join(pkgDir, name))
  }
}
const variantName = /^(?:lib)?ggml-cpu-(.+)\.(?:so|dll)$/
// The CPU variants, and the RPC back end (EngineOptions.rpc, rpc-worker),
// a module of its own in this build, loaded when a model names workers.
const moduleName = /^(?:lib)?ggml-(cpu-.+|rpc)\.(?:so|dll)$/
const modules = readdirSync(join(out, 'backends')).filter((f) => moduleName.test(f))
const variants = modules.filter((f) => variantName.test(f))
for (const f of modules) {
  copyFileSync(realpathSync(join(out, 'backends', f)), join(pkgDir, f))
  for (const name of needed(join(pkgDir, f))) {
    if (copied.has(name)) continue
    const src = libDirs.map((d) => join(d, name)).find(existsSync)
    if (!src) continue
    // A runtime DLL only the variants need (MinGW's libgomp, say) ships too.
    if (!windows) throw new Error(`${f} needs ${name}, which the addon does not`)
    copyFileSync(realpathSync(src), join(pkgDir, name))
    copied.add(name)
  }
}

// MinGW's DLLs carry their debug sections (libstdc++-6.dll is 24 MB with
// them, 2 MB without); the package ships them stripped.
if (windows) {
  for (const f of readdirSync(pkgDir).filter(isLib)) execFileSync('x86_64-w64-mingw32-strip', ['--strip-unneeded', join(pkgDir, f)])
}

// What the package may depend on at run time: the C and C++ runtimes only
// (on Windows: the system's DLLs and, for N-API, the host process).
const system = new Set()
for (const f of readdirSync(pkgDir).filter(isLib)) {
  for (const name of needed(join(pkgDir, f))) if (!copied.has(name)) system.add(name)
}
const allowed = windows
  ? /^(kernel32|msvcrt|ntdll|advapi32|bcrypt|bcryptprimitives|ws2_32|userenv|user32|shell32|ole32|oleaut32|api-ms-win-.*|node)\.(dll|exe)$/i
  : /^(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux.*)\.so/
const extra = [...system].filter((n) => !allowed.test(n))
if (extra.length) throw new Error(`the prebuilt addon would need ${extra.join(', ')} on the user's machine`)

const rootPkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
const pkg = only ? { name: `the addon with CPU variants ${only}`, version: rootPkg.version } : JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'))
if (pkg.version !== rootPkg.version) throw new Error(`npm/${triple}/package.json version ${pkg.version} != ${rootPkg.version}`)
if (only && variants.map((v) => variantName.exec(v)[1]).sort().join(',') !== only.split(',').sort().join(',')) {
  throw new Error(`--variants ${only}: built ${variants.join(', ') || 'no variant'} (is every tag one of ggml's?)`)
}

const files = readdirSync(pkgDir).filter(isLib)
const mb = files.reduce((s, f) => s + statSync(join(pkgDir, f)).size, 0) / 1048576
console.log(
  `llama-engine: ${pkg.name} in ${relative(root, pkgDir)}/: ${basename(addon)}, ${[...copied].join(', ')}, ` +
    `${variants.length} CPU variants (${variants.map((v) => variantName.exec(v)[1]).join(', ')})` +
    `${modules.length > variants.length ? `, ${modules.filter((f) => !variantName.test(f)).join(', ')}` : ''}; ` +
    `${mb.toFixed(1)} MiB; system libraries: ${[...system].sort().join(', ')}; ${((Date.now() - t0) / 1000).toFixed(0)} s`,
)
