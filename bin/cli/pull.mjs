// `llama-engine pull URI`: a model fetched into the cache, its path printed.
import { SIGNAL_EXIT, parseCommand } from './common.mjs'
import { USAGE } from './run.mjs'

// `llama-engine pull URI`: resolveModel with a progress bar (speed and ETA)
// on a TTY, a line per 10 % otherwise; prints the local path on stdout.
export async function pull(argv) {
  const { stdout, stderr } = process
  const parsed = parseCommand('pull', argv, { offline: { type: 'boolean' }, 'cache-dir': { type: 'string' } }, 'one URI', USAGE)
  if (typeof parsed === 'number') return parsed
  const { values: v, positionals } = parsed
  const { resolveModel } = await import('../../index.mjs')
  const started = Date.now()
  const tty = Boolean(stderr.isTTY)
  let lastTenth = -1
  let drew = false
  const mb = (n) => (n / 2 ** 20).toFixed(1)
  const onProgress = ({ file, downloaded, total }) => {
    const fraction = total > 0 ? downloaded / total : 0
    if (tty) {
      const secs = (Date.now() - started) / 1000
      const speed = secs > 0 ? downloaded / secs : 0
      const eta = speed > 0 ? Math.max(0, (total - downloaded) / speed) : 0
      const width = 24
      const filled = Math.round(fraction * width)
      stderr.write(`\r${file} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${mb(downloaded)}/${mb(total)} MB ${mb(speed)} MB/s ETA ${eta.toFixed(0)} s\x1b[K`)
      drew = true
    } else {
      const tenth = Math.floor(fraction * 10)
      if (tenth !== lastTenth) {
        lastTenth = tenth
        stderr.write(`${file}: ${tenth * 10}% (${mb(downloaded)} of ${mb(total)} MB)\n`)
      }
    }
  }
  const ac = new AbortController()
  const onSigint = () => ac.abort(new Error('interrupted'))
  process.once('SIGINT', onSigint)
  try {
    const file = await resolveModel(positionals[0], { offline: Boolean(v.offline), cacheDir: v['cache-dir'], signal: ac.signal, onProgress })
    if (drew) stderr.write('\n')
    stdout.write(`${file}\n`)
    return 0
  } catch (e) {
    if (drew) stderr.write('\n')
    stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
    return ac.signal.aborted ? SIGNAL_EXIT.SIGINT : 1
  } finally {
    process.off('SIGINT', onSigint)
  }
}
