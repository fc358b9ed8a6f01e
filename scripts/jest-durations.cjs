// A Jest reporter: after the run, the slowest tests and files, so the time a
// suite costs can be read off every run (`--durations`-style). The numbers
// go to stderr beside Jest's own summary; LLAMA_ENGINE_TEST_DURATIONS=N
// changes how many (20 by default; 0 prints none), and
// LLAMA_ENGINE_TEST_DURATIONS_FILE=path also writes every test's time as JSON.
const fs = require('node:fs')
const path = require('node:path')

class DurationsReporter {
  constructor(globalConfig) {
    this.root = globalConfig.rootDir
    this.count = Number(process.env.LLAMA_ENGINE_TEST_DURATIONS ?? 20)
  }

  onRunComplete(_contexts, results) {
    const files = []
    const tests = []
    for (const file of results.testResults) {
      const name = path.relative(this.root, file.testFilePath)
      files.push({ name, ms: file.perfStats.end - file.perfStats.start, tests: file.testResults.length })
      for (const t of file.testResults) {
        if (t.status === 'passed' || t.status === 'failed') tests.push({ file: name, name: t.fullName, ms: t.duration || 0, status: t.status })
      }
    }
    if (process.env.LLAMA_ENGINE_TEST_DURATIONS_FILE) {
      fs.writeFileSync(process.env.LLAMA_ENGINE_TEST_DURATIONS_FILE, JSON.stringify({ files, tests }, null, 1))
    }
    if (this.count <= 0) return
    const s = (ms) => `${(ms / 1000).toFixed(1).padStart(7)} s`
    const out = [`\nslowest ${Math.min(this.count, tests.length)} tests:`]
    for (const t of [...tests].sort((a, b) => b.ms - a.ms).slice(0, this.count)) out.push(`${s(t.ms)}  ${t.file}  ${t.name}`)
    out.push(`slowest files (with their loads and hooks):`)
    for (const f of [...files].sort((a, b) => b.ms - a.ms).slice(0, this.count)) out.push(`${s(f.ms)}  ${f.name} (${f.tests} tests)`)
    process.stderr.write(out.join('\n') + '\n')
  }
}

module.exports = DurationsReporter
