"""Build data/workloads/fim.jsonl: the "fim" bench workload (code with a hole: fill in the middle).

Each row is a stretch of a pure-Python module of the Python standard library with a hole cut
out of one function: a whole line, a block of 2-5 lines, or the end of a line (after its first
``=`` or ``(``), in rotation. The prefix is the code before the hole (from up to ``BEFORE``
lines above the function, under a comment naming the module), the suffix the code after it (to
``AFTER`` lines past the function), ``middle`` the text that was cut out. Rows are in ``edgespec
bench --prompts`` layout: ``turns[0]`` is the prefix (raw text, not a chat message), plus
``suffix``, ``middle`` and ``source``; the format is in /tmp/notes/bench_rows.md.

Nothing here comes from the held-out evaluation prompts. Deterministic: the same Python version
writes the same file (the code is the running interpreter's stdlib).

    .venv/bin/python scripts/make_fim_workload.py [--out data/workloads/fim.jsonl]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
from pathlib import Path

# pure-Python modules (none of them is in the edits workload)
MODULES = ["difflib", "ntpath", "json/encoder", "json/decoder", "quopri", "gettext", "pprint",
           "tokenize", "dataclasses", "argparse", "configparser", "shutil"]
PER_MODULE = 3
BEFORE, AFTER = 12, 6
KINDS = ("line", "block", "tail")


def _functions(tree: ast.Module):
    """Functions and methods of 8-40 lines, in ``ast.walk``'s order (deterministic)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and 8 <= node.end_lineno - node.lineno + 1 <= 40:
            yield node


def _code_lines(fn: ast.FunctionDef, lines: list[str]) -> list[int]:
    """0-based line numbers of the body's plain statement lines (no docstring, blank, comment,
    decorator or lone bracket)."""
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(
        getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    if not body:
        return []
    keep = []
    for i in range(body[0].lineno - 1, fn.end_lineno):
        text = lines[i].strip()
        if len(text) > 8 and not text.startswith(("#", '"', "'", ")", "]", "}")):
            keep.append(i)
    return keep


def _hole(kind: str, fn: ast.FunctionDef, lines: list[str]) -> tuple[int, int, int] | None:
    """(first line, column, end line) of the hole: lines[first][column:] .. lines[end - 1]."""
    code = _code_lines(fn, lines)
    if len(code) < 4:
        return None
    mid = code[len(code) // 2]
    if kind == "line":
        return mid, len(lines[mid]) - len(lines[mid].lstrip()), mid + 1
    if kind == "block":
        end = min(mid + 2 + len(code) % 4, fn.end_lineno)
        return mid, len(lines[mid]) - len(lines[mid].lstrip()), end
    for i in code[len(code) // 2:] + code[: len(code) // 2]:
        text = lines[i]
        cut = min((text.find(c) for c in "=(" if text.find(c) > 0), default=-1)
        if 0 < cut < len(text.rstrip()) - 3:
            return i, cut + 1, i + 1
    return None


def rows() -> list[dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    version = sys.version.split()[0]
    out, k = [], 0
    for module in MODULES:
        path = stdlib / f"{module}.py"
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        made = 0
        for fn in _functions(ast.parse(text)):
            if made == PER_MODULE:
                break
            kind = KINDS[k % len(KINDS)]
            hole = _hole(kind, fn, lines)
            if hole is None:
                continue
            first, col, end = hole
            start = max(0, fn.lineno - 1 - BEFORE)
            head = f"# {module}.py, from the Python standard library\n"
            prefix = head + "".join(lines[start:first]) + lines[first][:col]
            middle = lines[first][col:] + "".join(lines[first + 1:end])
            suffix = "".join(lines[end:min(len(lines), fn.end_lineno + AFTER)])
            k += 1
            made += 1
            out.append({"question_id": f"fim-{k:02d}", "category": "fim", "turns": [prefix],
                        "suffix": suffix, "middle": middle, "kind": kind,
                        "source": f"{module}.py:{first + 1}-{end} {fn.name} (Python {version})"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/workloads/fim.jsonl")
    out = Path(ap.parse_args().out)
    out.parent.mkdir(parents=True, exist_ok=True)
    made = rows()
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in made), encoding="utf-8")
    print(f"wrote {len(made)} rows to {out}")


if __name__ == "__main__":
    main()
