"""Tool calls, as OpenAI's Chat Completions API defines them, for every supported family.

- ``syntax``: each family's call syntax (detected from the tokenizer), read and written;
- ``parse``: the value scanners the families share;
- ``stream``: text -> content and calls, incrementally (streamed == whole, by construction);
- ``prompt``: messages and tools -> the prompt, through the model's template or the fallback;
- ``constrain``: the grammar of a required or named call;
- ``request``: the request's tool fields, validated.
"""

from .parse import Call
from .prompt import FALLBACK, render, supports_tools
from .request import ToolRequest, tool_request
from .stream import CallReader, read_all
from .syntax import SYNTAXES, Syntax, detect, write

__all__ = ["Call", "CallReader", "FALLBACK", "SYNTAXES", "Syntax", "ToolRequest", "detect",
           "read_all", "render", "supports_tools", "tool_request", "write"]
