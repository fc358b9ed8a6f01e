// Builds the native addon from source with cargo (release profile) and puts
// it where lib/addon/loader.js looks for it. Shared by `npm install` and the test and
// demo entry points, so a fresh clone needs no other step.
import { execFileSync, spawnSync } from 'node:child_process'
import { copyFileSync, existsSync, readdirSync, renameSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import loader from '../lib/addon/loader.js'
import { ensureVendored } from './vendor.mjs'

const { platformTriple } = loader

export const root = join(dirname(fileURLToPath(import.meta.url)), '..')

// The same name lib/addon/loader.js looks for.
export const addonFile = join(root, `llama-engine.${platformTriple()}.node`)

export function addonBuilt() {
  return existsSync(addonFile)
}

function has(cmd, args = ['--version']) {
  return spawnSync(cmd, args, { stdio: 'ignore' }).status === 0
}

function libclangPresent() {
  if (process.env.LIBCLANG_PATH) return true
  if (process.platform !== 'linux') return true
  const dirs = ['/usr/lib', '/usr/lib64', '/usr/lib/x86_64-linux-gnu', '/usr/lib/aarch64-linux-gnu', '/usr/local/lib']
  for (const d of dirs) {
    try {
      if (readdirSync(d).some((f) => f.startsWith('libclang') && f.includes('.so'))) return true
    } catch {}
    try {
      for (const sub of readdirSync(d).filter((s) => s.startsWith('llvm-'))) {
        if (readdirSync(join(d, sub, 'lib')).some((f) => f.startsWith('libclang') && f.includes('.so'))) return true
      }
    } catch {}
  }
  return false
}

/** What is missing to build llama.cpp and the addon, as Debian package names. */
export function missingPrerequisites() {
  const missing = []
  if (!has('cargo')) missing.push('cargo (Rust toolchain, https://rustup.rs)')
  if (!has('cmake')) missing.push('cmake')
  if (!has('cc') && !has('clang')) missing.push('a C/C++ compiler (clang or build-essential)')
  if (!has('c++') && !has('clang++')) missing.push('a C++ compiler (clang or g++)')
  if (!libclangPresent()) missing.push('libclang-dev')
  return missing
}

/** Installs missing Debian packages when we are root on a Debian-like system; otherwise explains. */
export function ensurePrerequisites() {
  let missing = missingPrerequisites()
  if (missing.length === 0) return
  const aptable = missing.every((m) => !m.startsWith('cargo'))
  const isRoot = typeof process.getuid === 'function' && process.getuid() === 0
  if (aptable && isRoot && has('apt-get', ['--version'])) {
    console.log(`llama-engine: installing build prerequisites with apt-get: cmake clang libclang-dev ccache`)
    execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit' })
    execFileSync('apt-get', ['install', '-y', '-qq', 'cmake', 'clang', 'libclang-dev', 'ccache'], {
      stdio: 'inherit',
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    })
    missing = missingPrerequisites()
  }
  if (missing.length > 0) {
    console.error(
      `llama-engine: cannot build the native addon; missing: ${missing.join(', ')}.\n` +
        `On Debian/Ubuntu: sudo apt-get install cmake clang libclang-dev`,
    )
    process.exit(1)
  }
}

/**
 * llama.cpp's C and C++ through ccache when it is installed (and no
 * launcher is set already): kept in ~/.cache/ccache, with paths relative to
 * the checkout, so a second build on the machine — another clone, another
 * target dir, CI after a session, the prebuilt variants sharing the
 * non-CPU code — compiles only what changed. CMake reads the launchers
 * from the environment; llama-cpp-sys-2 forwards CMAKE_* variables too.
 */
export function compilerCacheEnv(dir = root) {
  if (process.env.CMAKE_CXX_COMPILER_LAUNCHER || process.env.LLAMA_ENGINE_NO_CCACHE || !has('ccache')) return {}
  return {
    CMAKE_C_COMPILER_LAUNCHER: 'ccache',
    CMAKE_CXX_COMPILER_LAUNCHER: 'ccache',
    CCACHE_BASEDIR: process.env.CCACHE_BASEDIR || dir,
    // Objects are the same whatever the build's directory (no debug info).
    CCACHE_NOHASHDIR: process.env.CCACHE_NOHASHDIR || '1',
  }
}

export function buildAddon({ features = [] } = {}) {
  ensurePrerequisites()
  ensureVendored()
  const args = ['build', '--release', '--lib']
  if (features.length) args.push('--features', features.join(','))
  console.log(`llama-engine: building the native addon (cargo ${args.join(' ')}); llama.cpp takes a few minutes the first time`)
  execFileSync('cargo', args, { cwd: root, stdio: 'inherit', env: { ...process.env, ...compilerCacheEnv() } })
  const lib = { linux: 'libllama_engine.so', darwin: 'libllama_engine.dylib', win32: 'llama_engine.dll' }[process.platform]
  // Copy then rename: a new inode, so a process that has the old addon
  // loaded keeps its mapping instead of crashing on a rewritten file.
  const tmp = `${addonFile}.${process.pid}.tmp`
  copyFileSync(join(root, 'target', 'release', lib), tmp)
  renameSync(tmp, addonFile)
}
