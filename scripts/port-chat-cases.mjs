// Ports the parsing cases of llama.cpp's tests/test-chat.cpp (as vendored
// in the PyPI sdist llama_cpp_python 0.3.36) into
// __test__/fixtures/chat-outputs.json: per template, raw model outputs and
// the message each must parse to (content, reasoning, tool calls), with the
// request settings of the case (tools, thinking, reasoning format, parallel
// calls). Cases, not code: only the C++ test builder chains of the simple
// shape are read (`tst.test(<literal>)…expect…run()`); a case that uses a
// variable, a partial input, a schema or anything else is skipped and
// counted. The templates are copied to __test__/fixtures/chat-templates/.
//
//   node scripts/port-chat-cases.mjs <dir of the extracted sdist>
import { copyFileSync, existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const sdist = process.argv[2]
if (!sdist) throw new Error('usage: node scripts/port-chat-cases.mjs <llama_cpp_python-0.3.36 directory>')
const llama = join(sdist, 'vendor', 'llama.cpp')
const src = readFileSync(join(llama, 'tests', 'test-chat.cpp'), 'utf8')

// C++ string literals, adjacent ones concatenated: "…" with escapes, R"d(…)d".
function readStrings(text, at) {
  let out = ''
  let i = at
  let any = false
  for (;;) {
    while (/\s/.test(text[i])) i++
    if (text.startsWith('R"', i)) {
      const open = text.indexOf('(', i)
      const delim = text.slice(i + 2, open)
      const end = text.indexOf(`)${delim}"`, open)
      if (open < 0 || end < 0) throw new Error('an unterminated raw string')
      out += text.slice(open + 1, end)
      i = end + delim.length + 2
      any = true
    } else if (text[i] === '"') {
      i++
      while (text[i] !== '"') {
        if (i >= text.length) throw new Error('an unterminated string')
        if (text[i] === '\\') {
          const c = text[i + 1]
          const map = { n: '\n', t: '\t', r: '\r', '"': '"', '\\': '\\', "'": "'", 0: '\0' }
          if (c === 'u') {
            out += String.fromCodePoint(parseInt(text.slice(i + 2, i + 6), 16))
            i += 6
            continue
          }
          if (!(c in map)) throw new Error(`escape \\${c}`)
          out += map[c]
          i += 2
        } else {
          out += text[i++]
        }
      }
      i++
      any = true
    } else break
  }
  return any ? { value: out, end: i } : null
}

// Tools: static common_chat_tool NAME{ "name", "description", R"(parameters)" };
const TOOLS = {}
for (const m of src.matchAll(/static common_chat_tool (\w+)\s*\{/g)) {
  let i = m.index + m[0].length
  const fields = []
  for (let k = 0; k < 3; k++) {
    const q = src.indexOf('"', i)
    const start = src[q - 1] === 'R' ? q - 1 : q
    const s = readStrings(src, start)
    fields.push(s.value)
    i = s.end
  }
  TOOLS[m[1]] = { type: 'function', function: { name: fields[0], description: fields[1], parameters: JSON.parse(fields[2]) } }
}

// The expected messages the cases name (test-chat.cpp's constants).
const msg = (content, reasoning = '', name = '', args = '', id = '') => ({ content, reasoning, calls: name || id ? [{ name, arguments: args, id }] : [] })
const MESSAGES = {
  message_assist: msg("Hello, world!\nWhat's up?"),
  message_assist_empty: msg(''),
  message_assist_thoughts_unparsed_deepseek: msg("<think>I'm\nthinking</think>Hello, world!\nWhat's up?"),
  message_assist_thoughts_unparsed_r7b: msg("<|START_THINKING|>I'm\nthinking<|END_THINKING|>Hello, world!\nWhat's up?"),
  message_assist_thoughts_unparsed_magistral: msg('[THINK]raisonnement[/THINK]Réponse'),
  message_assist_thoughts: msg("Hello, world!\nWhat's up?", "I'm\nthinking"),
  message_assist_thoughts_unopened_unparsed: msg("I'm\nthinking</think>Hello, world!\nWhat's up?"),
  message_assist_thoughts_no_content: msg('', "I'm\nthinking"),
  message_assist_call: msg('', '', 'special_function', '{"arg1": 1}'),
  message_assist_call_noopt: msg('', '', 'special_function_with_opt', '{"arg1": 1}'),
  message_assist_call_withopt: msg('', '', 'special_function_with_opt', '{"arg1": 1, "arg2": 2}'),
  message_assist_call_content: msg("Hello, world!\nWhat's up?", '', 'special_function', '{"arg1":1}'),
  message_assist_call_empty_args: msg('', '', 'special_function'),
  message_assist_call_thoughts: msg('', "I'm\nthinking", 'special_function', '{"arg1":1}'),
  message_assist_call_thoughts_unparsed: msg("<think>I'm\nthinking</think>\n\n", '', 'special_function', '{"arg1": 1}'),
  message_assist_call_thoughts_content: msg("Hello, world!\nWhat's up?", "I'm\nthinking", 'special_function', '{"arg1": 1}'),
  message_assist_call_id: msg('', '', 'special_function', '{"arg1":1}', '123456789'),
  message_assist_call_idx: msg('', '', 'special_function', '{"arg1":1}', '0'),
  message_assist_thoughts_call_idx: msg('', "I'm\nthinking", 'special_function', '{"arg1": 1}', '0'),
  message_assist_call_python: msg('', '', 'python', '{"code":"print(\'hey\')"}'),
  message_assist_call_python_lines: msg('', '', 'python', '{"code":"# This is a program:\\nprint(\'hey\')"}'),
  message_assist_json_content: msg('{\n  "response": "Hello, world!\\nWhat\'s up?"\n}'),
}

// Balanced (…) from `at` (the opening parenthesis); strings skipped.
function balanced(text, at) {
  let depth = 0
  for (let i = at; i < text.length; i++) {
    const c = text[i]
    if (c === "'") {
      // A character literal: '"' or '\''.
      i = text.indexOf("'", i + (text[i + 1] === '\\' ? 3 : 2))
      continue
    }
    if (c === '/' && text[i + 1] === '/') {
      i = text.indexOf('\n', i)
      continue
    }
    if (c === '"' || (c === 'R' && text[i + 1] === '"' && !/\w/.test(text[i - 1]))) {
      const s = readStrings(text, i)
      i = s.end - 1
      continue
    }
    if (c === '(' || c === '{') depth++
    if (c === ')' || c === '}') {
      depth--
      if (depth === 0) return i
    }
  }
  return -1
}

const skipped = {}
const skip = (why) => (skipped[why] = (skipped[why] || 0) + 1)
const cases = {}
const blocks = [...src.matchAll(/peg_tester\("models\/templates\/([^"]+)"/g)]
blocks.forEach((b, bi) => {
  const template = b[1]
  const end = bi + 1 < blocks.length ? blocks[bi + 1].index : src.length
  const body = src.slice(b.index, end)
  for (const t of body.matchAll(/\btst2?\.test\(/g)) {
    const open = t.index + t[0].length - 1
    let close
    let input
    try {
      close = balanced(body, open)
      input = readStrings(body, open + 1)
    } catch {
      skip('unreadable')
      continue
    }
    if (!input || input.end < close - 1 && body.slice(input.end, close).trim() !== '') {
      skip('input not a literal')
      continue
    }
    const runAt = body.indexOf('.run()', close)
    const chain = body.slice(close + 1, runAt)
    const c = { input: input.value, tools: [], parallel_tool_calls: false, enable_thinking: true, reasoning_format: 'none' }
    let expect = null
    let ok = true
    for (const m of chain.matchAll(/\.(\w+)\(/g)) {
      const name = m[1]
      const argOpen = m.index + m[0].length - 1
      const argClose = balanced(chain, argOpen)
      const arg = chain.slice(argOpen + 1, argClose).trim()
      if (name === 'tools') {
        const names = arg.replace(/[{}\s]/g, '').split(',').filter(Boolean)
        if (!names.every((n) => TOOLS[n])) ok = false
        else c.tools = names.map((n) => TOOLS[n])
      } else if (name === 'parallel_tool_calls') c.parallel_tool_calls = arg === 'true'
      else if (name === 'enable_thinking') c.enable_thinking = arg === 'true'
      else if (name === 'reasoning_format') {
        if (arg === 'COMMON_REASONING_FORMAT_NONE') c.reasoning_format = 'none'
        else if (arg === 'COMMON_REASONING_FORMAT_AUTO' || arg === 'COMMON_REASONING_FORMAT_DEEPSEEK') c.reasoning_format = 'auto'
        else ok = false
      } else if (name === 'expect') {
        if (!MESSAGES[arg]) ok = false
        else expect = structuredClone(MESSAGES[arg])
      } else if (name === 'expect_content' || name === 'expect_reasoning') {
        const s = readStrings(chain, argOpen + 1)
        if (!s) ok = false
        else {
          expect ??= msg('')
          expect[name === 'expect_content' ? 'content' : 'reasoning'] = s.value
        }
      } else if (name === 'expect_tool_calls') {
        expect ??= msg('')
        expect.calls = []
        const inner = chain.slice(argOpen + 1, argClose)
        for (const call of inner.matchAll(/\{\s*(?=["R])/g)) {
          const n = readStrings(inner, call.index + call[0].length)
          const rest = inner.slice(n.end).replace(/^\s*,\s*/, '')
          const a = readStrings(rest, 0)
          if (!a) {
            ok = false
            break
          }
          const after = rest.slice(a.end).replace(/^\s*,\s*/, '')
          const id = after.startsWith('"') ? readStrings(after, 0).value : ''
          expect.calls.push({ name: n.value, arguments: a.value, id })
        }
      } else if (name === 'expect_reconstruction' || name === 'expect_reconstruction_prefix') {
        // (re-rendering the parsed message: not what this port checks)
      } else {
        ok = false
        skip(`.${name}()`)
      }
    }
    if (!ok || !expect) {
      if (ok) skip('no expectation')
      continue
    }
    ;(cases[template] ??= []).push({ ...c, expect })
  }
})

const fixtures = join(root, '__test__', 'fixtures')
for (const template of Object.keys(cases)) {
  const to = join(fixtures, 'chat-templates', template)
  if (!existsSync(to)) copyFileSync(join(llama, 'models', 'templates', template), to)
}
const total = Object.values(cases).reduce((n, c) => n + c.length, 0)
writeFileSync(
  join(fixtures, 'chat-outputs.json'),
  JSON.stringify({ source: 'llama_cpp_python-0.3.36/vendor/llama.cpp/tests/test-chat.cpp (scripts/port-chat-cases.mjs)', total, skipped, cases }, null, 1) + '\n',
)
console.log(`ported ${total} cases for ${Object.keys(cases).length} templates; skipped ${JSON.stringify(skipped)}`)
