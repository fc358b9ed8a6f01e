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
// best CPU variant (src/engine/ggml_setup.rs). The exactness settings are
// the source build's: llamafile and repacking off (.cargo/config.toml [env]
// applies to every build), the tiled path and extra buffers off at run time.
//
// Its own cargo target dir (target/prebuilt), so the source build is kept.
// About 30 minutes on 2 cores the first time: llama.cpp's CPU code is
// compiled once per variant.
import { execFileSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, statSync } from 'node:fs'
import { basename, join } from 'node:path'
import { ensurePrerequisites, root } from './native.mjs'

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

const { platformTriple } = (await import('../native-loader.js')).default
const triple = platformTriple()
if (triple !== 'linux-x64-gnu' && triple !== 'linux-arm64-gnu') {
  console.log(`npm run prebuild builds linux-x64-gnu (and linux-arm64-gnu on an arm64 host); for ${triple} see README "Other platforms"`)
  process.exit(0)
}
const pkgDir = join(root, 'npm', triple)
const targetDir = join(root, 'target', 'prebuilt')

ensurePrerequisites()
const t0 = Date.now()
// llama-cpp-sys-2 0.1.160 hard-links llama.cpp's shared libraries into the
// target dir when its build script runs, and fails (EEXIST) on the dangling
// links a previous run left there: remove them first.
for (const sub of ['', 'deps', 'examples']) {
  const dir = join(targetDir, 'release', sub)
  for (const f of existsSync(dir) ? readdirSync(dir) : []) {
    if (/^lib(llama|ggml)[^_]*\.so/.test(f)) rmSync(join(dir, f))
  }
}
console.log(`llama-engine: building the portable addon for ${triple} (cargo build --release --lib --no-default-features --features prebuilt)`)
execFileSync('cargo', ['build', '--release', '--lib', '--no-default-features', '--features', 'prebuilt', '--target-dir', targetDir], {
  cwd: root,
  stdio: 'inherit',
  // RUSTFLAGS replaces .cargo/config.toml's -C target-cpu=native: no
  // machine-specific code in the addon or in llama.cpp (GGML_NATIVE=OFF).
  // No OpenSSL either: llama.cpp's common library would link libssl for
  // downloads the engine never makes.
  env: { ...process.env, RUSTFLAGS: '', CMAKE_DISABLE_FIND_PACKAGE_OpenSSL: 'TRUE' },
})

// llama-cpp-sys-2's output: lib/ (libllama, libggml, libggml-base, …) and
// backends/ (libggml-cpu-<variant>.so), from the newest build.
const buildRoot = join(targetDir, 'release', 'build')
const outs = readdirSync(buildRoot)
  .filter((d) => d.startsWith('llama-cpp-sys-2-') && existsSync(join(buildRoot, d, 'out', 'backends')))
  .map((d) => join(buildRoot, d, 'out'))
  .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)
if (!outs.length) throw new Error(`no llama-cpp-sys-2 output with backends/ under ${buildRoot}`)
const out = outs[0]
const libDirs = ['lib', 'lib64'].map((d) => join(out, d)).filter(existsSync)

function needed(file) {
  const text = execFileSync('readelf', ['-d', file], { encoding: 'utf8' })
  return [...text.matchAll(/\(NEEDED\)\s+Shared library: \[(.+?)\]/g)].map((m) => m[1])
}

// Clean the package folder but keep its package.json and README.
for (const f of existsSync(pkgDir) ? readdirSync(pkgDir) : []) {
  if (f.endsWith('.node') || f.includes('.so')) rmSync(join(pkgDir, f))
}
mkdirSync(pkgDir, { recursive: true })

const addon = join(pkgDir, `llama-engine.${triple}.node`)
copyFileSync(join(targetDir, 'release', 'libllama_engine.so'), addon)

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
const variants = readdirSync(join(out, 'backends')).filter((f) => /^libggml-cpu-.+\.so$/.test(f))
for (const f of variants) {
  copyFileSync(realpathSync(join(out, 'backends', f)), join(pkgDir, f))
  for (const name of needed(join(pkgDir, f))) {
    if (!copied.has(name) && libDirs.some((d) => existsSync(join(d, name)))) {
      throw new Error(`${f} needs ${name}, which the addon does not`)
    }
  }
}

// What the package may depend on at run time: the C and C++ runtimes only.
const system = new Set()
for (const f of readdirSync(pkgDir).filter((f) => f.endsWith('.node') || f.includes('.so'))) {
  for (const name of needed(join(pkgDir, f))) if (!copied.has(name)) system.add(name)
}
const allowed = /^(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux.*)\.so/
const extra = [...system].filter((n) => !allowed.test(n))
if (extra.length) throw new Error(`the prebuilt addon would need ${extra.join(', ')} on the user's machine`)

const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'))
const rootPkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
if (pkg.version !== rootPkg.version) throw new Error(`npm/${triple}/package.json version ${pkg.version} != ${rootPkg.version}`)

const files = readdirSync(pkgDir).filter((f) => f.endsWith('.node') || f.includes('.so'))
const mb = files.reduce((s, f) => s + statSync(join(pkgDir, f)).size, 0) / 1048576
console.log(
  `llama-engine: ${pkg.name} in npm/${triple}/: ${basename(addon)}, ${[...copied].join(', ')}, ` +
    `${variants.length} CPU variants (${variants.map((v) => v.slice(12, -3)).join(', ')}); ` +
    `${mb.toFixed(1)} MiB; system libraries: ${[...system].sort().join(', ')}; ${((Date.now() - t0) / 1000).toFixed(0)} s`,
)
