// `npm install` hook: build the addon from source unless a prebuilt binary
// for this platform is already here.
import { addonBuilt, buildAddon } from './native.mjs'

if (!addonBuilt() && !process.env.LLAMA_ENGINE_SKIP_BUILD) {
  buildAddon({ features: (process.env.LLAMA_ENGINE_FEATURES || '').split(',').filter(Boolean) })
}
