"""The base of every request body model (and every object inside one): nothing is ignored.

Contract: a ``RequestModel`` checks types strictly (``"5"`` is not an integer) and forbids
fields it does not define, so a request field is either implemented or refused with a 400 that
names it: ``UNSUPPORTED`` lists the fields of OpenAI's API that edgespec does not implement
(name -> what to do instead; the 400 says "not supported"; null, OpenAI's "not sent", is
accepted), anything else is an unknown field.
A field is implemented by defining it on the model; its ``UNSUPPORTED`` entry then has no
effect and must go (``tests/test_server_fields.py`` checks). ``errors.py`` turns both refusals
into OpenAI's error body with the field's path as ``param``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

NOT_SUPPORTED = "not_supported"
"""pydantic's error type for a field in ``UNSUPPORTED`` (``errors.py`` reads it)."""


class RequestModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    UNSUPPORTED: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        if not isinstance(data, dict):
            return data
        refused = {k for k in data if k in cls.UNSUPPORTED and k not in cls.model_fields}
        for name in refused:
            if data[name] is not None:
                raise PydanticCustomError(
                    NOT_SUPPORTED, "{name} is not supported by this server: {why}",
                    {"name": name, "why": cls.UNSUPPORTED[name]})
        # null is OpenAI's "not sent" for each of them (a client echoing a message back sends it)
        return {k: v for k, v in data.items() if k not in refused}
