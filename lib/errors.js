'use strict'
// Errors as callers see them: an Error with a stable `code` (and `field`
// for INVALID_REQUEST), whether raised here or by the addon.

const { errorCodes } = require('./addon/native.js')

const CODES = new Set(errorCodes)

// Errors raised here, before anything reaches the addon.
function engineError(code, message) {
  const err = new Error(message)
  err.code = CODES.has(code) ? code : 'INTERNAL'
  return err
}

// Everything the addon throws carries a code; anything else (a failed
// argument conversion, say) becomes INTERNAL so callers can rely on `code`.
function coded(e) {
  if (e && typeof e === 'object' && CODES.has(e.code)) return e
  return engineError('INTERNAL', String((e && e.message) || e))
}

module.exports = { engineError, coded }
