'use strict'
// llama-server's slot files (`--slot-save-path DIR`, createServer's
// `slotSavePath`): POST /slots/{id}?action=save|restore|erase, over the
// engine's saveSlot, loadSession({ slot }) and eraseSlot. A file is named
// by the client and lives in DIR: a bare file name, never a path.

const fs = require('node:fs')
const path = require('node:path')
const { performance } = require('node:perf_hooks')
const { ApiError, invalid, openaiErrorBody } = require('./errors.js')

const MAX_NAME_BYTES = 255

/**
 * Whether `name` is a file name llama-server accepts (common's
 * fs_validate_filename): 1 to 255 bytes of UTF-8, no control characters,
 * no `/ \ : * ? " < > |` nor their look-alikes, no leading or trailing
 * space, no trailing dot, not `.` or `..`.
 */
function validFilename(name) {
  if (typeof name !== 'string' || name === '' || Buffer.byteLength(name) > MAX_NAME_BYTES) return false
  if (name === '.' || name === '..' || /^ | $|\.$/.test(name)) return false
  for (const ch of name) {
    const c = ch.codePointAt(0)
    if (c <= 0x1f || c === 0x7f || (c >= 0x80 && c <= 0x9f)) return false
    if ([0xff0e, 0x2215, 0x2216, 0xfffd, 0xfeff].includes(c) || (c >= 0xd800 && c <= 0xdfff)) return false
    if ('/\\:*?"<>|'.includes(ch)) return false
  }
  return true
}

async function slotAction(ctx) {
  const dir = ctx.server.slotSavePath
  if (!dir) {
    throw new ApiError(501, 'This server does not support slots action. Start it with `--slot-save-path`', { code: 'NOT_SUPPORTED', type: 'not_supported_error' })
  }
  if (!/^\d{1,9}$/.test(ctx.params.id)) throw new ApiError(400, 'Invalid slot ID', { param: 'id_slot' })
  const id = Number(ctx.params.id)
  const action = ctx.query.get('action')
  const t0 = performance.now()
  const ms = () => performance.now() - t0
  if (action === 'erase') {
    const { tokens } = await ctx.engine.eraseSlot(id)
    return ctx.json(200, { id_slot: id, n_erased: tokens })
  }
  if (action !== 'save' && action !== 'restore') throw new ApiError(400, 'Invalid action (save, restore or erase)', { param: 'action' })
  const { filename } = await ctx.body()
  if (!validFilename(filename)) throw invalid('filename', 'Invalid filename: a file name in the --slot-save-path directory, not a path')
  const file = path.join(dir, filename)
  if (action === 'save') {
    const { tokens, bytes } = await ctx.engine.saveSlot(id, file)
    return ctx.json(200, { id_slot: id, filename, n_saved: tokens, n_written: bytes, timings: { save_ms: ms() } })
  }
  if (!fs.existsSync(file)) throw invalid('filename', `no slot file ${filename} in the --slot-save-path directory`)
  const { tokens } = await ctx.engine.loadSession(file, { slot: id })
  const read = fs.statSync(file).size
  ctx.json(200, { id_slot: id, filename, n_restored: tokens, n_read: read, timings: { restore_ms: ms() } })
}

module.exports = {
  validFilename,
  errorBody: openaiErrorBody,
  routes: {
    'POST /slots/:id': slotAction,
  },
}
