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
