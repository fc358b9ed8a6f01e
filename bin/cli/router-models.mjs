// The models a `serve` router serves (bin/cli/serve.mjs builds the router
// from the command line): ours given as ALIAS=URI, the preset's (ours in
// JSON or llama-server's INI, presets.mjs), the --models directory's and,
// as llama-server's router, the Hugging Face cache's. Listed at start and
// again on each reload (GET /models?reload=1).
import { readdirSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { UsageError } from './table.mjs'
import { SERVE_TABLE } from './serve-options.mjs'
import { BUILTIN_TEMPLATES } from './common.mjs'
import { readPresetFile } from './presets.mjs'

/**
 * The preset's models (`--models-preset`, read again on each reload): ours
 * in JSON, or llama-server's INI, whose sections' flags become each model's
 * load options under the command line's (llama-server's precedence: the
 * command line, the model's section, `[*]`). A section without a model
 * names a model of the cache (its settings; resolved with the cache's list).
 */
export function presetModels(router) {
  const { kind, models } = readPresetFile(router.preset, SERVE_TABLE)
  if (kind === 'json') return models
  return models.map((m) => {
    const load = router.loadOf(m.argv)
    const options = Object.fromEntries(Object.entries(load).filter(([k]) => !(k in router.engineOptions) || router.engineOptions[k] === undefined))
    return { name: m.name, uri: m.uri, options, preload: m.loadOnStartup, dedup: m.dedup }
  })
}

/**
 * Every model the router serves now: the aliases, the preset's, the
 * directory's and (llama-server's router) the cache's, by name, the first
 * source of a name winning; a preset section naming a cache model gives it
 * its settings; `dedup-cache-models` hides the cache entry of a file a
 * preset names (still served by its name).
 */
export async function routerModels(router, inspectModel, listCachedModels, resolveModel) {
  let models = [...router.models]
  const add = (m) => {
    if (!models.some((x) => x.name === m.name)) models.push(m)
  }
  const preset = router.preset !== undefined ? presetModels(router) : []
  for (const m of preset) if (m.uri !== undefined) add(m)
  if (router.dir !== undefined) for (const m of await modelsIn(router.dir, inspectModel, router.engineOptions)) add(m)
  if (router.cache) {
    const offline = { offline: true }
    const hidden = new Set()
    for (const m of preset.filter((p) => p.dedup && p.uri !== undefined)) {
      for (const uri of [m.uri, m.options?.draftModelPath]) {
        if (typeof uri === 'string') hidden.add(await resolveModel(uri, offline).catch(() => null))
      }
    }
    for (const c of listCachedModels()) {
      const settings = preset.find((p) => p.uri === undefined && p.name === c.name)
      const options = { ...(c.mmproj && router.engineOptions.mmprojPath === undefined ? { mmprojPath: c.mmproj } : {}), ...settings?.options }
      add({ name: c.name, uri: c.path, options, hidden: hidden.has(c.path), preload: settings?.preload })
    }
  }
  const unknown = preset.find((p) => p.uri === undefined && !models.some((m) => m.name === p.name))
  if (unknown) throw new UsageError(`--models-preset: [${unknown.name}] names no model (give model or hf-repo; no model of the cache has that name)`)
  // As llama-server: a model without a chat template chats in ChatML (a
  // local file is read now; a remote one is not fetched for it).
  const out = []
  for (const { dedup, ...m } of models) {
    const load = { ...router.engineOptions, ...m.options, modelPath: m.uri }
    if (!/^(hf:|https?:\/\/)/i.test(m.uri) && m.options?.chatTemplate === undefined) {
      const chat = await withChatTemplate(load, inspectModel)
      if (chat.chatTemplate !== load.chatTemplate) m.options = { ...m.options, chatTemplate: chat.chatTemplate }
    }
    out.push(m)
  }
  return out
}

/**
 * The load options with ChatML for a model whose GGUF has no chat template
 * (as llama-server chats with such a model), unless --chat-template gave one.
 */
export async function withChatTemplate(load, inspectModel) {
  if (load.chatTemplate !== undefined) return load
  const info = await inspectModel(load.modelPath, { offline: load.offline, contextSize: 256, parallel: 1 }).catch(() => null)
  if (info?.kind === 'model' && !info.chatTemplate && !info.chatTemplateError) return { ...load, chatTemplate: BUILTIN_TEMPLATES.chatml }
  return load
}

/**
 * The models of `--models DIR`: every GGUF in it that is a model (not a
 * projector or a LoRA adapter), named by its file without `.gguf`, with
 * inspect's estimate of its memory for the context and slots asked.
 */
async function modelsIn(dir, inspectModel, load) {
  let names
  try {
    names = readdirSync(dir)
      .filter((f) => /\.gguf$/i.test(f))
      .sort()
  } catch (e) {
    throw new UsageError(`--models: cannot read ${dir} (${e.code || e.message})`)
  }
  const out = []
  for (const f of names) {
    const path = join(resolve(dir), f)
    let info
    try {
      info = await inspectModel(path, { contextSize: load.contextSize ?? 4096, parallel: load.parallel ?? 4 })
    } catch {
      continue // not a GGUF this build reads: not served
    }
    if (info.kind !== 'model') continue
    const model = { name: f.replace(/\.gguf$/i, ''), uri: path, bytes: typeof info.memory?.total === 'number' ? info.memory.total : info.fileBytes }
    // As llama-server: a model without a chat template chats in ChatML.
    if (load.chatTemplate === undefined && !info.chatTemplate && !info.chatTemplateError) model.options = { chatTemplate: BUILTIN_TEMPLATES.chatml }
    out.push(model)
  }
  return out
}

