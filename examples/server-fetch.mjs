// llama-engine/server as a Web-standard fetch handler, (Request) => Response:
// what Hono, Next.js route handlers, Bun.serve and Deno.serve take.
//
//   Hono:     app.all('/v1/*', (c) => handler(c.req.raw))
//   Next.js:  app/v1/[...path]/route.js: export const GET = handler, POST = handler
//   Bun:      Bun.serve({ fetch: handler })
//
// Here Node's own http server drives it through a tiny adapter (what
// @hono/node-server does), so the example runs with nothing installed:
//
//   node examples/server-fetch.mjs [--model PATH] [--port 8080]
import http from 'node:http'
import { Readable } from 'node:stream'
import { realpathSync } from 'node:fs'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { createFetchHandler } from 'llama-engine/server'

/** node:http's (req, res) -> a Request for `fetchHandler`, its Response written back (streamed). */
export function fromFetch(fetchHandler) {
  return async (req, res) => {
    const ac = new AbortController()
    res.on('close', () => ac.abort()) // the client left: cancel the Request (and its generation)
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD'
    const request = new Request(`http://${req.headers.host ?? 'localhost'}${req.url}`, {
      method: req.method,
      headers: Object.entries(req.headers).flatMap(([k, v]) => (Array.isArray(v) ? v.map((x) => [k, x]) : [[k, v]])),
      body: hasBody ? Readable.toWeb(req) : undefined,
      duplex: hasBody ? 'half' : undefined,
      signal: ac.signal,
    })
    const response = await fetchHandler(request)
    res.writeHead(response.status, Object.fromEntries(response.headers))
    if (!response.body) return res.end()
    for await (const chunk of response.body) res.write(chunk)
    res.end()
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const { values } = parseArgs({ options: { model: { type: 'string' }, port: { type: 'string' } } })
  const { LlamaEngine } = await import('llama-engine')
  const model = values.model ?? fileURLToPath(new URL('../models/SmolLM2-135M-Instruct.Q4_1.gguf', import.meta.url))
  const engine = await LlamaEngine.load({ modelPath: model })
  const server = http.createServer(fromFetch(createFetchHandler(engine)))
  server.listen(Number(values.port ?? 8080), '127.0.0.1', () => console.error(`listening on http://127.0.0.1:${server.address().port}`))
}
