// The Responses API's kept responses, bounded by count and by bytes, the
// oldest dropped first; items reachable while some kept response holds them.
const { ResponseStore } = require('../server/response-store.js')

const response = (id, text, itemId = `msg_${id}`) => ({
  id,
  object: 'response',
  output: [{ type: 'message', id: itemId, role: 'assistant', content: [{ type: 'output_text', text }] }],
})
const user = (text) => ({ type: 'message', role: 'user', content: text })

test('the oldest go first past the count; every input item gets an id', () => {
  const store = new ResponseStore({ max: 2 })
  store.put(response('r1', 'a'), [user('1')])
  store.put(response('r2', 'b'), [user('2')])
  store.put(response('r3', 'c'), [user('3')])
  expect([store.get('r1'), store.get('r2')?.id, store.get('r3')?.id]).toEqual([undefined, 'r2', 'r3'])
  expect(store.size).toBe(2)
  expect(store.item('msg_r1')).toBeUndefined()
  expect(store.item('msg_r3')).toMatchObject({ role: 'assistant' })
  expect(store.input('r3')).toEqual([{ ...user('3'), id: expect.stringMatching(/^msg_/) }])
  expect(store.conversation('r3').map((i) => i.role)).toEqual(['user', 'assistant'])
})

test('the oldest go first past the bytes; one larger than the bound is not kept', () => {
  const one = Buffer.byteLength(JSON.stringify(response('r1', 'x'.repeat(1000)))) + Buffer.byteLength(JSON.stringify([]))
  const store = new ResponseStore({ max: 100, maxBytes: 2 * one + 10 })
  for (const id of ['r1', 'r2', 'r3']) expect(store.put(response(id, 'x'.repeat(1000)), [])).toBe(true)
  expect([store.get('r1'), !!store.get('r2'), !!store.get('r3')]).toEqual([undefined, true, true])
  expect(store.bytes).toBeLessThanOrEqual(2 * one + 10)
  expect(store.put(response('big', 'x'.repeat(10_000)), [])).toBe(false)
  expect(store.get('big')).toBeUndefined()
  expect(store.size).toBe(2)
})

test('an item stays while a later response of its conversation holds it; delete frees the rest', () => {
  const store = new ResponseStore()
  store.put(response('r1', 'a', 'msg_a'), [user('1')])
  store.put(response('r2', 'b', 'msg_b'), store.conversation('r1').concat(user('2')))
  expect(store.delete('r1')).toBe(true)
  expect(store.item('msg_a')).toMatchObject({ id: 'msg_a' }) // r2's conversation holds it
  expect(store.delete('r2')).toBe(true)
  expect([store.item('msg_a'), store.item('msg_b'), store.size, store.bytes]).toEqual([undefined, undefined, 0, 0])
  expect(store.delete('r2')).toBe(false)
})

test('max 0 keeps nothing; bad bounds are refused', () => {
  const store = new ResponseStore({ max: 0 })
  expect(store.put(response('r1', 'a'), [])).toBe(false)
  expect(() => new ResponseStore({ max: -1 })).toThrow(/responsesMax/)
  expect(() => new ResponseStore({ maxBytes: 1.5 })).toThrow(/responsesMaxBytes/)
})

describe('kept on disk (responsesFile)', () => {
  const fs = require('node:fs')
  const os = require('node:os')
  const path = require('node:path')
  const { execFileSync } = require('node:child_process')
  let dir
  beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-engine-responses-'))))
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }))

  async function written(file, n = 3) {
    const store = new ResponseStore({ file })
    for (let i = 1; i <= n; i++) store.put(response(`r${i}`, `answer ${i}`), [user(`question ${i}`)])
    await store.close()
    return store
  }

  test('written after a change and at close, read back by the next store in order, with the same items', async () => {
    const file = path.join(dir, 'kept.responses')
    const store = new ResponseStore({ file })
    expect(store.loadError).toBeNull()
    store.put(response('r1', 'a'), [user('1')])
    // A moment after the change, without close.
    await new Promise((r) => setTimeout(r, 600))
    expect(fs.existsSync(file)).toBe(true)
    expect(new ResponseStore({ file }).get('r1')).toEqual(store.get('r1'))
    store.put(response('r2', 'b'), [user('2')])
    store.delete('r1')
    await store.close()
    const again = new ResponseStore({ file })
    expect(again.loadError).toBeNull()
    expect([again.get('r1'), again.get('r2')]).toEqual([undefined, store.get('r2')])
    expect(again.input('r2')).toEqual(store.input('r2'))
    expect(again.item('msg_r2')).toEqual(store.item('msg_r2'))
    expect(again.bytes).toBe(store.bytes)
    // No temporary file left beside it; readable by its owner only.
    expect(fs.readdirSync(dir)).toEqual(['kept.responses'])
    expect(fs.statSync(file).mode & 0o077).toBe(0)
  })

  test('read back under the bounds of today: the oldest go first', async () => {
    const file = path.join(dir, 'kept.responses')
    await written(file, 5)
    const small = new ResponseStore({ file, max: 2 })
    expect([small.size, !!small.get('r4'), !!small.get('r5'), small.get('r1')]).toEqual([2, true, true, undefined])
  })

  test('a damaged, cut, altered or foreign file is not used, says why, and is replaced at the next change', async () => {
    const file = path.join(dir, 'kept.responses')
    await written(file)
    const valid = fs.readFileSync(file)
    const cases = {
      'one byte of the body flipped': (() => {
        const b = Buffer.from(valid)
        b[b.length - 10] ^= 0x04
        return b
      })(),
      'cut short': valid.subarray(0, valid.length - 7),
      'not ours': Buffer.from('GGUF\u0003\u0000\u0000\u0000'),
      empty: Buffer.alloc(0),
      'a valid checksum over the wrong shape': (() => {
        const body = Buffer.from(JSON.stringify({ responses: [{ response: { id: 7, output: 'x' }, input: [] }] }))
        const sum = require('node:crypto').createHash('sha256').update(body).digest('hex')
        return Buffer.concat([Buffer.from(`llama-engine responses 1\n${body.length} ${sum}\n`), body])
      })(),
    }
    for (const [name, bytes] of Object.entries(cases)) {
      fs.writeFileSync(file, bytes)
      const store = new ResponseStore({ file })
      expect({ name, size: store.size, why: typeof store.loadError }).toEqual({ name, size: 0, why: 'string' })
    }
    expect(new ResponseStore({ file }).loadError).toMatch(/not a kept response/)
    // Larger than a store of these bounds writes.
    fs.writeFileSync(file, Buffer.alloc(3 * 1024 + 4097))
    expect(new ResponseStore({ file, maxBytes: 1024 }).loadError).toMatch(/more than a store/)
    // A directory.
    expect(new ResponseStore({ file: dir }).loadError).toMatch(/not a regular file/)
    // The next change replaces the damaged file with a good one.
    fs.writeFileSync(file, 'garbage')
    const store = new ResponseStore({ file })
    store.put(response('r9', 'z'), [user('9')])
    await store.close()
    expect(new ResponseStore({ file }).get('r9')).toMatchObject({ id: 'r9' })
  })

  test('a write that cannot land says why and keeps the store in memory', async () => {
    const store = new ResponseStore({ file: path.join(dir, 'no', 'such', 'dir', 'kept.responses') })
    expect(store.loadError).toBeNull()
    store.put(response('r1', 'a'), [user('1')])
    await expect(store.flush()).rejects.toMatchObject({ code: 'ENOENT' })
    expect(store.writeError).toMatchObject({ code: 'ENOENT' })
    expect(store.get('r1')).toMatchObject({ id: 'r1' })
  })

  test('fuzz, in a child process: 400 mutated files, each read back whole or refused, never a throw', async () => {
    const file = path.join(dir, 'kept.responses')
    await written(file, 4)
    const script = `
      const fs = require('node:fs'), crypto = require('node:crypto')
      const { ResponseStore } = require(${JSON.stringify(path.join(__dirname, '..', 'server', 'response-store.js'))})
      const valid = fs.readFileSync(${JSON.stringify(file)})
      const header = valid.indexOf(10, valid.indexOf(10) + 1) + 1
      let x = 20261128
      const rand = (n) => ((x = (x * 1103515245 + 12345) >>> 0), x % n)
      const out = { loaded: 0, refused: 0, kinds: {} }
      for (let i = 0; i < 400; i++) {
        let b = Buffer.from(valid)
        const kind = i % 4
        const at = rand(b.length)
        if (kind === 0) b = b.subarray(0, at)
        else if (kind === 1) b[at] ^= 1 << rand(8)
        else {
          // The body changed with its checksum and length made right again:
          // the shape checks (and JSON.parse) meet it.
          let body = Buffer.from(b.subarray(header))
          const j = rand(body.length)
          if (kind === 2) body[j] = rand(256)
          else body = Buffer.concat([body.subarray(0, j), body.subarray(j + 1 + rand(40))])
          const sum = crypto.createHash('sha256').update(body).digest('hex')
          b = Buffer.concat([Buffer.from('llama-engine responses 1\\n' + body.length + ' ' + sum + '\\n'), body])
        }
        fs.writeFileSync(${JSON.stringify(file)} + '.f', b)
        const s = new ResponseStore({ file: ${JSON.stringify(file)} + '.f' })
        const ok = s.loadError === null
        if (ok && s.size > 4) throw new Error('read back ' + s.size + ' responses of 4')
        out[ok ? 'loaded' : 'refused']++
        out.kinds[kind] = (out.kinds[kind] || 0) + (ok ? 0 : 1)
      }
      console.log(JSON.stringify(out))`
    const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { timeout: 120000 }).toString())
    expect(out.loaded + out.refused).toBe(400)
    // Cut files and flipped bits: the length or the checksum refuses every one.
    expect([out.kinds[0], out.kinds[1]]).toEqual([100, 100])
  })
})
