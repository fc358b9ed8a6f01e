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

function loadNative() {
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
