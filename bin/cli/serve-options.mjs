// `llama-engine serve`'s options: one row each (table.mjs), ours and
// llama-server's spellings together, so that a llama-server command line
// (a script, a compose file, a Kubernetes manifest) runs by changing one
// word. Where a spelling is llama-server's, it means what it means there.
// parseServe() turns the values into { load, listen, server, router }.

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { UsageError, numberOf } from './table.mjs'

const { requestFields } = createRequire(import.meta.url)('../../index.js')

export const SERVE_GROUPS = ['Model', 'Context and threads', 'Chat', 'Speculative decoding', 'Sampling defaults (a request without the field gets these)', 'Server', 'Many models', 'Other']

const G = {
  model: 'Model',
  ctx: 'Context and threads',
  chat: 'Chat',
  spec: 'Speculative decoding',
  sampling: 'Sampling defaults (a request without the field gets these)',
  server: 'Server',
  many: 'Many models',
  other: 'Other',
}

// Sampling flags of llama-server (and ours, the request field's name)
// that set the default of a request field.
const SAMPLING = [
  ['n_predict', ['-n', '--n-predict', '--predict', '--n_predict'], 'LLAMA_ARG_N_PREDICT', 'N', 'tokens to generate (-1: until the end of the context)', '-1'],
  ['temperature', ['--temp', '--temperature'], 'LLAMA_ARG_TEMPERATURE', 'X', 'temperature', '0.8'],
  ['seed', ['-s', '--seed'], undefined, 'N', 'RNG seed (-1: random)', '-1'],
  ['top_k', ['--top-k', '--top_k'], 'LLAMA_ARG_TOP_K', 'N', 'top-k (0: off)', '40'],
  ['top_p', ['--top-p', '--top_p'], 'LLAMA_ARG_TOP_P', 'X', 'top-p (1: off)', '0.95'],
  ['min_p', ['--min-p', '--min_p'], 'LLAMA_ARG_MIN_P', 'X', 'min-p (0: off)', '0.05'],
  ['typical_p', ['--typical', '--typical-p', '--typical_p'], undefined, 'X', 'locally typical sampling (1: off)', '1'],
  ['repeat_last_n', ['--repeat-last-n', '--repeat_last_n'], undefined, 'N', 'tokens the penalties look back on', '64'],
  ['repeat_penalty', ['--repeat-penalty', '--repeat_penalty'], 'LLAMA_ARG_REPEAT_PENALTY', 'X', 'repeat penalty (1: off)', '1'],
  ['presence_penalty', ['--presence-penalty', '--presence_penalty'], 'LLAMA_ARG_PRESENCE_PENALTY', 'X', 'presence penalty', '0'],
  ['frequency_penalty', ['--frequency-penalty', '--frequency_penalty'], 'LLAMA_ARG_FREQUENCY_PENALTY', 'X', 'frequency penalty', '0'],
  ['mirostat', ['--mirostat'], undefined, 'N', 'Mirostat (0 off, 1, 2)', '0'],
  ['mirostat_tau', ['--mirostat-ent', '--mirostat_tau'], undefined, 'X', 'Mirostat target entropy (tau)', '5'],
  ['mirostat_eta', ['--mirostat-lr', '--mirostat_eta'], undefined, 'X', 'Mirostat learning rate (eta)', '0.1'],
]
const FIELD_KIND = Object.fromEntries(requestFields.map((f) => [f.name, f.kind]))

/** @type {import('./table.mjs').OptionRow[]} */
export const SERVE_TABLE = [
  // Model
  { key: 'model', names: ['-m', '--model'], env: 'LLAMA_ARG_MODEL', kind: 'string', arg: 'PATH', multiple: true, group: G.model, help: 'the GGUF model (a path, hf:OWNER/REPO:QUANT or https://…); with several models, ALIAS=URI, repeated', def: "none: a router over the cache's models (llama-server's)" },
  { key: 'hf-repo', names: ['-hf', '-hfr', '--hf-repo'], env: 'LLAMA_ARG_HF_REPO', kind: 'string', arg: 'OWNER/REPO[:QUANT]', group: G.model, help: 'the model from Hugging Face (as --model hf:OWNER/REPO:QUANT; without a quant: Q4_K_M, else Q8_0, else the first model file)' },
  { key: 'hf-file', names: ['-hff', '--hf-file'], env: 'LLAMA_ARG_HF_FILE', kind: 'string', arg: 'FILE', group: G.model, help: 'the file of --hf-repo to fetch (instead of a quant)' },
  { key: 'model-url', names: ['-mu', '--model-url'], env: 'LLAMA_ARG_MODEL_URL', kind: 'string', arg: 'URL', group: G.model, help: 'the model from an https:// URL' },
  { key: 'offline', names: ['--offline'], env: 'LLAMA_ARG_OFFLINE', kind: 'bool', group: G.model, help: 'never fetch: models only from the cache' },
  { key: 'draft', names: ['--draft', '-md', '--model-draft', '--spec-draft-model'], env: 'LLAMA_ARG_SPEC_DRAFT_MODEL', kind: 'string', arg: 'PATH', group: G.model, help: 'the draft model for speculative decoding (same vocabulary)' },
  { key: 'draft-hf', names: ['-hfd', '-hfrd', '--hf-repo-draft', '--spec-draft-hf'], env: 'LLAMA_ARG_SPEC_DRAFT_HF_REPO', kind: 'string', arg: 'OWNER/REPO[:QUANT]', group: G.model, help: 'the draft model from Hugging Face (as --draft hf:OWNER/REPO:QUANT)' },
  { key: 'mmproj', names: ['--mmproj', '-mm', '-mmu', '--mmproj-url'], env: ['LLAMA_ARG_MMPROJ', 'LLAMA_ARG_MMPROJ_URL'], kind: 'string', arg: 'PATH|URI', group: G.model, help: "the model's multimodal projector: image (and audio) parts in every API" },
  { key: 'mmproj-auto', names: ['--mmproj-auto'], negations: ['--no-mmproj', '--no-mmproj-auto'], kind: 'bool', group: G.model, help: 'fetch the projector beside an -hf model', accepted: 'a projector is loaded only when --mmproj names one' },
  { key: 'allow-remote-media', names: ['--allow-remote-media'], kind: 'bool', group: G.model, help: 'also fetch http(s) image URLs (at most 20 MiB, 10 s each)' },
  { key: 'lora', names: ['--lora', '--lora-scaled'], kind: 'string', arg: 'PATH[:SCALE][,…]', multiple: true, group: G.model, help: 'LoRA adapters (GGUF) at SCALE (default 1); repeats, or comma-separated; ids in this order (request field lora, /lora-adapters)' },
  { key: 'rpc', names: ['--rpc'], env: 'LLAMA_ARG_RPC', kind: 'string', arg: 'HOST:PORT,…', group: G.model, help: "the model's layers on these RPC workers (llama-engine rpc-worker)" },
  { key: 'n-gpu-layers', names: ['-ngl', '--gpu-layers', '--n-gpu-layers'], env: 'LLAMA_ARG_N_GPU_LAYERS', kind: 'string', arg: 'N|auto|all', group: G.model, help: 'layers on the GPU, in a build with one', def: 'auto' },
  { key: 'portable', names: ['--portable'], kind: 'bool', group: G.model, help: "determinism 'portable': the same tokens and probabilities on every CPU (slower kernels)" },
  { key: 'pooling', names: ['--pooling'], env: 'LLAMA_ARG_POOLING', kind: 'choice', choices: ['none', 'mean', 'cls', 'last', 'rank'], arg: 'none|mean|cls|last|rank', group: G.model, help: "how the embeddings pool (default: the GGUF's, else mean); none: every token's vector (on /embeddings; /v1/embeddings refuses it, as llama-server); rank: a reranker's score (the rerank endpoints)" },
  { key: 'embedding', names: ['--embedding', '--embeddings'], env: 'LLAMA_ARG_EMBEDDINGS', kind: 'bool', group: G.model, help: 'embeddings only', accepted: 'every model here serves /v1/embeddings beside generation' },
  { key: 'reranking', names: ['--rerank', '--reranking'], env: 'LLAMA_ARG_RERANKING', kind: 'bool', group: G.model, help: 'the model is a reranker: its pooling is rank (as --pooling rank); /rerank, /v1/rerank and /v1/reranking score documents (a GGUF whose pooling is rank is one without it)' },

  // Context and threads
  { key: 'ctx-size', names: ['-c', '--ctx-size'], env: 'LLAMA_ARG_CTX_SIZE', kind: 'string', arg: 'N', group: G.ctx, help: "the KV cache in tokens, as llama-server's: with -np N (and no --kv-unified) split over the slots, each c / N; with -np left to its default or --kv-unified, what each request may fill (each slot has c here); capped at the model's (0: the model's)", def: '4096' },
  { key: 'parallel', names: ['-np', '--parallel'], env: 'LLAMA_ARG_N_PARALLEL', kind: 'string', arg: 'N', group: G.ctx, help: 'slots: requests decoded together (-1: the default)', def: '4' },
  { key: 'threads', names: ['-t', '--threads'], env: 'LLAMA_ARG_THREADS', kind: 'string', arg: 'N', group: G.ctx, help: 'threads (-1: the default)', def: 'available parallelism' },
  { key: 'threads-batch', names: ['-tb', '--threads-batch'], kind: 'string', arg: 'N', group: G.ctx, help: 'threads for prompts', accepted: 'prompts and generation use --threads alike' },
  { key: 'batch-size', names: ['-b', '--batch-size'], env: 'LLAMA_ARG_BATCH', kind: 'string', arg: 'N', group: G.ctx, help: 'prompt tokens decoded per batch', def: '512' },
  { key: 'ubatch-size', names: ['-ub', '--ubatch-size'], env: 'LLAMA_ARG_UBATCH', kind: 'string', arg: 'N', group: G.ctx, help: 'physical batch size', accepted: 'the engine sizes its own batches; results do not depend on them' },
  { key: 'flash-attn', names: ['-fa', '--flash-attn'], env: 'LLAMA_ARG_FLASH_ATTN', kind: 'choice', choices: ['on', 'off', 'auto'], optional: 'on', arg: 'on|off|auto', group: G.ctx, help: 'flash attention', accepted: 'the CPU attention here is its own batch-invariant kernel' },
  { key: 'kv-unified', names: ['-kvu', '--kv-unified'], negations: ['-no-kvu', '--no-kv-unified'], env: 'LLAMA_ARG_KV_UNIFIED', kind: 'bool', group: G.ctx, help: "one KV buffer for all slots: each request may fill -c (here each slot has its own -c cells)" },
  { key: 'cont-batching', names: ['-cb', '--cont-batching'], negations: ['-nocb', '--no-cont-batching'], env: 'LLAMA_ARG_CONT_BATCHING', kind: 'bool', group: G.ctx, help: 'continuous batching', accepted: 'requests always join the running batch' },
  { key: 'context-shift', names: ['--context-shift'], negations: ['--no-context-shift'], env: 'LLAMA_ARG_CONTEXT_SHIFT', kind: 'bool', group: G.ctx, help: "the request field context_shift's default: on, a prompt longer than a slot's context is truncated and a full context shifts; off (as llama-server), such a prompt is a 400 exceed_context_size_error and such a generation ends (truncated)", def: 'off' },
  { key: 'cache-ram', names: ['-cram', '--cache-ram'], env: 'LLAMA_ARG_CACHE_RAM', kind: 'string', arg: 'MiB', group: G.ctx, help: 'the host-memory prompt cache, in MiB (-1: no limit, 0: off)' },
  { key: 'cache-idle-slots', names: ['--cache-idle-slots'], negations: ['--no-cache-idle-slots'], env: 'LLAMA_ARG_CACHE_IDLE_SLOTS', kind: 'bool', group: G.ctx, help: 'keep idle slots in the prompt cache', accepted: 'the prompt cache keeps what a slot held when another prompt takes the slot, always (--cache-ram)' },
  { key: 'cache-prompt', names: ['--cache-prompt'], negations: ['--no-cache-prompt'], env: 'LLAMA_ARG_CACHE_PROMPT', kind: 'bool', group: G.ctx, help: "reuse a slot's cached prefix (the request field cache_prompt's default)", def: 'on' },

  // Chat
  { key: 'chat-template', names: ['--chat-template'], env: 'LLAMA_ARG_CHAT_TEMPLATE', kind: 'string', arg: 'TEMPLATE', group: G.chat, help: "a Jinja chat template instead of the GGUF's: a built-in name of llama.cpp's (chatml, llama3, command-r, gemma, phi3, phi4, mistral-v7, granite, deepseek, deepseek2, vicuna, openchat, orion, monarch), a file, or the template's text" },
  { key: 'chat-template-file', names: ['--chat-template-file'], env: 'LLAMA_ARG_CHAT_TEMPLATE_FILE', kind: 'string', arg: 'FILE', group: G.chat, help: 'the chat template from a file' },
  { key: 'jinja', names: ['--jinja'], negations: ['--no-jinja'], env: 'LLAMA_ARG_JINJA', kind: 'bool', group: G.chat, help: 'Jinja chat templates', accepted: 'templates are always rendered as Jinja' },
  { key: 'tool-call-format', names: ['--tool-call-format'], kind: 'choice', choices: ['auto', 'hermes', 'llama3', 'mistral', 'generic'], arg: 'auto|hermes|llama3|mistral|generic', group: G.chat, help: "how tool calls are written (default: from the template)" },

  // Speculative decoding
  { key: 'spec-type', names: ['--spec', '--spec-type'], kind: 'string', arg: 'MODE', group: G.spec, help: "speculative.mode's default: ours (auto, off, draft, ngram, suffix, ngram+draft, …) or llama-server's list (none, draft-simple, ngram-simple, ngram-cache, ngram-mod, …)", def: 'auto' },
  { key: 'spec-draft-n-max', names: ['--n-max', '--spec-draft-n-max'], env: 'LLAMA_ARG_SPEC_DRAFT_N_MAX', kind: 'string', arg: 'N', group: G.spec, help: 'most tokens drafted per step (speculative.n_max)' },
  { key: 'spec-draft-n-min', names: ['--n-min', '--spec-draft-n-min'], env: 'LLAMA_ARG_SPEC_DRAFT_N_MIN', kind: 'string', arg: 'N', group: G.spec, help: 'fewest tokens a draft must have to be verified (speculative.n_min)' },
  { key: 'spec-draft-p-min', names: ['--p-min', '--spec-draft-p-min', '--draft-p-min'], env: 'LLAMA_ARG_SPEC_DRAFT_P_MIN', kind: 'string', arg: 'P', group: G.spec, help: 'stop drafting below this draft probability (speculative.p_min)' },
  { key: 'spec-draft-p-split', names: ['--p-split', '--spec-draft-p-split', '--draft-p-split'], env: 'LLAMA_ARG_SPEC_DRAFT_P_SPLIT', kind: 'string', arg: 'P', group: G.spec, help: 'branch the draft tree above this probability (speculative.p_split)' },

  // Sampling defaults
  ...SAMPLING.filter(([field]) => FIELD_KIND[field]).map(([field, names, env, arg, help, def]) => ({ key: `default-${field}`, field, names, env, kind: 'string', arg, group: G.sampling, help, def })),
  { key: 'default-ignore_eos', field: 'ignore_eos', names: ['--ignore-eos', '--ignore_eos'], kind: 'bool', group: G.sampling, help: 'generate past the end-of-generation token' },
  { key: 'backend-sampling', names: ['-bs', '--backend-sampling', '--backend_sampling'], env: 'LLAMA_ARG_BACKEND_SAMPLING', kind: 'bool', group: G.sampling, help: 'sampling on the GPU back end', accepted: 'sampling is the engine\'s own, the same probabilities wherever the logits are computed' },

  // Server
  { key: 'host', names: ['--host'], env: 'LLAMA_ARG_HOST', kind: 'string', arg: 'ADDR[,ADDR…]', group: G.server, help: 'addresses to listen on, comma-separated (each at the same port)', def: '127.0.0.1' },
  { key: 'port', names: ['--port'], env: ['LLAMA_ARG_PORT', 'PORT'], kind: 'string', arg: 'N', group: G.server, help: 'port (0 picks a free one)', def: '8080' },
  { key: 'api-key', names: ['--api-key'], env: ['LLAMA_API_KEY', 'LLAMA_ENGINE_API_KEY'], kind: 'string', arg: 'KEY[,KEY…]', group: G.server, help: 'require a key (Authorization: Bearer KEY, or x-api-key: KEY) on every endpoint but /health; several comma-separated' },
  { key: 'api-key-file', names: ['--api-key-file'], env: 'LLAMA_ARG_API_KEY_FILE', kind: 'string', arg: 'FILE', group: G.server, help: 'the keys from a file, one per line (# starts a comment)' },
  { key: 'alias', names: ['--model-name', '-a', '--alias'], env: 'LLAMA_ARG_ALIAS', kind: 'string', arg: 'NAME', group: G.server, help: "the model's name in answers; comma-separated aliases, as llama-server: each is listed by /v1/models, the first in alphabetical order is the name", def: "the file's name" },
  { key: 'tags', names: ['--tags'], env: 'LLAMA_ARG_TAGS', kind: 'string', arg: 'TAGS', group: G.server, help: "comma-separated tags of the model, listed by /v1/models (informational)" },
  { key: 'cors', names: ['--cors', '--cors-origins'], env: 'LLAMA_ARG_CORS_ORIGINS', kind: 'string', arg: 'ORIGINS', group: G.server, help: "origins browsers may call from: a comma-separated list, * (any: the Origin is echoed), or localhost (http://localhost, 127.0.0.1 and [::1] at any port)", def: '*' },
  { key: 'cors-methods', names: ['--cors-methods'], env: 'LLAMA_ARG_CORS_METHODS', kind: 'string', arg: 'METHODS', group: G.server, help: 'the methods a preflight allows', def: 'GET, POST, DELETE, OPTIONS' },
  { key: 'cors-headers', names: ['--cors-headers'], env: 'LLAMA_ARG_CORS_HEADERS', kind: 'string', arg: 'HEADERS', group: G.server, help: 'the headers a preflight allows (a browser never lets * cover Authorization: name it to send an API key)', def: '*' },
  { key: 'cors-credentials', names: ['--cors-credentials'], negations: ['--no-cors-credentials'], env: 'LLAMA_ARG_CORS_CREDENTIALS', kind: 'bool', group: G.server, help: 'Access-Control-Allow-Credentials on preflights', def: 'on' },
  { key: 'slots', names: ['--slots'], negations: ['--no-slots'], env: 'LLAMA_ARG_ENDPOINT_SLOTS', kind: 'bool', group: G.server, help: 'GET /slots (off: 501)', def: 'on' },
  { key: 'metrics', names: ['--metrics'], negations: ['--no-metrics'], env: 'LLAMA_ARG_ENDPOINT_METRICS', kind: 'bool', group: G.server, help: 'Prometheus GET /metrics: our counters, llama-server\'s llamacpp:* and the gateway\'s vllm:* gauges (off: 501, as llama-server)', def: 'off' },
  { key: 'props', names: ['--props'], env: 'LLAMA_ARG_ENDPOINT_PROPS', kind: 'bool', group: G.server, help: 'POST /props', accepted: 'GET /props only' },
  { key: 'ui', names: ['--ui', '--webui'], negations: ['--no-ui', '--no-webui'], env: 'LLAMA_ARG_UI', kind: 'bool', group: G.server, help: 'the web page at /', accepted: 'there is none yet' },
  { key: 'max-queue', names: ['--max-queue'], kind: 'string', arg: 'N', group: G.server, help: 'requests that may wait for a slot; more get 429', def: '64' },
  { key: 'headers-timeout', names: ['--headers-timeout'], kind: 'string', arg: 'MS', group: G.server, help: 'drop a client whose headers are not in by then', def: '10000' },
  { key: 'request-timeout', names: ['--request-timeout'], kind: 'string', arg: 'MS', group: G.server, help: 'drop a client whose body is not in by then', def: '60000' },
  { key: 'timeout', names: ['-to', '--timeout'], env: 'LLAMA_ARG_TIMEOUT', kind: 'string', arg: 'SECONDS', group: G.server, help: 'as --request-timeout, in seconds (a generation is never cut by it)' },
  { key: 'threads-http', names: ['--threads-http'], env: 'LLAMA_ARG_THREADS_HTTP', kind: 'string', arg: 'N', group: G.server, help: 'HTTP threads', accepted: "Node's event loop serves HTTP" },
  { key: 'shutdown-grace', names: ['--shutdown-grace'], kind: 'string', arg: 'MS', group: G.server, help: 'on SIGTERM/SIGINT, how long running requests may finish', def: '10000' },
  { key: 'responses-max', names: ['--responses-max'], kind: 'string', arg: 'N', group: G.server, help: 'Responses API: responses kept for previous_response_id and GET/DELETE /v1/responses/{id}, oldest dropped first (0 keeps none)', def: '1000' },
  { key: 'responses-max-bytes', names: ['--responses-max-bytes'], kind: 'string', arg: 'B', group: G.server, help: 'and at most B bytes of them', def: '67108864' },
  { key: 'responses-file', names: ['--responses-file'], kind: 'string', arg: 'PATH', group: G.server, help: 'kept responses also on disk (written atomically, read back at start)' },
  { key: 'isolation', names: ['--isolation'], kind: 'choice', choices: ['process', 'none'], arg: 'process|none', group: G.server, help: 'process: the engine in a child process, restarted if it dies; none: in this process', def: 'process' },
  { key: 'verbose', names: ['-v', '--verbose', '--log-verbose'], kind: 'bool', group: G.server, help: "every answer carries __verbose: the prompt as the model read it and /completion's whole result (as llama-server's; a request's verbose: true asks for it alone)" },
  { key: 'log-disable', names: ['--log-disable'], kind: 'bool', group: G.server, help: 'no log', accepted: "llama.cpp's log is never printed here" },

  // Many models
  { key: 'models', names: ['--models', '--models-dir'], env: 'LLAMA_ARG_MODELS_DIR', kind: 'string', arg: 'DIR', group: G.many, help: 'every model GGUF in DIR, named by its file (without .gguf), beside the cache\'s' },
  { key: 'models-preset', names: ['--models-preset'], env: 'LLAMA_ARG_MODELS_PRESET', kind: 'string', arg: 'FILE', group: G.many, help: 'llama-server\'s INI (a [NAME] section per model: model or hf-repo and any flag without its dashes; [*] for all; load-on-startup, dedup-cache-models), or ours in JSON: { "ALIAS": { "model": PATH|URI, "pinned": true, "options": { EngineOptions } } } (paths relative to FILE)' },
  { key: 'models-max', names: ['--models-max'], env: 'LLAMA_ARG_MODELS_MAX', kind: 'string', arg: 'N', group: G.many, help: 'at most N loaded at once (0: no limit)', def: '4' },
  { key: 'memory-max', names: ['--memory-max'], kind: 'string', arg: 'BYTES', group: G.many, help: "at most BYTES loaded, by inspect's estimate (K, M, G suffixes)" },
  { key: 'idle-unload', names: ['--idle-unload'], kind: 'string', arg: 'SECONDS', group: G.many, help: 'unload a model no request used for that long' },
  { key: 'pin', names: ['--pin'], kind: 'string', arg: 'ALIAS', multiple: true, group: G.many, help: 'load ALIAS at start and never unload it; repeats' },
  { key: 'models-autoload', names: ['--models-autoload'], negations: ['--no-models-autoload'], env: 'LLAMA_ARG_MODELS_AUTOLOAD', kind: 'bool', group: G.many, help: 'load a model when a request names it (off: a 400 until POST /models/load; a request\'s ?autoload= says otherwise)', def: 'on' },

  // llama-server's, for features this server lacks: named in the error.
  { key: 'slot-save-path', names: ['--slot-save-path'], env: 'LLAMA_ARG_SLOT_SAVE_PATH', kind: 'string', arg: 'DIR', group: G.other, help: 'POST /slots/ID?action=save|restore|erase: the cells of a slot saved to and restored from files of DIR (made if missing)' },
  { key: 'media-path', names: ['--media-path'], kind: 'string', arg: 'DIR', group: G.model, help: 'image parts may name files of DIR as file://PATH (never outside it)' },
  { key: 'sleep-idle-seconds', names: ['--sleep-idle-seconds'], kind: 'string', arg: 'N', group: G.server, help: 'unload the model after N seconds without a request; the next one loads it again (/health, /props, /v1/models, /slots, /metrics do not wake it; -1: never)', def: '-1' },
  { key: 'swa-full', names: ['--swa-full'], env: 'LLAMA_ARG_SWA_FULL', kind: 'bool', group: G.other, missing: 'a full-size SWA cache is not supported' },
  { key: 'cache-type-k', names: ['-ctk', '--cache-type-k'], env: 'LLAMA_ARG_CACHE_TYPE_K', kind: 'string', arg: 'TYPE', group: G.other, missing: 'the KV cache is F16 here (quantized caches break bit-exact speculation)' },
  { key: 'cache-type-v', names: ['-ctv', '--cache-type-v'], env: 'LLAMA_ARG_CACHE_TYPE_V', kind: 'string', arg: 'TYPE', group: G.other, missing: 'the KV cache is F16 here (quantized caches break bit-exact speculation)' },
  { key: 'reasoning-format', names: ['--reasoning-format'], kind: 'string', arg: 'FORMAT', group: G.other, missing: 'a server-wide reasoning format is not supported yet (the request field reasoning_format is)' },
  { key: 'reasoning', names: ['-rea', '--reasoning'], env: 'LLAMA_ARG_REASONING', kind: 'choice', choices: ['on', 'off', 'auto'], arg: 'on|off|auto', optional: 'on', group: G.chat, help: "thinking in the chat: on or off is the templates' enable_thinking (the request field chat_template_kwargs' default); auto leaves it to the template", def: 'auto' },
  { key: 'server-tools', names: ['--tools', '--tools-runtime', '--mcp-servers-config', '--mcp-servers-json'], kind: 'string', arg: 'X', group: G.other, missing: 'server-side tools and MCP servers are not supported (clients run their tools: docs/tools.md)' },
  { key: 'agent', names: ['-ag', '--agent', '--ui-mcp-proxy', '--webui-mcp-proxy'], kind: 'bool', group: G.other, missing: "llama-server's agent mode and MCP proxy are not supported" },
  { key: 'help', names: ['-h', '--help', '--usage'], kind: 'bool', group: G.other, help: 'this help' },
]

const num = (key, given, text, kind = 'int') => numberOf(given[key] ?? `--${key}`, text, kind)

/** llama-server's --spec-type list (comma-separated) as our speculative.mode. */
export function specMode(text) {
  const ours = requestFields.find((f) => f.name === 'speculative').fields.find((f) => f.name === 'mode').choices
  if (ours.includes(text)) return text
  const parts = text.split(',').map((s) => s.trim()).filter(Boolean)
  const modes = new Set()
  for (const p of parts) {
    if (p === 'none') continue
    else if (p === 'draft-simple' || p === 'draft') modes.add('draft')
    else if (/^ngram(-|$)/.test(p)) modes.add('ngram')
    else throw new UsageError(`--spec-type: ${JSON.stringify(p)} is not supported (supported: none, draft-simple, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, or ours: ${ours.join(', ')})`)
  }
  if (modes.size === 0) return 'off'
  return modes.size === 2 ? 'ngram+draft' : [...modes][0]
}

/**
 * What the values say beyond the model flags: the request defaults
 * (sampling and speculative flags) and the server's own options.
 * `defaults` goes to the server's `requestDefaults`.
 */
export function serveExtras(values, given, env) {
  const defaults = {}
  for (const row of SERVE_TABLE) {
    if (!row.field || values[row.key] === undefined) continue
    if (row.kind === 'bool') defaults[row.field] = values[row.key]
    else defaults[row.field] = num(row.key, given, values[row.key], FIELD_KIND[row.field] === 'int' ? 'int' : 'float')
  }
  if (values['cache-prompt'] !== undefined) defaults.cache_prompt = values['cache-prompt']
  // llama-server's default: no context shift.
  defaults.context_shift = values['context-shift'] === true
  if (values.reasoning === 'on' || values.reasoning === 'off') defaults.chat_template_kwargs = { enable_thinking: values.reasoning === 'on' }
  const spec = {}
  if (values['spec-type'] !== undefined) spec.mode = specMode(values['spec-type'])
  if (values['spec-draft-n-max'] !== undefined) spec.n_max = num('spec-draft-n-max', given, values['spec-draft-n-max'])
  if (values['spec-draft-n-min'] !== undefined) spec.n_min = num('spec-draft-n-min', given, values['spec-draft-n-min'])
  if (values['spec-draft-p-min'] !== undefined) spec.p_min = num('spec-draft-p-min', given, values['spec-draft-p-min'], 'float')
  if (values['spec-draft-p-split'] !== undefined) spec.p_split = num('spec-draft-p-split', given, values['spec-draft-p-split'], 'float')
  if (Object.keys(spec).length > 0) defaults.speculative = spec

  const server = {}
  const keys = []
  if (values['api-key'] !== undefined) keys.push(...values['api-key'].split(',').map((k) => k.trim()).filter(Boolean))
  if (values['api-key-file'] !== undefined) {
    let text
    try {
      text = readFileSync(values['api-key-file'], 'utf8')
    } catch (e) {
      throw new UsageError(`--api-key-file: cannot read ${values['api-key-file']} (${e.code || e.message})`)
    }
    keys.push(...text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l && !l.startsWith('#')))
  }
  if (keys.length === 1) server.apiKey = keys[0]
  else if (keys.length > 1) server.apiKey = keys
  // llama-server's defaults: any origin, its methods, headers "*".
  server.cors = values.cors ?? '*'
  if (values['cors-methods'] !== undefined) server.corsMethods = values['cors-methods']
  server.corsHeaders = values['cors-headers'] ?? '*'
  if (values['cors-credentials'] !== undefined) server.corsCredentials = values['cors-credentials']
  if (values.slots === false) server.slots = false
  // As llama-server: /metrics only when asked for.
  server.metrics = values.metrics === true
  if (values.verbose === true) server.verbose = true
  if (values.alias !== undefined) {
    // As llama-server: the aliases as a set, the first of them in order the name.
    const aliases = [...new Set(values.alias.split(',').map((a) => a.trim()).filter(Boolean))].sort()
    if (aliases.length === 0) throw new UsageError(`${given.alias}: expected a name`)
    server.modelName = aliases[0]
    if (aliases.length > 1) server.modelAliases = aliases
  }
  if (values.tags !== undefined) server.modelTags = [...new Set(values.tags.split(',').map((t) => t.trim()).filter(Boolean))]
  if (values.timeout !== undefined && values['request-timeout'] === undefined) {
    const s = num('timeout', given, values.timeout)
    if (s < 0) throw new UsageError(`${given.timeout}: expected a non-negative number of seconds`)
    server.requestTimeoutMs = s * 1000
  }
  if (Object.keys(defaults).length > 0) server.requestDefaults = defaults
  return server
}

/** The model flag from llama-server's -hf / -hff / -mu, when --model is not given. */
export function modelFromHub(values) {
  if (values['hf-repo'] !== undefined) {
    const repo = values['hf-repo']
    if (values['hf-file'] !== undefined) return `hf:${repo.replace(/:[^/]*$/, '')}/${values['hf-file']}`
    return `hf:${repo}`
  }
  if (values['hf-file'] !== undefined) throw new UsageError('--hf-file goes with --hf-repo')
  if (values['model-url'] !== undefined) return values['model-url']
  return undefined
}
