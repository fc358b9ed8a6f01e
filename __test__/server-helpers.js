// Shared by server.test.js and openai.test.js: examples/server.mjs loaded,
// listened on a free port, closed.
const path = require('node:path')
const vm = require('node:vm')
const { pathToFileURL } = require('node:url')

const SERVER = path.join(__dirname, '..', 'examples', 'server.mjs')

// examples/server.mjs is an ES module. Jest runs tests as CommonJS in a VM
// that cannot import() without --experimental-vm-modules; then load it with
// Node's own loader in the main context instead.
async function importServer() {
  const url = pathToFileURL(SERVER).href
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

function listen(server) {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${server.address().port}`)))
}

function close(server) {
  const closed = new Promise((resolve) => server.close(resolve))
  server.closeAllConnections()
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

module.exports = { importServer, listen, close, until }
