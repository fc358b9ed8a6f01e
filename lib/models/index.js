'use strict'
// Model files as the public API offers them: fetched by name (resolve.js),
// described without loading (`inspectModel`), re-quantized (`quantizeModel`).

const os = require('node:os')
const { binding } = require('../addon/native.js')
const { coded } = require('../errors.js')
const { resolveModel: resolveRemote } = require('./resolve.js')

/** Re-quantizes a GGUF model with llama.cpp (used to make the test fixtures). */
async function quantizeModel(input, output, ftype) {
  try {
    await binding.quantizeModel(String(input), String(output), String(ftype))
  } catch (e) {
    throw coded(e)
  }
}

/**
 * The local path of a model named by a path, `hf:OWNER/REPO:QUANT`,
 * `hf:OWNER/REPO/FILE.gguf` or an https URL, downloaded into Hugging Face's
 * hub cache if needed (resolve.js).
 */
async function resolveModel(uri, options) {
  try {
    return await resolveRemote(uri, options)
  } catch (e) {
    if (e && e.name === 'AbortError') throw e
    throw coded(e)
  }
}

/**
 * What a GGUF file (a model or a LoRA adapter, by path or URI) holds, and
 * for a model the memory a context of `contextSize` tokens per slot
 * (`parallel` slots, the engine's defaults) takes — weights, KV cache and
 * compute buffers as llama.cpp sizes them — against the memory available,
 * without loading the weights.
 */
async function inspectModel(uri, options = {}) {
  if (options === null || typeof options !== 'object') throw engineError('INVALID_REQUEST', 'options: expected an object')
  const { contextSize, parallel, batchSize, signal, offline, cacheDir, onProgress } = options
  const path = await resolveModel(uri, { signal, offline, cacheDir, onProgress })
  let info
  try {
    info = JSON.parse(await binding.inspectModel(JSON.stringify({ modelPath: path, contextSize, parallel, batchSize })))
  } catch (e) {
    throw coded(e)
  }
  if (info.memory && typeof info.memory.total === 'number') {
    info.memory.available = os.freemem()
    info.memory.fits = info.memory.total <= info.memory.available
  }
  return info
}

module.exports = { quantizeModel, resolveModel, inspectModel }
