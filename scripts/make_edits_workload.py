"""Build data/workloads/edits.jsonl: the "edits" bench workload (predicted outputs).

Each row is a small file cut from the Python standard library's own source (one top-level
function of a pure-Python module, with the module's name in a comment line), an instruction
for a small change, and the file itself as the ``prediction`` (what an editor sends when it
asks for a file to be rewritten). Rows are in ``edgespec bench --prompts`` layout
(``question_id``, ``category``, ``turns``) plus ``prediction`` and ``source``.

Nothing here comes from the held-out evaluation prompts. Deterministic: the same Python version
writes the same file (the functions' text is the running interpreter's stdlib).

    .venv/bin/python scripts/make_edits_workload.py [--out data/workloads/edits.jsonl]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
from pathlib import Path

# (module, function): pure-Python functions of 8-45 lines
FUNCTIONS = [
    ("textwrap", "dedent"), ("textwrap", "indent"), ("textwrap", "shorten"),
    ("shlex", "quote"), ("shlex", "join"), ("shlex", "split"),
    ("fnmatch", "filter"), ("fnmatch", "fnmatchcase"),
    ("colorsys", "rgb_to_hsv"), ("colorsys", "hsv_to_rgb"), ("colorsys", "rgb_to_hls"),
    ("colorsys", "hls_to_rgb"), ("bisect", "insort_right"), ("bisect", "bisect_left"),
    ("string", "capwords"), ("posixpath", "join"), ("posixpath", "split"),
    ("posixpath", "commonpath"), ("genericpath", "commonprefix"), ("base64", "b64encode"),
    ("statistics", "median"), ("statistics", "median_low"), ("calendar", "leapdays"),
    ("html", "escape"), ("glob", "has_magic"), ("heapq", "heappushpop"),
]

INSTRUCTIONS = [
    "Rename the function `{name}` to `{name}_v2`.",
    "Add the line `from __future__ import annotations` at the top of the file.",
    "Rename the parameter `{param}` to `{param}_in` everywhere in the function.",
    "Add a comment line `# Checked.` right before the function's last line.",
    "Replace the comment line at the top of the file with `# Copied from the standard library.`",
]

PROMPT = ("Here is a Python file:\n\n```python\n{code}\n```\n\n{instruction} Reply with the "
          "complete updated file in one code block, and nothing else.")


def function_file(module: str, name: str) -> str:
    """The source of ``module.name``, as a small file headed by a comment naming its origin."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = stdlib / f"{module}.py"
    if not path.is_file():  # a package
        path = stdlib / module / "__init__.py"
    source = path.read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return f"# {module}.{name}, from the Python standard library\n\n" + \
                ast.get_source_segment(source, node) + "\n"
    raise SystemExit(f"{module}.{name}: no top-level function of that name in {path}")


def first_param(code: str) -> str:
    fn = next(n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef))
    return fn.args.args[0].arg if fn.args.args else fn.name


def rows() -> list[dict]:
    out = []
    for i, (module, name) in enumerate(FUNCTIONS):
        code = function_file(module, name)
        instruction = INSTRUCTIONS[i % len(INSTRUCTIONS)].format(name=name, param=first_param(code))
        out.append({"question_id": f"edits-{i + 1:02d}", "category": "edits",
                    "turns": [PROMPT.format(code=code.rstrip("\n"), instruction=instruction)],
                    "prediction": code,
                    "source": f"{module}.{name} (Python {sys.version.split()[0]})"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/workloads/edits.jsonl")
    out = Path(ap.parse_args().out)
    out.parent.mkdir(parents=True, exist_ok=True)
    made = rows()
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in made)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {len(made)} rows to {out}")


if __name__ == "__main__":
    main()
