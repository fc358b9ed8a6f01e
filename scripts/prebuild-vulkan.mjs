// `npm run prebuild:vulkan`: the Vulkan back end for the prebuilt Linux x64
// addon, as a ggml module (libggml-vulkan.so) in its own optional package,
// npm/linux-x64-gnu-vulkan/ (llama-engine-linux-x64-gnu-vulkan).
//
// The prebuilt addon's llama.cpp is built with GGML_BACKEND_DL: back ends
// are modules that register with libggml-base at run time. This builds one
// more from the same llama.cpp source (the one llama-cpp-sys-2 vendors) and
// the same compiler flags, with CMake, target `ggml-vulkan` only: a few
// minutes, most of it compiling shaders with glslc. The module needs
// libggml-base.so.0 (the platform package's) and the system's Vulkan loader,
// libvulkan.so.1, nothing else.
//
// Needs cmake, glslc, libvulkan-dev and spirv-headers (Debian packages,
// installed when missing and run as root) and Vulkan-Hpp headers of 1.3.268
// or newer (ggml uses VK_EXT_layer_settings): the system's when new enough,
// else VULKAN_INCLUDE_DIR, else Debian 13's libvulkan-dev package, fetched
// from deb.debian.org and unpacked (headers only) into target/.
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { compilerCacheEnv, root } from './native.mjs'
import { ensureVendored } from './vendor.mjs'

const t0 = Date.now()
const triple = 'linux-x64-gnu'
const pkgDir = join(root, 'npm', `${triple}-vulkan`)
const work = join(root, 'target', 'prebuilt', 'vulkan')
mkdirSync(work, { recursive: true })
const has = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0

if (process.platform !== 'linux' || process.arch !== 'x64') {
  console.log('npm run prebuild:vulkan builds the linux-x64-gnu Vulkan module; run it on Linux x86-64')
  process.exit(0)
}

// Debian packages.
const need = { cmake: 'cmake', glslc: 'glslc', 'c++': 'g++' }
const missing = Object.entries(need).filter(([cmd]) => !has(cmd)).map(([, pkg]) => pkg)
if (!existsSync('/usr/lib/x86_64-linux-gnu/libvulkan.so')) missing.push('libvulkan-dev')
if (!existsSync('/usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake')) missing.push('spirv-headers')
if (missing.length) {
  if (process.getuid?.() !== 0) throw new Error(`prebuild:vulkan needs ${missing.join(' ')} (apt-get install)`)
  console.log(`prebuild:vulkan: installing ${missing.join(' ')}`)
  execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit' })
  execFileSync('apt-get', ['install', '-y', '-qq', ...missing], { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } })
}

// Vulkan-Hpp new enough for ggml.
function headerVersion(dir) {
  const core = join(dir, 'vulkan', 'vulkan_core.h')
  if (!existsSync(core) || !existsSync(join(dir, 'vulkan', 'vulkan.hpp'))) return 0
  const m = /#define VK_HEADER_VERSION (\d+)/.exec(readFileSync(core, 'utf8'))
  const v = /#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(0, (\d+), (\d+)/.exec(readFileSync(core, 'utf8'))
  return m && v ? Number(v[1]) * 1e6 + Number(v[2]) * 1e3 + Number(m[1]) : 0
}
const MIN_HEADERS = 1003268 // 1.3.268
function vulkanHeaders() {
  if (process.env.VULKAN_INCLUDE_DIR) return process.env.VULKAN_INCLUDE_DIR
  if (headerVersion('/usr/include') >= MIN_HEADERS) return '/usr/include'
  const dir = join(work, 'vulkan-headers')
  const inc = join(dir, 'usr', 'include')
  if (headerVersion(inc) >= MIN_HEADERS) return inc
  // Debian 13 (trixie)'s libvulkan-dev: the headers only, unpacked; the
  // loader the module links against stays the system's.
  console.log('prebuild:vulkan: the system Vulkan headers are older than 1.3.268; fetching Debian 13 libvulkan-dev (headers only)')
  const mirror = process.env.DEBIAN_MIRROR || 'http://deb.debian.org/debian'
  const index = join(work, 'trixie-Packages.xz')
  execFileSync('curl', ['-fsSL', '-o', index, `${mirror}/dists/trixie/main/binary-amd64/Packages.xz`])
  const packages = execFileSync('xz', ['-dc', index], { encoding: 'utf8', maxBuffer: 1 << 30 })
  const entry = packages.split('\n\n').find((p) => p.startsWith('Package: libvulkan-dev\n'))
  const file = entry && /^Filename: (.+)$/m.exec(entry)?.[1]
  if (!file) throw new Error('libvulkan-dev is not in the Debian 13 index')
  const deb = join(work, 'libvulkan-dev.deb')
  execFileSync('curl', ['-fsSL', '-o', deb, `${mirror}/${file}`])
  rmSync(dir, { recursive: true, force: true })
  execFileSync('dpkg-deb', ['-x', deb, dir])
  if (headerVersion(inc) < MIN_HEADERS) throw new Error(`${file}: headers older than 1.3.268`)
  return inc
}

// The llama.cpp source llama-cpp-sys-2 builds the addon from: the patched copy.
ensureVendored()
const meta = JSON.parse(execFileSync('cargo', ['metadata', '--format-version', '1', '--locked'], { cwd: root, encoding: 'utf8', maxBuffer: 1 << 28 }))
const sysPkg = meta.packages.find((p) => p.name === 'llama-cpp-sys-2')
const src = join(sysPkg.manifest_path, '..', 'llama.cpp')
if (!existsSync(join(src, 'ggml', 'src', 'ggml-vulkan'))) throw new Error(`${src}: no ggml-vulkan source`)

// The prebuilt addon's flags (llama-cpp-sys-2 with `dynamic-backends`, no
// target-cpu): -march=x86-64, GGML_NATIVE off, back ends as modules.
const flags = '-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64 -w'
const build = join(work, 'build')
const configure = [
  '-S', src, '-B', build,
  '-DCMAKE_BUILD_TYPE=Release', '-DBUILD_SHARED_LIBS=ON', '-DCMAKE_SKIP_RPATH=ON',
  '-DGGML_BACKEND_DL=ON', '-DGGML_NATIVE=OFF', '-DGGML_CPU=OFF', '-DGGML_OPENMP=OFF', '-DGGML_CCACHE=OFF',
  '-DGGML_VULKAN=ON', `-DVulkan_INCLUDE_DIR=${vulkanHeaders()}`,
  '-DLLAMA_BUILD_COMMON=OFF', '-DLLAMA_BUILD_APP=OFF', '-DLLAMA_BUILD_TESTS=OFF', '-DLLAMA_BUILD_EXAMPLES=OFF',
  '-DLLAMA_BUILD_TOOLS=OFF', '-DLLAMA_BUILD_SERVER=OFF', '-DLLAMA_BUILD_UI=OFF', '-DLLAMA_CURL=OFF', '-DLLAMA_OPENSSL=OFF',
  '-DGGML_BUILD_TESTS=OFF', '-DGGML_BUILD_EXAMPLES=OFF',
  `-DCMAKE_C_FLAGS=${flags}`, `-DCMAKE_CXX_FLAGS=${flags}`,
]
console.log(`llama-engine: building the Vulkan module for ${triple} from ${src}`)
execFileSync('cmake', configure, { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, ...compilerCacheEnv() } })
const jobs = String(Number(process.env.CMAKE_BUILD_PARALLEL_LEVEL) || 2)
execFileSync('cmake', ['--build', build, '--target', 'ggml-vulkan', '-j', jobs], { stdio: ['ignore', process.env.CI ? 'ignore' : 'inherit', 'inherit'] })

const built = join(build, 'bin', 'libggml-vulkan.so')
mkdirSync(pkgDir, { recursive: true })
const out = join(pkgDir, 'libggml-vulkan.so')
execFileSync('strip', ['--strip-unneeded', '-o', out, built])

// What it may need on a user's machine: the platform package's ggml, the
// Vulkan loader, and the C/C++ runtimes.
const needed = [...execFileSync('readelf', ['-d', out], { encoding: 'utf8' }).matchAll(/\(NEEDED\)\s+Shared library: \[(.+?)\]/g)].map((m) => m[1])
const allowed = /^(libggml-base\.so\.0|libvulkan\.so\.1|libc\.so|libm\.so|libdl\.so|libpthread\.so|libgcc_s\.so|libstdc\+\+\.so|ld-linux)/
const extra = needed.filter((n) => !allowed.test(n))
if (extra.length) throw new Error(`libggml-vulkan.so would need ${extra.join(', ')}`)
if (/RUNPATH|RPATH/.test(execFileSync('readelf', ['-d', out], { encoding: 'utf8' }))) throw new Error('libggml-vulkan.so has a build rpath')
// ggml checks at load that the module's back-end API version is its own
// (GGML_BACKEND_API_VERSION): a module from another ggml is refused, and the
// engine says so in status().gpu.reason.

const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'))
const rootPkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
if (pkg.version !== rootPkg.version) throw new Error(`npm/${triple}-vulkan/package.json version ${pkg.version} != ${rootPkg.version}`)
const mb = statSync(out).size / 1048576
console.log(`llama-engine: ${pkg.name} in npm/${triple}-vulkan/: libggml-vulkan.so, ${mb.toFixed(1)} MiB; needs ${needed.join(', ')}; ${((Date.now() - t0) / 1000).toFixed(0)} s`)
