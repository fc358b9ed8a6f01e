// GPU back ends never break the CPU one. On a build without a GPU back end,
// `gpuLayers` runs on the CPU with the same output as `gpuLayers: 0`, and
// `status().gpu` says why. The Vulkan module is first loaded in a child
// process (lib/addon/gpu.js's probe): a module that crashes there (as a broken driver
// does) or does not start leaves this process on the CPU with the reason.
// The real Vulkan package on lavapipe is checked by
// `npm run test:platforms -- linux-x64-gnu-vulkan`.
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { LlamaEngine, TARGET } = require('./helpers')
const { probe, decide } = require('../lib/addon/gpu.js')

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-gpu-'))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

// A ggml back-end module whose entry point does what a broken driver does.
function fakeModule(name, body) {
  const src = path.join(dir, `${name}.c`)
  const lib = path.join(dir, `lib${name}.so`)
  fs.writeFileSync(src, `#include <signal.h>\n#include <stddef.h>\nvoid *ggml_backend_init(void) { ${body} }\n`)
  execFileSync('cc', ['-shared', '-fPIC', '-o', lib, src])
  return lib
}

test('gpuLayers on a build without a GPU back end: the CPU computes, the same output, and status says why', async () => {
  const req = { prompt: 'The capital of France is', n_predict: 12, temperature: 0, n_probs: 2 }
  const gpu = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, threads: 2, gpuLayers: 99, draftGpuLayers: 99 })
  const s = gpu.status()
  const a = await gpu.complete(req)
  await gpu.dispose()
  // A source build has none built in; the prebuilt package has none installed beside it.
  expect(s.gpu).toEqual({ device: null, devices: [], layers: 0, draftLayers: 0, reason: expect.stringMatching(/without a GPU back end|no GPU back end installed/) })
  expect(s.batchInvariant).toBe(true)
  const cpu = await LlamaEngine.load({ modelPath: TARGET, contextSize: 512, threads: 2 })
  const b = await cpu.complete(req)
  expect(cpu.status().gpu.layers).toBe(0)
  await cpu.dispose()
  expect(a.content).toBe(b.content)
  expect(a.completion_probabilities).toEqual(b.completion_probabilities)
})

test('a GPU module that crashes takes down only the probe process', async () => {
  const crash = fakeModule('crash', 'raise(SIGSEGV); return NULL;')
  const r = await probe(crash)
  expect(r.devices).toBeUndefined()
  expect(r.reason).toMatch(/killed by SIGSEGV: the driver crashed/)
})

test('a GPU module that does not start, or is not there, is a reason, not an error', async () => {
  const none = fakeModule('nostart', 'return NULL;')
  expect((await probe(none)).reason).toMatch(/did not start/)
  expect((await probe(path.join(dir, 'missing.so'))).reason).toMatch(/no such file/)
})

test('decide: the module from LLAMA_ENGINE_VULKAN, LLAMA_ENGINE_GPU=off, the package missing', async () => {
  const calls = []
  const binding = { buildInfo: () => ({ dynamicBackends: true }), configureGpu: (p, why) => calls.push([p, why]) }
  const saved = { ...process.env }
  try {
    process.env.LLAMA_ENGINE_GPU = 'off'
    await decide(binding, 'linux-x64-gnu')
    delete process.env.LLAMA_ENGINE_GPU
    process.env.LLAMA_ENGINE_VULKAN = path.join(dir, 'nowhere.so')
    await decide(binding, 'linux-x64-gnu')
    process.env.LLAMA_ENGINE_VULKAN = fakeModule('crash2', 'raise(SIGSEGV); return NULL;')
    await decide(binding, 'linux-x64-gnu')
    delete process.env.LLAMA_ENGINE_VULKAN
    await decide(binding, 'linux-x64-gnu')
    // A source build keeps ggml's own registry: nothing to decide.
    await decide({ buildInfo: () => ({ dynamicBackends: false }), configureGpu: () => calls.push('source') }, 'linux-x64-gnu')
  } finally {
    process.env = saved
  }
  expect(calls).toEqual([
    [null, 'LLAMA_ENGINE_GPU=off'],
    [null, expect.stringMatching(/nowhere\.so: no such file/)],
    [null, expect.stringMatching(/SIGSEGV/)],
    [null, expect.stringMatching(/npm install llama-engine-linux-x64-gnu-vulkan/)],
  ])
})
