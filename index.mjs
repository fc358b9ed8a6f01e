// ESM entry: the same objects as the CommonJS entry.
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
const cjs = require('./index.js')

export const { LlamaEngine, quantizeModel, resolveModel, inspectModel, errorCodes, requestFields, drafters } = cjs
export default cjs
