"""Tool-calling fixtures: each family's calls as its models write them, a tool list, and
Qwen2.5's chat template (its tool part as the model's files carry it)."""

from __future__ import annotations

import json

from edgespec.loading.tokenizer import Tokenizer

from .tiny import _byte_level_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object",
                   "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]

PARIS = ("get_weather", '{"city": "Paris", "days": 3}')
UTC = ("get_time", '{"tz": "UTC"}')

# (family, text a model of that family writes, content, calls)
SAMPLES = [
    ("hermes", 'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"Paris", "days": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
               '{"tz": "UTC"}}\n</tool_call>', "Let me look that up.", [PARIS, UTC]),
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
     None, [UTC]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
     None, [PARIS]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
               '{"name": "get_time", "parameters": {"tz": "UTC"}}', None, [PARIS, UTC]),
    ("llama3", '[get_weather(city="Paris", days=3), get_time(tz="UTC")]', None, [PARIS, UTC]),
    ("llama3", '<|python_tag|>brave_search.call(query="Paris weather")',
     None, [("brave_search", '{"query": "Paris weather"}')]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
                '{"name": "get_time", "arguments": {"tz": "UTC"}}]', None, [PARIS, UTC]),
    ("mistral_args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'
                     '[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}', None, [PARIS, UTC]),
    ("phi4", 'functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
     None, [PARIS]),
    ("phi4", '<|tool_call|>[{"name": "get_time", "arguments": {"tz": "UTC"}}]<|/tool_call|>',
     None, [UTC]),
    ("gemma", '```tool_code\nprint(get_weather(city="Paris", days=3))\n```', None, [PARIS]),
    ("gemma", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', None, [PARIS]),
    ("gemma", '[get_weather(city="Paris", days=3), get_time(tz="UTC")]', None, [PARIS, UTC]),
]

# answers with no call in them, each family's near misses included
PLAIN = [
    ("hermes", "The weather is fine. I did not need <tool_calls> or a <tool_ helper."),
    ("hermes", 'x <tool_call>\n{"name": broken}\n</tool_call> y'),
    ("llama3", '{"answer": 42}'),
    ("llama3", "Sure: {\"name\": \"get_weather\"} is the function you mean."),
    ("mistral", "[TOOL_CALLS] I am not sure"),
    ("phi4", "functools is a Python module."),
    ("gemma", "[1, 2, 3] are numbers."),
]

QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == "
    "'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    "
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>\" }}"
    "\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    "
    "{%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\""
    "name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n"
    "\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>"
    "system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|"
    "im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_"
    "end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if "
    "(message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message."
    "role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message."
    "role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == "
    "\"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message."
    "content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for "
    "tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n       "
    "     {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n           "
    " {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n            "
    "{{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- "
    "elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 "
    "- 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n     "
    "   {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_"
    "response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")

MARKERS = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>",
           "<|tool_call|>", "<|/tool_call|>", "<|start_header_id|>"]


def tokenizer(template: str | None = None, markers=MARKERS) -> Tokenizer:
    """The tiny byte-level tokenizer with the families' call markers as special tokens."""
    backend = _byte_level_tokenizer()
    backend.add_special_tokens(list(markers))
    return Tokenizer(backend, {"eos_token": "<|im_end|>"}, chat_template=template)


def history(call_id: str = "call_1") -> list[dict]:
    """A conversation with a call and its result, as an OpenAI client sends it back."""
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris for 3 days?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps(
                     {"city": "Paris", "days": 3})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21C"}]
