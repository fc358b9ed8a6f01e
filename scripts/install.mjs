// `npm install` hook. Nothing to do when an addon loads: the prebuilt
// platform package (llama-engine-linux-x64-gnu, …, an optional dependency)
// or a local build. Otherwise, or when forced with
// `npm install --build-from-source` (npm_config_build_from_source=true), it
// builds the addon from source, and names the missing system packages when
// it cannot.
import { createRequire } from 'node:module'
import { buildAddon } from './native.mjs'

const require = createRequire(import.meta.url)
const fromSource = process.env.npm_config_build_from_source === 'true'

function loaded() {
  try {
    return require('../lib/addon/loader.js').loadNative().from
  } catch {
    return null
  }
}

if (!process.env.LLAMA_ENGINE_SKIP_BUILD) {
  const from = fromSource ? null : loaded()
  if (from) {
    console.log(`llama-engine: using the ${from === 'local build' ? 'local build' : `prebuilt addon from ${from}`}`)
  } else {
    if (!fromSource) console.log('llama-engine: no prebuilt addon for this platform; building from source')
    buildAddon({ features: (process.env.LLAMA_ENGINE_FEATURES || '').split(',').filter(Boolean) })
  }
}
