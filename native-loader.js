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
// when the addon loads it. Every engine has its own thread and so its own
// OpenMP team: with two engines in a process there are more OpenMP threads
// than cores, and libgomp then spins only 100 times at each of ggml's
// barriers (hundreds per token) before sleeping in the kernel, which halved
// decoding speed while the other engine sat idle (measured: 39–48 tokens/s
// against 85–98). OMP_WAIT_POLICY=active raises that spin to 1000;
// GOMP_SPINCOUNT keeps a lone team's spin at libgomp's default (300000,
// a few ms), so an idle engine still sleeps. Set only while the addon loads
// (child processes do not inherit them) and never over the host's own.
function withOpenMpSettings(load) {
  const env = process.env
  if (env.OMP_WAIT_POLICY !== undefined || env.GOMP_SPINCOUNT !== undefined) return load()
  env.OMP_WAIT_POLICY = 'active'
  env.GOMP_SPINCOUNT = '300000'
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
  const local = path.join(__dirname, `llama-engine.${triple}.node`)
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
