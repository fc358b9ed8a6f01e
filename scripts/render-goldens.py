"""Golden renders of chat templates by Python's Jinja2, configured as
transformers 5.23's apply_chat_template configures it (sandboxed, trim_blocks,
lstrip_blocks, loopcontrols, the generation tag, tojson as json.dumps,
raise_exception, strftime_now frozen at 2025-01-15 12:00 UTC; message keys
that are None dropped). `cargo test renders_agent_conversations` compares
the engine's bounded Jinja with them.

    python3 scripts/render-goldens.py <dir of .jinja> <out dir>

Writes <out>/AGENT.json (the case, and per template the render or the error)
for the agent conversation: a system message, tools, an assistant turn with
reasoning and a call, a tool result, a second call, its result, and the
generation prompt; once with every call's arguments an object and once a
JSON string. Sandboxed but not immutable (Kimi's templates append to lists,
as llama.cpp's Jinja allows); `from_json` and llama.cpp's extra variables
(`datetime`) is defined, and `functions` (firefunction-v2).
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import SandboxedEnvironment


class Generation(Extension):
    """transformers' AssistantTracker: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


NOW = datetime(2025, 1, 15, 12, 0, 0)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["location"],
            },
        },
    }
]

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris and in Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Paris first.",
        "tool_calls": [{"id": "a1B2c3D4e", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}],
    },
    {"role": "tool", "tool_call_id": "a1B2c3D4e", "name": "get_weather", "content": "{\"temperature\": 22}"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "f5G6h7I8j", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Tokyo\"}"}}],
    },
    {"role": "tool", "tool_call_id": "f5G6h7I8j", "name": "get_weather", "content": "{\"temperature\": 18}"},
]

BOS, EOS = "<s>", "</s>"


def with_args(kind):
    """MESSAGES with every call's arguments as an object or as JSON text."""
    out = json.loads(json.dumps(MESSAGES))
    for m in out:
        for c in m.get("tool_calls", []):
            a = c["function"]["arguments"]
            a = json.loads(a) if isinstance(a, str) else a
            c["function"]["arguments"] = a if kind == "object" else json.dumps(a, ensure_ascii=False)
    return out


def render(source, messages):
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters["from_json"] = json.loads
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    t = env.from_string(source)
    # llama.cpp's extra variable `datetime` (its `date_string` is not set,
    # as transformers does not), and the functions firefunction-v2 lists
    # (its tools' function objects).
    extra = {"datetime": NOW.strftime("%b %d %Y"), "functions": json.dumps([t["function"] for t in TOOLS], indent=2)}
    return t.render(messages=messages, tools=TOOLS, add_generation_prompt=True, bos_token=BOS, eos_token=EOS, enable_thinking=True, **extra)


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    results = {}
    for name in sorted(os.listdir(src)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(src, name), encoding="utf-8") as f:
            source = f.read()
        results[name] = {}
        for kind in ("object", "string"):
            try:
                results[name][kind] = {"ok": True, "text": render(source, with_args(kind))}
            except Exception as e:  # the template's own refusal, or what Jinja2 cannot do
                results[name][kind] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    index = {
        "renderer": f"jinja2 {jinja2.__version__} configured like transformers 5.23.0 apply_chat_template",
        "strftime_now_frozen_at": NOW.isoformat(),
        "bos_eos": [BOS, EOS],
        "messages": MESSAGES,
        "tools": TOOLS,
        "enable_thinking": True,
        "results": results,
    }
    with open(os.path.join(out, "AGENT.json"), "w", encoding="utf-8") as f:
        json.dump(index, f, ensure_ascii=False, indent=1)
    for kind in ("object", "string"):
        ok = sum(1 for r in results.values() if r[kind]["ok"])
        print(f"{kind} arguments: {len(results)} templates, {ok} rendered, {len(results) - ok} raised")


if __name__ == "__main__":
    main()
