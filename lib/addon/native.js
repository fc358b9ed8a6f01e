'use strict'
// The native addon of this process, loaded once (loader.js finds it), and
// the lists it exports: error codes, request fields, drafters.

const { loadNative, platformTriple } = require('./loader.js')

const native = loadNative()

/** Every error code the engine uses (the addon's list). */
const errorCodes = Object.freeze(native.binding.errorCodes())

/** The request fields this version accepts: name, type, kind, range, default, doc. */
const requestFields = Object.freeze(native.binding.requestFields())

/** The drafters speculation can use, from the addon's table. */
const drafters = Object.freeze(native.binding.drafters().map((d) => Object.freeze(d)))

module.exports = { native, binding: native.binding, platformTriple, errorCodes, requestFields, drafters }
