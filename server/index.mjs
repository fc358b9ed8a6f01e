// The ES module entry of llama-engine/server (the code is CommonJS: index.js).
import server from './index.js'

export const { createServer, createHandler, createFetchHandler } = server
export default server
