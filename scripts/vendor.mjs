// Makes vendor/llama-cpp-sys-2: the registry crate llama-cpp-sys-2 (the
// pinned version, its sha256 checked) with the patch files of
// patches/llama-cpp-sys-2/ applied in name order. Cargo.toml's
// [patch.crates-io] builds llama.cpp from this copy, so every build (source,
// prebuilt, Vulkan module, cross builds) compiles the patched ggml.
//
//   node scripts/vendor.mjs              make the copy unless it is up to date
//   node scripts/vendor.mjs --pristine D extract the unpatched crate into D
//                                        (to write a patch: edit a copy, then
//                                        `git diff --no-index D/… vendor/…`)
//     [--with P1,P2]                     and apply only these patches (the
//                                        bench's ceiling: llama.cpp's own
//                                        kernels with the API patches the
//                                        engine links against)
//
// The copy is generated, not committed (about 40 MB): a stamp file holds the
// hash of the crate and the patches, and the copy is made again when either
// changes. A version bump: change VERSION and SHA256, run this; a patch that
// no longer applies stops it with the file and the hunk.
import { createHash } from 'node:crypto'
import { execFileSync } from 'node:child_process'
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs'
import { homedir, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const CRATE = 'llama-cpp-sys-2'
export const VERSION = '0.1.160'
const SHA256 = '912d8a0522acec022ae07d099366234067c8af6a18570a603f0749b7bb927e9a'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
export const vendorDir = join(root, 'vendor', CRATE)
const patchDir = join(root, 'patches', CRATE)
const stampFile = join(vendorDir, '.vendor-stamp')

const sha256 = (buf) => createHash('sha256').update(buf).digest('hex')

function patchFiles() {
  return existsSync(patchDir) ? readdirSync(patchDir).filter((f) => f.endsWith('.patch')).sort() : []
}

function stamp() {
  const h = createHash('sha256').update(`${CRATE}-${VERSION}:${SHA256}\n`)
  for (const f of patchFiles()) h.update(`${f}\n`).update(readFileSync(join(patchDir, f)))
  return h.digest('hex')
}

/** The .crate file from cargo's download cache, fetched through cargo (its registry settings) if absent. */
function crateFile() {
  const cargoHome = process.env.CARGO_HOME || join(homedir(), '.cargo')
  const cached = () => {
    const cache = join(cargoHome, 'registry', 'cache')
    if (!existsSync(cache)) return null
    for (const index of readdirSync(cache)) {
      const f = join(cache, index, `${CRATE}-${VERSION}.crate`)
      if (existsSync(f) && sha256(readFileSync(f)) === SHA256) return f
    }
    return null
  }
  let f = cached()
  if (f) return f
  // A throw-away package outside this workspace that depends on the crate:
  // `cargo fetch` downloads it the way cargo downloads everything else.
  const dir = mkdtempSync(join(tmpdir(), 'llama-engine-vendor-'))
  try {
    mkdirSync(join(dir, 'src'))
    writeFileSync(join(dir, 'src', 'lib.rs'), '')
    writeFileSync(
      join(dir, 'Cargo.toml'),
      `[package]\nname = "vendor-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\n${CRATE} = "=${VERSION}"\n\n[workspace]\n`,
    )
    execFileSync('cargo', ['fetch', '--manifest-path', join(dir, 'Cargo.toml')], { stdio: ['ignore', 'ignore', 'inherit'] })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  f = cached()
  if (!f) throw new Error(`${CRATE} ${VERSION}: cargo fetched no crate with sha256 ${SHA256}`)
  return f
}

function extract(into) {
  mkdirSync(into, { recursive: true })
  execFileSync('tar', ['-xzf', crateFile(), '-C', into, '--strip-components=1'], { stdio: 'inherit' })
}

/**
 * Applies one unified diff (as `git diff` or `diff -u` writes it) under
 * `dir`. Strict: every context and removed line must match exactly; no fuzz,
 * no offsets beyond where the hunk header says. Text before the first
 * `--- ` line is the patch's description and is ignored. A file whose `---`
 * line is `/dev/null` is added.
 */
export function applyPatch(dir, text, name) {
  const lines = text.split('\n')
  let i = 0
  const fail = (msg) => {
    throw new Error(`${name}: ${msg}`)
  }
  while (i < lines.length) {
    if (!lines[i].startsWith('--- ')) {
      i++
      continue
    }
    const target = lines[i + 1]?.startsWith('+++ ') ? lines[i + 1].slice(4).split('\t')[0] : fail(`no +++ line after line ${i + 1}`)
    const rel = target.replace(/^[ab]\//, '')
    const file = join(dir, rel)
    // `--- /dev/null`: a file the patch adds (it must not exist yet)
    const added = lines[i].slice(4).split('\t')[0] === '/dev/null'
    if (added && existsSync(file)) fail(`${rel} is added but exists`)
    if (!added && !existsSync(file)) fail(`${rel} does not exist`)
    const original = added ? '' : readFileSync(file, 'utf8')
    const src = original.split('\n')
    const out = []
    let at = 0 // next line of src not yet copied
    i += 2
    while (i < lines.length && lines[i].startsWith('@@')) {
      const m = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/.exec(lines[i]) || fail(`bad hunk header ${lines[i]}`)
      const start = Math.max(Number(m[1]) - (m[2] === '0' ? 0 : 1), 0)
      if (start < at) fail(`${rel}: overlapping hunk ${lines[i]}`)
      out.push(...src.slice(at, start))
      at = start
      i++
      while (i < lines.length && /^[ +\-\\]/.test(lines[i]) && !lines[i].startsWith('--- ')) {
        const l = lines[i]
        if (l.startsWith('\\')) {
          i++
          continue
        }
        const body = l.slice(1)
        if (l[0] === '+') out.push(body)
        else {
          if (src[at] !== body) fail(`${rel}: hunk ${m[0]} does not match at line ${at + 1}: expected ${JSON.stringify(body)}, found ${JSON.stringify(src[at])}`)
          if (l[0] === ' ') out.push(body)
          at++
        }
        i++
      }
    }
    out.push(...src.slice(at))
    writeFileSync(file, out.join('\n'))
  }
}

/**
 * Gives every file of `into` that is byte for byte the one in `from` the
 * older file's times, so that a new or changed patch makes cargo and CMake
 * rebuild what it touches, not all of llama.cpp.
 */
function keepTimes(from, into) {
  for (const name of readdirSync(into)) {
    const a = join(from, name)
    const b = join(into, name)
    const sb = lstatSync(b)
    if (!existsSync(a)) continue
    const sa = lstatSync(a)
    if (sb.isDirectory() && sa.isDirectory()) keepTimes(a, b)
    else if (sb.isFile() && sa.isFile() && sa.size === sb.size && readFileSync(a).equals(readFileSync(b))) utimesSync(b, sa.atime, sa.mtime)
  }
}

export function ensureVendored() {
  const want = stamp()
  if (existsSync(stampFile) && readFileSync(stampFile, 'utf8').trim() === want) return false
  const tmp = `${vendorDir}.${process.pid}.tmp`
  rmSync(tmp, { recursive: true, force: true })
  extract(tmp)
  for (const f of patchFiles()) applyPatch(tmp, readFileSync(join(patchDir, f), 'utf8'), f)
  writeFileSync(join(tmp, '.vendor-stamp'), `${want}\n`)
  if (existsSync(vendorDir)) keepTimes(vendorDir, tmp)
  rmSync(vendorDir, { recursive: true, force: true })
  mkdirSync(dirname(vendorDir), { recursive: true })
  renameSync(tmp, vendorDir)
  console.log(`llama-engine: vendored ${CRATE} ${VERSION} with ${patchFiles().length} patch(es) in vendor/${CRATE}`)
  return true
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const p = process.argv.indexOf('--pristine')
  if (p >= 0) {
    const into = process.argv[p + 1] || fail('--pristine needs a directory')
    extract(into)
    const w = process.argv.indexOf('--with')
    for (const f of w >= 0 ? (process.argv[w + 1] || '').split(',').filter(Boolean) : []) {
      applyPatch(into, readFileSync(join(patchDir, f), 'utf8'), f)
    }
  } else {
    ensureVendored()
  }
}

function fail(msg) {
  throw new Error(msg)
}
