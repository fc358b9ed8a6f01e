'use strict'
// Chooses the GPU back end of this process, once, before its first engine
// loads. The prebuilt addon has none built in: the Vulkan back end is a
// ggml module in an optional package (llama-engine-<platform>-vulkan). A
// Vulkan driver can crash the process that loads it, so the module is first
// loaded in a child process (gpu-probe.js, beside this file), which also computes on each
// device; only if the child succeeds does this process load it. Otherwise
// the engine runs on the CPU and status().gpu.reason says why.
//
// LLAMA_ENGINE_GPU=off skips all of it; LLAMA_ENGINE_VULKAN=/path/to/
// libggml-vulkan.so names the module instead of the package.

const { execFile } = require('node:child_process')
const path = require('node:path')
const fs = require('node:fs')

const PROBE_TIMEOUT_MS = 120000

function modulePath(triple) {
  const file = process.platform === 'win32' ? 'ggml-vulkan.dll' : 'libggml-vulkan.so'
  if (process.env.LLAMA_ENGINE_VULKAN) return { path: path.resolve(process.env.LLAMA_ENGINE_VULKAN) }
  const pkg = `llama-engine-${triple}-vulkan`
  try {
    return { path: path.join(path.dirname(require.resolve(`${pkg}/package.json`)), file) }
  } catch {
    return { reason: `no GPU back end installed (npm install ${pkg} adds Vulkan)` }
  }
}

// The child: this Node (or Electron, run as Node), with the same addon.
function probe(module) {
  const env = { ...process.env, ELECTRON_RUN_AS_NODE: '1' }
  const where = `the Vulkan probe (a child process loading ${module})`
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [path.join(__dirname, 'gpu-probe.js'), module],
      { env, encoding: 'utf8', timeout: PROBE_TIMEOUT_MS, killSignal: 'SIGKILL', windowsHide: true, maxBuffer: 1 << 24 },
      (error, stdout) => {
        if (error && error.killed) return resolve({ reason: `${where} gave no answer in ${PROBE_TIMEOUT_MS / 1000} s` })
        if (error && error.signal) return resolve({ reason: `${where} was killed by ${error.signal}: the driver crashed` })
        if (error && typeof error.code !== 'number') return resolve({ reason: `${where} could not run: ${error.message}` })
        let answer
        try {
          answer = JSON.parse(String(stdout).trim().split('\n').pop())
        } catch {
          return resolve({ reason: `${where} exited with code ${error ? error.code : 0} without an answer` })
        }
        resolve(answer.ok ? { devices: answer.devices } : { reason: answer.reason })
      },
    )
  })
}

let decided = null
// Before the first NativeEngine.load of the process; later calls wait for
// the same decision.
function setupGpu(binding, triple) {
  if (!decided) decided = decide(binding, triple)
  return decided
}

async function decide(binding, triple) {
  if (typeof binding.buildInfo !== 'function' || !binding.buildInfo().dynamicBackends) return // a source build: ggml's own registry
  if (/^(off|0|false|none)$/i.test(process.env.LLAMA_ENGINE_GPU || '')) {
    binding.configureGpu(null, 'LLAMA_ENGINE_GPU=off')
    return
  }
  const found = modulePath(triple)
  if (!found.path) return void binding.configureGpu(null, found.reason)
  if (!fs.existsSync(found.path)) return void binding.configureGpu(null, `${found.path}: no such file`)
  const result = await probe(found.path)
  if (result.devices) binding.configureGpu(found.path, null)
  else binding.configureGpu(null, result.reason)
}

// probe and decide are exported for the tests.
module.exports = { setupGpu, probe, decide }
