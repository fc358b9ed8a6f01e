'use strict'
// The package's entry point (CommonJS; index.mjs is the ESM one). The code
// is in lib/, by concern: engine.js (the LlamaEngine class), addon/ (finding
// and loading the native addon and a GPU module), isolation/ (the engine in
// a child process), models/ (models by name, inspected, quantized),
// errors.js, wire.js and stream.js.

const { LlamaEngine } = require('./lib/engine.js')
const { quantizeModel, resolveModel, inspectModel } = require('./lib/models/index.js')
const { errorCodes, requestFields, drafters } = require('./lib/addon/native.js')

module.exports = { LlamaEngine, quantizeModel, resolveModel, inspectModel, errorCodes, requestFields, drafters }
