// Makes a fresh clone ready to run: npm dependencies, the native addon and
// the model fixtures. Each step is skipped when already done. While the
// addon builds (minutes of compiling), what needs no addon is fetched
// beside it: the npm dependencies and the models downloaded as they are;
// the ones made with the addon (quantized, adapters) come after. The demo
// asks for less (no npm dependencies: the CLI needs none; two models), so a
// fresh clone streams its first tokens sooner.
import { execFileSync, spawn } from 'node:child_process'
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { addonBuilt, buildAddon, ensurePrerequisites, root } from './native.mjs'
import { ensureVendored } from './vendor.mjs'

/** `models`: true for every fixture, or the file names to fetch. */
export async function ensureReady({ models = true, real = false, npmDeps = true } = {}) {
  ensurePrerequisites()
  ensureVendored()
  const npmInstall = ['npm', ['install', '--no-audit', '--no-fund'], { LLAMA_ENGINE_SKIP_BUILD: '1' }]
  const needDeps = npmDeps && !existsSync(join(root, 'node_modules', '.bin', 'jest'))
  const which = !models ? null : Array.isArray(models) ? ['--only', models.join(',')] : real ? ['--real'] : []
  const modelsScript = join(root, 'scripts', 'models.mjs')
  if (!addonBuilt()) {
    // What needs no addon, beside the build (the network while the CPU compiles).
    const beside = []
    if (needDeps) beside.push(besideBuild('npm install', ...npmInstall))
    if (which) beside.push(besideBuild('the model downloads', process.execPath, [modelsScript, '--fetch-only', ...which]))
    buildAddon()
    await Promise.all(beside)
  }
  if (npmDeps && !existsSync(join(root, 'node_modules', '.bin', 'jest'))) {
    execFileSync(npmInstall[0], npmInstall[1], { cwd: root, stdio: 'inherit', env: { ...process.env, ...npmInstall[2] } })
  }
  if (which) execFileSync(process.execPath, [modelsScript, ...which], { cwd: root, stdio: 'inherit' })
}

/**
 * Runs a command beside the build, its output in a file (the build blocks
 * this thread: a pipe would fill and stall it); resolves when it ends. A
 * failure shows in its output and is left to the run after the build.
 */
function besideBuild(what, cmd, args, env = {}) {
  const log = join(mkdtempSync(join(tmpdir(), 'llama-engine-beside-')), 'out.log')
  const fd = openSync(log, 'w')
  const child = spawn(cmd, args, { cwd: root, stdio: ['ignore', fd, fd], env: { ...process.env, ...env } })
  closeSync(fd)
  return new Promise((resolve) => {
    const done = () => {
      const out = readFileSync(log, 'utf8').trim()
      if (out) console.log(`llama-engine: ${what}, beside the build:\n${out}`)
      rmSync(dirname(log), { recursive: true, force: true })
      resolve()
    }
    child.on('error', done)
    child.on('close', done)
  })
}

if (import.meta.url === `file://${process.argv[1]}`) await ensureReady()
