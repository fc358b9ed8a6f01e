// How the package finds its native addon (lib/addon/loader.js): the platform
// package first, then a local build; what status() says about it; and the
// message when nothing loads. The prebuilt platform package itself is
// installed and run offline by `npm run test:prebuilt` (scripts/check-prebuilt.mjs).
const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { LlamaEngine } = require('..')
const { platformTriple } = require('../lib/addon/loader.js')
const { MODELS } = require('./helpers')

const root = path.join(__dirname, '..')

test('status() says where the addon came from and which CPU back end computes', async () => {
  const engine = await LlamaEngine.load({ modelPath: path.join(MODELS, 'SmolLM2-135M-Instruct.Q4_1.gguf'), contextSize: 256 })
  try {
    const s = engine.status()
    // LLAMA_ENGINE_ADDON names one (CI runs the suites again on the prebuilt package's AVX2 variant).
    expect(s.addon).toBe(process.env.LLAMA_ENGINE_ADDON ? path.resolve(process.env.LLAMA_ENGINE_ADDON) : 'local build')
    if (process.env.LLAMA_ENGINE_CPU_VARIANT) expect(s.cpuBackend).toBe(process.env.LLAMA_ENGINE_CPU_VARIANT)
    expect(typeof s.cpuBackend).toBe('string')
    expect(s.cpuBackend.length).toBeGreaterThan(0)
    expect(s.batchInvariant).toBe(true)
  } finally {
    await engine.dispose()
  }
})

test('the platform package is named by napi-rs convention and exists as a folder under npm/', () => {
  const triple = platformTriple()
  expect(triple).toMatch(/^(linux-(x64|arm64)-(gnu|musl)|darwin-(x64|arm64)|win32-(x64|arm64)-gnu)$/)
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'npm', triple, 'package.json'), 'utf8'))
  const rootPkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))
  expect(pkg.name).toBe(`llama-engine-${triple}`)
  expect(pkg.main).toBe(`llama-engine.${triple}.node`)
  expect(pkg.version).toBe(rootPkg.version)
  expect(rootPkg.optionalDependencies[pkg.name]).toBe(rootPkg.version)
  for (const dir of fs.readdirSync(path.join(root, 'npm'))) {
    const p = JSON.parse(fs.readFileSync(path.join(root, 'npm', dir, 'package.json'), 'utf8'))
    // A GPU module package (llama-engine-<platform>-vulkan) is installed by
    // the user, never by default: not an optional dependency, a peer of its
    // platform package, which is one.
    const gpu = /^(.+)-vulkan$/.exec(dir)
    expect({ dir, name: p.name, version: p.version, listed: rootPkg.optionalDependencies[p.name] }).toEqual({
      dir,
      name: `llama-engine-${dir}`,
      version: rootPkg.version,
      listed: gpu ? undefined : rootPkg.version,
    })
    if (gpu) {
      expect(p.peerDependencies).toEqual({ [`llama-engine-${gpu[1]}`]: rootPkg.version })
      expect(rootPkg.optionalDependencies[`llama-engine-${gpu[1]}`]).toBe(rootPkg.version)
    }
    expect(p.os.length && p.cpu.length).toBeTruthy()
  }
})

test('without any addon, requiring the package fails with a message that says what to do', () => {
  // A copy of the JS files without a .node beside them and without the platform package.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-noaddon-'))
  try {
    // The package's JavaScript (its entry points and lib/), as npm would install them.
    const rootPkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))
    for (const f of rootPkg.files.filter((f) => f.endsWith('.js'))) fs.copyFileSync(path.join(root, f), path.join(dir, f))
    fs.cpSync(path.join(root, 'lib'), path.join(dir, 'lib'), { recursive: true })
    const env = { ...process.env }
    delete env.LLAMA_ENGINE_ADDON
    const r = spawnSync(process.execPath, ['-e', `require(${JSON.stringify(dir)})`], { cwd: dir, env, encoding: 'utf8' })
    expect(r.status).not.toBe(0)
    expect(r.stderr).toContain(`llama-engine-${platformTriple()}: not installed`)
    expect(r.stderr).toContain('not built')
    expect(r.stderr).toContain('--build-from-source')
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
  }
})

test('LLAMA_ENGINE_ADDON loads the addon from a given path', () => {
  const local = path.join(root, `llama-engine.${platformTriple()}.node`)
  const r = spawnSync(
    process.execPath,
    ['-e', `const { LlamaEngine } = require(${JSON.stringify(root)}); console.log(typeof LlamaEngine.load)`],
    { env: { ...process.env, LLAMA_ENGINE_ADDON: local }, encoding: 'utf8' },
  )
  expect(r.stderr).toBe('')
  expect(r.stdout.trim()).toBe('function')
})

test("libgomp's spin settings apply while the addon loads and are not left in the host's environment", () => {
  const script = `require(${JSON.stringify(root)}); console.log(JSON.stringify([process.env.OMP_WAIT_POLICY ?? null, process.env.GOMP_SPINCOUNT ?? null]))`
  const run = (extra) => spawnSync(process.execPath, ['-e', script], { env: { ...process.env, OMP_DISPLAY_ENV: 'verbose', ...extra }, encoding: 'utf8' })
  const ours = run({})
  expect(JSON.parse(ours.stdout.trim().split('\n').pop())).toEqual([null, null])
  // A source build links libgomp, which prints what it read (OMP_DISPLAY_ENV).
  if (ours.stderr.includes('OPENMP DISPLAY ENVIRONMENT')) {
    expect(ours.stderr).toMatch(/OMP_WAIT_POLICY = 'ACTIVE'/)
    expect(ours.stderr).toMatch(/GOMP_SPINCOUNT = '1000'/)
  }
  // The host's own setting wins and stays.
  const host = run({ OMP_WAIT_POLICY: 'passive' })
  expect(JSON.parse(host.stdout.trim().split('\n').pop())).toEqual(['passive', null])
  if (host.stderr.includes('OPENMP DISPLAY ENVIRONMENT')) expect(host.stderr).toMatch(/OMP_WAIT_POLICY = 'PASSIVE'/)
})
