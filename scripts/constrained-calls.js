// A required call on every template of llama.cpp's set, over SmolLM2:
// whether the family's constraint applies (its grammar drafts) and whether
// the forced answer holds a call within the budget. `node scripts/constrained-calls.js`
const fs = require('node:fs')
const path = require('node:path')
const { LlamaEngine, TARGET } = require('../__test__/helpers')

const dir = path.join(__dirname, '../__test__/fixtures/chat-templates')
const weather = {
  type: 'function',
  function: { name: 'get_weather', description: 'Get the weather in a city.', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
}

;(async () => {
  const counts = { call: 0, none: 0, refused: 0 }
  for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.jinja'))) {
    const engine = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, parallel: 1, chatTemplate: fs.readFileSync(path.join(dir, file), 'utf8') })
    const family = engine.status().toolCallFormat
    try {
      const r = await engine.complete({
        messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
        tools: [weather],
        tool_choice: 'required',
        parallel_tool_calls: false,
        chat_template_kwargs: { enable_thinking: false },
        temperature: 0,
        n_predict: 160,
      })
      const g = r.speculative.drafters.grammar
      const call = r.tool_calls?.[0]?.function
      counts[call ? 'call' : 'none']++
      console.log(`${file}\t${family}\t${g ? `constrained (${g.n_accepted} drafted)` : 'read only'}\t${call ? `${call.name} ${call.arguments}` : 'no call: ' + JSON.stringify((r.reasoning_content ?? '') + r.content).slice(0, 60)}`)
    } catch (e) {
      counts.refused++
      console.log(`${file}\t${family}\t${e.code}: ${e.message.slice(0, 100)}`)
    }
    await engine.dispose()
  }
  console.log(counts)
})()
