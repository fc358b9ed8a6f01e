// The cost of re-reading a growing answer with llama.cpp's parser (the
// families it reads are re-parsed at every token as they stream):
// `node scripts/reparse-cost.js`.
const fs = require('node:fs')
const { LlamaEngine, TARGET } = require('../__test__/helpers')
;(async () => {
  const glm = await LlamaEngine.load({ modelPath: TARGET, contextSize: 1024, parallel: 1, chatTemplate: fs.readFileSync(require('node:path').join(__dirname, '../__test__/fixtures') + '/chat-templates/GLM-4.6.jinja', 'utf8') })
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'd', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }]
  const words = 'Paris is the capital of France and a city of art, light and long walks by the river. '
  for (const size of [4000, 16000]) {
    const text = '<think>' + words.repeat(size / words.length / 2) + '</think>' + words.repeat(size / words.length / 2)
    const t0 = process.hrtime.bigint()
    let n = 0
    for (let end = 4; end <= text.length; end += 4) { glm.parseChatOutput(text.slice(0, end), { tools }); n++ }
    const us = Number(process.hrtime.bigint() - t0) / 1e3 / n
    console.log(`answer of ${text.length} chars: ${n} readings (one per ~token), mean ${us.toFixed(0)} µs per reading`)
  }
  await glm.dispose()
})()
