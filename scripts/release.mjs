// `npm run test:release`: every check, before a release, and after changing
// what the cross-platform checks depend on. CI (.ci/run) runs the quick
// cut of a few matrices and skips the cross-platform checks whose inputs
// have not changed since this last passed; this runs all of it:
//
//   full        npm run test:full with LLAMA_ENGINE_TEST_RELEASE=1: every
//               matrix in full, the cases CI leaves out included
//   real        npm run test:real (the real coder models)
//   kernels     npm run test:portable-kernels (every ISA and platform)
//   variant     npm run test:variant (the suites on another CPU class,
//               portable mode's golden file on every x86-64 variant here)
//   platforms   npm run test:platforms (the packages on arm64 under qemu,
//               Windows under wine, Vulkan on lavapipe)
//   portable    npm run test:platforms -- --portable (the golden file on
//               arm64 and Windows, three CPU variants each)
//   prebuilt    npm run prebuild && npm run test:prebuilt (this platform's
//               package, every CPU variant, installed offline)
//   llama-server  npm run test:llama-server (llama.cpp's own server tests
//               against serve, compared with the expected failures)
//
// Each step's time is printed as it ends and in the summary. The inputs of
// each cross-platform check whose steps all passed in the run are recorded
// in .ci/release-checked.json (scripts/release-digest.mjs: portable-kernels
// by `kernels`, cross-platform by `variant` and `portable` or `portable-ci`): commit it, and
// CI skips those checks until their inputs change again.
//
//   npm run test:release                          every step
//   npm run test:release -- --from variant        that step and the ones after it
//                                                 (after fixing a failure)
//   npm run test:release -- --only variant,portable  those steps
//   npm run test:release -- --only kernels,variant,portable-ci
//                                                 what CI would run for the
//                                                 cross-platform groups: records
//                                                 them after a change
import { spawnSync } from 'node:child_process'
import { ensureReady } from './ensure-ready.mjs'
import { root } from './native.mjs'
import { GROUPS, writeRecord } from './release-digest.mjs'

const npm = (...args) => ['npm', ['run', ...args]]
const STEPS = [
  ['full', [npm('test:full')], { LLAMA_ENGINE_TEST_RELEASE: '1' }],
  ['real', [npm('test:real')]],
  ['kernels', [npm('test:portable-kernels')]],
  ['variant', [npm('test:variant')]],
  ['platforms', [npm('test:platforms')]],
  ['portable', [npm('test:platforms', '--', '--portable')]],
  ['prebuilt', [npm('prebuild'), npm('test:prebuilt')]],
  ['llama-server', [npm('test:llama-server')]],
  // Not in a run of every step (`portable` covers it): the cut CI runs,
  // enough to record the cross-platform inputs after a change to them.
  ['portable-ci', [npm('test:platforms', '--', '--portable', '--ci')]],
]
const EVERY = STEPS.map(([n]) => n).filter((n) => n !== 'portable-ci')

const args = process.argv.slice(2)
const names = STEPS.map(([n]) => n)
const fromArg = args.indexOf('--from')
const onlyArg = args.indexOf('--only')
let chosen = EVERY
if (fromArg >= 0) chosen = EVERY.slice(EVERY.indexOf(args[fromArg + 1]))
if (onlyArg >= 0) chosen = args[onlyArg + 1].split(',')
if ((fromArg >= 0 && !EVERY.includes(args[fromArg + 1])) || chosen.some((n) => !names.includes(n))) {
  console.error(`test:release --from <step> | --only <step,step>: steps are ${names.join(', ')}`)
  process.exit(2)
}

const minutes = (s) => `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`
const t0 = Date.now()
await ensureReady({ real: true })
const results = []
for (const [name, commands, env = {}] of STEPS.filter(([n]) => chosen.includes(n))) {
  const t = Date.now()
  let status = 0
  for (const [cmd, argv] of commands) {
    console.log(`\ntest:release: ${name}: ${cmd} ${argv.join(' ')}`)
    status = spawnSync(cmd, argv, { cwd: root, stdio: 'inherit', env: { ...process.env, ...env } }).status ?? 1
    if (status !== 0) break
  }
  const seconds = (Date.now() - t) / 1000
  results.push({ name, ok: status === 0, seconds })
  console.log(`test:release: ${name} ${status === 0 ? 'passed' : `FAILED (exit ${status})`} in ${minutes(seconds)}`)
}

const total = (Date.now() - t0) / 1000
console.log('\ntest:release summary:')
for (const r of results) console.log(`  ${r.ok ? 'ok  ' : 'FAIL'} ${r.name.padEnd(10)} ${minutes(r.seconds)}`)
console.log(`  total ${minutes(total)}`)
// Each group whose checks all passed here is recorded (the others keep
// what the record said).
const passed = new Set(results.filter((r) => r.ok).map((r) => r.name))
const checked = Object.keys(GROUPS).filter((g) => GROUPS[g].steps.some((set) => set.every((s) => passed.has(s))))
if (checked.length) {
  writeRecord(checked, { passed: new Date().toISOString().slice(0, 10) })
  console.log(`test:release: recorded the inputs of ${checked.join(', ')} in .ci/release-checked.json (commit it: CI skips their checks until they change)`)
}
const failed = results.filter((r) => !r.ok)
if (failed.length) {
  console.log(`test:release: ${failed.map((r) => r.name).join(', ')} failed`)
  process.exit(1)
}
console.log(`test:release: ${chosen === EVERY ? 'every step' : chosen.join(', ')} passed`)
