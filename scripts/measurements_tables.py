"""Regenerate the bench tables of ``docs/measurements.md`` from the committed bench JSON.

Usage: python scripts/measurements_tables.py [--check] [FILE]

A generated table sits between two markers, the JSON file named relative to the repository root::

    <!-- table: docs/bench/2026-11-27-edits.json overall -->
    ...
    <!-- /table -->

Its text is bench's own markdown report of that file (``bench.report_markdown``, what
``edgespec bench`` prints: the run's environment line, then the table), so a table reads as the
run printed it. Options after the file name: ``overall`` keeps each method's overall row only
(no per-category rows). A prompts file outside the repository is shown by its file name only (the
path was the measuring machine's). Every other bench table in the file is refused (see
``hand_copied``): a run whose JSON was not saved is kept as recorded text in a fenced block.

Run it after adding a marker or a JSON file; ``tests/test_measurements.py`` fails while a table
differs from its JSON. ``--check``: write nothing, exit 1 naming each stale table (and any
hand-copied bench table); FILE defaults to ``docs/measurements.md``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path, PurePosixPath

from edgespec.bench import report_markdown
from edgespec.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "measurements.md"
OPTIONS = ("overall",)
_OPEN = re.compile(r"^<!-- table: (\S+)((?: [\w-]+)*) -->$")
_CLOSE = "<!-- /table -->"


def render(root: Path, json_path: str, options: tuple[str, ...] = ()) -> str:
    """The generated text of one region: bench's markdown report of ``root/json_path``."""
    bad = [o for o in options if o not in OPTIONS]
    if bad:
        raise ConfigError(f"table {json_path}: unknown option(s) {', '.join(map(repr, bad))}; "
                          f"allowed: {', '.join(OPTIONS)}")
    try:
        report = json.loads((root / json_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"table {json_path}: no such file under {root}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"table {json_path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(report, dict) or not {"methods", "env"} <= report.keys():
        raise ConfigError(f"table {json_path}: not a bench report (`edgespec bench --json`: an "
                          "object with \"methods\" and \"env\")")
    env = dict(report["env"], prompts_file=_shown_path(report["env"].get("prompts_file")))
    methods = report["methods"]
    if "overall" in options:
        methods = {name: {"overall": m["overall"], "categories": {}} for name, m in methods.items()}
    return report_markdown({"methods": methods, "env": env}) + "\n"


def _shown_path(path: str | None) -> str | None:
    """A prompts file inside the repository as given; one outside it by its file name."""
    if path is None:
        return None
    p = PurePosixPath(path)
    return path if not p.is_absolute() and ".." not in p.parts else p.name


def regions(text: str) -> list[tuple[int, int, str, tuple[str, ...]]]:
    """Each generated region as (opening marker's line index, closing marker's, JSON path,
    options); ConfigError naming the line for a marker without its pair."""
    found, start = [], None
    for i, line in enumerate(text.split("\n")):
        opened = _OPEN.match(line.strip())
        if opened and start is not None:
            raise ConfigError(f"line {i + 1}: a table marker inside the table opened on line "
                              f"{start[0] + 1}; close that one first with {_CLOSE}")
        if opened:
            start = (i, opened[1], tuple(opened[2].split()))
        elif line.strip() == _CLOSE:
            if start is None:
                raise ConfigError(f"line {i + 1}: {_CLOSE} without an opening "
                                  "<!-- table: FILE.json --> marker")
            found.append((start[0], i, start[1], start[2]))
            start = None
    if start is not None:
        raise ConfigError(f"line {start[0] + 1}: table {start[1]} is never closed with {_CLOSE}")
    return found


def regenerate(text: str, root: Path | None = None) -> tuple[str, list[str]]:
    """``text`` with every region rewritten from its JSON (paths relative to ``root``, default
    the repository), and the JSON paths of the regions that changed (stale)."""
    root = root or ROOT
    lines, stale, done = text.split("\n"), [], 0
    out: list[str] = []
    for start, end, path, options in regions(text):
        fresh = render(root, path, options).split("\n")[:-1]
        if lines[start + 1:end] != fresh:
            stale.append(path)
        out += lines[done:start + 1] + fresh
        done = end
    return "\n".join(out + lines[done:]), stale


def hand_copied(text: str) -> list[int]:
    """Line numbers (1-based) of bench tables that are not generated: a markdown table whose
    header has a ``method...`` cell and a ``τ`` cell, outside every region and fenced block."""
    inside = {i for start, end, _, _ in regions(text) for i in range(start, end + 1)}
    found, fenced, previous = [], False, ""
    for i, line in enumerate(text.split("\n")):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and i not in inside and line.lstrip().startswith("|") \
                and not previous.lstrip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if any(c.startswith("method") for c in cells) and any("τ" in c for c in cells):
                found.append(i + 1)
        previous = "" if fenced else line
    return found


def main(argv: list[str]) -> int:
    check = "--check" in argv
    files = [a for a in argv if a != "--check"]
    path = Path(files[0]) if files else DOC
    try:
        text = path.read_text(encoding="utf-8")
        new, stale = regenerate(text)
        copied = hand_copied(text)
    except (ConfigError, OSError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 2
    for line in copied:
        print(f"{path}:{line}: a bench table that is not generated; put it between "
              "<!-- table: docs/bench/FILE.json --> markers, or keep it as recorded text in a "
              "fenced block", file=sys.stderr)
    if check:
        for p in stale:
            print(f"{path}: the table of {p} differs from its JSON; run "
                  "python scripts/measurements_tables.py", file=sys.stderr)
        print(f"{path}: {len(regions(text))} generated tables, {len(stale)} stale")
        return 1 if stale or copied else 0
    if new != text:
        path.write_text(new, encoding="utf-8")
    print(f"{path}: {len(regions(text))} generated tables, {len(stale)} rewritten")
    return 1 if copied else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
