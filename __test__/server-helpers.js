// Shared by the server tests: the package's server (llama-engine/server),
// listened on a free port, closed; SSE bodies read.
const vm = require('node:vm')
const { pathToFileURL } = require('node:url')
const server = require('../server')
const { createServer } = server
const { loadTarget } = require('./helpers')

/** The server module (kept async for the tests written when it was an ES module example). */
async function importServer() {
  return server
}

// Jest runs tests as CommonJS in a VM that cannot import() ES modules (the
// examples) without --experimental-vm-modules; load them with Node's own
// loader in the main context instead.
async function importEsm(file) {
  const url = pathToFileURL(file).href
  try {
    return await import(url)
  } catch (e) {
    if (!String(e.code).startsWith('ERR_VM_DYNAMIC_IMPORT')) throw e
    const load = new vm.Script('(url) => import(url)', {
      importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
    }).runInThisContext()
    return load(url)
  }
}

/** An engine on the fixture target and the package's server over it, on a free port. */
async function startServer(serverOptions = {}, engineOptions = {}) {
  const engine = await loadTarget({ contextSize: 2048, ...engineOptions })
  const server = createServer({ engine, signals: false, ...serverOptions })
  return { engine, server, base: await listen(server) }
}

/** Closes what `startServer` started. */
async function stopServer({ engine, server }) {
  if (server) await close(server)
  if (engine) await engine.dispose()
}

function listen(s) {
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${s.address().port}`)))
}

function close(s) {
  const closed = new Promise((resolve) => s.close(resolve))
  s.closeAllConnections()
  return closed
}

/** Polls `predicate` every 25 ms; false if it is still false after `ms`. */
async function until(predicate, ms) {
  const deadline = Date.now() + ms
  while (!predicate()) {
    if (Date.now() > deadline) return false
    await new Promise((r) => setTimeout(r, 25))
  }
  return true
}

/** The events of an SSE body: `{ event, data }`, data parsed when it is JSON. */
function sseEvents(text) {
  return text
    .split('\n\n')
    .filter((block) => block.trim() !== '')
    .map((block) => {
      const event = /^event: (.*)$/m.exec(block)?.[1] ?? null
      const data = block
        .split('\n')
        .filter((l) => l.startsWith('data: '))
        .map((l) => l.slice(6))
        .join('\n')
      let parsed = data
      try {
        parsed = JSON.parse(data)
      } catch {}
      return { event, data: parsed }
    })
}

module.exports = { startServer, stopServer, importServer, importEsm, listen, close, until, sseEvents }
