// `llama-engine inspect PATH|URI`: what a GGUF holds and the memory it needs.
import { resolve } from 'node:path'
import { UsageError } from './table.mjs'
import { number, parseCommand } from './common.mjs'
import { USAGE } from './run.mjs'

const bytes = (n) => {
  if (typeof n !== 'number') return '?'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < units.length - 1) (n /= 1024), i++
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`
}

/** The lines `llama-engine inspect` prints for a description from inspectModel. */
export function describeInspection(info) {
  const row = (k, v) => `${`${k}:`.padEnd(18)}${v}`
  const lines = [row('file', `${info.path} (${bytes(info.fileBytes)})`)]
  if (info.kind === 'adapter') {
    lines.push(row('kind', `LoRA adapter (${info.adapterType}) for ${info.architecture}`))
    lines.push(row('rank / alpha', `${info.rank} / ${info.alpha}`))
    lines.push(row('tensors', `${info.tensors} (${info.parameters.toLocaleString('en-US')} parameters)`))
    return lines
  }
  if (info.kind === 'projector') {
    const reads = [info.vision && 'images', info.audio && 'audio'].filter(Boolean).join(' and ')
    lines.push(row('kind', `multimodal projector (${info.projectorType}) reading ${reads}, for mmprojPath`))
    if (info.vision) {
      const tokens = info.tokensPerImage != null ? `${info.tokensPerImage} tokens per image` : 'tokens per image by its size'
      lines.push(row('images', `${info.imageSize} px, patches of ${info.patchSize} px; ${tokens}`))
    }
    lines.push(row('projects to', `embedding ${info.embeddingLength ?? '?'} (the text model's)`))
    lines.push(row('tensors', `${info.tensors} (${info.parameters.toLocaleString('en-US')} parameters, ${bytes(info.weightBytes)})`))
    return lines
  }
  const params = info.parameters >= 1e9 ? `${(info.parameters / 1e9).toFixed(2)} B` : `${(info.parameters / 1e6).toFixed(1)} M`
  lines.push(row('architecture', `${info.architecture}${info.name ? ` (${info.name})` : ''}`))
  lines.push(row('parameters', params))
  lines.push(row('quantization', `${info.quantization ?? '?'}; tensors: ${info.tensorTypes.map((t) => `${t.type} ×${t.tensors}`).join(', ')}`))
  lines.push(row('context length', `${info.contextLength} (trained)`))
  const shape = [`${info.layers} layers`, `embedding ${info.embeddingLength}`]
  if (info.heads != null) shape.push(`${info.heads} heads (${info.kvHeads ?? info.heads} KV)`)
  if (info.slidingWindow) shape.push(`sliding window ${info.slidingWindow}`)
  if (info.experts) shape.push(`${info.experts} experts`)
  lines.push(row('layers', shape.join(', ')))
  lines.push(row('vocabulary', `${info.vocabSize} tokens`))
  lines.push(
    row('chat template', info.chatTemplate ? `yes; tool calls: ${info.toolCallFormat}` : info.chatTemplateError ? `unusable (${info.chatTemplateError})` : 'none'),
  )
  const m = info.memory
  if (m && m.error) lines.push(row('memory', `not computed (${m.error})`))
  else if (m) {
    lines.push(
      row(
        'memory',
        `${bytes(m.total)} for ${m.contextSize} tokens × ${m.parallel} slots: weights ${bytes(m.weights)}, KV cache ${bytes(m.kvCache)}, compute ${bytes(m.compute)}`,
      ),
    )
    lines.push(row('available', `${bytes(m.available)}: ${m.fits ? 'fits' : 'does NOT fit'}`))
  }
  return lines
}

// `llama-engine inspect PATH|URI`: what a GGUF is and what it needs.
export async function inspect(argv) {
  const { stdout, stderr } = process
  const parsed = parseCommand(
    'inspect',
    argv,
    { json: { type: 'boolean' }, ctx: { type: 'string' }, parallel: { type: 'string' }, offline: { type: 'boolean' }, 'cache-dir': { type: 'string' } },
    'one PATH or URI',
    USAGE,
  )
  if (typeof parsed === 'number') return parsed
  const { values: v, positionals } = parsed
  const { inspectModel } = await import('../../index.mjs')
  try {
    const options = { offline: Boolean(v.offline), cacheDir: v['cache-dir'] }
    if (v.ctx !== undefined) options.contextSize = number('ctx', v.ctx, 'int')
    if (v.parallel !== undefined) options.parallel = number('parallel', v.parallel, 'int')
    const where = /^(hf:|https?:\/\/)/i.test(positionals[0]) ? positionals[0] : resolve(positionals[0])
    const info = await inspectModel(where, options)
    stdout.write(v.json ? `${JSON.stringify(info, null, 2)}\n` : `${describeInspection(info).join('\n')}\n`)
    return 0
  } catch (e) {
    stderr.write(`error ${e.code || 'INTERNAL'}: ${e.message}\n`)
    return e instanceof UsageError ? 2 : 1
  }
}
