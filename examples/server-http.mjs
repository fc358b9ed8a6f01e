// llama-engine/server mounted in an existing node:http app: the handler
// serves its own routes (/v1/..., /health, /metrics, ...) and hands every
// other request to next(), as Express, Connect and Fastify middleware do.
//
//   node examples/server-http.mjs [--model PATH] [--port 8080]
//   curl localhost:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
//   curl localhost:8080/hello
//
// With Express:  app.use('/llm', createHandler(engine))   (then /llm/v1/chat/completions)
// With Fastify:  fastify.all('/v1/*', (request, reply) => { reply.hijack(); handler(request.raw, reply.raw) })
import http from 'node:http'
import { realpathSync } from 'node:fs'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { createHandler } from 'llama-engine/server'

/** The app: the model's endpoints, and the app's own routes beside them. */
export function createApp(engine, options = {}) {
  const llm = createHandler(engine, options)
  return http.createServer((req, res) => {
    llm(req, res, () => {
      if (req.url === '/hello') {
        res.writeHead(200, { 'Content-Type': 'text/plain' })
        return res.end('hello from the app\n')
      }
      res.writeHead(404, { 'Content-Type': 'text/plain' })
      res.end('not found\n')
    })
  })
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const { values } = parseArgs({ options: { model: { type: 'string' }, port: { type: 'string' } } })
  const { LlamaEngine } = await import('llama-engine')
  const model = values.model ?? fileURLToPath(new URL('../models/SmolLM2-135M-Instruct.Q4_1.gguf', import.meta.url))
  const engine = await LlamaEngine.load({ modelPath: model })
  const app = createApp(engine)
  app.listen(Number(values.port ?? 8080), '127.0.0.1', () => console.error(`listening on http://127.0.0.1:${app.address().port}`))
}
