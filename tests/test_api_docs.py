"""The API documentation runs: every ```python block of README.md's "Python API" section and of
docs/api.md is executed on the demo model, in order, one namespace per file (a block may use
what an earlier one defined), so the examples cannot drift from the code. Also: the README's
"Hello" is answered as a chat, with the same tokens as ``edgespec generate``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli import main

pytestmark = pytest.mark.demo

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def readme_api_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Python API\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def run_blocks(blocks: list[str], name: str) -> tuple[list[str], dict]:
    """Execute ``blocks`` in one namespace: what each printed, and the namespace."""
    namespace: dict = {"__name__": f"docs:{name}"}
    printed = []
    for i, code in enumerate(blocks):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{name} block {i + 1}", "exec"), namespace)
        printed.append(out.getvalue())
    return printed, namespace


def test_block_extraction():
    text = "x\n```python\na = 1\n```\n```text\nno\n```\n```python\nb = 2\n```\n"
    assert python_blocks(text) == ["a = 1\n", "b = 2\n"]


def test_readme_api_examples_run_and_hello_is_answered_like_the_chat():
    blocks = python_blocks(readme_api_section())
    assert len(blocks) >= 2
    printed, namespace = run_blocks(blocks, "README.md")
    assert all(p.strip() for p in printed)  # each example shows something
    with namespace["llm"] as llm:
        hello = llm.chat("Hello", max_tokens=24)
    out = CliRunner().invoke(main, ["generate", "--model", "demo", "--json", "--max-tokens", "24",
                                    "Hello"], catch_exceptions=False).output
    assert hello.token_ids == json.loads(out.strip().splitlines()[-1])["token_ids"]
    assert not hello.text.startswith("-")  # answered, not continued as raw text


def test_api_doc_examples_run():
    blocks = python_blocks((ROOT / "docs" / "api.md").read_text())
    assert len(blocks) >= 12
    printed, _ = run_blocks(blocks, "docs/api.md")
    assert "Paris" in printed[0]
    assert "cancelled" in "".join(printed)
