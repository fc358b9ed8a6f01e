// Public types of llama-engine. The native layer's own generated types are
// in binding.d.ts; this file is the surface users see.

export type ErrorCode = 'INVALID_REQUEST' | 'MODEL_LOAD_FAILED' | 'INCOMPATIBLE_DRAFT' | 'DISPOSED' | 'INVALID_SESSION' | 'CONTEXT_EXCEEDED' | 'ENGINE_CRASHED' | 'ENGINE_RESTARTING' | 'INTERNAL'

/** Every rejection and throw of the engine is an Error with one of these codes. */
export interface LlamaEngineError extends Error {
  code: ErrorCode
  /**
   * For `INVALID_REQUEST`: the request field at fault, as data (e.g.
   * `"top_p"`, `"tools[0].function.parameters.properties.a"`,
   * `"response_format.json_schema.schema.minItems"`). Absent for other codes
   * and for errors that are not about one field.
   */
  field?: string
  /** For `ENGINE_RESTARTING`: when the next engine process starts, in ms from now. */
  retryAfterMs?: number
  /** For `CONTEXT_EXCEEDED`: the prompt's tokens, and the cells of a slot's context. */
  promptTokens?: number
  contextSize?: number
}

/** Every error code, as the addon lists them. */
export declare const errorCodes: readonly ErrorCode[]

/** One request field as the engine checks it. */
export interface RequestField {
  name: string
  /** Its TypeScript type. */
  type: string
  kind: 'int' | 'float' | 'bool' | 'string' | 'choice' | 'object' | 'other'
  min?: number
  max?: number
  choices?: string[]
  /** The default (absent when there is none). */
  default?: unknown
  doc: string
  /** For `kind: "object"`: its fields. */
  fields?: RequestField[]
}

/** Every request field this version accepts (for tools that build requests: CLIs, servers). */
export declare const requestFields: readonly RequestField[]

/** A drafter of the engine's table (`drafters`). */
export interface Drafter {
  /** A word of `speculative.mode`, the `source` of the tokens it proposed, its key in `speculative.drafters`. */
  name: Exclude<TokenSource, 'target'>
  /** `always`: in every request that speculates (what a constraint forces); `named`: when the mode names it, or `auto` includes it. */
  runs: 'always' | 'named'
  inAuto: boolean
  needsDraftModel: boolean
  /** The acceptance rate its controller assumes before it has measured any. */
  prior: number
}

/** Every drafter, in the order a request's chain tries them. */
export declare const drafters: readonly Drafter[]

/** Where a generated token came from: the target model, or the drafter that proposed it. */
export type TokenSource = 'target' | 'grammar' | 'suffix' | 'ngram' | 'draft'

export interface EngineOptions {
  /** A GGUF file, or a model to fetch first: `hf:OWNER/REPO:QUANT`, `hf:OWNER/REPO/FILE.gguf`, `https://…` (`resolveModel`). */
  modelPath: string
  /** Draft model for speculative decoding (same vocabulary as the target). */
  draftModelPath?: string
  /**
   * The model's multimodal projector (`mmproj-*.gguf`, a path or an `hf:`
   * URI): messages may then carry images (and audio, with an audio
   * projector). A projector of another model, or a damaged file, is refused
   * with its cause (`MODEL_LOAD_FAILED`).
   */
  mmprojPath?: string
  /** Default 4096, capped at the model's training context. */
  contextSize?: number
  /** Default 512. */
  batchSize?: number
  /** Default: available parallelism. */
  threads?: number
  /**
   * Layers on the GPU (default 0; 99 = all). Needs a GPU back end: the
   * optional `llama-engine-linux-x64-gnu-vulkan` package or a source build
   * with one. Without it the CPU computes and `status().gpu.reason` says why.
   */
  gpuLayers?: number
  draftGpuLayers?: number
  /** Model loading progress, 0..1 (with an `hf:`/`https:` model, the download is the first half). */
  onProgress?: (fraction: number) => void
  /** Stops the download of an `hf:`/`https:` model (see `resolveModel`). */
  signal?: AbortSignal
  /** `hf:`/`https:` models from the cache only, no network. */
  offline?: boolean
  /** Dynamic n-gram cache: loaded if present. */
  ngramCachePath?: string
  /** Read-only n-gram cache (llama.cpp lookup format). */
  staticNgramCachePath?: string
  /**
   * Tokens of earlier requests' outputs the suffix drafter keeps, for all
   * slots (default 262144; 0 keeps none). Past it the oldest outputs are
   * dropped first, whichever namespace holds them.
   */
  suffixCacheTokens?: number
  /**
   * The suffix drafter's shared indexes: read at load when the file exists
   * (a damaged file, or one of another vocabulary, is reported in
   * `status().suffixCache.errors` and the engine starts empty), written by
   * `saveSuffixCache()`.
   */
  suffixCachePath?: string
  /**
   * The suffix drafter's namespace for requests that name none
   * (`speculative.namespace`; default `""`, at most 128 bytes).
   */
  suffixNamespace?: string
  /**
   * A Jinja chat template for `messages`, replacing the GGUF's
   * `tokenizer.chat_template` (needed for models without one). A template
   * that does not compile rejects `load` with INVALID_REQUEST naming `chatTemplate`.
   */
  chatTemplate?: string
  /**
   * How the model writes tool calls: detected from its chat template
   * ("auto", the default: the template is rendered with probe calls and the
   * syntax read from the difference), or one family's syntax: "hermes"
   * (`<tool_call>{"name", "arguments"}</tool_call>`), "llama3" (a bare
   * `{"name", "parameters"}`), "mistral" (`[TOOL_CALLS][{…, "id"}]`), or
   * "generic" (a system preamble lists the tools; Hermes syntax).
   */
  toolCallFormat?: 'auto' | 'hermes' | 'llama3' | 'mistral' | 'generic'
  /**
   * Requests decoded together, one batch per step, each in its own slot (a
   * KV stream of `contextSize` cells, so memory for the KV cache grows with
   * it); more wait in FIFO order. Default 4; 1 decodes one request at a time.
   */
  parallel?: number
  /**
   * MiB of host memory for the prompt cache: before a slot's cells are
   * overwritten by another prompt, they are kept here (least recently used
   * out first) and restored when a later prompt starts with them. Default
   * 1024; 0 turns it off.
   */
  promptCacheMB?: number
  /**
   * How `embed()` turns an input's token vectors into one vector: `mean`
   * (their average), `cls` (the first token's), `last` (the last token's);
   * `rank`: the model is a reranker (its classifier head scores the pair;
   * `rerank()` only); `none`: no pooling, each input's vector is every
   * token's vector one after another (`tokens × embeddingSize` values,
   * never normalised; images' and audio's rows are not among them).
   * Default: the GGUF's `<arch>.pooling_type` when it names one of
   * mean, cls, last or rank, else `mean`.
   */
  pooling?: 'mean' | 'cls' | 'last' | 'rank' | 'none'
  /**
   * LoRA adapters (GGUF, llama.cpp's adapter format; paths or model URIs as
   * `modelPath`), applied at `scale` (default 1) to requests without their
   * own `lora`; their ids are their places in this list. An adapter for
   * another base model is refused (`MODEL_LOAD_FAILED`, with the reason).
   * Requests with different adapters or scales decode in one batch, each
   * as it would alone; scale 0 is the base model bit for bit.
   */
  loras?: Array<{ path: string; scale?: number }>
  /**
   * Where the engine runs. `'none'` (default): in this process. `'process'`:
   * in a child process (Electron's utilityProcess in an Electron main
   * process, else `child_process.fork`) behind the same API; if it dies (an
   * assert in llama.cpp, a driver fault, the out-of-memory killer) only its
   * running and queued requests fail, with `ENGINE_CRASHED`, and a new child
   * starts. `tokenize`, `detokenize` and `applyChatTemplate` stay synchronous
   * (this process keeps the vocabulary, not the weights).
   */
  isolation?: 'none' | 'process'
  /**
   * RPC workers (`'host:port'`, each a `llama-engine rpc-worker`): the
   * target's layers are spread over them (llama.cpp's RPC back end, by the
   * memory each offers), computed by the same CPU kernels as here: the same
   * tokens and probabilities as a local run. A worker that cannot be reached
   * fails the load (`MODEL_LOAD_FAILED` naming it). Implies `isolation:
   * 'process'` (ggml ends the process that loses a worker; the request
   * running then rejects `ENGINE_CRASHED`); `'none'` is refused. The draft
   * model stays here. The protocol has no authentication: private networks only.
   */
  rpc?: string[]
  /**
   * `'default'`: the fastest kernels this CPU has — the same bits run after
   * run on this machine, batch- and thread-invariant, but another CPU class
   * (AVX2 vs AVX-512, arm64, Windows) may write other tokens. `'portable'`:
   * kernels that compute the same bits on every CPU the packages support
   * (fixed-lane sums in one order, no fused multiply-add, our own
   * exp/sin/cos), for snapshot tests and reproducible runs; slower (decode
   * 1.4–1.6×, prompts 2.3–2.5× on AVX-512 here) and CPU only: `gpuLayers`, `draftGpuLayers` and
   * `rpc` are refused with it. Weight types F32, F16, BF16, Q4_0, Q4_1,
   * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; a model computing anything else fails
   * to load with `MODEL_LOAD_FAILED` naming it. See docs/testing.md.
   */
  determinism?: 'default' | 'portable'
  /**
   * With `isolation: 'process'`: start a new child when one dies — at once,
   * then with backoff (1, 2, 4 … 30 s) while new children die before
   * answering anything. Default true.
   */
  restart?: boolean
  /**
   * With `isolation: 'process'`: how long a call made while the child
   * restarts waits for the next one, in ms (default 5000). A call the next
   * child is not expected to be ready for in that time (its backoff plus
   * the last load's time), or is not ready for, rejects with
   * `ENGINE_RESTARTING` and `retryAfterMs`. 0: never wait.
   */
  restartWaitMs?: number
  /**
   * Where the verdicts of the load-time self-check (the batch-invariance
   * check and batch costs behind `status().batchInvariant`, seconds of
   * compute) are kept across processes: a later load of the same model file
   * with the same context settings, threads and build — a restarted
   * isolated engine, the next server process — reuses a verdict that held
   * instead of checking again. A file path, or `false` for none (verdicts
   * are then reused within this process only). Default:
   * `self-check.bin` in `LLAMA_ENGINE_CACHE_DIR`, else the user's cache
   * directory (`$XDG_CACHE_HOME/llama-engine` or `~/.cache/llama-engine`,
   * `~/Library/Caches/llama-engine`, `%LOCALAPPDATA%\llama-engine\cache`).
   * The file is checked whole before use (a damaged one is ignored and
   * replaced) and written atomically; a check that failed is never kept.
   */
  selfCheckCache?: string | false
}

/** What `embed()` takes besides its input. */
export interface RerankRequest {
  query: string
  documents: string[]
  /** Only the best N. Default: all. */
  top_n?: number
}

/**
 * Best first (ties in the documents' order); `relevance_score` is the
 * model's (a logit, or a probability for Qwen3-Reranker). `tokens`: those
 * of every pair scored (a property of the array, not an element).
 */
export type RerankResult = { index: number; relevance_score: number }[] & { readonly tokens: number }

export interface EmbedOptions {
  /** Scale each vector to unit length (L2). Default true. */
  normalize?: boolean
  /**
   * Cut an input longer than `contextSize` tokens to its first
   * `contextSize` tokens. Default false: such an input rejects with
   * `INVALID_REQUEST` naming it (`input[2]`) and the limit.
   */
  truncate?: boolean
}

/** What `embed()` resolves with. */
export interface EmbedResult {
  /** One vector per input, in input order (`status().embeddingSize` values each). */
  embeddings: Float32Array[]
  /** Input tokens, all inputs together. */
  tokens: number
}

/** What a chat session is saved with: the conversation so far, or a prompt. */
export type SessionConversation =
  | ({ messages: ChatMessage[] } & Pick<CompletionRequest, 'tools' | 'tool_choice' | 'parallel_tool_calls' | 'chat_template_kwargs'>)
  | { prompt: string | Array<string | number> }

export interface SavedSession {
  /** Tokens whose KV cells the file holds. */
  tokens: number
  /** The cells are what computing the tokens gives (always, for files this version writes). */
  exact: boolean
  /** The file's size in bytes. */
  bytes: number
}

export type LoadedSession = {
  /** Tokens now held by a slot: a request starting with them evaluates only what follows. */
  tokens: number
  /**
   * The cells are bit-identical to computing the tokens here: the file was
   * written by this version of llama-engine on a back end with the same CPU
   * features. False: valid cells, but output may differ from a cold run in
   * the last bits.
   */
  exact: boolean
  /** The slot that holds them. */
  slot: number
} & SessionConversation

/** A text part of an OpenAI-style message. */
export interface ChatTextPart {
  type: 'text'
  text: string
}

/**
 * An image or audio file in a message (the engine needs `mmprojPath`):
 * its bytes (`Uint8Array`/`Buffer`, or base64 text, or a `data:` URL), or a
 * file of the host's by `path`. PNG, JPEG, GIF, BMP; WAV, MP3, FLAC; at
 * most 20 MiB and 8192×8192 pixels each, 16 per request.
 */
export interface ChatMediaPart {
  type: 'image' | 'audio'
  data?: Uint8Array | ArrayBuffer | string
  path?: string
  mimeType?: string
}

/** OpenAI's image part: a `data:` URL (remote URLs only through `serve --allow-remote-media`). */
export interface ChatImageUrlPart {
  type: 'image_url'
  image_url: { url: string; detail?: string } | string
}

/** OpenAI's audio part: base64 bytes of a WAV or MP3 file. */
export interface ChatInputAudioPart {
  type: 'input_audio'
  input_audio: { data: string; format: string }
}

export type ChatContentPart = ChatTextPart | ChatMediaPart | ChatImageUrlPart | ChatInputAudioPart

/** One input of `embed()`: text, token ids, or content parts (text, images, audio). */
export type EmbedInput = string | number[] | Int32Array | ChatContentPart[]

/**
 * One message of a conversation (OpenAI's shape). `role` is usually
 * "system", "user", "assistant" or "tool"; other roles go to the template,
 * which may refuse them. Text parts are joined (a last assistant message
 * continued — "prefill" — with a blank line between its parts, as
 * llama-server continues it). `name`, `tool_call_id` and `tool_calls` are
 * passed to the template as given.
 */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool'
  content: string | ChatContentPart[] | null
  name?: string
  /** A tool result: the id of the call it answers. */
  tool_call_id?: string
  /** An assistant turn's calls (as a result's `tool_calls` has them). */
  tool_calls?: ToolCall[]
  /** An earlier turn's reasoning, for templates that show it. */
  reasoning_content?: string
}

/** A function the model may call (OpenAI's shape). */
export interface ChatTool {
  type: 'function'
  function: {
    /** 1–64 letters, digits, `_`, `-` or `.`. */
    name: string
    description?: string
    /** A JSON schema of the arguments (an object schema); calls are constrained to it. */
    parameters?: Record<string, unknown>
    strict?: boolean
  }
}

/** A call the model made. */
export interface ToolCall {
  id: string
  type: 'function'
  /** `arguments` is a JSON text. */
  function: { name: string; arguments: string }
}

/** A step's change to a tool call: index, id and name first, then fragments of `arguments`. */
export interface ToolCallDelta {
  index: number
  id?: string
  name?: string
  arguments?: string
}

export type SpeculativeMode = 'auto' | 'off' | 'suffix' | 'ngram' | 'draft' | 'suffix+ngram' | 'suffix+draft' | 'ngram+draft' | 'suffix+ngram+draft'

export interface SpeculativeOptions {
  /**
   * Default "auto": every drafter the engine has; a loaded draft model only
   * where its measured cost leaves room to pay (drafts accepted 90 % of the
   * time would run a step 1.2x faster). Name it ("draft", "ngram+draft", …)
   * to have it tried from the first step.
   */
  mode?: SpeculativeMode
  /** Most tokens drafted per step (0..64, default 16). */
  n_max?: number
  /** Drafts shorter than this are dropped (default 0). */
  n_min?: number
  /**
   * The draft model stops drafting below this confidence (default 0.75).
   * With `adaptive`, it stops where the acceptance measured for tokens of
   * that confidence no longer pays, never above `p_min`.
   */
  p_min?: number
  /** Tune the draft length from measured costs (default true). */
  adaptive?: boolean
  /** Draft tree branches, 1..8 (1 = a single chain). */
  n_parallel?: number
  /** Probability above which a branch splits (default 0.1). */
  p_split?: number
  /**
   * Which of the suffix drafter's shared indexes this request reads and
   * adds its output to: one per agent or project, so that one's outputs do
   * not vote in another's drafts (at most 128 bytes; default the engine's
   * `suffixNamespace`).
   */
  namespace?: string
}

export interface CompletionRequest {
  /**
   * A string, or an array mixing strings and token ids; or llama-server's
   * multimodal prompt: `prompt_string` with one file of `multimodal_data`
   * (an image or audio clip in base64 or a `data:` URL; needs
   * `mmprojPath`) per `<__media__>` in it, read where it stands. Exactly
   * one of `prompt` and `messages`.
   */
  prompt?: string | Array<string | number> | { prompt_string: string; multimodal_data?: string[] }
  /**
   * A conversation, rendered with the model's chat template (the GGUF's, or
   * `chatTemplate` from load) with `add_generation_prompt` true; the
   * rendered text is tokenised with special tokens parsed and no second BOS.
   */
  messages?: ChatMessage[]
  /**
   * Fill-in-the-middle (see `infill()`): the text before the gap. With
   * `input_suffix`, the prompt is built from the model's FIM tokens as
   * llama.cpp's `/infill` builds it; `prompt`, when given, is appended to it.
   */
  input_prefix?: string
  /** Fill-in-the-middle: the text after the gap. */
  input_suffix?: string
  /** Fill-in-the-middle: other files of the project, put before the prefix (a missing `filename` is `"tmp"`). */
  input_extra?: { filename?: string; text: string }[]
  /** Tokens to generate; -1 (default) = until end of generation or a full context. */
  n_predict?: number
  /** Default 0.8; <= 0 means greedy. */
  temperature?: number
  top_k?: number
  top_p?: number
  min_p?: number
  typical_p?: number
  repeat_last_n?: number
  repeat_penalty?: number
  presence_penalty?: number
  frequency_penalty?: number
  mirostat?: 0 | 1 | 2
  mirostat_tau?: number
  mirostat_eta?: number
  /** -1 or absent = random. */
  seed?: number
  n_keep?: number
  stop?: string | string[]
  ignore_eos?: boolean
  /**
   * The slot to run in when it is free (llama-server's `id_slot`; its
   * cells are reused as far as they match the prompt); -1 (the default):
   * the free slot whose cells fit best. A slot the engine lacks rejects
   * with `INVALID_REQUEST` naming `id_slot`.
   */
  id_slot?: number
  logit_bias?: Array<[number, number | false]> | Record<string, number | false>
  n_probs?: number
  /** GBNF grammar (at most 256 KB; repetitions up to {0,1000}; parentheses nested up to 64). When it allows no further token the request ends (`stopped_eos`). */
  grammar?: string
  /** A JSON schema the output must match (computed by llguidance; the layout is `json.dumps`'s). */
  json_schema?: object | boolean | string
  /** Functions the model may call (with `messages`); a call it starts is always valid JSON matching its schema. */
  tools?: ChatTool[]
  /** Default "auto" (free text, or calls constrained from their opener); "required" and a named function constrain from the first token. */
  tool_choice?: 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } }
  /** Default true: several calls in one turn. */
  parallel_tool_calls?: boolean
  /** The answer as JSON: `json_object` (any object), or matching `json_schema.schema`. */
  response_format?: { type: 'text' | 'json_object' } | { type: 'json_schema'; json_schema: { name?: string; schema?: object; strict?: boolean } }
  /** Extra variables for the chat template, e.g. `{ enable_thinking: false }`. */
  chat_template_kwargs?: Record<string, unknown>
  /** Default "auto": `<think>` reasoning goes to `reasoning_content`; "none" leaves it in `content`. */
  reasoning_format?: 'auto' | 'none'
  /** How much the model should think (templates that read `reasoning_effort`, e.g. gpt-oss). */
  reasoning_effort?: 'low' | 'medium' | 'high'
  /**
   * Most tokens of thinking per thinking block (chat requests): at the budget the
   * family's end of thinking (`</think>`, …) is forced and the answer goes on.
   * Default -1: no limit; 0: the thinking is closed at once.
   */
  reasoning_budget?: number
  /**
   * LoRA adapters for this request (llama.cpp's server field): `id` their
   * place in `EngineOptions.loras`, `scale` (default 1) within ±100;
   * adapters not listed are off. Absent: the load scales.
   */
  lora?: Array<{ id: number; scale?: number }>
  /** Default true. */
  cache_prompt?: boolean
  /**
   * Default true: a full context shifts (a prompt longer than the context is
   * truncated after `n_keep`; a generation that fills it drops half of what
   * follows `n_keep` and goes on). False, as llama-server without
   * --context-shift: such a prompt rejects with CONTEXT_EXCEEDED and such a
   * generation ends (`stopped_limit`, `truncated`).
   */
  context_shift?: boolean
  /** Default false: `progress` events while the prompt is evaluated (llama-server's `prompt_progress`). */
  return_progress?: boolean
  speculative?: SpeculativeOptions
}

export interface TokenProbability {
  id: number
  piece: string
  prob: number
}

export interface GeneratedToken {
  id: number
  piece: string
  source: TokenSource
  /** With `n_probs`: this token's own probability in the distribution `probs` is the top of (0 where a constraint chose a token it gave none). */
  prob?: number
  /** With `n_probs`: the most probable tokens, most probable first. */
  probs?: TokenProbability[]
}

export interface TokenEvent {
  type: 'token'
  /** Text safe to show: whole UTF-8 characters, stop-string prefixes held back (a character cut off by the end of generation is flushed last, as U+FFFD). */
  content: string
  tokens: GeneratedToken[]
  /** Reasoning text of this step (chat answers of models that think; not in `content`). */
  reasoning?: string
  /** Tool-call deltas of this step (markup never reaches `content`). */
  tool_calls?: ToolCallDelta[]
  /** Drafted in this step. */
  n_drafted: number
  /** Accepted in this step. */
  n_accepted: number
}

export interface Timings {
  prompt_n: number
  prompt_ms: number
  prompt_per_token_ms: number
  prompt_per_second: number
  predicted_n: number
  predicted_ms: number
  predicted_per_token_ms: number
  predicted_per_second: number
  /** Images and audio files in the prompt. */
  media_n: number
  /** Ms the projector spent encoding them (0 for files encoded for an earlier request and kept). */
  media_encode_ms: number
  /** Ms their embeddings took to go into the context (part of `prompt_ms`). */
  media_decode_ms: number
}

export interface SpeculativeStats {
  mode: string
  n_drafted: number
  n_accepted: number
  acceptance_rate: number
  target_passes: number
  draft_ms: number
  drafters: Record<string, { n_drafted: number; n_accepted: number }>
  /**
   * The engine's load-time self-check (`status().batchInvariant`). When true,
   * greedy speculative output is bit-identical to mode "off" (tokens and
   * probabilities). When false, verification batches may round differently
   * from one-token decoding, and output may differ from "off" in near-ties.
   */
  batch_invariant: boolean
}

export interface CompletionResult {
  content: string
  stop: true
  model: string
  tokens_predicted: number
  tokens_evaluated: number
  tokens_cached: number
  truncated: boolean
  stopped_eos: boolean
  stopped_word: boolean
  stopped_limit: boolean
  stopped_abort: boolean
  stopping_word: string
  generation_settings: Record<string, unknown>
  timings: Timings
  speculative: SpeculativeStats
  /** When n_probs > 0: the legacy `[{ content, probs: [{ tok_str, prob }] }]`. */
  completion_probabilities?: Array<{ content: string; probs: Array<{ tok_str: string; prob: number }> }>
  /** The calls the model made (present only when it made some); `content` holds the text outside them. */
  tool_calls?: ToolCall[]
  /** The model's reasoning, apart from `content` (with `reasoning_format` "auto"). */
  reasoning_content?: string
  /** The turn ended with tool calls (OpenAI's `finish_reason: "tool_calls"`). */
  stopped_tool_calls: boolean
}

/**
 * With `return_progress`: how far the prompt is evaluated, before its first
 * chunk (`processed` = `cache`) and after each (`processed` = `total` at the end).
 */
export interface ProgressEvent {
  type: 'progress'
  /** Prompt tokens. */
  total: number
  /** Of them, found in a cache (not computed). */
  cache: number
  /** In the context now, the cached ones included. */
  processed: number
  /** Since the request began. */
  time_ms: number
}

export type DoneEvent = { type: 'done' } & CompletionResult
export type CompletionEvent = TokenEvent | ProgressEvent | DoneEvent

export interface EngineStatus {
  /** Requests waiting for a slot. */
  queued: number
  /**
   * Where the engine runs: `mode` and `pid` (this process's with `'none'`),
   * how many times a dead child was restarted, whether one is restarting
   * now, how the last one died, and the child's resident memory (bytes, as
   * of its last answer).
   */
  isolation?: { mode: 'none' | 'process'; pid: number; restarts: number; restarting?: boolean; lastCrash?: string; rss?: number }
  /** Requests decoding now (at most `parallel`). */
  active?: number
  /** Slots: requests decoded together. */
  parallel?: number
  /** `active > 0`. */
  busy: boolean
  disposed: boolean
  model?: string
  draftModel?: string | null
  contextSize?: number
  trainContextSize?: number
  batchSize?: number
  threads?: number
  /**
   * Threads a step computes with now: `threads`, or 1 while the engine finds
   * one faster (a machine busy with other work, a second engine).
   */
  threadsInUse?: number
  /** The target's decoding steps since load (one `llama_decode` each: prompt chunks, generation, verification, and `embed()`'s and `rerank()`'s passes) and the slots (or inputs) they served, summed (`slots / steps`: requests per step). */
  decodes?: { steps: number; slots: number }
  vocabSize?: number
  /** How `embed()` pools (`EngineOptions.pooling`, else the GGUF's, else `mean`); `rank` for a reranker. */
  pooling?: 'mean' | 'cls' | 'last' | 'rank' | 'none'
  /** Values in one embedding. */
  embeddingSize?: number
  /**
   * The load-time self-check: a run of tokens decoded one at a time and as
   * batches of 2, 4, 8, 16 and 33 rows gave bit-identical logits at every
   * row, and so did the attention kernel over long caches and each weight
   * type's mat-mul kernels (the model's types) alone, batched and on other
   * thread counts. True means greedy speculation is bit-exact on this engine.
   */
  batchInvariant?: boolean
  /**
   * `EngineOptions.determinism` as loaded: `'portable'` (the same bits on
   * every CPU) or `'default'`.
   */
  determinism?: 'default' | 'portable'
  /**
   * What the self-check found, in words: the first differing row when it
   * failed; the weight types whose kernels it proved (`Q4_K (plain and
   * repacked)`, `Q5_K (…)`, `Q6_K (…)` where those weights are repacked:
   * x86 with AVX2 and FMA); and
   * which fast kernels are on (`fast kernels on: flash attention …,
   * tinyBLAS (…), Q4_1 tiles …, tiled K-quants (Q4_K, Q5_K, Q6_K) from 8
   * rows, repacked Q4_K, Q5_K, Q6_K (…)`). `LLAMA_ENGINE_REPACK=0` in the
   * environment before the first load keeps every weight plain (mapped,
   * less memory; the same bits, slower decoding).
   */
  batchInvariance?: string
  /** What the projector (`mmprojPath`) lets the model read; null without one. */
  media?: { vision: boolean; audio: boolean } | null
  /** The RPC workers the target's layers are on (`rpc`); null without. */
  rpc?: { workers: string[] } | null
  /**
   * The CPU back end computing: in the prebuilt addon, the variant chosen at
   * load for this CPU (e.g. `"haswell"`, `"skylakex"`, `"sapphirerapids"`;
   * `LLAMA_ENGINE_CPU_VARIANT` forces one); in a source build,
   * `"built in (source build)"`.
   */
  cpuBackend?: string
  /**
   * The GPU back end: the device computing (`"Vulkan0: <driver's name>"`,
   * null when no layer is on a GPU), the devices it has, how many layers
   * of the target and the draft model are on it, and why none are (no GPU
   * back end installed, no Vulkan loader, no device, a driver that crashed
   * in the probe process, or `gpuLayers` 0; null when some are).
   */
  gpu?: {
    device: string | null
    devices: Array<{ backend: string; name: string; description: string; memoryMB: number }>
    layers: number
    draftLayers: number
    reason: string | null
  }
  /**
   * Where the native addon was loaded from: the platform package's name
   * (e.g. `"llama-engine-linux-x64-gnu"`), `"local build"`, or the path in
   * `LLAMA_ENGINE_ADDON`.
   */
  addon?: string
  tokensCached?: number
  /** The host-memory prompt cache (`promptCacheMB`): states kept, their size, and restores. */
  promptCache?: { entries: number; bytes: number; hits: number; limitBytes: number }
  /** Measured cost (ms) of a target batch of n tokens, at index n. */
  batchCostMs?: Array<number | null>
  /** Measured cost (ms) of one draft-model step. */
  draftStepMs?: number | null
  ngramCache?: { dynamicEntries: number; staticEntries: number; errors: string[] }
  /**
   * The suffix drafter's shared indexes: tokens and outputs kept over every
   * namespace, the namespaces, the cap (`suffixCacheTokens`), and why
   * `suffixCachePath` could not be read.
   */
  suffixCache?: { tokens: number; outputs: number; namespaces: number; limitTokens: number; errors: string[] }
  /**
   * Each slot: whether a request decodes in it (its id), its prompt's
   * tokens, the tokens generated so far and the tokens its KV cache holds
   * (the server's `GET /slots`).
   */
  slots?: Array<{
    id: number
    busy: boolean
    requestId: number | null
    contextSize: number
    promptTokens: number
    predicted: number
    cachedTokens: number
  }>
  /** The LoRA adapters loaded (`EngineOptions.loras`): ids, paths and load scales. */
  loras?: Array<{ id: number; path: string; scale: number }>
  /** The model file as loaded. */
  modelPath?: string
  /** The chat template `messages` are rendered with (the `chatTemplate` option, else the GGUF's); null without one. */
  chatTemplate?: string | null
  /** The text of the BOS and EOS tokens. */
  bosToken?: string
  eosToken?: string
  /** How the model writes tool calls (detected or `toolCallFormat`); null without a chat template. */
  toolCallFormat?:
    | 'hermes'
    | 'llama3'
    | 'mistral'
    | 'generic'
    | 'learned'
    | 'gpt-oss'
    | 'deepseek'
    | 'deepseek-v3.2'
    | 'kimi-k2'
    | 'minimax-m2'
    | 'seed-oss'
    | 'glm'
    | 'qwen3-coder'
    | 'command-r7b'
    | 'granite'
    | 'functionary'
    | 'firefunction'
    | 'apertus'
    | 'lfm2'
    | 'nemotron'
    | 'gemma4'
    | 'auto'
    | null
}

export declare class LlamaEngine {
  private constructor(native: unknown)
  static load(options: EngineOptions): Promise<LlamaEngine>
  tokenize(text: string, options?: { addBos?: boolean; special?: boolean }): number[]
  detokenize(tokens: number[]): string
  /**
   * The prompt a chat request with these `messages` (and these template
   * fields of the request: its tools, template variables) evaluates (sync).
   */
  applyChatTemplate(
    messages: ChatMessage[],
    options?: {
      addGenerationPrompt?: boolean
    } & Pick<CompletionRequest, 'tools' | 'tool_choice' | 'parallel_tool_calls' | 'chat_template_kwargs'>,
  ): string
  /**
   * `tokenize` off the JS thread (a thread of libuv's pool): text of any
   * size without holding the event loop. `withPieces` gives each token
   * with its own text, as llama.cpp's `/tokenize` does.
   */
  tokenizeAsync(text: string, options?: { addBos?: boolean; special?: boolean; withPieces?: false }): Promise<number[]>
  tokenizeAsync(text: string, options: { addBos?: boolean; special?: boolean; withPieces: true }): Promise<{ id: number; piece: string }[]>
  /**
   * A chat answer (generated here or elsewhere) read as the engine reads its
   * own — content, reasoning, tool calls — given the tools and settings of
   * the request it answered: the mirror of `applyChatTemplate`.
   */
  parseChatOutput(
    text: string,
    options?: {
      tools?: CompletionRequest['tools']
      parallelToolCalls?: boolean
      chat_template_kwargs?: Record<string, unknown>
      reasoning_format?: 'auto' | 'none'
    },
  ): { content: string; reasoning_content?: string; tool_calls?: ToolCall[] }
  /** `detokenize` off the JS thread. */
  detokenizeAsync(tokens: number[]): Promise<string>
  /** `applyChatTemplate` off the JS thread. */
  applyChatTemplateAsync(
    messages: ChatMessage[],
    options?: {
      addGenerationPrompt?: boolean
    } & Pick<CompletionRequest, 'tools' | 'tool_choice' | 'parallel_tool_calls' | 'chat_template_kwargs'>,
  ): Promise<string>
  complete(
    request: CompletionRequest | string,
    onEvent?: ((event: CompletionEvent) => void) | null,
    signal?: AbortSignal | null,
  ): Promise<CompletionResult>
  stream(request: CompletionRequest | string, signal?: AbortSignal | null): AsyncIterableIterator<CompletionEvent>
  /**
   * Fill-in-the-middle: completes the gap between `input_prefix` and
   * `input_suffix` (both required) with the model's FIM tokens, as
   * llama.cpp's `/infill`: repo-level context from `input_extra` where the
   * vocabulary has file-separator tokens. A model without FIM tokens
   * rejects with `INVALID_REQUEST` naming `input_prefix`. Every other
   * request field applies; the suffix and extra files are in the prompt, so
   * the n-gram drafters draft from them.
   */
  infill(
    request: CompletionRequest & { input_prefix: string; input_suffix: string },
    onEvent?: ((event: CompletionEvent) => void) | null,
    signal?: AbortSignal | null,
  ): Promise<CompletionResult>
  /** Stops every request that is running now (queued ones stay queued). */
  cancel(): void
  status(): EngineStatus
  /** Writes the dynamic n-gram cache (llama.cpp lookup format) to `path`, or to `ngramCachePath`. */
  saveNgramCache(path?: string): Promise<void>
  /**
   * Writes the suffix drafter's shared indexes (every namespace) to `path`,
   * or to `suffixCachePath`, atomically; resolves with the tokens written.
   */
  saveSuffixCache(path?: string): Promise<number>
  /**
   * Evaluates a conversation (or prompt) as its next request will start —
   * reusing whatever of it is cached — and writes its KV cells to `path`
   * atomically, beside running requests.
   */
  saveSession(path: string, conversation: SessionConversation): Promise<SavedSession>
  /**
   * Reads and checks a session file, then puts its cells into a free slot
   * (or, with `slot`, into that idle slot, replacing what it held: llama-server's
   * slot restore): the next request starting with its tokens reuses them. A file of another
   * model or KV settings, truncated, corrupted or not a session rejects with
   * `INVALID_SESSION`; a path that cannot be read rejects with
   * `INVALID_REQUEST`.
   */
  loadSession(path: string, options?: { slot?: number }): Promise<LoadedSession>
  /**
   * Writes what idle slot `slot` holds — its KV cells and their tokens —
   * to `path`, atomically, as a session file `loadSession` reads (its
   * conversation is `{ prompt: [the token ids] }`): llama-server's slot
   * save. A slot running a request, or one the engine lacks, rejects with
   * `INVALID_REQUEST` naming `slot`; so does a slot whose context was shifted.
   */
  saveSlot(slot: number, path: string): Promise<SavedSession>
  /**
   * Drops the KV cells of idle slot `slot` (they are not kept in the
   * prompt cache) and resolves with the tokens it held: llama-server's
   * slot erase.
   */
  eraseSlot(slot: number): Promise<{ tokens: number }>
  /**
   * Embeddings of a string, token ids, content parts (text with images or
   * audio, as a message's content; the engine needs `mmprojPath`) or an
   * array of those: computed on the engine thread in a context of their
   * own, a chunk (or one image) at a time between decoding steps (running
   * requests keep streaming). Each input is computed alone, so its vector
   * is the same, bit for bit, whatever is beside it. Text gets the model's
   * BOS/EOS as `tokenize(text, { addBos: true })` adds them; token arrays
   * are used as given. An image or clip reaches the vector through the text
   * after it (its own rows are not pooled, as in llama.cpp's server): end
   * an input with text. Empty inputs, ids outside the vocabulary, bad media
   * and (without `truncate`; an input with media is never cut) inputs over
   * `contextSize` tokens reject with `INVALID_REQUEST` naming the input
   * (`input[1]`).
   */
  embed(input: EmbedInput | EmbedInput[], options?: EmbedOptions): Promise<EmbedResult>
  /**
   * Scores each document against `query` with a reranker (a GGUF whose
   * pooling is rank: a BERT-style classifier or a Qwen3-Reranker, as
   * llama.cpp converts them), on the engine thread beside running
   * requests: `[{ index, relevance_score }]`, best first (ties in the
   * documents' order), at most `top_n`; `tokens` on the array counts the
   * tokens of every pair. Each pair is made as llama.cpp's server makes it (the model's
   * `tokenizer.chat_template.rerank` with `{query}` and `{document}`, else
   * BOS, query, EOS, SEP, document, EOS as the model adds them) and scored
   * alone, so a document's score does not depend on the others. A model
   * that is not a reranker, an empty query or document list, a document
   * that is not a string and a pair over `contextSize` tokens reject with
   * `INVALID_REQUEST` (naming `documents[i]`); `embed()` on a reranker too.
   */
  rerank(request: RerankRequest): Promise<RerankResult>
  /** Frees models and contexts now, not at GC. */
  dispose(): Promise<void>
}

/** Re-quantizes a GGUF model with llama.cpp's quantizer (requantizing a quantized model is allowed). */
export declare function quantizeModel(
  input: string,
  output: string,
  ftype: 'Q2_K' | 'Q3_K_M' | 'Q4_0' | 'Q4_1' | 'Q4_K_M' | 'Q5_K_M' | 'Q6_K' | 'Q8_0' | 'F16' | 'F32',
): Promise<void>

/** What `resolveModel` reports while it downloads. */
export interface ResolveProgress {
  /** The file's path in the repository (or the URL's file name). */
  file: string
  downloaded: number
  total: number
}

/**
 * The local path of a model: a path as it is; `hf:OWNER/REPO:QUANT` (the
 * repository's .gguf whose name contains QUANT, case-insensitive; without
 * QUANT, as llama.cpp picks: Q4_K_M, else Q8_0, else the first model file;
 * every part of a split GGUF, the first returned),
 * `hf:OWNER/REPO/FILE.gguf`, or an `https://` URL, downloaded if needed into
 * Hugging Face's hub cache, found as llama.cpp finds it so its `-hf`
 * downloads are shared (`LLAMA_CACHE`, else `HF_HUB_CACHE`, else
 * `HUGGINGFACE_HUB_CACHE`, else `HF_HOME/hub`, else
 * `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`;
 * `HF_ENDPOINT`, `HF_TOKEN` honoured), resumed
 * after a cut and checked against the repository's sha256. Rejects with
 * `MODEL_LOAD_FAILED` saying which repository or file and why (an aborted
 * download: `name` `AbortError`).
 */
export declare function resolveModel(
  uri: string,
  options?: { cacheDir?: string; offline?: boolean; signal?: AbortSignal; onProgress?: (p: ResolveProgress) => void },
): Promise<string>

/** What `inspectModel` finds in a model file. */
export interface ModelInspection {
  kind: 'model'
  path: string
  fileBytes: number
  architecture: string
  name: string | null
  /** Weights, counted. */
  parameters: number
  /** The file type llama.cpp wrote (`Q4_K_M`, …), else the type most of the weights have. */
  quantization: string | null
  fileType: number | null
  tensorTypes: Array<{ type: string; tensors: number; bytes: number }>
  /** The context it was trained for. */
  contextLength: number
  layers: number | null
  embeddingLength: number | null
  heads: number | null
  kvHeads: number | null
  slidingWindow: number | null
  experts: number | null
  vocabSize: number
  /** Whether it has a usable chat template, and why not when it has an unusable one. */
  chatTemplate: boolean
  chatTemplateError: string | null
  /** The tool-call family detected from the template (as `status().toolCallFormat`). */
  toolCallFormat: string | null
  /**
   * Bytes a context of `contextSize` tokens per slot and `parallel` slots
   * takes, as llama.cpp sizes them for this build: weights, KV cache, compute
   * buffers; against the memory available now. `{ error }` when llama.cpp
   * would not make the context.
   */
  memory:
    | { contextSize: number; parallel: number; weights: number; kvCache: number; compute: number; total: number; available: number; fits: boolean }
    | { error: string }
}

/** What `inspectModel` finds in a LoRA adapter file. */
export interface AdapterInspection {
  kind: 'adapter'
  path: string
  fileBytes: number
  architecture: string | null
  name: string | null
  adapterType: string | null
  alpha: number | null
  rank: number | null
  tensors: number
  parameters: number
}

/** What `inspectModel` finds in a multimodal projector (`mmproj-*.gguf`, for `mmprojPath`). */
export interface ProjectorInspection {
  kind: 'projector'
  path: string
  fileBytes: number
  name: string | null
  /** llama.cpp's projector type (`gemma3`, `qwen2vl_merger`, `qwen2.5vl_merger`, `idefics3`, …). */
  projectorType: string | null
  vision: boolean
  audio: boolean
  /** The side of the square an image is resized to or tiled by, and of a patch (pixels). */
  imageSize: number | null
  patchSize: number | null
  /** Tokens one image takes, where that is fixed (null: it depends on the image's size). */
  tokensPerImage: number | null
  /** The text model's embedding width it projects to. */
  embeddingLength: number | null
  tensors: number
  parameters: number
  /** Bytes of its weights (the memory it takes, loaded, besides compute buffers). */
  weightBytes: number
}

/**
 * What a GGUF file (a path or a model URI, resolved as `resolveModel` does)
 * holds and, for a model, the memory a context of `contextSize` tokens
 * (default 4096) per slot and `parallel` slots (default 4) takes — without
 * loading the weights (llama.cpp sizes every buffer without allocating it).
 * A damaged file rejects with `MODEL_LOAD_FAILED`, as `load` would.
 */
export declare function inspectModel(
  uri: string,
  options?: {
    contextSize?: number
    parallel?: number
    batchSize?: number
    cacheDir?: string
    offline?: boolean
    signal?: AbortSignal
    onProgress?: (p: ResolveProgress) => void
  },
): Promise<ModelInspection | AdapterInspection | ProjectorInspection>

declare const llamaEngine: {
  LlamaEngine: typeof LlamaEngine
  quantizeModel: typeof quantizeModel
  resolveModel: typeof resolveModel
  inspectModel: typeof inspectModel
  errorCodes: typeof errorCodes
  requestFields: typeof requestFields
  drafters: typeof drafters
}
export default llamaEngine
