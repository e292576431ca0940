"""The package's layers: each module imports only from its own layer or the layers below it.

The picture (``docs/architecture.md``), bottom to top:

    0  errors, config, methods (the drafting methods' table), extras (which optional module
       comes with which pip extra)                                 (no mlx)
    1  loading/, tree, sampling, cache, stream_text, prompt, stats, fim (fill-in-the-middle
       prompts), generation_defaults (sampling defaults: the model's generation_config.json),
       metrics (the server's counters, Prometheus text format), prefix_store (finished
       requests' KV caches, reused by prompt prefix)
    2  kernels/, verify, rules (per-node transforms of the target's logits), penalties (rules
       from the sampling config), logprobs, grammar (structured output as a rule), toolcalls
       (tool calls: each family's syntax read and written, prompts with tools, call grammars)
    3  targets/, heads/ (trained drafting heads: EAGLE-3, Medusa, their formats)
    4  drafters/
    5  engine, plain_pipeline (plain greedy decoding pipelined), rule_tree (a step's tree under rules, and the drafter's view of it), options
       (what each surface takes from the config classes), worker (the one generation thread
       the server and the Python API run the engine on), kv_budget (a sequence's KV cache
       bytes), batch (decodings stepped together, sharing forwards), jobs (the worker's jobs and
       events), decoding (a generation's steps and coroutine), training/ (it runs the target and the heads),
       learn/ (recording while decoding, learning from it, the guard and versions)
    6  bench, bench_heads (bench's METHOD@HEAD variants), bench_plot, bench_rows, doctor,
       server/, tui/, cli, llm, streams, learn_cli (``edgespec learn``), __init__ (the surfaces)

A module missing from ``LAYERS`` fails the test, so a new file has to take a place in the
picture. Imports inside functions count too (a lazy import is still a dependency). No import
cycle either: none between the top-level modules (lazy imports counted), none between files
at import time (what a module runs when it is first imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "edgespec"

LAYERS = {
    "errors": 0, "config": 0, "methods": 0, "extras": 0,
    "loading": 1, "tree": 1, "sampling": 1, "cache": 1, "stream_text": 1, "prompt": 1, "stats": 1,
    "fim": 1, "generation_defaults": 1, "metrics": 1, "prefix_store": 1,
    "kernels": 2, "verify": 2, "rules": 2, "grammar": 2, "penalties": 2, "logprobs": 2,
    "toolcalls": 2,
    "targets": 3, "heads": 3,
    "drafters": 4,
    "engine": 5, "plain_pipeline": 5, "rule_tree": 5, "options": 5, "worker": 5, "training": 5,
    "kv_budget": 5, "batch": 5, "jobs": 5, "decoding": 5, "learn": 5,
    "bench": 6, "bench_heads": 6, "bench_plot": 6, "bench_rows": 6, "doctor": 6, "server": 6,
    "tui": 6, "cli": 6, "llm": 6, "streams": 6, "learn_cli": 6,
    "__init__": 6,
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
            if other in LAYERS and LAYERS[other] > LAYERS[me]:
                upward.append(f"{path.relative_to(PACKAGE)} (layer {LAYERS[me]}) imports "
                              f"{other} (layer {LAYERS[other]})")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_relative_and_lazy_imports():
    """The import reader itself: relative imports one and two levels up, and a lazy one."""
    found = _imports(PACKAGE / "drafters" / "cascade.py")
    assert {"tree", "verify", "targets", "config", "drafters"} <= found  # ..tree, .draft_model
    assert "loading" in _imports(PACKAGE / "targets" / "__init__.py")  # inside load()


# -- cycles ---------------------------------------------------------------------------------------

def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node of ``graph`` (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _module(path: Path) -> str:
    """``path``'s dotted name inside the package ('' for the package itself)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_time(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that importing ``path`` imports first: its module-level imports
    (not those under ``if TYPE_CHECKING``), each with the packages above it that are not
    ``path``'s own (a module's own packages are already being imported when it runs)."""
    me = _module(path)
    here = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    here = [p for p in here if p]
    found = set()
    for node in _module_level(ast.parse(path.read_text()).body):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                name = ".".join(base + (node.module.split(".") if node.module else []))
            elif (node.module or "").split(".")[0] == "edgespec":
                name = node.module.removeprefix("edgespec").lstrip(".")
            else:
                continue
            subs = [f"{name}.{a.name}".lstrip(".") for a in node.names]
            names = [s for s in subs if s in modules]
            if len(names) < len(subs):  # a name of the module itself (not a submodule)
                names.append(name)
        elif isinstance(node, ast.Import):
            names = [a.name.removeprefix("edgespec.") for a in node.names
                     if a.name.startswith("edgespec.")]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for i in range(1 if parts[0] else 0, len(parts) + 1):
                m = ".".join(parts[:i])
                own = me == m or me.startswith(m + ".")
                if m in modules and (not own or (m == name and m != me)):
                    found.add(m)
    return found


def _module_level(body: list[ast.stmt]):
    """The statements of a module body run at import (into ``if`` and ``try`` blocks, but not
    an ``if TYPE_CHECKING:`` block)."""
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody
                                     + [s for h in node.handlers for s in h.body])
        else:
            yield node


def test_no_import_cycle_between_top_level_modules():
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        me = _top(path)
        graph.setdefault(me, set()).update(_imports(path) - {me})
    assert not _cycles(graph), f"top-level modules importing each other: {_cycles(graph)}"


def test_no_import_cycle_at_import_time():
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _import_time(p, set(files)) for m, p in files.items()}  # '': the package
    assert not _cycles(graph), f"modules importing each other when loaded: {_cycles(graph)}"


def test_the_cycle_checker_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert "methods" in _imports(PACKAGE / "config.py")
    files = {_module(p) for p in PACKAGE.rglob("*.py")}
    assert {"heads.find", "heads"} <= _import_time(PACKAGE / "drafters" / "default.py", files)
    assert "heads.loaded" not in _import_time(PACKAGE / "drafters" / "registry.py", files)  # lazy
