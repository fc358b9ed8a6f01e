'use strict'
// Media parts of chat requests as the server lets them reach the engine:
// a part naming a file of the server's (`path`) is refused (that is for the
// library's own callers), and an http(s) image URL is fetched into a data:
// URL only when the server was started with --allow-remote-media, within a
// size and a time limit; otherwise the engine refuses it by name. A
// `file://` URL names a file under the server's media directory
// (llama-server's --media-path): read there, never outside it (no `..`, no
// link out of it); without a media directory it is refused.

const fs = require('node:fs')
const path = require('node:path')
const { invalid } = require('./errors.js')

const MIME = { '.jpg': 'image/jpeg', '.jpeg': 'image/jpeg', '.png': 'image/png', '.gif': 'image/gif', '.bmp': 'image/bmp', '.webp': 'image/webp', '.wav': 'audio/wav', '.mp3': 'audio/mpeg', '.flac': 'audio/flac' }

const REMOTE_MAX_BYTES = 20 * 1024 * 1024
const REMOTE_TIMEOUT_MS = 10_000

/** The URL of an image_url part, when it is a remote one. */
function remoteUrl(part) {
  const url = typeof part.image_url === 'string' ? part.image_url : part.image_url?.url
  return typeof url === 'string' && /^https?:\/\//i.test(url) ? url : null
}

/** Fetches `url` (at most REMOTE_MAX_BYTES, REMOTE_TIMEOUT_MS) into a data: URL. */
async function fetchDataUrl(url, at, signal) {
  const timeout = AbortSignal.timeout(REMOTE_TIMEOUT_MS)
  const both = signal ? AbortSignal.any([signal, timeout]) : timeout
  let res
  try {
    res = await fetch(url, { signal: both, redirect: 'follow' })
  } catch (e) {
    throw invalid(at, `cannot fetch ${url} (${timeout.aborted ? `no answer within ${REMOTE_TIMEOUT_MS / 1000} s` : e.cause?.code || e.message})`)
  }
  if (!res.ok) throw invalid(at, `fetching ${url} gave HTTP ${res.status}`)
  const declared = Number(res.headers.get('content-length'))
  if (declared > REMOTE_MAX_BYTES) throw invalid(at, `${url} is ${declared} bytes; at most ${REMOTE_MAX_BYTES}`)
  const chunks = []
  let n = 0
  try {
    for await (const chunk of res.body) {
      n += chunk.length
      if (n > REMOTE_MAX_BYTES) throw invalid(at, `${url} is more than ${REMOTE_MAX_BYTES} bytes`)
      chunks.push(chunk)
    }
  } catch (e) {
    if (e.status === 400) throw e
    throw invalid(at, `cannot fetch ${url} (${timeout.aborted ? `not read within ${REMOTE_TIMEOUT_MS / 1000} s` : e.message})`)
  }
  const type = (res.headers.get('content-type') || 'application/octet-stream').split(';')[0]
  return `data:${type};base64,${Buffer.concat(chunks).toString('base64')}`
}

/**
 * The bytes of `file://REL` under `mediaPath`, as a data: URL. The path is
 * relative to the directory whatever slashes lead it (`file:////a//b` is
 * `a/b`); `..`, a path that resolves (links followed) outside the
 * directory, a missing file and one over REMOTE_MAX_BYTES are refused.
 */
function localDataUrl(url, mediaPath, at) {
  if (!mediaPath) throw invalid(at, `${url}: file:// URLs are read only from the server's media directory (serve --media-path DIR)`)
  const rel = url.slice('file://'.length).split(/[\\/]+/).filter((p) => p !== '' && p !== '.')
  if (rel.length === 0 || rel.some((p) => p === '..')) throw invalid(at, `${url}: not a file under the media directory`)
  const root = fs.realpathSync(mediaPath)
  let real
  try {
    real = fs.realpathSync(path.join(root, ...rel))
  } catch {
    throw invalid(at, `${url}: no such file in the media directory`)
  }
  if (!real.startsWith(root + path.sep)) throw invalid(at, `${url}: not a file under the media directory`)
  const stat = fs.statSync(real)
  if (!stat.isFile()) throw invalid(at, `${url}: not a file`)
  if (stat.size > REMOTE_MAX_BYTES) throw invalid(at, `${url} is ${stat.size} bytes; at most ${REMOTE_MAX_BYTES}`)
  const type = MIME[path.extname(real).toLowerCase()] ?? 'application/octet-stream'
  return `data:${type};base64,${fs.readFileSync(real).toString('base64')}`
}

/** `request` with its media parts checked (remote ones fetched when allowed, local ones read under `mediaPath`). */
async function serverMedia(request, { allowRemote = false, mediaPath, signal } = {}) {
  if (!request || typeof request !== 'object' || !Array.isArray(request.messages)) return request
  let messages = null
  for (const [i, m] of request.messages.entries()) {
    if (!m || !Array.isArray(m.content)) continue
    for (const [j, part] of m.content.entries()) {
      if (!part || typeof part !== 'object') continue
      const at = `messages[${i}].content[${j}]`
      if ((part.type === 'image' || part.type === 'audio') && part.path != null) {
        throw invalid(`${at}.path`, 'files of the server are not read for a client: send the bytes (data)')
      }
      if (part.type === 'image_url' || part.type === 'input_image') {
        const given = typeof part.image_url === 'string' ? part.image_url : part.image_url?.url
        if (typeof given === 'string' && /^file:\/\//i.test(given)) {
          const data = localDataUrl(given, mediaPath, `${at}.image_url`)
          messages ??= request.messages.map((x) => (x && Array.isArray(x.content) ? { ...x, content: [...x.content] } : x))
          messages[i].content[j] = { type: 'image_url', image_url: { url: data } }
          continue
        }
      }
      if ((part.type === 'image_url' || part.type === 'input_image') && allowRemote) {
        const url = remoteUrl(part)
        if (!url) continue
        const data = await fetchDataUrl(url, `${at}.image_url`, signal)
        messages ??= request.messages.map((x) => (x && Array.isArray(x.content) ? { ...x, content: [...x.content] } : x))
        messages[i].content[j] = { type: 'image_url', image_url: { url: data } }
      }
    }
  }
  return messages ? { ...request, messages } : request
}

module.exports = { serverMedia, REMOTE_MAX_BYTES, REMOTE_TIMEOUT_MS }
