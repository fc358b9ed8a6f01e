// Types of llama-engine/server: an HTTP server over one LlamaEngine
// (OpenAI Chat Completions, Completions, Responses and embeddings,
// Anthropic Messages, llama.cpp's endpoints, Prometheus metrics).

import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { EngineOptions, EngineStatus, LlamaEngine } from '../index'

export interface ServerOptions {
  /**
   * Required on every endpoint but /health (and CORS preflights), as
   * `Authorization: Bearer <key>` or `x-api-key: <key>`; compared in
   * constant time; several keys: any of them. Default: none (no key needed).
   */
  apiKey?: string | string[]
  /** The model's name in answers and GET /v1/models. Default: the model file's name (`status().model`). */
  modelName?: string
  /**
   * Requests that may wait for a slot; one more is answered 429 with
   * `Retry-After`. Default 64.
   */
  maxQueue?: number
  /**
   * CORS: `true` or `"*"` allows any origin (echoed, with credentials, when
   * `corsCredentials`; else `*`); `"localhost"` origins on this machine
   * (localhost, 127.0.0.1, [::1], any port); a string (or comma-separated
   * list) those origins. Every OPTIONS request is then answered 200 as a
   * preflight (without Access-Control-Allow-Origin for an origin not
   * allowed). Default: off. (`llama-engine serve`: `"*"`, as llama-server.)
   */
  cors?: string | boolean
  /** The methods a preflight allows. Default `"GET, POST, DELETE, OPTIONS"`. */
  corsMethods?: string
  /** The headers a preflight allows. Default: those the preflight asks for. (`serve`: `"*"`.) */
  corsHeaders?: string
  /** Access-Control-Allow-Credentials. Default true. */
  corsCredentials?: boolean
  /** GET /slots; false answers it 501 (llama-server's --no-slots). Default true. */
  slots?: boolean
  /**
   * Defaults of request fields (`temperature`, `seed`, `n_predict`,
   * `speculative`…: llama-server's --temp, --seed, -n, --spec-*): a request
   * that leaves a field out gets it; `speculative` merges field by field.
   */
  requestDefaults?: Record<string, unknown>
  /** createServer: a connection whose request headers are not in by then is dropped (408). Default 10000. */
  headersTimeoutMs?: number
  /**
   * A request whose body is not in by then is answered 408 and its
   * connection dropped. It bounds reading the request, not generating the
   * answer. Default 60000.
   */
  requestTimeoutMs?: number
  /** Bodies larger than this are answered 413. Default 16 MiB. */
  maxBodyBytes?: number
  /** On shutdown, how long running requests may go on before they are aborted. Default 10000. */
  shutdownGraceMs?: number
  /**
   * Responses API: how many finished responses are kept (in memory) for
   * `previous_response_id`, `item_reference` inputs and GET/DELETE
   * /v1/responses/{id}; a request with `store: false` is not kept. The
   * oldest go first. Default 1000; 0 keeps none.
   */
  responsesMax?: number
  /** And at most this many bytes of them (their JSON). Default 64 MiB. */
  responsesMaxBytes?: number
  /**
   * Keep them on disk too: written atomically (temporary file, fsync,
   * rename) ~200 ms after a change and on `shutdown()`, read back
   * at start. A file that fails its checks (header, length, sha256, shape,
   * size) is not used: the store starts empty and `server.responses.loadError`
   * says why; the next change replaces it.
   */
  responsesFile?: string
  /**
   * Fetch http(s) image URLs of image parts (OpenAI `image_url`, Responses
   * `input_image`, Anthropic `url` images) into the request: at most 20 MiB
   * each, within 10 s. Default false: only data: URLs and base64 are read.
   */
  allowRemoteMedia?: boolean
  /**
   * A directory whose files image parts may name as `file://PATH` (relative
   * to it, whatever slashes lead; llama-server's `--media-path`): read as
   * the request is, at most 20 MiB. `..`, paths that resolve (links
   * followed) outside it and missing files are 400s. Default: none, and
   * `file://` URLs are 400s.
   */
  mediaPath?: string
  /**
   * A directory (that exists) for llama-server's slot files: POST
   * /slots/{id}?action=save|restore|erase save a slot's cells to a file
   * named by the client in it, restore them into a slot, or drop them
   * (`--slot-save-path`). Without it those answer 501.
   */
  slotSavePath?: string
  /**
   * After this many ms without a request, the engine is disposed (its
   * memory given back; llama-server's `--sleep-idle-seconds`). GET /health,
   * /props (`is_sleeping: true`), /v1/models, /slots and /metrics answer
   * from what it was; any other request loads it again with
   * `reloadEngine` and is served once it is loaded. Over one model only.
   * Default 0: never.
   */
  sleepIdleMs?: number
  /** How a sleeping server's engine is loaded again. Default (with `model`): the same load. */
  reloadEngine?: () => Promise<LlamaEngine>
  /**
   * Called for every answer with a status of 500 or more (also an error
   * sent as an event mid-stream): the error (`status`, `code`, `message`,
   * which says its cause) and the request. Nothing is printed otherwise;
   * `llama-engine serve` prints one line to stderr.
   */
  onError?: (error: Error & { status: number; code: string }, request: { method: string; path: string; status: number; streaming: boolean }) => void
}

export interface CreateServerOptions extends ServerOptions {
  /** The engine to serve, or a promise of it (until it resolves, /health says "loading" and the rest answers 503). */
  engine?: LlamaEngine | Promise<LlamaEngine>
  /** Instead of `engine`: the path of a GGUF model, loaded with `engineOptions`. The server then owns the engine and disposes of it when it closes. */
  model?: string
  engineOptions?: Omit<EngineOptions, 'modelPath'>
  /**
   * Instead of `engine` and `model`: many models behind one server
   * (`serve --models`). The request's `model` picks one (a request naming
   * none gets the only one, when there is one); a model not loaded is
   * loaded on demand with `engineOptions` and its own `options`, in its own
   * child process (`isolation: 'process'` unless its options say
   * otherwise); requests for it wait meanwhile (at most `maxQueue`,
   * counted as queued in /metrics). An unknown model answers 404 in each
   * protocol's shape. `pinned` models load at start and are never
   * unloaded. `bytes`: its memory, else inspectModel's estimate for its
   * context and slots. GET /v1/models lists every model with its state
   * (`status.value`: `unloaded`, `loading`, `loaded`, `failed`) but the
   * `hidden` ones (still served by name); POST /models/load and
   * /models/unload `{ model }` load and unload one; GET /props without
   * `?model=` is the router's own (`role: 'router'`, `max_instances`,
   * `models_autoload`). A load no request waits for any more (its clients
   * left while it waited for room) is given up before it unloads anything.
   * May be empty (llama-server's router over an empty cache).
   */
  models?: { name: string; uri: string; options?: Omit<EngineOptions, 'modelPath'>; pinned?: boolean; hidden?: boolean; bytes?: number }[]
  /**
   * With `models`: load a model when a request names it (default true).
   * False: a request for a model not loaded is a 400 ("model is not
   * loaded"); POST /models/load loads it. A request's `?autoload=` says
   * otherwise for itself. llama-server's `--no-models-autoload`.
   */
  modelsAutoload?: boolean
  /**
   * With `models`: the list read again, for GET /models?reload=1 and POST
   * /models/reload (new models added, gone ones unloaded and removed, the
   * others kept).
   */
  reloadModels?: () => NonNullable<CreateServerOptions['models']> | Promise<NonNullable<CreateServerOptions['models']>>
  /**
   * With `models`: POST /models (llama-server's): downloads `name`
   * (`OWNER/REPO[:TAG]`) where the list (`reloadModels`) will find it,
   * telling `onProgress({ file, downloaded, total })`; `signal` aborts it
   * when the server closes. Without it, POST /models is a 501.
   */
  downloadModel?: (name: string, options: { onProgress: (p: { file: string; downloaded: number; total: number }) => void; signal: AbortSignal }) => Promise<unknown>
  /**
   * With `models`: DELETE /models (llama-server's): removes the files of
   * model `name` (after it is unloaded) and resolves true; with `check`,
   * only whether it could (a model of the cache). Without it, a 501.
   */
  removeModel?: (name: string, options?: { check?: boolean }) => Promise<boolean>
  /** With `models`: at most this many loaded at once (the least recently used idle one is unloaded first). Default: no limit. */
  modelsMax?: number
  /** With `models`: at most this many bytes loaded, by each model's estimate. Default: no limit. */
  memoryMax?: number
  /** With `models`: unload a model no request used for this long (ms). Default: never. */
  idleUnloadMs?: number
  /**
   * While listening, SIGTERM and SIGINT shut the server down gracefully
   * (`shutdown()`), then end the process as the signal would have; a second
   * signal ends it at once. Default true.
   */
  signals?: boolean
}

export interface ShutdownOptions {
  /** How long running requests may go on before they are aborted. Default: `shutdownGraceMs`. */
  graceMs?: number
  /** Dispose of the engine afterwards. Default: when the server loaded it (`model`). */
  dispose?: boolean
}

export interface LlamaEngineServer extends Server {
  /**
   * Stops accepting connections, answers queued requests 503, lets running
   * ones finish for `graceMs`, aborts the rest, closes every connection,
   * then disposes of the engine (see `dispose`).
   */
  shutdown(options?: ShutdownOptions): Promise<void>
  /** What the Responses API keeps (`store`). */
  readonly responses: KeptResponses
  /** With `models`: the router (null over one engine). */
  readonly router: ModelRouter | null
}

export interface ModelRouter {
  /** Every model, with its state. */
  list(): { name: string; uri: string; state: 'unloaded' | 'loading' | 'loaded' | 'failed'; pinned: boolean; bytes: number | null; error: { code: string; message: string } | null; lastUsed: number | null; requests: number; status?: EngineStatus }[]
  /** Loads a model (making room as a request would). */
  load(name: string): Promise<string>
  /** Unloads a model: its queued requests get 503, running ones may finish for the grace period. Resolves with whether it was loaded. */
  unload(name: string): Promise<boolean>
  /** Replaces the list of models (as GET /models?reload=1 does with `reloadModels`' answer). */
  sync(models: NonNullable<CreateServerOptions['models']>): Promise<void>
}

export interface KeptResponses {
  /** Responses kept now. */
  readonly size: number
  /** Their bytes (JSON). */
  readonly bytes: number
  /** `responsesFile`, resolved; null without one. */
  readonly file: string | null
  /** Why the file was not used at start (null when it was, or there was none). */
  readonly loadError: string | null
  /** Why the last write failed (null after one succeeds). */
  readonly writeError: Error | null
  /** Writes what is kept now; resolves when it is on disk. */
  flush(): Promise<void>
}

export interface CloseOptions {
  graceMs?: number
}

export type NodeHandler = ((req: IncomingMessage, res: ServerResponse, next?: (err?: unknown) => void) => void) & {
  /** New and queued requests are answered 503; running ones may finish for `graceMs`, then are aborted. */
  close(options?: CloseOptions): Promise<void>
}

export type FetchHandler = ((request: Request) => Promise<Response>) & {
  close(options?: CloseOptions): Promise<void>
}

/** A node:http server, not yet listening, over one engine (or, with `models`, many). */
export declare function createServer(options: CreateServerOptions): LlamaEngineServer

/**
 * A handler for node:http's (req, res): mount it in Express
 * (`app.use(handler)`), Connect, Fastify (`reply.hijack()`) or a plain
 * server. With `next`, requests it does not serve go on to `next()`.
 */
export declare function createHandler(engine: LlamaEngine | Promise<LlamaEngine>, options?: ServerOptions): NodeHandler

/** A Web-standard handler, `(Request) => Promise<Response>`: Hono, Next.js route handlers, Bun, Deno. */
export declare function createFetchHandler(engine: LlamaEngine | Promise<LlamaEngine>, options?: ServerOptions): FetchHandler
