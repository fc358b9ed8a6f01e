// `npm run bench`: speed, measured side by side in one run on this machine.
// Not a test: it prints numbers and asserts nothing.
//
//   binding   greedy tokens/s of complete() vs the same loop in plain Rust
//             with llama-cpp-2 (crates/engine/examples/plain_greedy.rs), same model/threads.
//   draft     speculative decoding with a draft model (Q2_K) on free-form
//             prompts, per target (Q4_1, F16): off, fixed draft lengths,
//             adaptive, draft trees (3 branches; fixed and adaptive), auto.
//   pair      a draft that can pay on a CPU: the F32 target with the Q4_1
//             file (the same weights) as its draft: off, auto (a fresh
//             engine per run), draft (adaptive) and fixed settings (n_max 3,
//             5, 8, 12 with p_min 0), per prompt, paired against off, in a
//             rotating order; and each against the best fixed setting.
//   ngram     prompt lookup on input-grounded prompts (and two free-form
//             ones): ngram and auto against off, and the ceiling an oracle
//             n-gram drafter would reach (crates/core/examples/ngram_ceiling/).
//   structured schema-constrained JSON (fixed keys, nested objects, enums)
//             and a tool call, and free text: off vs auto, where the grammar
//             drafter proposes what the constraint forces; the share of
//             tokens it drafted; the mask's cost per token, llguidance vs
//             llama.cpp's GBNF sampler on the same schema (crates/engine/examples/mask_cost/).
//   parallel  several users at once: aggregate tokens/s of 1, 2, 4 and 8
//             concurrent greedy requests against the same requests in turn,
//             next to the limit the batch costs give (k·t1/tk), without and
//             with speculation; and the longest wait between two token events
//             of streaming requests while a 1,000-token prompt is prefilled.
//   prefix    a 1,000-token system prompt shared by users: time to first
//             token cold, copied from another slot, restored from the
//             host-memory prompt cache and loaded from a session file; and
//             the prompt tokens computed when 8 users arrive together.
//   tiled     what ggml's tiled K-quant mat-mul (batch-invariant since patch
//             0006, on by default) gives on K-quant models: plain decoding,
//             prompt evaluation and batch costs with it on and off
//             (GGML_CPU_TILED_MM=0), alternating processes (bench/probe.mjs).
//   sequence  three ~1,600-token never-seen prompts one after the other in one
//             process (bench/prefill.mjs engine-sequence), each timed: none
//             may take much longer than the others (BENCH_SEQUENCE_MODEL).
//   prefill   long never-seen prompts (three of ~2,000 tokens, one of ~4,000):
//             time to first token and prefill tokens/s, then decode tokens/s
//             after the prompt, each run in its own process, implementations
//             alternated: this engine, node-llama-cpp (bench/package.json,
//             installed on first use) and the ceiling, the same llama.cpp
//             unpatched with its default build options
//             (crates/engine/examples/prefill_ceiling.rs, built into target/ceiling), on
//             SmolLM2 Q4_1 and gemma-3 Q4_K_M, Q5_K_M, Q6_K and Q8_0
//             (BENCH_PREFILL_MODELS, BENCH_PREFILL_PROMPTS narrow it).
//             BENCH_PREFILL_BEFORE=<addon> adds an older build of the engine
//             (before/after).
//   contention  the engine on a machine busy with something else: load time
//             and greedy tokens/s (SmolLM2 Q4_1, 128 tokens, 2 threads),
//             idle, beside two busy-loop processes, beside a second engine
//             process streaming, and two engines in one process (both
//             generating; per engine), each run its own process (bench/
//             contention.mjs). BENCH_CONTENTION_BEFORE=<addon> adds an older
//             build (before/after), BENCH_CONTENTION_BEFORE_ENV=K=V,… the
//             environment it ran with.
//   isolation isolation: 'process' against in-process: greedy tokens/s and
//             time to first token of a short chat request, alternated, on
//             fresh engines of each kind.
//   kernels   the weight and attention kernels on the downloaded models
//             (Qwen2.5-Coder-1.5B Q4_K_M when fetched, gemma-3 Q4_K_M and
//             Q6_K): prompts of ~2k/4k/8k tokens and a short one, prefill
//             and decode after it, against node-llama-cpp and this build
//             with the repacked kernels off; BENCH_KERNELS_AVX2_ADDON adds
//             the AVX2 variant; BENCH_KERNELS_MODELS / _SIZES narrow it. Not
//             in the default list (about 40 minutes with the 1.5B).
//   multimodal images through the projector (the test fixtures: gemma-3-270m
//             with a tiny gemma3 projector; the Qwen2-VL pair with the real
//             models): encode ms, into-the-cells ms and prompt ms per image
//             size, a second question about the same image, and the longest
//             gap a neighbour's stream sees while an image request starts.
//   rpc       a model's layers over two loopback RPC workers (`llama-engine
//             rpc-worker`, half the threads each) against the same model
//             here, both isolated: decode and prefill tokens/s, alternated,
//             on SmolLM2 Q4_1, gemma-3 Q4_K_M and the 1.5B when fetched
//             (BENCH_RPC_MODELS). Not in the default list.
//   portable  determinism 'portable' (the same bits on every CPU) against the
//             default kernels: decode and prefill tokens/s, fresh engines
//             alternated, on SmolLM2 Q4_1, gemma-3 Q4_K_M and
//             Qwen2.5-Coder-0.5B when fetched (BENCH_PORTABLE_MODELS). Not
//             in the default list.
//   prebuilt  the portable addon of `npm run prebuild` (npm/<triple>/, CPU
//             variant chosen at run time) against the source build
//             (-C target-cpu=native): plain decoding and prompt evaluation,
//             alternating processes. In the default list when the prebuilt
//             addon exists.
//
// Environment: BENCH_SECTIONS (comma list, default binding,draft,pair,ngram,structured,parallel,prefix,prefill,tiled,contention,isolation,agentic[,fim with the real models][,prebuilt]; also lora),
// BENCH_AGENTIC_MODEL, BENCH_PAIR_TARGET + BENCH_PAIR_DRAFT, BENCH_FIM_MODEL (file names in the models
// directory: the agentic traces, the draft pair and fill-in-the-middle on other models, e.g. the real
// Qwen2.5-Coder 1.5B / 0.5B of `npm run models -- --real`),
// BENCH_TOKENS (tokens per run, default 128), BENCH_REPEATS (default 3;
// medians), BENCH_THREADS (default 2), LLAMA_ENGINE_MODELS_DIR.
// Every row is also written to bench-results/latest.json.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { cpus, loadavg } from 'node:os'
import { join } from 'node:path'
import { ensureReady } from '../scripts/ensure-ready.mjs'
import { root } from '../scripts/native.mjs'

await ensureReady()
const { LlamaEngine } = await import('../index.mjs')

const models = process.env.LLAMA_ENGINE_MODELS_DIR || join(root, 'models')
const TARGET = join(models, 'SmolLM2-135M-Instruct.Q4_1.gguf')
const TARGET_F16 = join(models, 'SmolLM2-135M-Instruct.F16.gguf')
const DRAFT = join(models, 'SmolLM2-135M-Instruct.Q2_K.gguf')
const THREADS = Number(process.env.BENCH_THREADS || 2)
const N = Number(process.env.BENCH_TOKENS || 128)
const REPEATS = Number(process.env.BENCH_REPEATS || 3)
const CONTEXT = 2048
const { platformTriple } = (await import('../lib/addon/loader.js')).default
const PREBUILT = join(root, 'npm', platformTriple(), `llama-engine.${platformTriple()}.node`)
const defaultSections = `binding,draft,pair,ngram,structured,parallel,prefix,sequence,prefill,tiled,contention,isolation,agentic${existsSync(join(models, 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf')) ? ',fim' : ''}${existsSync(PREBUILT) ? ',prebuilt' : ''}`
const sections = new Set((process.env.BENCH_SECTIONS || defaultSections).split(',').map((s) => s.trim()))

// A chat request's input (rendered with the model's own template).
const chat = (u) => ({ messages: [{ role: 'user', content: u }] })
const FREE_PROMPTS = [
  chat('Write a short story about a lighthouse keeper.'),
  chat('Explain how photosynthesis works.'),
  chat('List ten ideas for a weekend trip.'),
]

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const fmt = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-')

/**
 * A table row of runs of two kinds `a` and `b` made in pairs ({ decode,
 * prefill } tokens/s each): each kind's range, and `ratio(runA, runB)` of
 * every pair (median, min–max) in the column `name`.
 */
function pairedRow(model, runs, [a, b], name, ratio) {
  const range = (xs) => `${fmt(Math.min(...xs))}–${fmt(Math.max(...xs))}`
  const paired = (f) => {
    const xs = runs[b].map((y, i) => ratio(f(runs[a][i]), f(y)))
    return `${fmt(median(xs), 2)}x (${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)})`
  }
  const row = { model }
  for (const what of ['decode', 'prefill']) {
    row[`${what} tok/s ${a}`] = range(runs[a].map((x) => x[what]))
    row[`${what} tok/s ${b}`] = range(runs[b].map((x) => x[what]))
    row[`${what} ${name}`] = paired((x) => x[what])
  }
  return row
}

function table(rows, cols) {
  const widths = cols.map((c) => Math.max(c.length, ...rows.map((r) => String(r[c]).length)))
  const line = (r) => cols.map((c, i) => String(r[c]).padStart(widths[i])).join('  ')
  console.log(line(Object.fromEntries(cols.map((c) => [c, c]))))
  for (const r of rows) console.log(line(r))
}

const machine = { cpu: cpus()[0].model, cores: cpus().length, threads: THREADS }
const load1 = () => loadavg()[0].toFixed(2)
console.log(`machine: ${cpus().length} x ${cpus()[0].model}; threads ${THREADS}; ${N} tokens per run, median of ${REPEATS}; load average ${load1()}`)
const results = { machine, tokens: N, repeats: REPEATS, date: new Date().toISOString() }
const t0 = Date.now()
const elapsed = (since) => `${((Date.now() - since) / 1000).toFixed(0)} s`

// ---------------------------------------------------------------------------
// Shared helpers for the speculative sections.

/** One greedy request; returns what the tables need (and the token ids). `input` is { messages } or { prompt }. */
async function run(engine, input, speculative) {
  const ids = []
  const res = await engine.complete(
    { ...input, n_predict: N, temperature: 0, ignore_eos: true, cache_prompt: false, speculative },
    (ev) => {
      if (ev.type === 'token') for (const t of ev.tokens) ids.push(t.id)
    },
  )
  const sp = res.speculative
  return {
    tps: res.timings.predicted_per_second,
    n: res.tokens_predicted,
    drafted: sp.n_drafted,
    accepted: sp.n_accepted,
    passes: sp.target_passes,
    drafters: sp.drafters,
    content: res.content,
    ids,
  }
}

/** A fresh engine for one request: the dynamic n-gram cache learns across requests. */
async function runFresh(load, input, speculative) {
  const engine = await LlamaEngine.load(load)
  try {
    // One short unrelated request first (mode off: nothing is learned), so a
    // fresh engine is as warm as the shared one `off` runs on.
    await engine.complete({ prompt: 'Hello there.', n_predict: 8, temperature: 0, speculative: { mode: 'off' } })
    return await run(engine, input, speculative)
  } finally {
    await engine.dispose()
  }
}

/** Medians (and sums for the acceptance rate) over the repeats of one mode. */
function summarize(runs, off) {
  const tps = median(runs.map((r) => r.tps))
  const drafted = runs.reduce((s, r) => s + r.drafted, 0)
  const accepted = runs.reduce((s, r) => s + r.accepted, 0)
  return {
    tps,
    ratio: off ? tps / off.tps : 1,
    acceptance: drafted > 0 ? accepted / drafted : null,
    drafted_per_run: median(runs.map((r) => r.drafted)),
    passes_per_token: median(runs.map((r) => r.passes / r.n)),
    // Per-repeat ratios against the off run of the same repeat (they ran
    // back to back): robust to the machine's speed drifting between repeats.
    paired: off?.runs ? runs.map((r, i) => r.tps / off.runs[i].tps) : null,
    // Best run against off's best run: the least disturbed runs of each (this
    // machine has spells at half speed that hit whole repeats).
    best: off?.runs ? Math.max(...runs.map((r) => r.tps)) / Math.max(...off.runs.map((r) => r.tps)) : null,
    // Greedy speculative decoding must give plain greedy's text.
    same_text: off ? runs.every((r) => r.content === off.content) : true,
    runs: runs.map(({ ids, content, ...r }) => r),
  }
}

const pct = (x) => (x == null ? '-' : `${fmt(x * 100, 0)} %`)
const times = (x) => `${fmt(x, 2)}x`

// ---------------------------------------------------------------------------

if (sections.has('binding')) {
  console.log('\n## binding overhead: complete() vs plain llama-cpp-2 (greedy, Q4_1)')
  execFileSync('cargo', ['build', '--release', '--example', 'plain_greedy'], { cwd: root, stdio: 'ignore' })
  const plainBin = join(root, 'target', 'release', 'examples', 'plain_greedy')
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 2048, threads: THREADS })
  const rows = []
  for (const [i, input] of FREE_PROMPTS.entries()) {
    const prompt = engine.applyChatTemplate(input.messages) // plain_greedy takes the rendered text
    const plain = []
    const addon = []
    for (let r = 0; r < REPEATS; r++) {
      // Interleaved so drift in machine load hits both sides alike.
      const out = execFileSync(plainBin, [TARGET, String(THREADS), String(N), prompt]).toString().trim()
      plain.push(JSON.parse(out).tok_s)
      const res = await engine.complete({ prompt, n_predict: N, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: { mode: 'off' } })
      addon.push(res.timings.predicted_per_second)
    }
    const p = median(plain)
    const a = median(addon)
    rows.push({ prompt: `free-${i + 1}`, 'plain tok/s': fmt(p), 'complete() tok/s': fmt(a), 'binding cost': `${fmt((1 - a / p) * 100)} %` })
  }
  table(rows, ['prompt', 'plain tok/s', 'complete() tok/s', 'binding cost'])
  results.binding = rows
  await engine.dispose()
}

// ---------------------------------------------------------------------------
// draft: a draft model on free-form prompts.

const DRAFT_PROMPTS = [
  ['story', FREE_PROMPTS[0]],
  ['explain', FREE_PROMPTS[1]],
  ['list', FREE_PROMPTS[2]],
  ['code', chat('Write a JavaScript function that checks whether a string is a palindrome, with a short explanation.')],
  ['q&a', chat('What is the difference between a virus and a bacterium?')],
]

// fresh: the mode uses n-grams, so every request gets a new engine.
const DRAFT_MODES = [
  { name: 'off', spec: { mode: 'off' } },
  { name: 'draft n4', spec: { mode: 'draft', adaptive: false, n_max: 4 } },
  { name: 'draft n8', spec: { mode: 'draft', adaptive: false, n_max: 8 } },
  { name: 'draft adaptive', spec: { mode: 'draft' } },
  { name: 'tree 3x4', spec: { mode: 'draft', adaptive: false, n_max: 4, n_parallel: 3, p_split: 0.1 } },
  { name: 'tree adaptive', spec: { mode: 'draft', n_parallel: 3 } },
  { name: 'auto', spec: { mode: 'auto' }, fresh: true },
]

const usesNgrams = (spec) => ['ngram', 'auto', 'ngram+draft'].includes(spec.mode)
for (const m of DRAFT_MODES) if (usesNgrams(m.spec) !== !!m.fresh) throw new Error(`bench: mode ${m.name} must use a fresh engine`)

if (sections.has('draft')) {
  const since = Date.now()
  console.log('\n## draft: speculative decoding with a draft model (Q2_K), free-form prompts, greedy')
  const pairs = [
    { name: 'Q4_1+Q2_K', load: { modelPath: TARGET, draftModelPath: DRAFT, contextSize: CONTEXT, threads: THREADS } },
    { name: 'F16+Q2_K', load: { modelPath: TARGET_F16, draftModelPath: DRAFT, contextSize: CONTEXT, threads: THREADS } },
  ]
  for (const pair of pairs) pair.engine = await LlamaEngine.load(pair.load)
  // runs[pair][prompt][mode] = [per repeat]
  const runs = pairs.map(() => DRAFT_PROMPTS.map(() => DRAFT_MODES.map(() => [])))
  for (let r = 0; r < REPEATS; r++) {
    for (const [p, pair] of pairs.entries()) {
      for (const [i, [, input]] of DRAFT_PROMPTS.entries()) {
        // All modes of one prompt back to back, so drift hits them alike.
        for (const [m, mode] of DRAFT_MODES.entries()) {
          const res = mode.fresh ? await runFresh(pair.load, input, mode.spec) : await run(pair.engine, input, mode.spec)
          runs[p][i][m].push(res)
        }
      }
    }
  }
  const rows = []
  const costs = {}
  for (const [p, pair] of pairs.entries()) {
    const st = pair.engine.status()
    costs[pair.name] = { batchCostMs: st.batchCostMs, draftStepMs: st.draftStepMs }
    await pair.engine.dispose()
    for (const [i, [label]] of DRAFT_PROMPTS.entries()) {
      const off = summarize(runs[p][i][0])
      off.content = runs[p][i][0][0].content
      for (const [m, mode] of DRAFT_MODES.entries()) {
        const s = m === 0 ? off : summarize(runs[p][i][m], off)
        rows.push({ pair: pair.name, prompt: label, mode: mode.name, ...s, content: undefined })
      }
    }
  }
  const view = rows.map((r) => ({
    target: r.pair,
    prompt: r.prompt,
    mode: r.mode,
    'tok/s': fmt(r.tps),
    'vs off': times(r.ratio),
    paired: r.paired ? `${times(median(r.paired))} (${fmt(Math.min(...r.paired), 2)}–${fmt(Math.max(...r.paired), 2)})` : '-',
    best: r.best ? times(r.best) : '-',
    accept: pct(r.acceptance),
    'drafted/run': fmt(r.drafted_per_run, 0),
    'passes/tok': fmt(r.passes_per_token, 2),
    'same text': r.same_text ? 'yes' : 'NO',
  }))
  table(view, ['target', 'prompt', 'mode', 'tok/s', 'vs off', 'paired', 'best', 'accept', 'drafted/run', 'passes/tok', 'same text'])
  // Medians over the prompts, per target and mode.
  const overall = []
  for (const pair of pairs) {
    for (const mode of DRAFT_MODES) {
      const sel = rows.filter((r) => r.pair === pair.name && r.mode === mode.name)
      overall.push({
        target: pair.name,
        mode: mode.name,
        'median vs off': times(median(sel.map((r) => r.ratio))),
        'range': `${fmt(Math.min(...sel.map((r) => r.ratio)), 2)}–${fmt(Math.max(...sel.map((r) => r.ratio)), 2)}`,
        'median best vs off': sel[0].best == null ? '-' : times(median(sel.map((r) => r.best))),
        'median passes/tok': fmt(median(sel.map((r) => r.passes_per_token)), 2),
      })
    }
  }
  console.log('')
  table(overall, ['target', 'mode', 'median vs off', 'range', 'median best vs off', 'median passes/tok'])
  console.log(`(draft section: ${elapsed(since)}; auto runs on a fresh engine per request)`)
  results.draft = rows
  results.draft_costs = costs
}

// ---------------------------------------------------------------------------
// pair: a draft that can pay on a CPU — the same weights, cheaper quant.

const TARGET_F32 = join(models, 'SmolLM2-135M-Instruct.F32.gguf')
const PAIR_MODES = [
  { name: 'off', spec: { mode: 'off' } },
  // auto drafts with n-grams too, which learn across requests: a fresh
  // engine per run, so it never replays an earlier run's output.
  { name: 'auto', spec: { mode: 'auto' }, fresh: true },
  { name: 'draft', spec: { mode: 'draft' } },
  ...[3, 5, 8, 12].map((n) => ({ name: `draft fixed ${n}`, spec: { mode: 'draft', adaptive: false, n_max: n, p_min: 0 }, fixed: true })),
]
for (const m of PAIR_MODES) if (usesNgrams(m.spec) !== !!m.fresh) throw new Error(`bench: mode ${m.name} must use a fresh engine`)

if (sections.has('pair')) {
  const since = Date.now()
  // BENCH_PAIR_TARGET / BENCH_PAIR_DRAFT (file names in the models
  // directory): another pair, e.g. Qwen2.5-Coder-1.5B with its 0.5B.
  const pairTarget = process.env.BENCH_PAIR_TARGET ? join(models, process.env.BENCH_PAIR_TARGET) : TARGET_F32
  const pairDraft = process.env.BENCH_PAIR_DRAFT ? join(models, process.env.BENCH_PAIR_DRAFT) : TARGET
  const named = process.env.BENCH_PAIR_TARGET ? `${process.env.BENCH_PAIR_TARGET} target, ${process.env.BENCH_PAIR_DRAFT} draft` : 'F32 target, Q4_1 draft (same weights)'
  console.log(`\n## pair: ${named}, free-form prompts, greedy, ${N} tokens`)
  const load = { modelPath: pairTarget, draftModelPath: pairDraft, contextSize: CONTEXT, threads: THREADS }
  const engine = await LlamaEngine.load(load)
  const runs = FREE_PROMPTS.map(() => PAIR_MODES.map(() => []))
  for (let r = 0; r < REPEATS; r++) {
    for (const [i, input] of FREE_PROMPTS.entries()) {
      // All modes of one prompt back to back, in an order that rotates with
      // the repeat and the prompt: no mode always runs first or last.
      for (let j = 0; j < PAIR_MODES.length; j++) {
        const m = (j + r + i) % PAIR_MODES.length
        const mode = PAIR_MODES[m]
        runs[i][m].push(mode.fresh ? await runFresh(load, { ...input }, mode.spec) : await run(engine, { ...input }, mode.spec))
      }
    }
  }
  const st = engine.status()
  await engine.dispose()
  const rows = []
  for (const [i] of FREE_PROMPTS.entries()) {
    const off = summarize(runs[i][0])
    off.content = runs[i][0][0].content
    for (const [m, mode] of PAIR_MODES.entries()) {
      const s = m === 0 ? off : summarize(runs[i][m], off)
      rows.push({ prompt: i, mode: mode.name, fixed: !!mode.fixed, ...s, content: undefined })
    }
  }
  table(rows.map((r) => ({
    prompt: r.prompt,
    mode: r.mode,
    'tok/s': fmt(r.tps),
    paired: r.paired ? `${times(median(r.paired))} (${fmt(Math.min(...r.paired), 2)}–${fmt(Math.max(...r.paired), 2)})` : '-',
    accept: pct(r.acceptance),
    'drafted/run': fmt(r.drafted_per_run, 0),
    'same text': r.same_text ? 'yes' : 'NO',
  })), ['prompt', 'mode', 'tok/s', 'paired', 'accept', 'drafted/run', 'same text'])
  // Per mode: the median over prompts of each prompt's median paired ratio;
  // the best fixed setting is the fixed mode with the highest such median.
  const overallOf = (name) => median(rows.filter((r) => r.mode === name).map((r) => median(r.paired)))
  const fixedModes = PAIR_MODES.filter((m) => m.fixed)
  const bestFixed = fixedModes.reduce((b, m) => (overallOf(m.name) > overallOf(b.name) ? m : b))
  const overall = PAIR_MODES.slice(1).map((mode) => ({
    mode: mode.name,
    'median paired vs off': times(overallOf(mode.name)),
    [`vs best fixed (${bestFixed.name.replace('draft fixed ', 'n_max ')})`]: fmt(overallOf(mode.name) / overallOf(bestFixed.name), 2),
  }))
  console.log('')
  table(overall, Object.keys(overall[0]))
  console.log(`(pair section: ${elapsed(since)}; costs now: t1..t4 ${st.batchCostMs.slice(1, 5).map((x) => fmt(x)).join('/')} ms, draft step ${fmt(st.draftStepMs)} ms)`)
  results.pair = rows
}

// ---------------------------------------------------------------------------
// ngram: prompt lookup on prompts whose answer copies from the input.

const PASSAGE = `The first lighthouses were not towers at all but fires lit on hilltops, tended by whoever lived closest to the shore. As trade grew, harbours began to pay for permanent lights, and by the eighteenth century stone towers stood on many dangerous headlands. Keeping a light was hard, lonely work. The keeper trimmed the wicks every few hours, polished the lenses, and wrote the weather into a logbook that inspectors read twice a year. In storms he might not sleep for two nights, because a light that went out could cost a ship and every life aboard. The invention of the Fresnel lens in 1822 changed the trade: a single lamp, focused through rings of glass prisms, could be seen more than twenty miles out to sea. Electric lamps and automatic timers later removed the need for a keeper, and by the end of the twentieth century almost every light in the world ran on its own.`

// Read as text: the 'code edit' input, shared with __test__/speculative.test.js.
const JS_FUNCTION = readFileSync(join(root, 'bench', 'fixtures', 'summarize-orders.js'), 'utf8').split('\n').slice(1).join('\n').trimEnd()

const HARBOUR_TEXT = `The town of Kestrel Bay grew up around its fishing fleet. Every morning before dawn the boats left the inner basin, and by noon the first of them were back with their catch. The market opened at one o'clock sharp, and buyers came from as far as the capital. The harbour master, a retired captain named Elena Brandt, decided which boats could unload first and kept a ledger of every arrival. In winter the fleet shrank to a handful of boats, and the market opened only three days a week. Tourists arrived in summer, filling the cafes along the quay and photographing the nets drying in the sun.`

const PROCEDURE = `To repot a houseplant, first water it a day before so the roots hold together. Choose a new pot that is only slightly larger than the old one and has a drainage hole. Put a layer of fresh potting mix in the bottom of the new pot. Turn the old pot on its side, support the base of the stems with one hand, and slide the plant out gently. Loosen the outer roots with your fingers and cut away any that are dark or mushy. Set the plant in the new pot so that the top of the root ball sits just below the rim. Fill the gaps around it with more mix and press it down lightly. Water the plant thoroughly and keep it out of direct sun for a week while it settles.`

const NGRAM_PROMPTS = [
  ['repeat', chat(`Repeat the following passage verbatim, word for word.\n\n${PASSAGE}`)],
  ['code edit', chat(`Rename the variable \`subtotal\` to \`netAmount\` in this JavaScript function and return the whole function.\n\n\`\`\`js\n${JS_FUNCTION}\n\`\`\``)],
  ['quote', chat(`${HARBOUR_TEXT}\n\nQuote the sentence of the text above that mentions the harbour master.`)],
  ['bullets', chat(`Rewrite the following passage as a bulleted list, one step per bullet, keeping the original wording.\n\n${PROCEDURE}`)],
  ['cite', chat(`Summarise the following passage in three sentences. After each sentence, cite the words of the passage it is based on in quotation marks.\n\n${PASSAGE}`)],
  ['free story', FREE_PROMPTS[0]],
  ['free explain', FREE_PROMPTS[1]],
]

const NGRAM_MODES = [
  { name: 'ngram', spec: { mode: 'ngram' } },
  { name: 'auto', spec: { mode: 'auto' } },
]

if (sections.has('ngram')) {
  const since = Date.now()
  console.log('\n## ngram: prompt lookup on input-grounded prompts (Q4_1 target + Q2_K draft, greedy)')
  execFileSync('cargo', ['build', '--release', '--example', 'ngram_ceiling'], { cwd: root, stdio: 'ignore' })
  const ceilingBin = join(root, 'target', 'release', 'examples', 'ngram_ceiling')
  const load = { modelPath: TARGET, draftModelPath: DRAFT, contextSize: CONTEXT, threads: THREADS }
  // `off` runs on one engine; its load-time batch costs price the ceiling.
  const engine = await LlamaEngine.load(load)
  const batchMs = engine.status().batchCostMs
  if (!Array.isArray(batchMs)) throw new Error('bench: engine.status().batchCostMs is missing (an old native build?)')
  // Prompt ids for the ceiling (SmolLM2 adds no BOS; special tokens parsed).
  const promptIds = NGRAM_PROMPTS.map(([, input]) => engine.tokenize(engine.applyChatTemplate(input.messages), { special: true }))
  const offRuns = NGRAM_PROMPTS.map(() => [])
  const modeRuns = NGRAM_PROMPTS.map(() => NGRAM_MODES.map(() => []))
  for (let r = 0; r < REPEATS; r++) {
    for (const [i, [, input]] of NGRAM_PROMPTS.entries()) {
      // off, then each n-gram mode, back to back, each on a fresh (warmed)
      // engine: a long-lived engine ran ~15 % faster than fresh ones here,
      // which made every mode look slower than off.
      offRuns[i].push(await runFresh(load, input, { mode: 'off' }))
      for (const [m, mode] of NGRAM_MODES.entries()) modeRuns[i][m].push(await runFresh(load, input, mode.spec))
    }
  }
  await engine.dispose()

  const rows = []
  for (const [i, [label]] of NGRAM_PROMPTS.entries()) {
    const off = summarize(offRuns[i])
    const first = offRuns[i][0]
    off.content = first.content
    const row = { prompt: label, prompt_tokens: promptIds[i].length, off, off_stable: offRuns[i].every((r) => r.ids.join() === first.ids.join()) }
    for (const [m, mode] of NGRAM_MODES.entries()) row[mode.name] = summarize(modeRuns[i][m], off)
    const input = JSON.stringify({ prompt: promptIds[i], output: first.ids, batch_ms: batchMs, n_max: 16 })
    row.ceiling = JSON.parse(execFileSync(ceilingBin, [], { input }).toString())
    // Target passes per output token as the engine counts them (the prompt
    // pass, which yields the first token, is not one).
    row.ceiling.passes_per_token = row.ceiling.steps / first.ids.length
    rows.push(row)
  }

  const range = (xs) => `${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)}`
  const view = rows.map((r) => ({
    prompt: r.prompt,
    'off t/s': fmt(r.off.tps),
    'ngram t/s': fmt(r.ngram.tps),
    'ngram x': times(r.ngram.ratio),
    'paired': `${times(median(r.ngram.paired))} (${range(r.ngram.paired)})`,
    'best': times(r.ngram.best),
    'ngram acc': pct(r.ngram.acceptance),
    'ngram p/t': fmt(r.ngram.passes_per_token, 2),
    'auto t/s': fmt(r.auto.tps),
    'auto x': times(r.auto.ratio),
    'paired ': `${times(median(r.auto.paired))} (${range(r.auto.paired)})`,
    'best ': times(r.auto.best),
    'auto acc': pct(r.auto.acceptance),
    'auto p/t': fmt(r.auto.passes_per_token, 2),
    ceiling: times(r.ceiling.ceiling),
    'policy (replay)': times(r.ceiling.policy),
    'oracle p/t': fmt(r.ceiling.passes_per_token, 2),
    'ngram/ceiling': pct(r.ngram.ratio / r.ceiling.ceiling),
    'same text': r.ngram.same_text && r.auto.same_text ? 'yes' : 'NO',
  }))
  table(view, Object.keys(view[0]))
  console.log('x = tokens/s vs off; acc = accepted/drafted; p/t = target passes per output token (the prompt pass not counted);')
  console.log('ceiling = speed-up of an oracle lookup drafter (n_max 16) that drafts only what the target accepts, when that pays;')
  console.log('policy (replay) = the engine\'s n-gram policy replayed offline on the same output, priced like the ceiling (no timing noise)')
  console.log('ngram/ceiling = (ngram x) / ceiling; same text = ngram and auto gave exactly the greedy text of off')
  console.log('paired = median (min–max) over the repeats of tokens/s against the off run of the same repeat; best = best run against off\'s best run')
  // The issue's targets, as this run measured them.
  const grounded = rows.filter((r) => !r.prompt.startsWith('free'))
  const free = rows.filter((r) => r.prompt.startsWith('free'))
  const check = (ok) => (ok ? 'met' : 'NOT met')
  const worstShare = Math.min(...grounded.map((r) => r.ngram.ratio / r.ceiling.ceiling))
  const rep = rows.find((r) => r.prompt === 'repeat')
  const worstFree = Math.min(...free.map((r) => r.auto.ratio))
  console.log(`targets: ngram >= 85 % of the ceiling on input-grounded prompts: worst ${pct(worstShare)} (${check(worstShare >= 0.85)}); ` +
    `passage repeat >= 1.5x: ${times(rep.ngram.ratio)} (${check(rep.ngram.ratio >= 1.5)}); auto >= 0.95x on free-form: worst ${times(worstFree)} (${check(worstFree >= 0.95)})`)
  const t = (n) => (batchMs[n] == null ? '-' : fmt(batchMs[n], 1))
  console.log(`batch costs at load (ms), which price the ceiling: t1 ${t(1)}, t2 ${t(2)}, t4 ${t(4)}, t8 ${t(8)}, t16 ${t(16)}`)
  const measured = [1, 2, 4, 8, 16].map((n) => batchMs[n]).filter((v) => v != null)
  if (measured.some((v, k) => k > 0 && v < measured[k - 1]) || !(batchMs[2] < 2 * batchMs[1])) {
    console.log('warning: these batch costs are not increasing and sub-linear as they should be (a busy machine?): the ceiling is unreliable')
  }
  if (rows.some((r) => !r.off_stable)) console.log('note: the off output differed between repeats for some prompt; the ceiling uses the first')
  console.log(`(ngram section: ${elapsed(since)}; off, ngram and auto each run on a fresh, warmed engine per request)`)
  results.ngram = rows.map((r) => ({ ...r, off: { ...r.off, content: undefined } }))
  results.ngram_batch_ms = batchMs
}

// ---------------------------------------------------------------------------
// parallel: several requests at once against the same requests in turn.

const TOPICS = ['the sea', 'a red bicycle', 'bread', 'the moon', 'a library', 'winter', 'a robot', 'tea']

if (sections.has('parallel')) {
  const since = Date.now()
  console.log('\n## parallel: k concurrent greedy requests (Q4_1 target + Q2_K draft, parallel 8) against the same k in turn')
  const engine = await LlamaEngine.load({ modelPath: TARGET, draftModelPath: DRAFT, contextSize: CONTEXT, threads: THREADS, parallel: 8 })
  const request = (i, speculative) => ({ ...chat(`Write a long story about ${TOPICS[i % TOPICS.length]}.`), n_predict: N, temperature: 0, ignore_eos: true, cache_prompt: false, speculative })
  await engine.complete({ prompt: 'Hello there.', n_predict: 8, temperature: 0, speculative: { mode: 'off' } })
  // tokens/s of the requests `ids` run at once, or one after the other.
  const together = async (ids, spec) => {
    const t = performance.now()
    const rs = await Promise.all(ids.map((i) => engine.complete(request(i, spec))))
    return rs.reduce((s, r) => s + r.tokens_predicted, 0) / ((performance.now() - t) / 1000)
  }
  const inTurn = async (ids, spec) => {
    const t = performance.now()
    let n = 0
    for (const i of ids) n += (await engine.complete(request(i, spec))).tokens_predicted
    return n / ((performance.now() - t) / 1000)
  }
  const rows = []
  const SPECS = { off: { mode: 'off' }, auto: { mode: 'auto' } }
  for (const k of [1, 2, 4, 8]) {
    const ids = [...Array(k).keys()]
    const tps = { off: { turn: [], together: [] }, auto: { turn: [], together: [] } }
    const ratio = { off: [], auto: [], autoOff: [] }
    for (let r = 0; r < REPEATS; r++) {
      // One repeat: each mode in turn and together, the order alternating
      // between repeats so drift in machine load hits every side alike.
      const order = r % 2 === 0 ? ['off', 'auto'] : ['auto', 'off']
      const got = {}
      for (const m of order) {
        const first = r % 2 === 0 ? 'turn' : 'together'
        const run = (how) => (how === 'turn' ? inTurn(ids, SPECS[m]) : together(ids, SPECS[m]))
        const a = await run(first)
        const b = await run(first === 'turn' ? 'together' : 'turn')
        got[m] = first === 'turn' ? { turn: a, together: b } : { turn: b, together: a }
      }
      for (const m of ['off', 'auto']) {
        tps[m].turn.push(got[m].turn)
        tps[m].together.push(got[m].together)
        ratio[m].push(got[m].together / got[m].turn)
      }
      ratio.autoOff.push(got.auto.together / got.off.together)
    }
    const bc = engine.status().batchCostMs
    const limit = bc[1] && bc[k] ? (k * bc[1]) / bc[k] : NaN
    const range = (xs) => `${times(median(xs))} (${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)})`
    for (const m of ['off', 'auto']) {
      rows.push({
        speculation: m,
        k,
        'in turn t/s': fmt(median(tps[m].turn)),
        'together t/s': fmt(median(tps[m].together)),
        'together/in turn': range(ratio[m]),
        'limit k·t1/tk': m === 'off' ? times(limit) : '',
        'auto/off together': m === 'auto' ? range(ratio.autoOff) : '',
      })
    }
  }
  table(rows, Object.keys(rows[0]))
  const bc = engine.status().batchCostMs
  console.log(`batch costs at load (ms): t1 ${fmt(bc[1])}, t2 ${fmt(bc[2])}, t4 ${fmt(bc[4])}, t8 ${fmt(bc[8])}; ratios are medians (min–max) over ${REPEATS} paired repeats`)
  // The longest wait between two token events of three streaming requests
  // while a long prompt is evaluated beside them, against that prefill.
  const stalls = []
  const passage = 'The lighthouse keeper climbed the stairs at dusk and wrote the weather in his notebook. '.repeat(60)
  for (let r = 0; r < REPEATS; r++) {
    let submitted = null
    let firstLong = null
    let worst = 0
    const last = new Map()
    const streams = [0, 1, 2].map((i) =>
      engine.complete(request(i, { mode: 'off' }), (e) => {
        if (e.type !== 'token') return
        const now = performance.now()
        if (submitted !== null && firstLong === null && last.has(i)) worst = Math.max(worst, now - last.get(i))
        last.set(i, now)
      }),
    )
    while (last.size < 3) await new Promise((res) => setTimeout(res, 5))
    submitted = performance.now()
    const long = engine.complete({ ...chat(`Summarise this in one sentence:\n\n${passage}`), n_predict: 8, temperature: 0, cache_prompt: false }, (e) => {
      if (e.type === 'token' && firstLong === null) firstLong = performance.now()
    })
    const [l] = await Promise.all([long, ...streams])
    stalls.push({ worst, prefill: firstLong - submitted, prompt: l.tokens_evaluated })
  }
  const st = stalls.map((s) => s.worst / s.prefill)
  console.log(
    `long prefill beside 3 streams: ${stalls[0].prompt} prompt tokens; prefill ${stalls.map((s) => fmt(s.prefill, 0)).join(', ')} ms; ` +
      `worst wait between two token events ${stalls.map((s) => fmt(s.worst, 0)).join(', ')} ms = ${st.map((x) => pct(x)).join(', ')} of the prefill (goal: at most ~33 %)`,
  )
  await engine.dispose()
  console.log(`(parallel section: ${elapsed(since)})`)
  results.parallel = { rows, stalls, batch_ms: bc }
}

// ---------------------------------------------------------------------------
// Sections that compare whole processes (a setting read once per process,
// another build of the addon): bench/probe.mjs on `model`, REPEATS times for
// each of two sides — each a set of environment changes, null removing the
// variable — which side goes first alternating, so the machine's drift hits
// both alike. `med(side, f)` is a side's median, `ratio(f)` the median
// (min–max) of each first-side run against the second-side run beside it.
function probePairs(model, sides) {
  const probe = join(root, 'bench', 'probe.mjs')
  // The code edit as plain text (gemma-3-270m has no chat template): ~300 prompt tokens.
  const prompt = NGRAM_PROMPTS[1][1].messages[0].content
  const cfg = JSON.stringify({ model, threads: THREADS, tokens: N, prompt, context: CONTEXT })
  const names = Object.keys(sides)
  const runs = Object.fromEntries(names.map((n) => [n, []]))
  for (let r = 0; r < REPEATS; r++) {
    for (const side of r % 2 ? [...names].reverse() : names) {
      const env = { ...process.env }
      for (const [k, v] of Object.entries(sides[side])) {
        if (v == null) delete env[k]
        else env[k] = v
      }
      runs[side].push(JSON.parse(execFileSync(process.execPath, [probe, cfg], { env }).toString()))
    }
  }
  const [a, b] = names
  const med = (side, f) => fmt(median(runs[side].map(f)))
  const ratio = (f) => {
    const xs = runs[a].map((x, i) => f(x) / f(runs[b][i]))
    return `${times(median(xs))} (${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)})`
  }
  const invariant = `${runs[a].every((x) => x.batchInvariant)}/${runs[b].every((x) => x.batchInvariant)}`
  return { runs, med, ratio, invariant }
}

const tps = (x) => x.tps
const promptTps = (x) => x.prompt_tps

// tiled: the cost of turning ggml's tiled K-quant mat-mul off. ggml reads
// GGML_CPU_TILED_MM once per process.
// ---------------------------------------------------------------------------
// structured: schema-constrained output and tool calls, where the grammar
// drafter proposes what the constraint forces.

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 16 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    city: { type: 'string', enum: ['Paris', 'London', 'Tokyo', 'New York'] },
    languages: { type: 'array', items: { type: 'string', enum: ['English', 'French', 'Japanese'] }, maxItems: 3 },
  },
  required: ['name', 'age', 'city', 'languages'],
  additionalProperties: false,
}
const ORDER = {
  type: 'object',
  properties: {
    order_id: { type: 'string', pattern: '^[A-Z]{2}[0-9]{4}$' },
    status: { type: 'string', enum: ['pending', 'shipped', 'delivered', 'cancelled'] },
    shipping: { type: 'object', properties: { street: { type: 'string', maxLength: 24 }, city: { type: 'string', maxLength: 16 }, country: { type: 'string', enum: ['FR', 'GB', 'JP', 'US'] } }, required: ['street', 'city', 'country'], additionalProperties: false },
    items: {
      type: 'array',
      items: { type: 'object', properties: { sku: { type: 'string', maxLength: 8 }, quantity: { type: 'integer', minimum: 1, maximum: 9 }, gift_wrap: { type: 'boolean' } }, required: ['sku', 'quantity', 'gift_wrap'], additionalProperties: false },
      minItems: 1,
      maxItems: 3,
    },
  },
  required: ['order_id', 'status', 'shipping', 'items'],
  additionalProperties: false,
}
const SETTINGS = {
  type: 'object',
  properties: Object.fromEntries(
    ['theme', 'language', 'notifications', 'privacy', 'font_size', 'autosave'].map((k, i) => [
      k,
      { type: 'string', enum: [['light', 'dark', 'system'], ['english', 'french', 'german'], ['all', 'mentions', 'none'], ['public', 'friends', 'private'], ['small', 'medium', 'large'], ['on', 'off']][i] },
    ]),
  ),
  required: ['theme', 'language', 'notifications', 'privacy', 'font_size', 'autosave'],
  additionalProperties: false,
}
const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] }, include_forecast: { type: 'boolean' } }, required: ['city', 'unit', 'include_forecast'], additionalProperties: false },
  },
}
const STRUCTURED = [
  ['fixed keys', { ...chat('Describe a person as JSON.'), response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } } }, PERSON],
  ['nested objects', { ...chat('Write an example order as JSON.'), response_format: { type: 'json_schema', json_schema: { name: 'order', schema: ORDER } } }, ORDER],
  ['enums', { ...chat('Give my app settings as JSON.'), response_format: { type: 'json_schema', json_schema: { name: 'settings', schema: SETTINGS } } }, SETTINGS],
  ['a tool call', { ...chat('What is the weather in Paris?'), tools: [WEATHER_TOOL], tool_choice: 'required', parallel_tool_calls: false }, null],
  ['free text', FREE_PROMPTS[0], null],
  ['free text, tools offered', { ...FREE_PROMPTS[0], tools: [WEATHER_TOOL] }, null],
]

if (sections.has('structured')) {
  console.log('\n## structured output: off vs auto (the grammar drafter first in the chain), Q4_1, greedy')
  const since = Date.now()
  execFileSync('cargo', ['build', '--release', '--example', 'mask_cost'], { cwd: root, stdio: 'ignore' })
  const maskBin = join(root, 'target', 'release', 'examples', 'mask_cost')
  const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: CONTEXT, threads: THREADS })
  const t1 = engine.status().batchCostMs[1]
  const bc = engine.status().batchCostMs
  // A batch of k rows priced from the measured costs (linear between the sizes measured).
  const price = (k) => {
    if (bc[k]) return bc[k]
    const lo = bc.findLastIndex((c, n) => n < k && c)
    const hi = bc.findIndex((c, n) => n > k && c)
    return hi < 0 ? (bc[lo] * k) / lo : bc[lo] + ((bc[hi] - bc[lo]) * (k - lo)) / (hi - lo)
  }
  // Tokens/s gained over one token per step, priced: n·t1 / Σ t(rows), a
  // step of [tokens, rows] (rows: the pending token and the draft).
  const priced = (steps) => (steps.reduce((a, [n]) => a + n, 0) * price(1)) / steps.reduce((a, [, rows]) => a + price(rows), 0)
  const one = async (input, mode) => {
    const steps = []
    const r = await engine.complete({ ...input, n_predict: N, temperature: 0, cache_prompt: false, speculative: { mode } }, (e) => {
      if (e.type === 'token' && e.tokens.length > 0) steps.push([e.tokens.length, 1 + e.n_drafted])
    })
    const g = r.speculative.drafters.grammar ?? { n_accepted: 0 }
    return { tps: r.timings.predicted_per_second, n: r.tokens_predicted, grammar: g.n_accepted, content: r.content, calls: r.tool_calls, steps }
  }
  const rows = []
  for (const [name, input, schema] of STRUCTURED) {
    await one(input, 'off') // warm: the constraint compiles once
    const off = []
    const auto = []
    for (let r = 0; r < REPEATS; r++) {
      off.push(await one(input, 'off'))
      auto.push(await one(input, 'auto'))
    }
    const paired = auto.map((a, i) => a.tps / off[i].tps)
    let mask = null
    if (schema) {
      const out = JSON.parse(execFileSync(maskBin, [TARGET, JSON.stringify(schema), off[0].content]).toString().trim())
      mask = out
    }
    rows.push({
      output: name,
      tokens: off[0].n,
      'off t/s': fmt(median(off.map((x) => x.tps))),
      'auto t/s': fmt(median(auto.map((x) => x.tps))),
      'auto/off': `${fmt(median(paired), 2)} (${fmt(Math.min(...paired), 2)}–${fmt(Math.max(...paired), 2)})`,
      'grammar-drafted': pct(median(auto.map((x) => x.grammar / x.n))),
      'auto priced': `${fmt(priced(auto[0].steps), 2)}`,
      'ceiling priced': mask ? fmt(priced(mask.steps.map((k) => [k, k])), 2) : '-',
      'same output': auto.every((a) => a.content === off[0].content && JSON.stringify(a.calls?.map((c) => c.function)) === JSON.stringify(off[0].calls?.map((c) => c.function))),
      'llguidance µs/token': mask ? `${fmt(mask.llguidance_us.p50, 0)} (mean ${fmt(mask.llguidance_us.mean, 0)})` : '-',
      'GBNF µs/token': mask ? `${fmt(mask.gbnf_us.p50, 0)} (mean ${fmt(mask.gbnf_us.mean, 0)})` : '-',
      'mask / step': mask && bc[1] ? pct(mask.llguidance_us.mean / 1000 / bc[1]) : '-',
    })
  }
  table(rows, Object.keys(rows[0]))
  console.log(`auto/off = median (min–max) of ${REPEATS} runs, each against the off run just before it; grammar-drafted = tokens the grammar drafter proposed and the target accepted; auto priced = auto's steps priced with the batch costs measured at load (the noise-free auto/off); ceiling priced = an oracle that drafts every forced token after each free one, same prices; µs/token = computing the mask and masking the whole vocabulary (median, mean); mask / step = llguidance's mean against one decode step. Batch costs (ms): t1 ${fmt(bc[1])}, t2 ${fmt(bc[2])}, t4 ${fmt(bc[4])}, t8 ${fmt(bc[8])}, t16 ${fmt(bc[16])}`)
  results.structured = rows
  await engine.dispose()
  console.log(`(structured section: ${elapsed(since)})`)
}

// ---------------------------------------------------------------------------
// prefix: one system prompt, many users.

const SHARED_SYSTEM =
  'You are the support assistant of a hardware shop. ' +
  Array.from({ length: 70 }, (_, i) => `Policy ${i + 1}: items of category ${i + 1} are returned within ${i + 10} days.`).join(' ')
const userOf = (q, extra = {}) => ({
  messages: [{ role: 'system', content: SHARED_SYSTEM }, { role: 'user', content: q }],
  n_predict: 4,
  temperature: 0,
  ...extra,
})

/** Time to the first token event of `request`, and what its prompt reused. */
async function firstToken(engine, request) {
  const t0 = performance.now()
  let first = null
  const r = await engine.complete(request, (e) => {
    if (first === null && e.type === 'token' && e.tokens.length > 0) first = performance.now() - t0
  })
  return { ms: first, cached: r.tokens_cached, prompt: r.tokens_evaluated, computed: r.timings.prompt_n }
}

if (sections.has('prefix')) {
  console.log('\n## prefix: a 1,000-token system prompt shared by users (Q4_1, greedy)')
  const since = Date.now()
  const load = (extra) => LlamaEngine.load({ modelPath: TARGET, contextSize: CONTEXT, threads: THREADS, ...extra })
  const sessionFile = join(root, 'bench-results', 'prefix.session')
  mkdirSync(join(root, 'bench-results'), { recursive: true })
  const rows = { cold: [], 'another slot': [], 'prompt cache (RAM)': [], 'session file': [] }
  let q = 0
  const ask = () => userOf(`What is the return period of category ${(q++ % 60) + 1}?`)
  for (let rep = 0; rep < REPEATS; rep++) {
    // cold: nothing cached.
    const coldEngine = await load({ parallel: 1, promptCacheMB: 0 })
    await coldEngine.complete({ prompt: 'warm up', n_predict: 1 })
    rows.cold.push(await firstToken(coldEngine, { ...ask(), cache_prompt: false }))
    await coldEngine.dispose()
    // another slot: slot 0 is busy answering a user; the next one copies its cells.
    const two = await load({ parallel: 2 })
    await two.complete({ prompt: 'warm up', n_predict: 1 })
    let generating
    const started = new Promise((r) => (generating = r))
    const busy = two.complete(userOf('Tell me about all the policies.', { n_predict: 400 }), (e) => e.type === 'token' && generating())
    await started
    rows['another slot'].push(await firstToken(two, ask()))
    two.cancel()
    await busy
    // RAM: the prompt was pushed out of the only slot by another one.
    await two.dispose()
    const one = await load({ parallel: 1 })
    await one.complete(ask())
    await one.complete({ prompt: 'An unrelated prompt. '.repeat(20), n_predict: 1 })
    q--
    rows['prompt cache (RAM)'].push(await firstToken(one, ask()))
    await one.saveSession(sessionFile, { messages: [{ role: 'system', content: SHARED_SYSTEM }] })
    await one.dispose()
    // session file: a new engine loads it, then a user asks.
    const fresh = await load({ parallel: 1 })
    await fresh.complete({ prompt: 'warm up', n_predict: 1 })
    const t0 = performance.now()
    await fresh.loadSession(sessionFile)
    const loadMs = performance.now() - t0
    const r = await firstToken(fresh, ask())
    rows['session file'].push({ ...r, ms: r.ms + loadMs, loadMs })
    await fresh.dispose()
  }
  const coldMs = median(rows.cold.map((x) => x.ms))
  const out = Object.entries(rows).map(([source, xs]) => ({
    'prefix from': source,
    'prompt tokens': xs[0].prompt,
    reused: xs[0].cached,
    'first token ms': `${fmt(median(xs.map((x) => x.ms)), 0)} (${fmt(Math.min(...xs.map((x) => x.ms)), 0)}–${fmt(Math.max(...xs.map((x) => x.ms)), 0)})`,
    'of cold': pct(median(xs.map((x) => x.ms)) / coldMs),
    'loadSession ms': source === 'session file' ? fmt(median(xs.map((x) => x.loadMs)), 0) : '-',
  }))
  table(out, ['prefix from', 'prompt tokens', 'reused', 'first token ms', 'of cold', 'loadSession ms'])
  // 8 users at once.
  const eight = await load({ parallel: 8 })
  await eight.complete({ prompt: 'warm up', n_predict: 1 })
  const t0 = performance.now()
  const firsts = []
  const together = await Promise.all(
    Array.from({ length: 8 }, (_, i) =>
      eight.complete(userOf(`What about category ${i * 7 + 2}?`), (e) => {
        if (e.type === 'token' && firsts[i] === undefined) firsts[i] = performance.now() - t0
      }),
    ),
  )
  await eight.dispose()
  const computed = together.reduce((a, r) => a + r.timings.prompt_n, 0)
  const given = together.reduce((a, r) => a + r.tokens_evaluated, 0)
  const sizes = await (async () => {
    const e = await load({ parallel: 1 })
    const n = e.tokenize(e.applyChatTemplate([{ role: 'system', content: SHARED_SYSTEM }], { addGenerationPrompt: false }), { special: true }).length
    await e.dispose()
    return n
  })()
  console.log(
    `8 users together: ${given} prompt tokens, ${computed} computed (the ${sizes}-token shared prefix ${computed < 2 * sizes ? 'once' : 'more than once'}); ` +
      `first tokens after ${fmt(Math.min(...firsts), 0)}–${fmt(Math.max(...firsts), 0)} ms`,
  )
  const bytes = existsSync(sessionFile) ? readFileSync(sessionFile).length : 0
  console.log(`session file: ${bytes} bytes for ${sizes} tokens (${fmt(bytes / sizes / 1024, 1)} KiB per token); ${REPEATS} repeats, medians (min–max)`)
  results.prefix = { rows: out, together: { given, computed, prefix: sizes, firstMs: firsts }, sessionBytes: bytes }
  console.log(`(prefix section: ${elapsed(since)})`)
}

if (sections.has('tiled')) {
  const since = Date.now()
  console.log('\n## tiled: what the tiled K-quant mat-mul gives on K-quant models (on = engine default, off = GGML_CPU_TILED_MM=0)')
  const rows = []
  for (const name of ['gemma-3-270m-q4_k_m.gguf', 'gemma-3-270m.Q6_K.gguf']) {
    const { runs, med, ratio, invariant } = probePairs(join(models, name), { off: { GGML_CPU_TILED_MM: '0' }, on: { GGML_CPU_TILED_MM: null } })
    const row = { model: name, invariant }
    row['gen t/s off'] = med('off', tps)
    row['gen t/s on'] = med('on', tps)
    row['gen off/on'] = ratio(tps)
    row['prompt t/s off'] = med('off', promptTps)
    row['prompt t/s on'] = med('on', promptTps)
    row['prompt off/on'] = ratio(promptTps)
    for (const n of [8, 16]) {
      row[`t${n} off`] = med('off', (x) => x.batchCostMs[n])
      row[`t${n} on`] = med('on', (x) => x.batchCostMs[n])
    }
    // Forced for every row count (GGML_CPU_TILED_MM_FORCE=1): one row pays
    // for unpacking the weights; against the default (vec_dot below 8 rows).
    const forced = probePairs(join(models, name), { off: { GGML_CPU_TILED_MM: null }, forced: { GGML_CPU_TILED_MM_FORCE: '1' } })
    row['invariant forced'] = forced.invariant.split('/')[1]
    row['gen off/forced'] = forced.ratio(tps)
    row['prompt off/forced'] = forced.ratio(promptTps)
    rows.push({ ...row, runs, forced: forced.runs })
  }
  table(rows, Object.keys(rows[0]).filter((k) => k !== 'runs' && k !== 'forced'))
  console.log('invariant = status().batchInvariant with the tiled path off/on; off/on = median (min–max) over the repeats of each off run against the on run next to it;')
  console.log('forced = the tiled path for every row count (GGML_CPU_TILED_MM_FORCE=1), against the default (off column = default) the same way;')
  console.log('t8/t16 = load-time cost (ms) of a batch of 8/16 rows (tiled takes over from 8 rows); prompt = the ~300-token code-edit prompt, evaluated without cache')
  console.log(`(tiled section: ${elapsed(since)})`)
  results.tiled = rows
}

// Never-seen text for the long-prompt sections: words drawn by a seeded
// generator (no cache, no n-gram can know it); ~1,800 words are ~2,000
// SmolLM2 tokens.
function neverSeenText(seed, nWords) {
  const WORDS = 'river stone market bright quietly harbour engine silver winter garden letter orange mountain whisper ancient copper lantern forest gentle thunder velvet ribbon marble candle shadow meadow crystal falcon canyon breeze'.split(' ')
  let x = (seed * 2654435761) % 4294967296
  const rnd = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648
  return Array.from({ length: nWords }, () => WORDS[Math.floor(rnd() * WORDS.length)] + (rnd() < 0.1 ? '.' : '')).join(' ')
}

// sequence: three long prompts one after the other in one process, each
// timed (the second once took twice as long as the others).
if (sections.has('sequence')) {
  console.log('\n## sequence: three ~1,600-token never-seen prompts in one process, one after the other')
  const dir = join(root, 'bench-results', 'sequence')
  mkdirSync(dir, { recursive: true })
  const files = [11, 12, 13].map((seed) => {
    const file = join(dir, `prompt-${seed}.txt`)
    writeFileSync(file, neverSeenText(seed, 1400))
    return file
  })
  const model = join(models, process.env.BENCH_SEQUENCE_MODEL || 'SmolLM2-135M-Instruct.Q4_1.gguf')
  const rows = []
  for (let r = 0; r < REPEATS; r++) {
    const out = execFileSync(process.execPath, [join(root, 'bench', 'prefill.mjs'), 'engine-sequence', model, files.join(','), '32'], { cwd: root, encoding: 'utf8' })
    const runs = out.trim().split('\n').map((l) => JSON.parse(l))
    rows.push({ repeat: r + 1, tokens: runs.map((x) => x.prompt_tokens).join(' / '), 'time to first token (ms)': runs.map((x) => fmt(x.ttft_ms, 0)).join(' / '), 'slowest / fastest': fmt(Math.max(...runs.map((x) => x.ttft_ms)) / Math.min(...runs.map((x) => x.ttft_ms)), 2) })
  }
  table(rows, ['repeat', 'tokens', 'time to first token (ms)', 'slowest / fastest'])
  results.sequence = rows
}

// kernels: the weight and attention kernels on the models people download
// (issue 49): time to first token on never-seen prompts of about 2k, 4k and
// 8k tokens and a short one, and greedy decoding after each, against
// node-llama-cpp and against this build with the repacked K-quant kernels off
// (LLAMA_ENGINE_REPACK=0); with an addon of the AVX2 CPU variant
// (BENCH_KERNELS_AVX2_ADDON, e.g. target/prebuilt-haswell/package/… of
// `npm run prebuild -- --variants haswell`), that variant forced too.
if (sections.has('kernels')) {
  const since = Date.now()
  console.log('\n## kernels: prompts of ~2k, 4k and 8k never-seen tokens and a short one, time to first token and decode after it (each run its own process, alternated)')
  const dir = join(root, 'bench-results', 'kernels')
  mkdirSync(dir, { recursive: true })
  const benchDir = join(root, 'bench')
  if (!existsSync(join(benchDir, 'node_modules', 'node-llama-cpp'))) {
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: benchDir, stdio: 'inherit' })
  }
  const NGEN = 64
  // Words of neverSeenText are about 1.1 tokens each in these vocabularies.
  const sizes = (process.env.BENCH_KERNELS_SIZES || 'short,2000,4000,8000').split(',')
  const prompts = sizes.map((size, i) => {
    const file = join(dir, `prompt-${size}.txt`)
    writeFileSync(file, size === 'short' ? 'Write a Python function that parses a CSV file and returns a list of dictionaries, one per row.' : neverSeenText(40 + i, Math.round(Number(size) / 1.12)))
    return { size, file }
  })
  const prefill = (env) => (m, f) => [process.execPath, [join(benchDir, 'prefill.mjs'), 'engine', m, f, String(NGEN)], env]
  const impls = {
    engine: prefill({}),
    'repack off': prefill({ LLAMA_ENGINE_REPACK: '0' }),
    'node-llama-cpp': (m, f) => [process.execPath, [join(benchDir, 'prefill.mjs'), 'node-llama-cpp', m, f, String(NGEN)], {}],
  }
  const avx2 = process.env.BENCH_KERNELS_AVX2_ADDON
  if (avx2) {
    impls['AVX2 variant'] = prefill({ LLAMA_ENGINE_ADDON: avx2, LLAMA_ENGINE_CPU_VARIANT: 'haswell' })
    impls['AVX2 repack off'] = prefill({ LLAMA_ENGINE_ADDON: avx2, LLAMA_ENGINE_CPU_VARIANT: 'haswell', LLAMA_ENGINE_REPACK: '0' })
  }
  const names = Object.keys(impls)
  const kernelModels = (process.env.BENCH_KERNELS_MODELS || ['Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf', 'gemma-3-270m-q4_k_m.gguf', 'gemma-3-270m.Q6_K.gguf'].filter((m) => existsSync(join(models, m))).join(',')).split(',')
  const rows = []
  for (const model of kernelModels) {
    for (const { size, file } of prompts) {
      const runs = Object.fromEntries(names.map((n) => [n, []]))
      for (let r = 0; r < REPEATS; r++) {
        for (const name of r % 2 ? [...names].reverse() : names) {
          const [cmd, args, env] = impls[name](join(models, model), file)
          // A context that holds the prompt (9,216 cells up to 8k tokens; 16k: 18,944).
          const context = String(Math.max(9216, size === 'short' ? 0 : Math.ceil((Number(size) * 1.15 + 512) / 256) * 256))
          const out = execFileSync(cmd, args, { cwd: root, encoding: 'utf8', env: { ...process.env, BENCH_CONTEXT: context, ...env }, stdio: ['ignore', 'pipe', 'ignore'] })
          runs[name].push(JSON.parse(out.trim().split('\n').pop()))
        }
      }
      const row = { model: model.replace('.gguf', ''), prompt: size, tokens: runs.engine[0].prompt_tokens }
      const range = (xs) => `${fmt(Math.min(...xs), 1)}–${fmt(Math.max(...xs), 1)}`
      for (const n of names) {
        row[`${n} prefill t/s`] = range(runs[n].map((x) => x.prefill_tps))
        row[`${n} decode t/s`] = range(runs[n].map((x) => x.decode_tps))
      }
      // Paired: each run against the other's run of the same repeat.
      const paired = (a, b, key) => {
        const xs = runs[a].map((x, i) => x[key] / runs[b][i][key])
        return `${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)}x`
      }
      row['decode vs node-llama-cpp'] = paired('engine', 'node-llama-cpp', 'decode_tps')
      row['prefill vs node-llama-cpp'] = paired('engine', 'node-llama-cpp', 'prefill_tps')
      row['decode vs repack off'] = paired('engine', 'repack off', 'decode_tps')
      if (avx2) {
        row['AVX2 decode vs node-llama-cpp'] = paired('AVX2 variant', 'node-llama-cpp', 'decode_tps')
        row['AVX2 decode vs repack off'] = paired('AVX2 variant', 'AVX2 repack off', 'decode_tps')
      }
      rows.push({ ...row, runs })
      console.log(JSON.stringify(row))
    }
  }
  table(rows, Object.keys(rows[0]).filter((k) => k !== 'runs'))
  console.log(`t/s: min–max over ${REPEATS} runs; "vs": min–max over the repeats of one run against the other's run of the same repeat. node-llama-cpp runs llama.cpp's default build (on a CPU with AMX, its AMX kernels).`)
  console.log(`(kernels section: ${elapsed(since)})`)
  results.kernels = rows
}

if (sections.has('prefill')) {
  const since = Date.now()
  console.log('\n## prefill: long never-seen prompts, time to first token and decode after it (each run its own process, alternated)')
  const dir = join(root, 'bench-results', 'prefill')
  mkdirSync(dir, { recursive: true })
  const prompts = [1, 2, 3, 4].map((seed) => {
    const file = join(dir, `prompt-${seed}.txt`)
    writeFileSync(file, neverSeenText(seed, seed === 4 ? 3600 : 1800))
    return file
  })
  // node-llama-cpp, for the bench only.
  const benchDir = join(root, 'bench')
  if (!existsSync(join(benchDir, 'node_modules', 'node-llama-cpp'))) {
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: benchDir, stdio: 'inherit' })
  }
  // The ceiling: the registry crate with none of the kernel patches (only
  // 0004 and 0005, API the engine's code links against), llama.cpp's default
  // build options (flash attention auto, llamafile, repacked weights, tiled
  // K-quants for every type).
  const pristine = join(root, 'target', 'pristine', 'llama-cpp-sys-2')
  if (!existsSync(join(pristine, '.api-patches'))) {
    rmSync(pristine, { recursive: true, force: true })
    execFileSync(process.execPath, [join(root, 'scripts', 'vendor.mjs'), '--pristine', pristine, '--with', '0004-thread-cap.patch,0005-chat-parser-wrapper.patch'], { stdio: 'inherit' })
    writeFileSync(join(pristine, '.api-patches'), '0004,0005\n')
  }
  execFileSync(
    'cargo',
    ['build', '--release', '--example', 'prefill_ceiling', '--target-dir', join(root, 'target', 'ceiling'), '--config', `patch.crates-io.llama-cpp-sys-2.path="${pristine}"`],
    { cwd: root, stdio: 'ignore', env: { ...process.env, GGML_LLAMAFILE: 'ON', GGML_CPU_REPACK: 'ON' } },
  )
  const ceiling = join(root, 'target', 'ceiling', 'release', 'examples', 'prefill_ceiling')
  const NGEN = 128
  const impls = {
    engine: (m, f) => [process.execPath, [join(benchDir, 'prefill.mjs'), 'engine', m, f, String(NGEN)], {}],
    'node-llama-cpp': (m, f) => [process.execPath, [join(benchDir, 'prefill.mjs'), 'node-llama-cpp', m, f, String(NGEN)], {}],
    ceiling: (m, f) => [ceiling, [m, String(THREADS), String(NGEN), f], {}],
  }
  if (process.env.BENCH_PREFILL_BEFORE) {
    impls['engine before'] = (m, f) => [process.execPath, [join(benchDir, 'prefill.mjs'), 'engine', m, f, String(NGEN)], { LLAMA_ENGINE_ADDON: process.env.BENCH_PREFILL_BEFORE }]
  }
  const names = Object.keys(impls)
  const rows = []
  // BENCH_PREFILL_MODELS / BENCH_PREFILL_PROMPTS (comma-separated file names
  // / prompt numbers 1-4) narrow the table.
  const prefillModels = (process.env.BENCH_PREFILL_MODELS || 'SmolLM2-135M-Instruct.Q4_1.gguf,gemma-3-270m-q4_k_m.gguf,gemma-3-270m.Q5_K_M.gguf,gemma-3-270m.Q6_K.gguf,gemma-3-270m.Q8_0.gguf').split(',')
  const prefillPrompts = (process.env.BENCH_PREFILL_PROMPTS || '1,2,3,4').split(',').map(Number)
  for (const model of prefillModels) {
    for (const [pi, file] of prompts.entries()) {
      if (!prefillPrompts.includes(pi + 1)) continue
      const runs = Object.fromEntries(names.map((n) => [n, []]))
      for (let r = 0; r < REPEATS; r++) {
        // Alternated, the order turned each repeat.
        for (const name of r % 2 ? [...names].reverse() : names) {
          const [cmd, args, env] = impls[name](join(models, model), file)
          const out = execFileSync(cmd, args, { cwd: root, encoding: 'utf8', env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'ignore'] })
          runs[name].push(JSON.parse(out.trim().split('\n').pop()))
        }
      }
      const row = { model: model.replace('.gguf', ''), prompt: pi + 1, tokens: runs.engine[0].prompt_tokens }
      const range = (xs) => `${fmt(Math.min(...xs), 0)}–${fmt(Math.max(...xs), 0)}`
      for (const n of names) {
        row[`${n} prefill t/s`] = range(runs[n].map((x) => x.prefill_tps))
        row[`${n} ttft s`] = fmt(median(runs[n].map((x) => x.ttft_ms)) / 1000, 2)
        row[`${n} decode t/s`] = range(runs[n].map((x) => x.decode_tps))
      }
      // Paired: each engine run against the other implementation's run of the same repeat.
      for (const other of names.filter((n) => n !== 'engine')) {
        const ps = runs.engine.map((x, i) => x.prefill_tps / runs[other][i].prefill_tps)
        row[`prefill vs ${other}`] = `${fmt(median(ps), 2)}x`
      }
      rows.push({ ...row, runs })
      console.log(JSON.stringify(Object.fromEntries(Object.entries(row))))
    }
  }
  table(rows, Object.keys(rows[0]).filter((k) => k !== 'runs'))
  console.log(`prefill t/s and decode t/s: min–max over ${REPEATS} runs; ttft: median; "prefill vs X": median over the repeats of the engine's run against X's run of the same repeat.`)
  console.log(`(prefill section: ${elapsed(since)})`)
  results.prefill = rows
}

// contention: scenarios of a busy machine, each measured in processes of
// their own; the addons (this build, and an older one with
// BENCH_CONTENTION_BEFORE) alternate within each scenario.
if (sections.has('contention')) {
  const since = Date.now()
  console.log('\n## contention: load time and tokens/s idle and beside other work (SmolLM2 Q4_1, 2 threads, 128 greedy tokens)')
  const { spawn } = await import('node:child_process')
  const probe = join(root, 'bench', 'contention.mjs')
  const addons = { after: null }
  if (process.env.BENCH_CONTENTION_BEFORE) addons.before = process.env.BENCH_CONTENTION_BEFORE
  // The older build's own environment (K=V,…), e.g. the spin settings its loader set.
  const beforeEnv = Object.fromEntries((process.env.BENCH_CONTENTION_BEFORE_ENV || '').split(',').filter(Boolean).map((kv) => kv.split('=')))
  const envOf = (addon) => {
    const env = { ...process.env }
    if (addon) Object.assign(env, { LLAMA_ENGINE_ADDON: addon }, beforeEnv)
    else delete env.LLAMA_ENGINE_ADDON
    return env
  }
  const cfg = (extra) => JSON.stringify({ model: TARGET, threads: THREADS, tokens: N, runs: 3, ...extra })
  const scenarios = {
    idle: { engines: 1, beside: () => [] },
    'two busy processes': { engines: 1, beside: () => [0, 1].map(() => spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' })) },
    'a second engine process': { engines: 1, beside: (env) => [spawn(process.execPath, [probe, cfg({ forever: true })], { stdio: 'ignore', env })], settle: 4000 },
    'two engines in one process': { engines: 2, beside: () => [] },
  }
  const rows = []
  for (const [scenario, sc] of Object.entries(scenarios)) {
    const runs = Object.fromEntries(Object.keys(addons).map((a) => [a, []]))
    for (let r = 0; r < REPEATS; r++) {
      for (const name of r % 2 ? Object.keys(addons).reverse() : Object.keys(addons)) {
        const env = envOf(addons[name])
        const bg = sc.beside(env)
        if (sc.settle) await new Promise((res) => setTimeout(res, sc.settle))
        try {
          runs[name].push(JSON.parse(execFileSync(process.execPath, [probe, cfg({ engines: sc.engines })], { env }).toString()))
        } finally {
          for (const p of bg) p.kill('SIGKILL')
        }
      }
    }
    for (const [name, rs] of Object.entries(runs)) {
      // Per run: the mean over its rounds and engines.
      const perRun = rs.map((x) => x.tps.flat().reduce((a, b) => a + b, 0) / x.tps.flat().length)
      rows.push({
        scenario,
        addon: name,
        'load s': `${fmt(Math.min(...rs.map((x) => x.load_ms)) / 1000, 1)}–${fmt(Math.max(...rs.map((x) => x.load_ms)) / 1000, 1)}`,
        'tok/s': `${fmt(Math.min(...perRun))}–${fmt(Math.max(...perRun))}`,
        'tok/s median': fmt(median(perRun)),
        'threads at the end': [...new Set(rs.map((x) => x.threadsInUse.join('+')))].join(', '),
        runs: rs,
      })
    }
  }
  const idle = Object.fromEntries(rows.filter((r) => r.scenario === 'idle').map((r) => [r.addon, Number(r['tok/s median'])]))
  for (const row of rows) row['vs idle'] = `${fmt(Number(row['tok/s median']) / idle[row.addon], 2)}x`
  table(rows, Object.keys(rows[0]).filter((k) => k !== 'runs'))
  console.log(`tok/s and load: min–max over ${REPEATS} runs (each the mean of 3 rounds; two engines: per engine); "vs idle": medians; busy processes are \`node -e "for(;;){}"\`.`)
  console.log(`(contention section: ${elapsed(since)})`)
  results.contention = rows
}

// isolation: the engine in a child process against in-process.
if (sections.has('isolation')) {
  const since = Date.now()
  console.log('\n## isolation: isolation "process" against in-process (SmolLM2 Q4_1, 2 threads)')
  const kinds = { 'in-process': 'none', isolated: 'process' }
  const runs = { 'in-process': [], isolated: [] }
  for (let r = 0; r < REPEATS; r++) {
    for (const kind of r % 2 ? ['isolated', 'in-process'] : ['in-process', 'isolated']) {
      const t0 = performance.now()
      const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: CONTEXT, threads: THREADS, isolation: kinds[kind] })
      const load = performance.now() - t0
      await engine.complete({ prompt: 'Hello', n_predict: 4, temperature: 0 })
      const ttfts = []
      for (let i = 0; i < 5; i++) {
        const t = performance.now()
        let first = 0
        await engine.complete({ messages: [{ role: 'user', content: `Say hello number ${i + r * 5}.` }], n_predict: 2, temperature: 0, cache_prompt: false }, (e) => {
          if (e.type === 'token' && !first) first = performance.now() - t
        })
        ttfts.push(first)
      }
      const res = await engine.complete({ prompt: 'Write a long story about a lighthouse keeper.', n_predict: N, temperature: 0, ignore_eos: true, speculative: { mode: 'off' } })
      let events = 0
      const t1 = performance.now()
      await engine.complete({ prompt: 'Write a long story about a lighthouse keeper.', n_predict: N, temperature: 0, ignore_eos: true, speculative: { mode: 'off' } }, () => events++)
      const wall = performance.now() - t1
      runs[kind].push({ load, ttft: median(ttfts), tps: res.timings.predicted_per_second, wallTps: N / (wall / 1000), events })
      await engine.dispose()
    }
  }
  const rows = Object.entries(runs).map(([kind, rs]) => ({
    kind,
    'load ms': fmt(median(rs.map((x) => x.load))),
    'ttft ms': fmt(median(rs.map((x) => x.ttft)), 1),
    'tok/s (engine)': fmt(median(rs.map((x) => x.tps))),
    'tok/s (seen by the caller)': fmt(median(rs.map((x) => x.wallTps))),
  }))
  const ratio = (f) => {
    const xs = runs.isolated.map((x, i) => f(x) / f(runs['in-process'][i]))
    return `${fmt(median(xs), 2)}x (${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)})`
  }
  rows.push({ kind: 'isolated / in-process', 'load ms': ratio((x) => x.load), 'ttft ms': ratio((x) => x.ttft), 'tok/s (engine)': ratio((x) => x.tps), 'tok/s (seen by the caller)': ratio((x) => x.wallTps) })
  table(rows, Object.keys(rows[0]))
  console.log(`medians over ${REPEATS} fresh engines of each kind, alternated; ttft: a 2-token chat request without cache (median of 5); tok/s seen by the caller: ${N} tokens over the wall time of complete() with an event callback.`)
  console.log(`(isolation section: ${elapsed(since)})`)
  results.isolation = { rows, runs }
}

// portable: determinism 'portable' against the default kernels, on the
// same machine, fresh engines alternated (docs/testing.md).
if (sections.has('portable')) {
  const since = Date.now()
  const list = (process.env.BENCH_PORTABLE_MODELS || 'SmolLM2-135M-Instruct.Q4_1.gguf,gemma-3-270m-q4_k_m.gguf,Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf')
    .split(',')
    .filter((m) => existsSync(join(models, m)))
  console.log(`\n## portable: determinism 'portable' against the default kernels (${THREADS} threads)`)
  const prompt = FREE_PROMPTS.map((p) => p.messages[0].content).join(' ').repeat(12)
  const rows = []
  const all = {}
  for (const m of list) {
    const runs = { default: [], portable: [] }
    for (let r = 0; r < REPEATS; r++) {
      for (const kind of r % 2 ? ['portable', 'default'] : ['default', 'portable']) {
        const engine = await LlamaEngine.load({ modelPath: join(models, m), contextSize: CONTEXT, threads: THREADS, parallel: 1, determinism: kind })
        const decode = await engine.complete({ prompt: 'Write a long story about a lighthouse keeper.', n_predict: N, temperature: 0, ignore_eos: true, speculative: { mode: 'off' } })
        const prefill = await engine.complete({ prompt: `${prompt} ${r} ${kind}`, n_predict: 1, temperature: 0, cache_prompt: false })
        runs[kind].push({ decode: decode.timings.predicted_per_second, prefill: prefill.timings.prompt_per_second, prefillTokens: prefill.timings.prompt_n })
        await engine.dispose()
      }
    }
    // default/portable: how many times slower portable is
    rows.push(pairedRow(m.replace(/\.gguf$/, ''), runs, ['default', 'portable'], 'slowdown', (d, p) => d / p))
    all[m] = runs
  }
  table(rows, Object.keys(rows[0]))
  console.log(`${REPEATS} fresh engines of each mode, alternated; decode: ${N} greedy tokens; prefill: a ~1,000-token prompt never seen. Slowdown = default/portable, paired run by run (median, min–max).`)
  results.portable = { rows, runs: all }
  console.log(`(portable section: ${elapsed(since)})`)
}

// rpc: a model's layers on two RPC workers on this machine (loopback)
// against the same model here, both isolated (an engine with workers is).
if (sections.has('rpc')) {
  const since = Date.now()
  const { spawn } = await import('node:child_process')
  const net = await import('node:net')
  const freePort = () =>
    new Promise((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const { port } = s.address()
        s.close(() => resolve(port))
      })
    })
  const listening = async (port) => {
    for (let i = 0; i < 200; i++) {
      const ok = await new Promise((r) => {
        const c = net.connect(port, '127.0.0.1', () => (c.end(), r(true))).on('error', () => r(false))
      })
      if (ok) return
      await new Promise((r) => setTimeout(r, 50))
    }
    throw new Error(`rpc-worker on ${port} did not start`)
  }
  const workerThreads = Math.max(1, Math.floor(THREADS / 2))
  const ports = [await freePort(), await freePort()]
  const workers = ports.map((port) =>
    spawn(process.execPath, [join(root, 'bin', 'llama-engine.mjs'), 'rpc-worker', '--port', String(port), '--threads', String(workerThreads)], { stdio: 'ignore' }),
  )
  try {
    for (const p of ports) await listening(p)
    const list = (process.env.BENCH_RPC_MODELS || 'SmolLM2-135M-Instruct.Q4_1.gguf,gemma-3-270m-q4_k_m.gguf,Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf')
      .split(',')
      .filter((m) => existsSync(join(models, m)))
    console.log(`\n## rpc: local against two loopback RPC workers (${workerThreads} thread${workerThreads > 1 ? 's' : ''} each; the engine ${THREADS} threads), both isolated`)
    const prompt = FREE_PROMPTS.map((p) => p.messages[0].content).join(' ').repeat(12)
    const rows = []
    const all = {}
    for (const m of list) {
      const runs = { local: [], rpc: [] }
      for (let r = 0; r < REPEATS; r++) {
        for (const kind of r % 2 ? ['rpc', 'local'] : ['local', 'rpc']) {
          const engine = await LlamaEngine.load({
            modelPath: join(models, m),
            contextSize: CONTEXT,
            threads: THREADS,
            isolation: 'process',
            ...(kind === 'rpc' ? { rpc: ports.map((p) => `127.0.0.1:${p}`) } : {}),
          })
          const decode = await engine.complete({ prompt: 'Write a long story about a lighthouse keeper.', n_predict: N, temperature: 0, ignore_eos: true, speculative: { mode: 'off' } })
          const prefill = await engine.complete({ prompt: `${prompt} ${r} ${kind}`, n_predict: 1, temperature: 0, cache_prompt: false })
          runs[kind].push({ decode: decode.timings.predicted_per_second, prefill: prefill.timings.prompt_per_second, tokens: decode.completion_probabilities?.length })
          await engine.dispose()
        }
      }
      rows.push(pairedRow(m.replace(/\.gguf$/, ''), runs, ['local', 'rpc'], 'rpc/local', (l, r) => r / l))
      all[m] = runs
    }
    table(rows, Object.keys(rows[0]))
    console.log(`${REPEATS} fresh engines of each kind, alternated; decode: ${N} greedy tokens; prefill: a ~1,000-token prompt never seen. Ratios pair run by run (median, min–max).`)
    results.rpc = { rows, runs: all }
  } finally {
    for (const w of workers) w.kill()
  }
  console.log(`(rpc section: ${elapsed(since)})`)
}

// multimodal: images through the projector (the test fixtures of
// scripts/mm-fixtures.mjs: gemma-3-270m with a tiny SigLIP projector, 16
// tokens an image; the Qwen2-VL pair with M-RoPE, whose tokens grow with the
// image, when the real models are there). Per image size: encode ms (on the
// preparing thread), the ms its embeddings take into the cells, the whole
// prompt; a second question about the same image (its cells reused: nothing
// encoded, only the question prefilled) against the first; and what a
// neighbour streaming in another slot sees while an image request starts
// (its longest gap between tokens, against its median gap alone).
if (sections.has('multimodal')) {
  const since = Date.now()
  const { pngBytes } = await import('../scripts/mm-fixtures.mjs')
  const GEMMA_T = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
  const CHATML = '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
  const pairs = [
    { name: 'gemma-3-270m Q4_K_M + gemma3 test projector', modelPath: join(models, 'gemma-3-270m-q4_k_m.gguf'), mmprojPath: join(models, 'gemma-3-270m.mmproj-test.gguf'), chatTemplate: GEMMA_T, sizes: [64, 512] },
    { name: 'qwen2vl-tiny + qwen2vl_merger test projector (M-RoPE)', modelPath: join(models, 'qwen2vl-tiny.gguf'), mmprojPath: join(models, 'qwen2vl-tiny.mmproj-test.gguf'), chatTemplate: CHATML, sizes: [64, 256, 512] },
  ].filter((p) => existsSync(p.modelPath) && existsSync(p.mmprojPath))
  console.log(`\n## multimodal: images through the projector (${THREADS} threads, parallel 2)`)
  const rows = []
  let seed = 100
  const ask = (image, text, extra = {}) => ({ messages: [{ role: 'user', content: [{ type: 'image', data: image }, { type: 'text', text }] }], n_predict: 8, temperature: 0, ...extra })
  for (const p of pairs) {
    const engine = await LlamaEngine.load({ modelPath: p.modelPath, mmprojPath: p.mmprojPath, chatTemplate: p.chatTemplate, contextSize: 4096, batchSize: 2048, threads: THREADS, parallel: 2 })
    await engine.complete(ask(pngBytes(64, 64, 1), 'Warm up.'))
    for (const size of p.sizes) {
      const runs = []
      for (let r = 0; r < REPEATS; r++) {
        const image = pngBytes(size, size, seed++)
        const first = await engine.complete(ask(image, 'Describe the image.'))
        const again = await engine.complete({
          messages: [
            { role: 'user', content: [{ type: 'image', data: image }, { type: 'text', text: 'Describe the image.' }] },
            { role: 'assistant', content: first.content },
            { role: 'user', content: 'And its colours?' },
          ],
          n_predict: 8,
          temperature: 0,
        })
        runs.push({ tokens: first.tokens_evaluated, encode: first.timings.media_encode_ms, decode: first.timings.media_decode_ms, prompt: first.timings.prompt_ms, second: again.timings.prompt_ms, secondN: again.timings.prompt_n, secondEncode: again.timings.media_encode_ms })
      }
      rows.push({
        model: p.name,
        image: `${size}x${size}`,
        'prompt tokens': median(runs.map((x) => x.tokens)),
        'encode ms': fmt(median(runs.map((x) => x.encode))),
        'into cells ms': fmt(median(runs.map((x) => x.decode))),
        'prompt ms': fmt(median(runs.map((x) => x.prompt))),
        '2nd question ms': fmt(median(runs.map((x) => x.second))),
        '2nd prefilled': median(runs.map((x) => x.secondN)),
        '2nd encode ms': fmt(median(runs.map((x) => x.secondEncode))),
        'speed-up': `${fmt(median(runs.map((x) => x.prompt / x.second)), 1)}x`,
      })
    }
    // The neighbour: a text stream alone, then with an image request starting mid-stream.
    const gaps = async (withImage, size) => {
      const times = []
      const stream = engine.complete({ messages: [{ role: 'user', content: 'Write a long story about a lighthouse keeper.' }], n_predict: 96, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: { mode: 'off' } }, (e) => {
        if (e.type === 'token') times.push(performance.now())
      })
      let image = null
      let settled = false
      stream.finally(() => (settled = true))
      if (withImage) {
        while (times.length < 24 && !settled) await new Promise((r) => setTimeout(r, 2))
        image = engine.complete(ask(pngBytes(size, size, seed++), 'Describe the image.', { cache_prompt: false }))
      }
      await stream
      await image
      const d = times.slice(1).map((t, i) => t - times[i])
      return { median: median(d), max: Math.max(...d.slice(20)) }
    }
    const big = p.sizes[p.sizes.length - 1]
    const alone = await gaps(false)
    const beside = await gaps(true, big)
    rows.push({ model: p.name, image: `neighbour, ${big}x${big}`, 'prompt tokens': '-', 'encode ms': '-', 'into cells ms': '-', 'prompt ms': `gap alone ${fmt(alone.median)} ms`, '2nd question ms': `longest gap ${fmt(beside.max)} ms`, '2nd prefilled': '-', '2nd encode ms': '-', 'speed-up': '-' })
    await engine.dispose()
  }
  if (rows.length) table(rows, Object.keys(rows[0]))
  console.log(`medians of ${REPEATS} never-seen images each; the 2nd question repeats the image and the answer and asks again (prefilled: the tokens computed).`)
  console.log(`(multimodal section: ${elapsed(since)})`)
  results.multimodal = { rows }
}

// lora: decoding with LoRA adapters loaded (the test adapter: rank 8 on
// every attn_q and attn_v) against an engine without, alternated: a request
// that uses none (the graph is rebuilt each step, no adapter node), and one
// at scale 1.
if (sections.has('lora')) {
  const since = Date.now()
  const ADAPTER = join(models, 'SmolLM2-135M-Instruct.lora-test.gguf')
  console.log(`\n## lora: SmolLM2 Q4_1 with ${ADAPTER.slice(models.length + 1)} loaded, against without (${THREADS} threads, ${N} tokens)`)
  const plain = await LlamaEngine.load({ modelPath: TARGET, contextSize: CONTEXT, threads: THREADS, parallel: 1 })
  const adapted = await LlamaEngine.load({ modelPath: TARGET, contextSize: CONTEXT, threads: THREADS, parallel: 1, loras: [{ path: ADAPTER, scale: 1 }] })
  const tps = async (engine, lora) => {
    const t = performance.now()
    await engine.complete({ prompt: 'Once upon a time', n_predict: N, temperature: 0, ignore_eos: true, cache_prompt: false, speculative: { mode: 'off' }, lora })
    return N / ((performance.now() - t) / 1000)
  }
  const pairs = { 'adapter loaded, request without it': [], 'adapter at scale 1': [] }
  for (let r = 0; r < Math.max(REPEATS, 6); r++) {
    for (const [name, lora] of [['adapter loaded, request without it', []], ['adapter at scale 1', [{ id: 0, scale: 1 }]]]) {
      const [a, b] = r % 2 ? [await tps(adapted, lora), await tps(plain)] : [await tps(plain), await tps(adapted, lora)].reverse()
      pairs[name].push(a / b)
    }
  }
  const rows = Object.entries(pairs).map(([kind, xs]) => ({ kind, 'tok/s vs no adapters': `${fmt(median(xs), 2)}x (${fmt(Math.min(...xs), 2)}–${fmt(Math.max(...xs), 2)})` }))
  table(rows, Object.keys(rows[0]))
  await plain.dispose()
  await adapted.dispose()
  console.log(`(lora section: ${elapsed(since)})`)
  results.lora = { rows, pairs }
}

// agentic: traces shaped like agents' work, one engine per mode, requests in
// sequence (the suffix drafter learns across them): records under one schema,
// whole-file edits, a tool loop, a chat that quotes itself. Modes: off,
// today's auto without a draft model (`ngram`: n-grams and grammar drafts),
// the suffix drafter alone, the new auto (suffix, then n-grams), and the
// oracle ceiling (every output drafted perfectly, n_max 16, priced with the
// engine's measured batch costs).
// ---------------------------------------------------------------------------
// fim: fill-in-the-middle on a code model (Qwen2.5-Coder-0.5B; BENCH_FIM_MODEL),
// off against the drafters, which read the suffix and the project files in
// the prompt. Greedy, to the model's end (at most BENCH_TOKENS).

const FIM_MODEL = join(models, process.env.BENCH_FIM_MODEL || 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf')

if (sections.has('fim')) {
  const since = Date.now()
  console.log(`\n## fim: fill-in-the-middle, ${process.env.BENCH_FIM_MODEL || 'Qwen2.5-Coder-0.5B-Instruct Q4_K_M'}, greedy, to the model's end (at most ${N} tokens)`)
  const orders = readFileSync(join(root, 'bench', 'fixtures', 'summarize-orders.js'), 'utf8').split('\n').slice(1).join('\n').trimEnd()
  // The loop of the function: from its first line to the line after it.
  const loopAt = orders.indexOf('  for (const order of orders) {\n')
  const loopEnd = orders.indexOf('  const tax = ')
  const TASKS = {
    // The gap is the loop of a function another file of the project
    // already has (the body the editor's user is writing again).
    'copy from a project file': {
      input_prefix: orders.slice(0, loopAt),
      input_suffix: `${orders.slice(loopEnd)}\n\nmodule.exports = { summarizeOrders }\n`,
      input_extra: [{ filename: 'legacy/summarize-orders.js', text: orders }],
    },
    // The gap repeats a pattern the suffix spells out.
    'a case the suffix repeats': {
      input_prefix: 'function describe(status) {\n  switch (status) {\n    case "new":\n',
      input_suffix: '\n    case "paid":\n      return { label: "Paid", color: "green", final: false }\n    case "shipped":\n      return { label: "Shipped", color: "blue", final: false }\n    case "closed":\n      return { label: "Closed", color: "grey", final: true }\n  }\n}\n',
    },
    'free: a function body': { input_prefix: 'def median(xs):\n    """The median of a non-empty list of numbers."""\n', input_suffix: '\n\nprint(median([3, 1, 2]))\n' },
  }
  const load = { modelPath: FIM_MODEL, contextSize: 4096, threads: THREADS, parallel: 1 }
  const MODES = [['off', { mode: 'off' }], ['ngram', { mode: 'ngram' }], ['auto', { mode: 'auto' }]]
  const runs = Object.fromEntries(Object.keys(TASKS).map((t) => [t, Object.fromEntries(MODES.map(([m]) => [m, []]))]))
  for (let r = 0; r < REPEATS; r++) {
    for (const [task, input] of Object.entries(TASKS)) {
      for (let j = 0; j < MODES.length; j++) {
        const [name, speculative] = MODES[(j + r) % MODES.length]
        // A fresh engine per request: what a drafter learnt must not carry over.
        const engine = await LlamaEngine.load(load)
        await engine.complete({ prompt: 'Hello there.', n_predict: 8, temperature: 0, speculative: { mode: 'off' } })
        const res = await engine.infill({ ...input, n_predict: N, temperature: 0, cache_prompt: false, speculative })
        await engine.dispose()
        runs[task][name].push({ tps: res.timings.predicted_per_second, n: res.tokens_predicted, drafted: res.speculative.n_drafted, accepted: res.speculative.n_accepted, content: res.content })
      }
    }
  }
  const rows = []
  for (const task of Object.keys(TASKS)) {
    const off = runs[task].off
    const row = { task, tokens: off[0].n, 'off tok/s': fmt(median(off.map((x) => x.tps))) }
    for (const [name] of MODES.slice(1)) {
      const paired = runs[task][name].map((x, i) => x.tps / off[i].tps)
      const drafted = runs[task][name].reduce((a, x) => a + x.drafted, 0)
      const accepted = runs[task][name].reduce((a, x) => a + x.accepted, 0)
      const same = runs[task][name].every((x) => x.content === off[0].content)
      row[name] = `${times(median(paired))} (${fmt(Math.min(...paired), 2)}–${fmt(Math.max(...paired), 2)}) ${pct(drafted ? accepted / drafted : null)}${same ? '' : ' DIFFERENT TEXT'}`
    }
    rows.push(row)
  }
  table(rows, Object.keys(rows[0]))
  console.log("each cell: generation tok/s against off, median (min–max) of the repeats paired with off's run of the same repeat; then the share of drafted tokens accepted. Every mode must give off's text.")
  console.log(`(fim section: ${elapsed(since)})`)
  results.fim = { rows, runs: Object.fromEntries(Object.entries(runs).map(([t, m]) => [t, Object.fromEntries(Object.entries(m).map(([k, v]) => [k, v.map(({ content, ...x }) => x)]))])) }
}

if (sections.has('agentic')) {
  const since = Date.now()
  // BENCH_AGENTIC_MODEL (a file name in the models directory): the traces
  // on another model, e.g. Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf.
  const agenticModel = process.env.BENCH_AGENTIC_MODEL ? join(models, process.env.BENCH_AGENTIC_MODEL) : TARGET
  console.log(`\n## agentic: agent-shaped traces, ${process.env.BENCH_AGENTIC_MODEL || 'SmolLM2 Q4_1'}, greedy, no draft model (${THREADS} threads)`)
  const SYSTEM = 'You are a precise assistant. Convert each staff record into one JSON object with the keys "name", "role", "team", "start_year" and "email". Answer with the JSON only.'
  const PEOPLE = [
    ['Alice Moreau', 'backend engineer', 'payments', 2019],
    ['Bruno Silva', 'data analyst', 'growth', 2021],
    ['Chen Wei', 'product manager', 'search', 2017],
    ['Dana Kowalski', 'designer', 'mobile', 2022],
    ['Emeka Obi', 'site reliability engineer', 'platform', 2018],
    ['Fatima Zahra', 'frontend engineer', 'checkout', 2020],
    ['Gustav Berg', 'security engineer', 'platform', 2016],
    ['Hana Sato', 'engineering manager', 'payments', 2015],
  ]
  const records = PEOPLE.map(([name, role, team, year]) => ({
    messages: [
      { role: 'system', content: SYSTEM },
      { role: 'user', content: `Record: ${name}, ${role}, ${team} team, joined in ${year}, email ${name.toLowerCase().replace(' ', '.')}@example.com.` },
    ],
    n_predict: 64,
  }))
  const FILE = readFileSync(join(root, 'bench', 'fixtures', 'summarize-orders.js'), 'utf8').split('\n').slice(1).join('\n').trimEnd()
  const edits = [
    ['subtotal', 'net'],
    ['itemCount', 'count'],
    ['byCategory', 'totals'],
    ['taxRate', 'rate'],
  ].map(([from, to]) => ({
    messages: [{ role: 'user', content: `Rewrite this whole file, renaming ${from} to ${to}. Output only the code.\n\n${FILE}` }],
    n_predict: 160,
  }))
  const TOOL_SYSTEM =
    'You call tools by writing one line {"tool": NAME, "arguments": {...}} and nothing else. Tools: get_weather(city), get_time(city), convert(amount, from, to).'
  const toolTurns = ['Paris', 'Berlin', 'Madrid', 'Rome', 'Lisbon', 'Vienna']
  // The tool loop's history grows with the engine's own answers (run() fills them in).
  const toolLoop = { loop: toolTurns.map((city) => `What is the weather in ${city}?`), system: TOOL_SYSTEM, n_predict: 48 }
  const chatLoop = {
    loop: ['Give three tips for writing clear code.', 'Repeat your previous answer, then add a fourth tip.', 'Repeat your previous answer word for word.', 'Quote your first answer again, then summarise it in one sentence.'],
    n_predict: 96,
  }
  // Free text, where nothing repeats: the new drafter must not cost there.
  const free = FREE_PROMPTS.map((input) => ({ ...input, n_predict: 96 }))
  const traces = { records, edits, tools: toolLoop, chat: chatLoop, free }
  const MODES = [
    ['off', { mode: 'off' }],
    ['auto before (ngram)', { mode: 'ngram' }],
    ['suffix', { mode: 'suffix' }],
    ['auto', { mode: 'auto' }],
  ]
  /** One trace on `engine`: [{ n, ms, drafted, accepted, content }] per request. */
  async function runTrace(engine, trace, speculative) {
    const out = []
    const one = async (req) => {
      const res = await engine.complete({ ...req, temperature: 0, speculative })
      out.push({ n: res.timings.predicted_n, ms: res.timings.predicted_ms, drafted: res.speculative.n_drafted, accepted: res.speculative.n_accepted, content: res.content, req })
      return res.content
    }
    if (Array.isArray(trace)) {
      for (const req of trace) await one(req)
    } else {
      const history = trace.system ? [{ role: 'system', content: trace.system }] : []
      for (const user of trace.loop) {
        history.push({ role: 'user', content: user })
        history.push({ role: 'assistant', content: await one({ messages: [...history], n_predict: trace.n_predict }) })
      }
    }
    return out
  }
  const load = { modelPath: agenticModel, contextSize: 4096, threads: THREADS, parallel: 1 }
  const runs = Object.fromEntries(Object.keys(traces).map((t) => [t, Object.fromEntries(MODES.map(([m]) => [m, []]))]))
  let batchMs
  for (let r = 0; r < REPEATS; r++) {
    for (const [name, speculative] of MODES) {
      const engine = await LlamaEngine.load(load)
      batchMs ??= engine.status().batchCostMs
      await engine.complete({ prompt: 'Hello there.', n_predict: 8, temperature: 0, speculative: { mode: 'off' } })
      for (const [t, trace] of Object.entries(traces)) runs[t][name].push(await runTrace(engine, trace, speculative))
      await engine.dispose()
    }
  }
  // The oracle: every token drafted right, drafts of up to 16 tokens, each
  // step priced at the measured cost of its batch; against one token a step.
  // (The engine measures some batch sizes; the others are interpolated.)
  const known = batchMs.map((ms, n) => [n, ms]).filter(([, ms]) => Number.isFinite(ms))
  const cost = (n) => {
    const hi = known.findIndex(([m]) => m >= n)
    if (known[hi][0] === n || hi === 0) return known[hi][1]
    const [[n0, c0], [n1, c1]] = [known[hi - 1], known[hi]]
    return c0 + ((c1 - c0) * (n - n0)) / (n1 - n0)
  }
  const oracle = Math.max(...Array.from({ length: 17 }, (_, k) => ((k + 1) * cost(1)) / cost(k + 1)))
  // The copy ceiling: what a drafter that copies could reach at best. At
  // each step it drafts the longest run of the true output (up to 16 tokens)
  // found anywhere in what the engine had read and written before (this
  // prompt, the output so far, every earlier output of the run), picking
  // the right occurrence; the step is priced at its batch's measured cost.
  // Text that is new (a record's values, a new answer) cannot be copied.
  // With `prompts`, earlier requests' prompts are sources too: what putting
  // prompts in the shared index could add at best.
  const tokenizer = await LlamaEngine.load({ ...load, contextSize: 512 })
  const copyCeiling = {}
  const withPrompts = {}
  const written = []
  const read = []
  for (const t of Object.keys(traces)) {
    let plain = 0
    let copied = 0
    let copiedP = 0
    for (const q of runs[t].off[0]) {
      const prompt = tokenizer.tokenize(q.req.messages ? tokenizer.applyChatTemplate(q.req.messages, { addGenerationPrompt: true }) : q.req.prompt, { special: true })
      const out = tokenizer.tokenize(q.content, { addBos: false })
      const longest = (i, prompts) => {
        let best = 0
        for (const seq of [...written, ...(prompts ? read : []), prompt, out.slice(0, i)]) {
          for (let j = 0; j < seq.length; j++) {
            let l = 0
            while (l < 16 && j + l < seq.length && i + l < out.length && seq[j + l] === out[i + l]) l++
            if (l > best) best = l
          }
        }
        return best
      }
      for (let i = 0; i < out.length; ) {
        const l = Math.min(longest(i, false), out.length - i - 1)
        copied += cost(l + 1)
        plain += (l + 1) * cost(1)
        i += l + 1
      }
      for (let i = 0; i < out.length; ) {
        const l = Math.min(longest(i, true), out.length - i - 1)
        copiedP += cost(l + 1)
        i += l + 1
      }
      written.push(out)
      read.push(prompt)
    }
    copyCeiling[t] = plain / copied
    withPrompts[t] = plain / copiedP
  }
  await tokenizer.dispose()
  const tpsOf = (run) => run.reduce((a, q) => a + q.n, 0) / (run.reduce((a, q) => a + q.ms, 0) / 1000)
  const rows = []
  for (const t of Object.keys(traces)) {
    const off = runs[t].off
    const row = { trace: t, requests: off[0].length, tokens: off[0].reduce((a, q) => a + q.n, 0), 'off t/s': fmt(median(off.map(tpsOf))) }
    for (const [name] of MODES.slice(1)) {
      const paired = runs[t][name].map((run, i) => tpsOf(run) / tpsOf(off[i]))
      const drafted = runs[t][name].flat().reduce((a, q) => a + q.drafted, 0)
      const accepted = runs[t][name].flat().reduce((a, q) => a + q.accepted, 0)
      const same = runs[t][name].every((run) => run.every((q, i) => q.content === off[0][i].content))
      row[name] = `${times(median(paired))} (${fmt(Math.min(...paired), 2)}–${fmt(Math.max(...paired), 2)}) ${pct(drafted ? accepted / drafted : null)}${same ? '' : ' DIFFERENT TEXT'}`
    }
    row.oracle = times(oracle)
    row['auto/oracle'] = pct(median(runs[t].auto.map((run, i) => tpsOf(run) / tpsOf(off[i]))) / oracle)
    row['copy ceiling'] = `${times(copyCeiling[t])} (${times(withPrompts[t])})`
    row['auto/copy'] = pct(median(runs[t].auto.map((run, i) => tpsOf(run) / tpsOf(off[i]))) / copyCeiling[t])
    rows.push(row)
  }
  const all = (name) => median(Array.from({ length: REPEATS }, (_, i) => {
    const pick = (m) => Object.keys(traces).filter((t) => t !== 'free').map((t) => runs[t][m][i]).flat()
    return tpsOf(pick(name)) / tpsOf(pick('off'))
  }))
  rows.push({ trace: 'all but free', requests: '', tokens: '', 'off t/s': '', ...Object.fromEntries(MODES.slice(1).map(([n]) => [n, times(all(n))])), oracle: times(oracle), 'auto/oracle': pct(all('auto') / oracle), 'copy ceiling': '', 'auto/copy': '' })
  table(rows, Object.keys(rows[0]))
  console.log('each cell: generation tok/s against off, median (min–max) over the repeats paired with the off run of the same repeat; then the share of drafted tokens accepted. Every mode must give off\'s text.')
  console.log('oracle: every token drafted right; copy ceiling: the longest run of each output found in what the engine had read (this prompt) and written (earlier outputs, the output so far), in parentheses with earlier prompts too.')
  console.log(`(agentic section: ${elapsed(since)})`)
  results.agentic = { rows, oracle, copyCeiling, withPrompts, batchMs, runs: Object.fromEntries(Object.entries(runs).map(([t, m]) => [t, Object.fromEntries(Object.entries(m).map(([k, v]) => [k, v.map((run) => run.map(({ content, req, ...q }) => q))]))])) }
}

// prebuilt: the portable addon against the source build
// (LLAMA_ENGINE_ADDON picks the prebuilt one).
if (sections.has('prebuilt')) {
  const since = Date.now()
  console.log(`\n## prebuilt: ${PREBUILT.slice(root.length + 1)} (CPU variant chosen at run time) vs the source build (target-cpu=native)`)
  if (!existsSync(PREBUILT)) {
    console.log('no prebuilt addon: run npm run prebuild first')
  } else {
    const rows = []
    for (const name of ['SmolLM2-135M-Instruct.Q4_1.gguf', 'gemma-3-270m-q4_k_m.gguf']) {
      const { runs, med, ratio, invariant } = probePairs(join(models, name), { prebuilt: { LLAMA_ENGINE_ADDON: PREBUILT }, source: { LLAMA_ENGINE_ADDON: null } })
      rows.push({
        model: name,
        variant: runs.prebuilt[0].cpuBackend,
        invariant,
        'gen t/s prebuilt': med('prebuilt', tps),
        'gen t/s source': med('source', tps),
        'gen prebuilt/source': ratio(tps),
        'prompt t/s prebuilt': med('prebuilt', promptTps),
        'prompt t/s source': med('source', promptTps),
        'prompt prebuilt/source': ratio(promptTps),
        runs,
      })
    }
    table(rows, Object.keys(rows[0]).filter((k) => k !== 'runs'))
    console.log('invariant = status().batchInvariant prebuilt/source; ratios = median (min–max) over the repeats, each prebuilt run against the source run next to it (order alternated)')
    results.prebuilt = rows
  }
  console.log(`(prebuilt section: ${elapsed(since)})`)
}

mkdirSync(join(root, 'bench-results'), { recursive: true })
const outFile = join(root, 'bench-results', 'latest.json')
writeFileSync(outFile, JSON.stringify(results, null, 2) + '\n')
console.log(`\nwrote ${outFile} (total ${elapsed(t0)}; load average now ${load1()})`)
