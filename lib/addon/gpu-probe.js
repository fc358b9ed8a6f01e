'use strict'
// Run by gpu.js in a child process: loads a GPU back-end module and computes
// on its devices. Prints one JSON line: { ok, devices } or { ok: false, reason }.
// If the driver crashes, only this process dies.
const { loadNative } = require('./loader.js')

let answer
try {
  answer = loadNative().binding.probeGpu(process.argv[2])
} catch (e) {
  answer = { ok: false, reason: String(e && e.message) }
}
process.stdout.write(`${JSON.stringify(answer)}\n`)
