// llama.cpp's built-in chat formats by name (`--chat-template NAME`,
// llama_chat_apply_template's names), written as Jinja templates that
// render what llama.cpp's own formats render: checked against the cases of
// llama.cpp's tests/test-chat-template.cpp
// (__test__/fixtures/chat-templates/builtin-names.json).

const role = (names) => `{%- set r = {${Object.entries(names).map(([k, v]) => `'${k}': '${v}'`).join(', ')}}[m['role']] | default(m['role']) -%}`

export const BUILTIN_TEMPLATES = {
  chatml:
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  llama3:
    "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
  'command-r':
    `{%- for m in messages -%}${role({ system: 'SYSTEM', user: 'USER', assistant: 'CHATBOT' })}{{ '<|START_OF_TURN_TOKEN|><|' + r | upper + '_TOKEN|>' + m['content'] | trim + '<|END_OF_TURN_TOKEN|>' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif -%}`,
  // The system prompt opens the next turn that is not the model's.
  gemma:
    "{%- set ns = namespace(system='') -%}{%- for m in messages -%}{%- if m['role'] == 'system' -%}{%- set ns.system = ns.system + m['content'] -%}{%- else -%}{%- set r = 'model' if m['role'] == 'assistant' else m['role'] -%}{{ '<start_of_turn>' + r + '\\n' }}{%- if ns.system and r != 'model' -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}{{ m['content'] | trim + '<end_of_turn>\\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}",
  phi3: "{%- for m in messages -%}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}",
  phi4: "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '<|im_sep|>' + m['content'] + '<|im_end|>' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant<|im_sep|>' }}{%- endif -%}",
  'mistral-v7':
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ '[SYSTEM_PROMPT] ' + m['content'] + '[/SYSTEM_PROMPT]' }}{%- elif m['role'] == 'user' -%}{{ '[INST] ' + m['content'] + '[/INST]' }}{%- else -%}{{ ' ' + m['content'] + '</s>' }}{%- endif -%}{%- endfor -%}",
  granite:
    "{%- for m in messages -%}{{ '<|start_of_role|>' + m['role'] + '<|end_of_role|>' + m['content'] + '<|end_of_text|>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif -%}",
  deepseek:
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] }}{%- elif m['role'] == 'user' -%}{{ '### Instruction:\\n' + m['content'] + '\\n' }}{%- else -%}{{ '### Response:\\n' + m['content'] + '\\n<|EOT|>\\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ '### Response:\\n' }}{%- endif -%}",
  deepseek2:
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\\n\\n' }}{%- elif m['role'] == 'user' -%}{{ 'User: ' + m['content'] + '\\n\\n' }}{%- else -%}{{ 'Assistant: ' + m['content'] + '<｜end▁of▁sentence｜>' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}",
  vicuna:
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '\\n\\n' }}{%- elif m['role'] == 'user' -%}{{ 'USER: ' + m['content'] + '\\n' }}{%- else -%}{{ 'ASSISTANT: ' + m['content'] + '</s>\\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}",
  openchat:
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] + '<|end_of_turn|>' }}{%- else -%}{{ 'GPT4 Correct ' + m['role'] | capitalize + ': ' + m['content'] + '<|end_of_turn|>' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ 'GPT4 Correct Assistant:' }}{%- endif -%}",
  // The system prompt opens the next human turn; each human turn writes the
  // assistant's prefix itself.
  orion:
    "{%- set ns = namespace(system='') -%}{%- for m in messages -%}{%- if m['role'] == 'system' -%}{%- set ns.system = ns.system + m['content'] -%}{%- elif m['role'] == 'user' -%}{{ 'Human: ' }}{%- if ns.system -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}{{ m['content'] + '\\n\\nAssistant: </s>' }}{%- else -%}{{ m['content'] + '</s>' }}{%- endif -%}{%- endfor -%}",
  monarch:
    "{%- for m in messages -%}{{ ('' if loop.first else '<s>') + m['role'] + '\\n' + m['content'] + '</s>\\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<s>assistant\\n' }}{%- endif -%}",
}
