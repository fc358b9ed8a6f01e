// Fill-in-the-middle requests as the engine checks them (the fills
// themselves are tested on a real code model: __test__/real/infill.real.js,
// npm run test:real). SmolLM2 and gemma-3 have no FIM tokens.
const { loadTarget } = require('./helpers')

let engine
beforeAll(async () => {
  engine = await loadTarget({ parallel: 1 })
})
afterAll(() => engine?.dispose())

const refusal = async (promise) => {
  const e = await promise.then(
    () => null,
    (err) => err,
  )
  return e && { code: e.code, message: e.message }
}

test('a model without fill-in-the-middle tokens refuses, naming input_prefix', async () => {
  const e = await refusal(engine.infill({ input_prefix: 'def f(', input_suffix: '):\n', n_predict: 4 }))
  expect(e).toEqual({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^input_prefix: .*no fill-in-the-middle tokens/) })
  // complete() with the same fields is the same request.
  expect(await refusal(engine.complete({ input_prefix: 'a', input_suffix: 'b' }))).toEqual(e && { ...e, message: expect.stringMatching(/^input_prefix:/) })
})

const BIG = 'a'.repeat(5 << 20)
const CASES = {
  'a prefix without a suffix': [{ input_prefix: 'a' }, /^input_suffix: required/],
  'a suffix without a prefix': [{ input_suffix: 'b' }, /^input_prefix: required/],
  'extra files alone': [{ input_extra: [] }, /^input_prefix: required/],
  'a prefix that is not text': [{ input_prefix: 1, input_suffix: 'b' }, /^input_prefix: expected a string/],
  'extra files that are not a list': [{ input_prefix: 'a', input_suffix: 'b', input_extra: {} }, /^input_extra: expected an array/],
  'a file without text': [{ input_prefix: 'a', input_suffix: 'b', input_extra: [{ filename: 'x' }] }, /^input_extra\[0\]: text: required/],
  'a file that is not an object': [{ input_prefix: 'a', input_suffix: 'b', input_extra: [{ text: 'x' }, 'y'] }, /^input_extra\[1\]: expected an object/],
  'a 5,000-byte file name': [{ input_prefix: 'a', input_suffix: 'b', input_extra: [{ text: 'x', filename: 'f'.repeat(5000) }] }, /^input_extra\[0\]: filename: at most/],
  '1,025 files': [{ input_prefix: 'a', input_suffix: 'b', input_extra: Array.from({ length: 1025 }, () => ({ text: '' })) }, /^input_extra: at most 1024/],
  'messages beside a prefix': [{ input_prefix: 'a', input_suffix: 'b', messages: [{ role: 'user', content: 'hi' }] }, /^messages: .*takes a prompt/],
  '10 MB of prefix and suffix': [{ input_prefix: BIG, input_suffix: BIG }, /^prompt: at most/],
}

test.each(Object.keys(CASES))('%s is refused before the model sees it', async (name) => {
  const [request, message] = CASES[name]
  expect(await refusal(engine.complete(request))).toEqual({ code: 'INVALID_REQUEST', message: expect.stringMatching(message) })
})

test('infill() requires both texts itself', async () => {
  expect(await refusal(engine.infill({ input_prefix: 'a' }))).toEqual({ code: 'INVALID_REQUEST', message: 'input_suffix: required, a string (got nothing)' })
  expect(await refusal(engine.infill(null))).toEqual({ code: 'INVALID_REQUEST', message: expect.stringMatching(/^request:/) })
})
