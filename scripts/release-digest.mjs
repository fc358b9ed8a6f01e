// The inputs of the checks that only matter when those inputs change, and
// the digests the last `npm run test:release` that passed recorded for them
// (.ci/release-checked.json, committed).
//
//   node scripts/release-digest.mjs --check <group>   exit 0 when the group's
//                                                     inputs are as recorded,
//                                                     1 (naming the files that
//                                                     changed) when not
//   node scripts/release-digest.mjs --write           record every group as it
//                                                     is now (by hand: test:release
//                                                     records each group whose
//                                                     checks passed)
//   node scripts/release-digest.mjs                   list the groups and their state
//
// CI runs a group's checks only when --check says its inputs changed; a
// release runs them all. The groups, their files and why: docs/testing.md.
import { createHash } from 'node:crypto'
import { existsSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(fileURLToPath(import.meta.url), '..', '..')
export const RECORD = join(root, '.ci', 'release-checked.json')

// What every cross-platform result is computed by: llama.cpp as patched
// (the crate version in vendor.mjs, the patches), and how it is built.
const LLAMA = ['patches/', 'scripts/vendor.mjs', '.cargo/config.toml', 'Cargo.lock']

export const GROUPS = {
  // npm run test:portable-kernels: the portable kernels compiled for every
  // ISA and platform, against the golden file's kernel digests.
  'portable-kernels': {
    checks: 'npm run test:portable-kernels',
    steps: [['kernels']],
    files: [...LLAMA, 'scripts/portable-kernels.mjs', 'scripts/portable-digest.c', '__test__/fixtures/portable-golden.json'],
  },
  // The five-variant x86-64 addon and the suites on another CPU class
  // (npm run test:variant), and the golden file with the whole engine on
  // arm64 under qemu and Windows under wine (npm run test:platforms --
  // --portable --ci): the CPU-dependent code (patches), how the variants are
  // built and chosen, portable mode's own code, the golden file and its cases.
  'cross-platform': {
    checks: 'npm run test:variant; npm run test:platforms -- --portable --ci',
    // test:release's steps that check it (either set): --portable runs
    // every CPU variant, --portable --ci the one per platform CI runs.
    steps: [
      ['variant', 'portable'],
      ['variant', 'portable-ci'],
    ],
    files: [
      ...LLAMA,
      'build.rs',
      'scripts/prebuild.mjs',
      'scripts/mingw-compat.h',
      'scripts/platforms.mjs',
      'scripts/portable-platform-checks.cjs',
      'lib/addon/loader.js',
      'crates/engine/src/ggml_setup.rs',
      'crates/engine/src/portable.rs',
      'crates/core/src/sampling/math.rs',
      '__test__/fixtures/portable-golden.json',
      '__test__/portable-cases.js',
      '__test__/portable.test.js',
    ],
  },
}

const sha256 = (buf) => createHash('sha256').update(buf).digest('hex')

/** Every file under `entry` (a file, or a folder ending in /), sorted. */
function filesOf(entry) {
  const abs = join(root, entry)
  if (!existsSync(abs)) return []
  if (!statSync(abs).isDirectory()) return [entry]
  const out = []
  for (const name of readdirSync(abs).sort()) out.push(...filesOf(relative(root, join(abs, name)) + (statSync(join(abs, name)).isDirectory() ? '/' : '')))
  return out
}

/** The group's files and their sha256, and one digest over them. */
export function digestOf(group) {
  const files = {}
  for (const entry of GROUPS[group].files) for (const f of filesOf(entry)) files[f] = sha256(readFileSync(join(root, f)))
  const digest = sha256(Object.entries(files).map(([f, h]) => `${h}  ${f}\n`).join(''))
  return { digest, files }
}

function recorded() {
  try {
    return JSON.parse(readFileSync(RECORD, 'utf8'))
  } catch {
    return { groups: {} }
  }
}

/** The files of `group` that differ from the record (added, changed, gone). */
export function changedFiles(group) {
  const was = recorded().groups[group]
  const now = digestOf(group)
  if (!was) return { changed: ['(never recorded)'], now }
  if (was.digest === now.digest) return { changed: [], now }
  const names = new Set([...Object.keys(was.files), ...Object.keys(now.files)])
  const changed = [...names].filter((f) => was.files[f] !== now.files[f]).sort()
  return { changed, now }
}

/**
 * Records `groups` (default: all) as they are now, keeping the others as
 * they were recorded: test:release records the groups whose checks all
 * passed in its run.
 */
export function writeRecord(groups = Object.keys(GROUPS), extra = {}) {
  const was = recorded()
  const record = { note: 'written by npm run test:release: each group\'s inputs as the checks that passed last checked them (scripts/release-digest.mjs, docs/testing.md)', groups: { ...was.groups } }
  for (const group of groups) record.groups[group] = { ...extra, ...digestOf(group) }
  const tmp = `${RECORD}.${process.pid}.tmp`
  writeFileSync(tmp, JSON.stringify(record, null, 1) + '\n')
  renameSync(tmp, RECORD)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2)
  if (args[0] === '--write') {
    writeRecord()
    console.log(`release-digest: recorded ${Object.keys(GROUPS).join(', ')} in ${relative(root, RECORD)}`)
  } else if (args[0] === '--check') {
    const group = args[1]
    if (!GROUPS[group]) {
      console.error(`release-digest --check: one of ${Object.keys(GROUPS).join(', ')}`)
      process.exit(2)
    }
    const { changed } = changedFiles(group)
    if (changed.length === 0) {
      console.log(`release-digest: ${group}: inputs as the last test:release checked them (${relative(root, RECORD)})`)
    } else {
      console.log(`release-digest: ${group}: inputs changed since the last test:release: ${changed.join(', ')}`)
      process.exit(1)
    }
  } else {
    for (const group of Object.keys(GROUPS)) {
      const { changed, now } = changedFiles(group)
      console.log(`${group} (${Object.keys(now.files).length} files, ${now.digest.slice(0, 12)}): ${changed.length ? `changed: ${changed.join(', ')}` : 'as recorded'}`)
      console.log(`  checks: ${GROUPS[group].checks}`)
    }
  }
}
