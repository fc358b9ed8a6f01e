// Makes a fresh clone ready to run: npm dependencies, the native addon and
// the model fixtures. Each step is skipped when already done.
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { addonBuilt, buildAddon, ensurePrerequisites, root } from './native.mjs'
import { ensureVendored } from './vendor.mjs'

export function ensureReady({ models = true, real = false } = {}) {
  ensurePrerequisites()
  ensureVendored()
  if (!existsSync(join(root, 'node_modules', '.bin', 'jest'))) {
    execFileSync('npm', ['install', '--no-audit', '--no-fund'], { cwd: root, stdio: 'inherit', env: { ...process.env, LLAMA_ENGINE_SKIP_BUILD: '1' } })
  }
  if (!addonBuilt()) buildAddon()
  if (models) execFileSync(process.execPath, [join(root, 'scripts', 'models.mjs'), ...(real ? ['--real'] : [])], { cwd: root, stdio: 'inherit' })
}

if (import.meta.url === `file://${process.argv[1]}`) ensureReady()
