#!/usr/bin/env node
// Builds llama.cpp's reference multimodal program `llama-mtmd-cli` from the
// vendored sources, for tests only (comparing our output with llama.cpp's
// own), into target/mtmd-cli/llama-mtmd-cli, and prints its path. Does
// nothing (but print the path) when it is already built and newer than its
// inputs.
//
// Fast path: compile tools/mtmd/mtmd-cli.cpp, and common's command-line
// parser, console and debug helpers that the addon's build leaves out (patch 0013; the downloader it
// calls stubbed: scripts/mtmd-cli-stubs.cpp), (g++ -O2, with the
// defines and include dirs the cargo build compiled llama-common with, read
// from its compile_commands.json, so the structs agree) and link it against
// the static libraries the cargo build of llama-cpp-sys-2 left under
// target/release/build/llama-cpp-sys-2-*/out/build (libmtmd, libllama-common,
// libllama, libggml*, vendor libs; the newest out dir that has libmtmd.a,
// i.e. a build with the `mtmd` feature). About a minute (arg.cpp is large;
// through ccache when it is installed).
// Fallback (no such out dir, or --cmake): a separate cmake build of the
// vendored llama.cpp into target/mtmd-cli/build (-j2; ~10 min).
//
//   node scripts/mtmd-cli.mjs [--cmake] [--force] [--verbose]
//   import { buildMtmdCli } from './mtmd-cli.mjs'  -> the binary's path
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const LLAMA = path.join(ROOT, 'vendor', 'llama-cpp-sys-2', 'llama.cpp');
const CLI_SRC = path.join(LLAMA, 'tools', 'mtmd', 'mtmd-cli.cpp');
const OUT_DIR = path.join(ROOT, 'target', 'mtmd-cli');
export const MTMD_CLI = path.join(OUT_DIR, 'llama-mtmd-cli');
const STUBS = path.join(ROOT, 'scripts', 'mtmd-cli-stubs.cpp');
const EXTRA_COMMON = ['arg.cpp', 'preset.cpp', 'console.cpp', 'debug.cpp'];

const mtime = (f) => { try { return fs.statSync(f).mtimeMs; } catch { return 0; } };

function findFiles(dir, pred, out = []) {
  let entries;
  try { entries = fs.readdirSync(dir, { withFileTypes: true }); } catch { return out; }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) findFiles(p, pred, out);
    else if (pred(e.name, p)) out.push(p);
  }
  return out;
}

/** The newest llama-cpp-sys-2 cmake build dir (…/out/build) that holds libmtmd.a, or null. */
export function findCargoBuild(profiles = ['release', 'debug']) {
  const found = [];
  for (const profile of profiles) {
    const base = path.join(ROOT, 'target', profile, 'build');
    let dirs = [];
    try { dirs = fs.readdirSync(base).filter((d) => d.startsWith('llama-cpp-sys-2-')); } catch { continue; }
    for (const d of dirs) {
      const build = path.join(base, d, 'out', 'build');
      const mtmd = findFiles(build, (n) => n === 'libmtmd.a')[0];
      if (mtmd && fs.existsSync(path.join(build, 'compile_commands.json'))) found.push({ build, at: mtime(mtmd) });
    }
  }
  found.sort((a, b) => b.at - a.at);
  return found[0]?.build ?? null;
}

function splitCommand(cmd) {
  const out = [];
  const re = /"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g;
  let m;
  while ((m = re.exec(cmd))) out.push(m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2] ?? m[3]);
  return out;
}

/** -D / -I flags a llama-common consumer needs, from the build's compile_commands.json. */
function commonFlags(build) {
  const db = JSON.parse(fs.readFileSync(path.join(build, 'compile_commands.json'), 'utf8'));
  const entry = db.find((e) => e.file.replace(/\\/g, '/').endsWith('/common/common.cpp'));
  if (!entry) throw new Error(`${build}: common/common.cpp is not in compile_commands.json (llama-common not built?)`);
  const args = entry.arguments ?? splitCommand(entry.command);
  const flags = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '-D' || a === '-I' || a === '-isystem') flags.push(a, args[++i]);
    else if (/^-[DI]./.test(a) || a.startsWith('-std=') || a === '-m64' || a === '-pthread') flags.push(a);
  }
  return flags;
}

function run(cmd, args, { verbose, cwd } = {}) {
  if (verbose) console.error(`$ ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { cwd, stdio: verbose ? ['ignore', 'inherit', 'inherit'] : ['ignore', 'pipe', 'pipe'], encoding: 'utf8' });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`${cmd} exited with ${r.status}\n$ ${cmd} ${args.join(' ')}\n${(r.stderr || '').slice(-4000)}`);
  return r;
}

function linkLibs(build) {
  const all = findFiles(build, (n) => n.endsWith('.a'));
  const byName = new Map();
  for (const p of all) if (!byName.has(path.basename(p))) byName.set(path.basename(p), p);
  const need = ['libmtmd.a', 'libllama-common.a', 'libllama-common-base.a', 'libllama.a', 'libggml.a', 'libggml-cpu.a', 'libggml-base.a'];
  for (const n of need) if (!byName.has(n)) throw new Error(`${build}: ${n} not found`);
  // order: consumers first; the whole set in a group anyway (vendor libs, backends)
  const rest = [...byName.keys()].filter((n) => !need.includes(n)).sort();
  return [...need, ...rest].map((n) => byName.get(n));
}

function cacheBool(build, key) {
  try {
    const m = fs.readFileSync(path.join(build, 'CMakeCache.txt'), 'utf8').match(new RegExp(`^${key}:[A-Z]+=(.*)$`, 'm'));
    return m ? /^(ON|TRUE|1|YES)$/i.test(m[1].trim()) : false;
  } catch { return false; }
}

function buildFromCargo(build, { verbose }) {
  const libs = linkLibs(build);
  const inputs = [CLI_SRC, STUBS, ...libs];
  if (mtime(MTMD_CLI) > Math.max(...inputs.map(mtime))) return MTMD_CLI;
  fs.mkdirSync(OUT_DIR, { recursive: true });
  // The program, and what the addon's llama-common leaves out (patch 0013)
  // that it needs: the command-line parser, presets, and stubs for the
  // downloader those call (scripts/mtmd-cli-stubs.cpp).
  const sources = [CLI_SRC, ...EXTRA_COMMON.map((f) => path.join(LLAMA, 'common', f)), STUBS];
  const cxx = spawnSync('ccache', ['--version'], { stdio: 'ignore' }).status === 0 ? ['ccache', 'g++'] : ['g++'];
  const objs = sources.map((src) => {
    const obj = path.join(OUT_DIR, `${path.basename(src)}.o`);
    run(cxx[0], [...cxx.slice(1), '-std=c++17', '-O2', ...commonFlags(build), `-I${path.join(LLAMA, 'tools', 'mtmd')}`, `-I${path.join(LLAMA, 'common')}`, '-c', src, '-o', obj], { verbose });
    return obj;
  });
  const sys = ['-fopenmp', '-lpthread', '-ldl', '-lm'];
  if (cacheBool(build, 'LLAMA_OPENSSL') || cacheBool(build, '_OPENSSL_FOUND')) sys.unshift('-lssl', '-lcrypto');
  const tmp = `${MTMD_CLI}.tmp`;
  run('g++', ['-o', tmp, ...objs, '-Wl,--start-group', ...libs, '-Wl,--end-group', ...sys], { verbose });
  fs.renameSync(tmp, MTMD_CLI);
  for (const obj of objs) fs.rmSync(obj, { force: true });
  return MTMD_CLI;
}

function buildWithCmake({ verbose }) {
  const build = path.join(OUT_DIR, 'build');
  const bin = path.join(build, 'bin', 'llama-mtmd-cli');
  const srcNewest = Math.max(mtime(CLI_SRC), mtime(path.join(LLAMA, 'CMakeLists.txt')));
  if (fs.existsSync(MTMD_CLI) && mtime(MTMD_CLI) > srcNewest && mtime(MTMD_CLI) >= mtime(bin)) return MTMD_CLI;
  run('cmake', ['-S', LLAMA, '-B', build, '-DCMAKE_BUILD_TYPE=Release', '-DBUILD_SHARED_LIBS=OFF', '-DLLAMA_BUILD_TOOLS=ON', '-DLLAMA_BUILD_MTMD=ON',
    '-DLLAMA_CURL=OFF', '-DLLAMA_OPENSSL=OFF', '-DLLAMA_BUILD_TESTS=OFF', '-DLLAMA_BUILD_EXAMPLES=OFF', '-DLLAMA_BUILD_SERVER=OFF'], { verbose });
  run('cmake', ['--build', build, '--target', 'llama-mtmd-cli', '-j2'], { verbose });
  fs.copyFileSync(bin, `${MTMD_CLI}.tmp`);
  fs.chmodSync(`${MTMD_CLI}.tmp`, 0o755);
  fs.renameSync(`${MTMD_CLI}.tmp`, MTMD_CLI);
  return MTMD_CLI;
}

/** Builds (when needed) and returns the path of target/mtmd-cli/llama-mtmd-cli. */
export function buildMtmdCli({ cmake = false, force = false, verbose = false } = {}) {
  if (force) fs.rmSync(MTMD_CLI, { force: true });
  const build = cmake ? null : findCargoBuild();
  if (build) return buildFromCargo(build, { verbose });
  if (!cmake && verbose) console.error('mtmd-cli: no cargo build with libmtmd.a under target/*/build/llama-cpp-sys-2-*/out; building with cmake');
  return buildWithCmake({ verbose });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  try {
    console.log(buildMtmdCli({ cmake: args.includes('--cmake'), force: args.includes('--force'), verbose: args.includes('--verbose') }));
  } catch (e) {
    console.error(`mtmd-cli: ${e.message}`);
    process.exit(1);
  }
}
