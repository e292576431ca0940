"""The package's layers: each module imports only from its own layer or the layers below it.

The picture (``docs/architecture.md``), bottom to top:

    0  errors, config                        (no mlx)
    1  loading/, tree, sampling, cache, stream_text, prompt, stats, fim (fill-in-the-middle
       prompts)
    2  kernels/, verify, rules (per-node transforms of the target's logits), penalties (rules
       from the sampling config), logprobs, grammar (structured output as a rule), toolcalls
       (tool calls: each family's syntax read and written, prompts with tools, call grammars)
    3  targets/, heads/ (trained drafting heads: EAGLE-3, Medusa, their formats)
    4  drafters/
    5  engine, rule_tree (a step's tree under rules, and the drafter's view of it), options
       (what each surface takes from the config classes), worker (the one generation thread
       the server and the Python API run the engine on), training/ (it runs the target and
       the heads)
    6  bench, bench_plot, bench_rows, doctor, server/, tui/, cli, llm, streams, __init__ (the surfaces)

A module missing from ``LAYERS`` fails the test, so a new file has to take a place in the
picture. Imports inside functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "edgespec"

LAYERS = {
    "errors": 0, "config": 0,
    "loading": 1, "tree": 1, "sampling": 1, "cache": 1, "stream_text": 1, "prompt": 1, "stats": 1,
    "fim": 1,
    "kernels": 2, "verify": 2, "rules": 2, "grammar": 2, "penalties": 2, "logprobs": 2,
    "toolcalls": 2,
    "targets": 3, "heads": 3,
    "drafters": 4,
    "engine": 5, "rule_tree": 5, "options": 5, "worker": 5, "training": 5,
    "bench": 6, "bench_plot": 6, "bench_rows": 6, "doctor": 6, "server": 6, "tui": 6, "cli": 6,
    "llm": 6, "streams": 6,
    "__init__": 6,
    "__main__": 6,
}
EXCEPTIONS = {
    # config validates method names against the registry's names: registry.py is data with no
    # imports of the drafters themselves (each builder is imported when a drafter is built).
    ("config", "drafters"),
}


def _top(path: Path) -> str:
    """The first component of a module's path inside the package (a file's stem or a folder)."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """Top-level edgespec components that ``path`` imports (absolute or relative)."""
    rel = path.relative_to(PACKAGE)
    depth = len(rel.parts) - 1  # packages between the package root and this file
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "edgespec":
                    continue
                parts = parts[1:]
            else:
                base = list(rel.parts[:-1])[: max(0, depth - (node.level - 1))]
                if node.level - 1 > depth:
                    continue
                parts = base + (node.module.split(".") if node.module else [])
            names = parts if parts else [a.name for a in node.names]
            found.update([names[0]] if parts else names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "edgespec" and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_every_module_has_a_layer():
    missing = sorted({_top(p) for p in PACKAGE.rglob("*.py")} - set(LAYERS))
    assert not missing, f"give these modules a layer in LAYERS (and the picture): {missing}"


def test_no_module_imports_upward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = _top(path)
        for other in _imports(path) - {me}:
            if other in LAYERS and LAYERS[other] > LAYERS[me] and (me, other) not in EXCEPTIONS:
                upward.append(f"{path.relative_to(PACKAGE)} (layer {LAYERS[me]}) imports "
                              f"{other} (layer {LAYERS[other]})")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_relative_and_lazy_imports():
    """The import reader itself: relative imports one and two levels up, and a lazy one."""
    found = _imports(PACKAGE / "drafters" / "cascade.py")
    assert {"tree", "verify", "targets", "config", "drafters"} <= found  # ..tree, .draft_model
    assert "loading" in _imports(PACKAGE / "targets" / "__init__.py")  # inside load()
