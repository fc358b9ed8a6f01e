// `npm run build [-- --features cuda]`: the release build of the addon, the
// same cargo profile and target dir as `cargo test --release`, so llama.cpp
// is compiled once. (`npm run build:bindings` regenerates binding.d.ts
// with the napi CLI after the native API changes.)
import { buildAddon } from './native.mjs'

const args = process.argv.slice(2)
const i = args.indexOf('--features')
const features = i >= 0 ? (args[i + 1] || '').split(',').filter(Boolean) : []
buildAddon({ features })
