"""The tool-calling parts of the request and response bodies (OpenAI's shapes; ``schemas.py``).

Types only, as in ``schemas.py``: values (names, ``tool_choice``, the schemas) are checked by
``toolcalls.tool_request``, which names the bad field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .request_model import RequestModel as _Request  # strict types, no field ignored


class FunctionDef(_Request):
    name: str = Field(description="1-64 letters, digits, '_' or '-'")
    description: str | None = None
    parameters: dict | None = Field(None, description="JSON schema of the arguments object")
    strict: bool | None = Field(None, description="accepted; a required or named call's "
                                "arguments are always generated under the schema's strict form "
                                "(objects allow only their listed properties)")


class Tool(_Request):
    type: str = Field(description="only 'function'")
    function: FunctionDef | None = Field(None, description="required (with type 'function')")


class FunctionName(_Request):
    name: str


class NamedToolChoice(_Request):
    type: str = Field(description="only 'function'")
    function: FunctionName


TOOL_CHOICE = ("'auto' (default with tools: the model may call), 'none' (text only; the tools "
               "are left out of the prompt), 'required' (the answer is constrained to calls whose "
               "arguments validate), or {'type': 'function', 'function': {'name'}} (a call to "
               "that function)")


class CalledFunction(_Request):
    name: str
    arguments: str = Field(description="the arguments as a JSON string")


class ToolCallIn(_Request):
    """A call in an earlier assistant message (what this server returned)."""

    id: str
    type: str = "function"
    function: CalledFunction


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: CalledFunction
