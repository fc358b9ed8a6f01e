'use strict'
// Finds the native addon: the platform package first (a prebuilt binary
// installed as an optional dependency, e.g. llama-engine-linux-x64-gnu), then
// a local build in this directory (`npm run build`, or the install script's
// source build). LLAMA_ENGINE_ADDON=/path/to/addon.node overrides both.

const path = require('node:path')

// The platform package's name and the local file's suffix, per napi-rs's
// convention: llama-engine-<platform>-<arch>[-<abi>].
function platformTriple() {
  const { platform, arch } = process
  if (platform === 'linux') {
    const glibc = process.report && typeof process.report.getReport === 'function'
      ? Boolean(process.report.getReport().header.glibcVersionRuntime)
      : true
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`
  }
  // Windows packages are built with MinGW-w64 (any N-API host loads them).
  if (platform === 'win32') return `win32-${arch}-gnu`
  return `${platform}-${arch}`
}

function isNotFound(e, what) {
  return e && e.code === 'MODULE_NOT_FOUND' && String(e.message).includes(what)
}

// Source builds compute with libgomp (OpenMP), which reads its settings once,
// when the addon loads it. A thread that reaches one of ggml's barriers
// (hundreds per token) before the others waits there: spinning is fastest
// when every thread has a core, but when one was preempted — the machine
// busy with other work, a second engine — the others spin through their
// time slices. libgomp's default (300,000 spins, or 100 with more threads
// than cores) and OMP_WAIT_POLICY=passive both lose (measured, SmolLM2
// Q4_1, 2 threads, 64 tokens: 300,000 spins ran 2–24 tokens/s beside two
// busy processes against 119–133 idle, and loaded in 4–7 s; passive ran
// 40–46 idle). OMP_WAIT_POLICY=active with GOMP_SPINCOUNT=1000 — tens of
// microseconds of spinning, then sleep — kept idle speed (114–132) and ran
// 47–55 beside two busy processes (0.4×, their fair share being 0.5×),
// loading in ~2 s; docs/benchmarks.md#contention. The engine also moves to
// one thread when that is faster (crates/core/src/threads.rs). Set only while the
// addon loads (child processes do not inherit them) and never over the
// host's own.
function withOpenMpSettings(load) {
  const env = process.env
  if (env.OMP_WAIT_POLICY !== undefined || env.GOMP_SPINCOUNT !== undefined) return load()
  env.OMP_WAIT_POLICY = 'active'
  env.GOMP_SPINCOUNT = '1000'
  try {
    return load()
  } finally {
    delete env.OMP_WAIT_POLICY
    delete env.GOMP_SPINCOUNT
  }
}

function loadNative() {
  return withOpenMpSettings(findNative)
}

function findNative() {
  const triple = platformTriple()
  const tried = []
  const override = process.env.LLAMA_ENGINE_ADDON
  if (override) {
    return { binding: require(path.resolve(override)), from: path.resolve(override) }
  }
  const pkg = `llama-engine-${triple}`
  if (process.env.npm_config_build_from_source !== 'true') {
    try {
      return { binding: require(pkg), from: pkg }
    } catch (e) {
      tried.push(isNotFound(e, pkg) ? `${pkg}: not installed` : `${pkg}: ${e.message}`)
    }
  }
  // The package root (two folders up), where `npm run build` puts it.
  const local = path.join(__dirname, '..', '..', `llama-engine.${triple}.node`)
  try {
    return { binding: require(local), from: 'local build' }
  } catch (e) {
    tried.push(isNotFound(e, local) ? `${local}: not built` : `${local}: ${e.message}`)
  }
  const err = new Error(
    `llama-engine: no native addon for ${triple} could be loaded.\n  ${tried.join('\n  ')}\n` +
      'Install the platform package (npm installs it as an optional dependency; do not use --omit=optional), ' +
      'or build from source: npm rebuild llama-engine --build-from-source (needs cargo, cmake, clang, libclang).',
  )
  throw err
}

module.exports = { loadNative, platformTriple }
