'use strict'
// resolveModel(uri): a model by name, as a local path. URIs:
//   hf:OWNER/REPO:QUANT     the repository's .gguf whose name holds QUANT
//                           (case-insensitive; every part of a split GGUF
//                           `-0000k-of-0000n`, the first returned)
//   hf:OWNER/REPO           as llama.cpp picks: Q4_K_M, else Q8_0, else the
//                           repository's first model file
//   hf:OWNER/REPO:mmproj    the repository's multimodal projector
//                           (mmproj-*.gguf: F16, else BF16, else Q8_0, else
//                           the shortest name; what `mmprojPath` takes)
//   hf:OWNER/REPO/PATH.gguf that file
//   https://…/FILE.gguf     that URL
//   anything else           a local path
//
// Hugging Face's conventions, so Python tools and this package share one
// cache: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN, and the hub
// cache, found as llama.cpp finds it (LLAMA_CACHE, else HF_HUB_CACHE, else
// HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub):
// models--OWNER--REPO/blobs/<sha256>, snapshots/<revision>/PATH a link to
// the blob, refs/main the revision. The file list and each file's sha256 come
// from {endpoint}/api/models/{repo}/tree/main; the bytes from
// {endpoint}/{repo}/resolve/main/{path}, written to <blob>.incomplete,
// resumed with a Range request after a cut, and moved into place only once
// their sha256 matches. Offline (or with no network) the cache answers.

const crypto = require('node:crypto')
const fs = require('node:fs')
const fsp = require('node:fs/promises')
const os = require('node:os')
const path = require('node:path')

const DEFAULT_QUANT = 'Q4_K_M'
const SPLIT = /-(\d{5})-of-(\d{5})\.gguf$/i
// Attempts per file: a cut download resumes from what it has.
const ATTEMPTS = 4

function resolveError(message, extra = {}) {
  const err = new Error(message)
  err.code = 'MODEL_LOAD_FAILED'
  Object.assign(err, extra)
  return err
}

function aborted(signal) {
  return resolveError(`model download aborted${signal?.reason?.message ? `: ${signal.reason.message}` : ''}`, { name: 'AbortError' })
}

/** What a URI names: { kind: 'path' | 'hf' | 'url', … }. */
function parseModelUri(uri) {
  if (typeof uri !== 'string' || uri.length === 0) throw resolveError('model: expected a path or a URI (hf:OWNER/REPO:QUANT, hf:OWNER/REPO/FILE.gguf, https://…)')
  if (/^https?:\/\//i.test(uri)) {
    let url
    try {
      url = new URL(uri)
    } catch {
      throw resolveError(`${uri}: not a valid URL`)
    }
    const file = decodeURIComponent(url.pathname.split('/').pop() || '')
    if (!file) throw resolveError(`${uri}: the URL names no file`)
    return { kind: 'url', url: url.href, file }
  }
  if (!uri.startsWith('hf:')) return { kind: 'path', path: path.resolve(uri) }
  const rest = uri.slice(3).replace(/^\/+/, '')
  const parts = rest.split('/')
  if (parts.length < 2 || !parts[0] || !parts[1]) throw resolveError(`${uri}: expected hf:OWNER/REPO:QUANT or hf:OWNER/REPO/FILE.gguf`)
  const owner = parts[0]
  if (parts.length === 2) {
    const [name, quant] = parts[1].split(':')
    if (!name) throw resolveError(`${uri}: expected hf:OWNER/REPO:QUANT`)
    return { kind: 'hf', repo: `${owner}/${name}`, quant: quant || DEFAULT_QUANT, ...(quant ? {} : { fallback: true }) }
  }
  const file = parts.slice(2).join('/')
  if (file.includes('..') || !/\.gguf$/i.test(file)) throw resolveError(`${uri}: the file must be a .gguf path inside the repository`)
  return { kind: 'hf', repo: `${owner}/${parts[1]}`, file }
}

function hubCache(cacheDir) {
  if (cacheDir) return path.resolve(cacheDir)
  const env = process.env
  for (const name of ['LLAMA_CACHE', 'HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE']) if (env[name]) return path.resolve(env[name])
  if (env.HF_HOME) return path.join(path.resolve(env.HF_HOME), 'hub')
  if (env.XDG_CACHE_HOME) return path.join(path.resolve(env.XDG_CACHE_HOME), 'huggingface', 'hub')
  return path.join(os.homedir(), '.cache', 'huggingface', 'hub')
}

// A model file's quantization tag as llama.cpp reads it from the name
// (`-Q8_0.gguf`, `.F16.gguf`, the split suffix left out), upper-cased.
const TAG = /[-.]([A-Z0-9_]+)$/i
// Files beside models that are not models: projectors and draft heads.
const NOT_MODEL = /mmproj|^mtp-|^eagle3-|^dflash-|^dspark-/i

/**
 * The models in the hub cache, as llama-server's router lists them:
 * `{ name: 'OWNER/REPO:TAG', uri: 'hf:OWNER/REPO:TAG', path, mmproj? }`
 * for each model file with a tag in its name (the first part of a split
 * one), with the repository's projector if it has one.
 */
function listCachedModels(cacheDir) {
  const root = hubCache(cacheDir)
  let dirs
  try {
    dirs = fs.readdirSync(root).filter((d) => d.startsWith('models--')).sort()
  } catch {
    return []
  }
  const out = []
  for (const dir of dirs) {
    const repo = dir.slice('models--'.length).replace(/--/g, '/')
    if (!/^[\w.-]+\/[\w.-]+$/.test(repo)) continue
    const snap = cachedSnapshot(path.join(root, dir))
    if (!snap) continue
    const ggufs = snap.files.filter((f) => /\.gguf$/i.test(f)).sort()
    const projector = ggufs.find((f) => /mmproj/i.test(path.basename(f)))
    const seen = new Set()
    for (const f of ggufs) {
      const base = path.basename(f)
      const split = SPLIT.exec(base)
      if (NOT_MODEL.test(base) || (split && Number(split[1]) !== 1)) continue
      const tag = TAG.exec(base.replace(split ? SPLIT : /\.gguf$/i, ''))?.[1]?.toUpperCase()
      if (!tag || seen.has(tag)) continue
      seen.add(tag)
      out.push({ name: `${repo}:${tag}`, uri: `hf:${repo}:${tag}`, path: path.join(snap.root, f), ...(projector ? { mmproj: path.join(snap.root, projector) } : {}) })
    }
  }
  return out
}

function endpoint() {
  return (process.env.HF_ENDPOINT || 'https://huggingface.co').replace(/\/+$/, '')
}

function headers(extra = {}) {
  const h = { 'user-agent': 'llama-engine', ...extra }
  if (process.env.HF_TOKEN) h.authorization = `Bearer ${process.env.HF_TOKEN}`
  return h
}

/** The files of `candidates` (paths) a request picks: one file, or every part of one split model. */
function pick(candidates, want, repo) {
  const ggufs = candidates.filter((p) => /\.gguf$/i.test(p))
  if (want.file) {
    const hit = ggufs.find((p) => p === want.file)
    if (!hit) throw resolveError(`${repo}: no file ${want.file} (it has ${ggufs.length ? ggufs.join(', ') : 'no .gguf files'})`)
    const m = SPLIT.exec(hit)
    if (!m) return [hit]
    return splitParts(ggufs, hit, m, repo)
  }
  const q = want.quant.toLowerCase()
  if (q === 'mmproj') {
    const projectors = ggufs.filter((p) => /mmproj/i.test(path.basename(p)))
    if (projectors.length === 0) throw resolveError(`${repo}: no multimodal projector (mmproj*.gguf) in it`)
    const rank = (p) => ['f16', 'bf16', 'q8_0'].findIndex((t) => path.basename(p).toLowerCase().includes(t)) >>> 0
    return [projectors.sort((a, b) => rank(a) - rank(b) || a.length - b.length || a.localeCompare(b))[0]]
  }
  let named = ggufs.filter((p) => p.toLowerCase().includes(q) && !/mmproj/i.test(path.basename(p))).sort()
  // No tag named: llama.cpp's choice, Q4_K_M, else Q8_0, else the first model file.
  if (named.length === 0 && want.fallback) {
    named = ggufs.filter((p) => p.toLowerCase().includes('q8_0') && !NOT_MODEL.test(path.basename(p))).sort()
    if (named.length === 0) named = ggufs.filter((p) => !NOT_MODEL.test(path.basename(p))).sort()
  }
  if (named.length === 0) {
    const quants = [...new Set(ggufs.map((p) => /[._-](I?Q\d[\w]*|F16|BF16|F32)/i.exec(path.basename(p))?.[1]).filter(Boolean))]
    throw resolveError(`${repo}: no .gguf file whose name contains ${want.quant}${quants.length ? ` (it has ${quants.join(', ')})` : ''}`)
  }
  // A whole file before a split one; among whole files the shortest name.
  const whole = named.filter((p) => !SPLIT.test(p)).sort((a, b) => a.length - b.length || a.localeCompare(b))
  if (whole.length) return [whole[0]]
  const first = named[0]
  return splitParts(ggufs, first, SPLIT.exec(first), repo)
}

function splitParts(ggufs, one, m, repo) {
  const n = Number(m[2])
  const stem = one.slice(0, m.index)
  const parts = []
  for (let k = 1; k <= n; k++) {
    const name = `${stem}-${String(k).padStart(5, '0')}-of-${m[2]}.gguf`
    const hit = ggufs.find((p) => p.toLowerCase() === name.toLowerCase())
    if (!hit) throw resolveError(`${repo}: ${path.basename(one)} is part of a split model whose part ${k} of ${n} is missing`)
    parts.push(hit)
  }
  return parts
}

async function getJson(url, repo, fetchImpl, signal) {
  const res = await fetchImpl(url, { headers: headers(), signal })
  if (res.status === 401 || res.status === 403) {
    throw resolveError(`${repo}: the Hub refused access (HTTP ${res.status}): ${process.env.HF_TOKEN ? 'HF_TOKEN does not grant access to it' : 'it is private or gated; set HF_TOKEN'}`, { status: res.status })
  }
  if (res.status === 404) throw resolveError(`${repo}: no such repository on ${endpoint()} (HTTP 404)`, { status: 404 })
  if (!res.ok) throw resolveError(`${repo}: the Hub answered HTTP ${res.status} for ${url}`, { status: res.status })
  return res.json()
}

/** The repository's snapshot in the cache: { revision, files } or null. */
function cachedSnapshot(repoDir) {
  let revision
  try {
    revision = fs.readFileSync(path.join(repoDir, 'refs', 'main'), 'utf8').trim()
  } catch {
    return null
  }
  const root = path.join(repoDir, 'snapshots', revision)
  const files = []
  const walk = (dir, rel) => {
    let entries
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true })
    } catch {
      return
    }
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name
      if (e.isDirectory()) walk(path.join(dir, e.name), r)
      else if (fs.existsSync(path.join(dir, e.name))) files.push(r)
    }
  }
  walk(root, '')
  return { revision, root, files }
}

async function hashFile(file, hash) {
  await new Promise((resolve, reject) => {
    const s = fs.createReadStream(file)
    s.on('data', (d) => hash.update(d))
    s.on('end', resolve)
    s.on('error', reject)
  })
}

/**
 * Downloads `url` into `dest`, through `dest.incomplete`, resuming after a
 * cut; checks the sha256 when one is given. Returns the bytes written.
 */
async function download({ url, dest, sha256, size, file, onProgress, signal, fetchImpl }) {
  const partial = `${dest}.incomplete`
  await fsp.mkdir(path.dirname(dest), { recursive: true })
  let lastError
  for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
    if (signal?.aborted) throw aborted(signal)
    let have = 0
    try {
      have = (await fsp.stat(partial)).size
    } catch {}
    if (size != null && have > size) {
      await fsp.rm(partial, { force: true })
      have = 0
    }
    const hash = crypto.createHash('sha256')
    if (have > 0) await hashFile(partial, hash)
    let res
    try {
      res = await fetchImpl(url, { headers: headers(have > 0 ? { range: `bytes=${have}-` } : {}), signal, redirect: 'follow' })
    } catch (e) {
      if (signal?.aborted) throw aborted(signal)
      lastError = e
      continue
    }
    if (res.status === 401 || res.status === 403) throw resolveError(`${file}: refused (HTTP ${res.status}): ${process.env.HF_TOKEN ? 'HF_TOKEN does not grant access' : 'set HF_TOKEN'}`, { status: res.status })
    if (res.status === 404) throw resolveError(`${file}: not found at ${url} (HTTP 404)`, { status: 404 })
    if (res.status === 416 && size != null && have === size) {
      // Everything was there already.
    } else if (have > 0 && res.status === 200) {
      // The server ignored the range: start again.
      have = 0
      hash.destroy?.()
      await fsp.rm(partial, { force: true })
      lastError = new Error('the server does not resume downloads')
      if (res.body) await res.body.cancel().catch(() => {})
      continue
    } else if (!(res.status === 200 || res.status === 206)) {
      lastError = new Error(`HTTP ${res.status}`)
      if (res.body) await res.body.cancel().catch(() => {})
      continue
    }
    const total = size ?? (Number(res.headers.get('content-length')) + have || null)
    const out = fs.createWriteStream(partial, { flags: have > 0 ? 'a' : 'w' })
    let done = have
    try {
      if (res.status !== 416) {
        for await (const chunk of res.body) {
          if (signal?.aborted) throw aborted(signal)
          hash.update(chunk)
          if (!out.write(chunk)) await new Promise((r) => out.once('drain', r))
          done += chunk.length
          onProgress?.({ file, downloaded: done, total: total ?? done })
        }
      }
      await new Promise((resolve, reject) => out.end((e) => (e ? reject(e) : resolve())))
    } catch (e) {
      await new Promise((r) => out.end(r))
      if (e?.name === 'AbortError' || signal?.aborted) throw aborted(signal)
      lastError = e
      continue
    }
    if (total != null && done < total) {
      lastError = new Error(`cut after ${done} of ${total} bytes`)
      continue
    }
    const digest = hash.digest('hex')
    if (sha256 && digest !== sha256) {
      await fsp.rm(partial, { force: true })
      throw resolveError(`${file}: the download's sha256 is ${digest}, the repository says ${sha256}; nothing was kept`, { expected: sha256, actual: digest })
    }
    await fsp.rename(partial, dest)
    return done
  }
  throw resolveError(`${file}: the download failed after ${ATTEMPTS} attempts (${lastError?.message || lastError}); what it got is kept in ${partial} and resumed next time`)
}

async function link(snapshotFile, blob) {
  await fsp.mkdir(path.dirname(snapshotFile), { recursive: true })
  await fsp.rm(snapshotFile, { force: true })
  const rel = path.relative(path.dirname(snapshotFile), blob)
  try {
    await fsp.symlink(rel, snapshotFile)
  } catch {
    // No symlinks (Windows without the privilege): a hard link, else a copy.
    try {
      await fsp.link(blob, snapshotFile)
    } catch {
      await fsp.copyFile(blob, snapshotFile)
    }
  }
}

async function resolveHf(want, { cacheDir, onProgress, signal, offline, fetchImpl }) {
  const repoDir = path.join(hubCache(cacheDir), `models--${want.repo.replace(/\//g, '--')}`)
  const fromCache = (why) => {
    const snap = cachedSnapshot(repoDir)
    if (!snap) throw resolveError(`${want.repo}: ${why}, and it is not in the cache (${repoDir})`)
    let files
    try {
      files = pick(snap.files, want, want.repo)
    } catch (e) {
      throw resolveError(`${e.message}; ${why}, and the cache has only what was fetched before`)
    }
    return path.join(snap.root, files[0])
  }
  if (offline) return fromCache('offline')
  const base = endpoint()
  let info, tree
  try {
    info = await getJson(`${base}/api/models/${want.repo}/revision/main`, want.repo, fetchImpl, signal)
    tree = await getJson(`${base}/api/models/${want.repo}/tree/main?recursive=true`, want.repo, fetchImpl, signal)
  } catch (e) {
    if (signal?.aborted) throw aborted(signal)
    if (e.code === 'MODEL_LOAD_FAILED') throw e
    return fromCache(`the Hub is unreachable (${e.cause?.code || e.message})`)
  }
  const revision = typeof info?.sha === 'string' && /^[0-9a-f]{7,64}$/i.test(info.sha) ? info.sha : 'main'
  const entries = Array.isArray(tree) ? tree.filter((e) => e && e.type === 'file' && typeof e.path === 'string') : []
  const files = pick(
    entries.map((e) => e.path),
    want,
    want.repo,
  )
  for (const file of files) {
    if (file.split('/').some((p) => p === '..' || p === '')) throw resolveError(`${want.repo}: unsafe file name ${file}`)
    const entry = entries.find((e) => e.path === file)
    const sha256 = entry.lfs?.oid || entry.lfs?.sha256
    if (!sha256 || !/^[0-9a-f]{64}$/.test(sha256)) throw resolveError(`${want.repo}: ${file} has no sha256 in the file list (not stored with LFS)`)
    const size = entry.lfs?.size ?? entry.size
    const blob = path.join(repoDir, 'blobs', sha256)
    if (!fs.existsSync(blob)) {
      const url = `${base}/${want.repo}/resolve/main/${file.split('/').map(encodeURIComponent).join('/')}`
      await download({ url, dest: blob, sha256, size, file, onProgress, signal, fetchImpl })
    } else {
      onProgress?.({ file, downloaded: size ?? 0, total: size ?? 0 })
    }
    await link(path.join(repoDir, 'snapshots', revision, file), blob)
  }
  await fsp.mkdir(path.join(repoDir, 'refs'), { recursive: true })
  await fsp.writeFile(path.join(repoDir, 'refs', 'main'), revision)
  return path.join(repoDir, 'snapshots', revision, files[0])
}

async function resolveUrl(want, { cacheDir, onProgress, signal, offline, fetchImpl }) {
  const key = crypto.createHash('sha256').update(want.url).digest('hex').slice(0, 16)
  const dest = path.join(hubCache(cacheDir), 'llama-engine-urls', key, want.file)
  if (fs.existsSync(dest)) return dest
  if (offline) throw resolveError(`${want.url}: offline, and it is not in the cache (${dest})`)
  await download({ url: want.url, dest, file: want.file, onProgress, signal, fetchImpl })
  return dest
}

/** The local path of a model named by `uri`, downloading it if needed. */
async function resolveModel(uri, options = {}) {
  if (options === null || typeof options !== 'object') throw resolveError('resolveModel options: expected an object')
  const { cacheDir, onProgress, signal, offline = false } = options
  if (onProgress != null && typeof onProgress !== 'function') throw resolveError('onProgress: expected a function')
  const progress = onProgress
    ? (p) => {
        try {
          onProgress(p)
        } catch {}
      }
    : undefined
  const fetchImpl = options.fetch || globalThis.fetch
  const want = parseModelUri(uri)
  if (signal?.aborted) throw aborted(signal)
  const opts = { cacheDir, onProgress: progress, signal, offline, fetchImpl }
  if (want.kind === 'path') return want.path
  if (want.kind === 'url') return resolveUrl(want, opts)
  return resolveHf(want, opts)
}

/**
 * Removes a model of the hub cache named as `listCachedModels` names it
 * (`OWNER/REPO:TAG`): its file (every part of a split one) from the
 * snapshot, and each blob no other file of the repository points to; the
 * repository's directory when no model file is left in it. Resolves with
 * the files removed (none: not in the cache).
 */
async function removeCachedModel(name, cacheDir) {
  const entry = listCachedModels(cacheDir).find((m) => m.name === name)
  if (!entry) return []
  const repo = name.slice(0, name.lastIndexOf(':'))
  const repoDir = path.join(hubCache(cacheDir), `models--${repo.replace(/\//g, '--')}`)
  const snap = cachedSnapshot(repoDir)
  if (!snap) return []
  const rel = path.relative(snap.root, entry.path).split(path.sep).join('/')
  const m = SPLIT.exec(rel)
  const files = m ? splitParts(snap.files, rel, m, repo) : [rel]
  const blobOf = (f) => {
    try {
      return fs.realpathSync(path.join(snap.root, f))
    } catch {
      return null
    }
  }
  const blobs = files.map(blobOf).filter(Boolean)
  for (const f of files) await fsp.rm(path.join(snap.root, f), { force: true })
  const left = cachedSnapshot(repoDir)?.files ?? []
  const kept = new Set(left.map(blobOf))
  for (const b of blobs) if (!kept.has(b) && b.startsWith(repoDir + path.sep)) await fsp.rm(b, { force: true })
  if (!left.some((f) => /\.gguf$/i.test(f) && !NOT_MODEL.test(path.basename(f)))) await fsp.rm(repoDir, { recursive: true, force: true })
  return files
}

/** Whether a model option names something resolveModel fetches. */
function isRemoteModel(uri) {
  return typeof uri === 'string' && (uri.startsWith('hf:') || /^https?:\/\//i.test(uri))
}

module.exports = { resolveModel, parseModelUri, isRemoteModel, hubCache, listCachedModels, removeCachedModel }
