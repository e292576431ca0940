"""Benchmark: each drafting method beside the target-only baseline, in one process, same prompts.

Contract (ARCHITECTURE.md, "Measuring"): ``run_bench`` loads the draft model once, warms each
method up on the first prompt (not counted), then for every prompt runs every method in turn,
baseline ``"none"`` first, so machine noise lands on all methods alike. Each generation gets a
fresh drafter, so a prompt's numbers do not depend on the prompts before it. Decoding is greedy
unless ``sampling`` says otherwise; exact match (token ids equal to the baseline's for the same
prompt) is reported only under greedy decoding, where a lossless method must score n/n.
A method written ``METHOD@HEAD`` (``eagle3@learned``) runs with that head, as a method of its
own, so one run compares heads (``bench_heads.py``); ``env["heads"]`` names the head folder of
every method that drafts with one.

``summarize`` is the pure aggregation: per-prompt rows -> per method, overall and per category,
pooled τ / acceptance / tokens-per-second (prefill excluded) and speedup against the baseline
over the same prompts. ``format_report`` (rich) and ``report_markdown`` (plain text) render it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
from tqdm import tqdm

from . import bench_heads
from .bench_rows import generate_row, row_fields, valid_answer
from .config import GenerationConfig, SamplingConfig
from .drafters import load_draft, make_drafter, registry
from .engine import Engine
from .errors import ConfigError
from .loading._blas import blas_info
from .prompt import encode_prediction
from .stats import format_metric
from .targets import Target

BASELINE = "none"
WARMUP_TOKENS = 16
_STATS = ("generated_tokens", "target_forwards", "proposed", "accepted", "forced", "prefill_s",
          "decode_s", "draft_s", "verify_s", "peak_memory_mb", "accepted_prediction_tokens",
          "rejected_prediction_tokens")
_COLUMNS = ("prompts", "τ", "accepted", "tok/s", "speedup", "median", "exact",
            "draft/verify/other %", "peak MB", "prediction kept/rejected", "valid")


@dataclass(frozen=True)
class BenchPrompt:
    id: str | int  # the file's question_id, else the 1-based line number
    category: str
    text: str  # the first turn, sent as one user chat message
    prediction: str | None = None  # predicted output: every method but the baseline drafts it
    response_format: dict | None = None  # OpenAI's: every method, the baseline too, obeys it
    suffix: str | None = None  # fill-in-the-middle: ``text`` is the prefix (raw, no chat)


def load_prompts(path, limit: int | None = None) -> list[BenchPrompt]:
    """Read a jsonl prompt file (MT-bench layout: ``category``, ``turns``); the first turn is the prompt.

    A row may also carry the editor workloads' fields: ``prediction`` (text: a predicted
    output, drafted first by every method but the baseline, ``drafters/prediction.py``),
    ``response_format`` (OpenAI's: every method runs under the grammar, ``grammar.py``) and
    ``suffix`` (fill-in-the-middle: the first turn is the code before the hole, sent in the
    model's own FIM format, ``fim.py``). A row with a field bench cannot run yet
    (``bench_rows.REFUSED_FIELDS``) is refused with a ConfigError.

    ``limit`` keeps N prompts picked round-robin across categories (the first of each category,
    then the second of each, ...), so a small limit still covers every category; the picked
    prompts keep their file order.
    """
    path = Path(path)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigError(f"limit must be an integer >= 1 (or None for all prompts), got {limit!r}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"prompts file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read prompts file {path}: {e}") from None
    prompts = [_parse_prompt(line, f"{path}:{n}", n) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise ConfigError(f"prompts file {path} is empty; expected one JSON object per line")
    return prompts if limit is None else _round_robin(prompts, limit)


def _parse_prompt(line: str, where: str, lineno: int) -> BenchPrompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    turns = obj.get("turns")
    if not (isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0].strip()):
        raise ConfigError(f"{where}: needs \"turns\", a list whose first item is the prompt text; "
                          f"got {turns!r:.60}")
    return BenchPrompt(obj.get("question_id", lineno), str(obj.get("category", "general")),
                       turns[0], **row_fields(obj, where))


def _round_robin(prompts: list[BenchPrompt], limit: int) -> list[BenchPrompt]:
    by_category: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_category.setdefault(p.category, []).append(i)
    picked: list[int] = []
    for rank in range(max(map(len, by_category.values()))):
        picked += [idx[rank] for idx in by_category.values() if rank < len(idx)]
    return [prompts[i] for i in sorted(picked[:limit])]


def run_bench(target: Target, methods, prompts: list[BenchPrompt], *,
              generation: GenerationConfig | None = None, sampling: SamplingConfig | None = None,
              spec: Mapping | None = None, draft_target: Target | None = None,
              progress: bool = True, prompts_file: str | None = None, raw: bool = False) -> dict:
    """Benchmark ``methods`` (list or comma string; "none" is always added, first) on ``prompts``.
    A method may be ``METHOD@HEAD``: ``METHOD`` with the head ``HEAD`` names ('shipped',
    'learned' or a head folder, ``bench_heads.py``).

    Each prompt's text goes in as one user chat message, or as raw text when ``raw`` (base
    models, which have no chat template).

    ``spec`` holds the SpecConfig options every method shares (``draft``, ``num_draft``, ...; an
    exclusive one such as ``exit_layer`` goes only to the methods that read it).
    ``generation`` defaults to bench's own (``options.SURFACES["bench"]``: 128 new tokens).
    ``draft_target`` is a loaded draft model; otherwise ``spec["draft"]`` is loaded once.
    Returns ``{"methods": ..., "env": ..., "prompts": [per-prompt rows]}`` (see module doc).
    """
    from .options import config, spec_for, values

    sampling = sampling or SamplingConfig()
    generation = generation or config(GenerationConfig, values("bench", {}))
    shared = dict(spec or {})
    if draft_target is not None and "draft" not in shared:
        shared["draft"] = str(draft_target.path or draft_target.name)
    names = [BASELINE, *method_names(methods)]
    if not prompts:
        raise ConfigError("no prompts to benchmark; give a prompts file with at least one line")
    folders = bench_heads.resolve(names, target)  # METHOD@HEAD: each HEAD once, before any run
    specs = {m: spec_for(bench_heads.split(m)[0],
                         {**shared, "head": str(folders[m])} if m in folders else shared)
             for m in names}
    if any(p.suffix is not None for p in prompts):
        from .fim import require_format

        require_format(target.tokenizer, target.name)  # a model without FIM tokens: say so now
    uses_draft = [m for m, s in specs.items() if registry.get(s.method).uses_draft(s.draft)]
    if uses_draft and draft_target is None:
        draft_target = load_draft(specs[uses_draft[0]].draft, target)

    def engine_for(name: str, prompt: BenchPrompt) -> Engine:
        predicted = None
        if prompt.prediction is not None and name != BASELINE:
            predicted = encode_prediction(target.tokenizer, prompt.prediction)
        drafter = make_drafter(specs[name], target, sampling,
                               draft=draft_target if name in uses_draft else None,
                               prediction=predicted)
        return Engine(target, drafter, sampling)

    warmup = GenerationConfig(min(generation.max_tokens, WARMUP_TOKENS), generation.stop)
    for name in specs:  # warm-up: first-call allocations and lazy setup, not counted
        generate_row(engine_for(name, prompts[0]), prompts[0], raw, warmup)
    rows = _run_all(engine_for, list(specs), prompts, generation, sampling.greedy, progress, raw)
    report = summarize(rows)
    report["env"] = environment(target, max_tokens=generation.max_tokens, num_prompts=len(prompts),
                                prompts_file=prompts_file, sampling=sampling,
                                draft=draft_target if uses_draft else None,
                                num_draft=specs[BASELINE].num_draft)
    report["env"]["prompt_format"] = "raw" if raw else "chat"
    report["env"]["heads"] = bench_heads.heads_used(specs, target)
    report["prompts"] = [{k: _round(v, 4) for k, v in r.items()} for r in rows]
    return report


def method_names(methods) -> list[str]:
    """Method names from a list or a comma-separated string, each checked against the registry
    (``METHOD@HEAD`` by ``bench_heads.split``), without repeats and without the baseline (which
    every run has anyway)."""
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods)]
    bad = [m for m in names if bench_heads.split(m)[0] not in registry.NAMES]
    if bad:
        raise ConfigError(f"unknown method(s) {', '.join(map(repr, bad))}; "
                          f"choose from: {', '.join(registry.NAMES)}")
    return [m for m in dict.fromkeys(names) if m != BASELINE]


def _run_all(engine_for, names: list[str], prompts: list[BenchPrompt],
             generation: GenerationConfig, greedy: bool, progress: bool,
             raw: bool = False) -> list[dict]:
    """Per prompt, every method in turn (baseline first); one row per (prompt, method)."""
    rows = []
    with tqdm(total=len(prompts) * len(names), desc="bench", unit="gen", file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        for i, p in enumerate(prompts):
            baseline_ids = None
            for name in names:
                bar.set_postfix_str(f"{p.category} #{p.id} {name}")
                result = generate_row(engine_for(name, p), p, raw, generation)
                baseline_ids = result.token_ids if name == BASELINE else baseline_ids
                row = {"prompt": i, "id": p.id, "category": p.category, "method": name}
                stats = asdict(result.stats)
                row.update({k: stats[k] for k in _STATS})
                row["exact"] = result.token_ids == baseline_ids if greedy else None
                row["valid"] = valid_answer(result.text, p.response_format)
                row["finish_reason"] = result.finish_reason
                rows.append(row)
                bar.update()
    return rows


def summarize(rows: list[dict]) -> dict:
    """Per-prompt rows -> ``{"methods": {name: {"overall": {...}, "categories": {cat: {...}}}}}``.

    Pure. A row has ``prompt`` (index), ``category``, ``method``, ``exact`` (bool or None) and the
    Stats fields in ``_STATS``; every prompt needs a baseline ("none") row.
    """
    base = {r["prompt"]: r for r in rows if r["method"] == BASELINE}
    methods = {}
    for name in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == name]
        categories = dict.fromkeys(r["category"] for r in mine)
        methods[name] = {"overall": _pool(mine, base),
                         "categories": {c: _pool([r for r in mine if r["category"] == c], base)
                                        for c in categories}}
    return {"methods": methods}


def _pool(rows: list[dict], base: dict[int, dict]) -> dict:
    """Pooled numbers for one method over ``rows``, against the baseline rows of the same prompts."""
    total = {k: sum(r.get(k, 0) for r in rows) for k in _STATS if k != "peak_memory_mb"}
    ref = [base[r["prompt"]] for r in rows]
    tps = _ratio(total["generated_tokens"], total["decode_s"])
    base_tps = _ratio(sum(b["generated_tokens"] for b in ref), sum(b["decode_s"] for b in ref))
    per_prompt = [s for r, b in zip(rows, ref) if (s := _ratio(_tps(r), _tps(b))) is not None]
    exact = [r["exact"] for r in rows]
    valid = [r["valid"] for r in rows if r.get("valid") is not None]
    other = max(0.0, total["decode_s"] - total["draft_s"] - total["verify_s"])
    return {
        "prompts": len(rows),
        "tokens": total["generated_tokens"],
        "tau": _round(_ratio(total["generated_tokens"], total["target_forwards"]), 3),
        "acceptance_rate": _round(_ratio(total["accepted"], total["proposed"]), 3),
        "forced": total["forced"],  # a grammar's forced tokens (not in the acceptance rate)
        "tokens_per_s": _round(tps, 2),
        "speedup": _round(_ratio(tps, base_tps), 3),
        "median_speedup": _round(statistics.median(per_prompt), 3) if per_prompt else None,
        "exact_match": None if None in exact else f"{sum(exact)}/{len(exact)}",
        "accepted_prediction_tokens": total["accepted_prediction_tokens"],
        "rejected_prediction_tokens": total["rejected_prediction_tokens"],
        "valid": f"{sum(valid)}/{len(valid)}" if valid else None,
        "prefill_s": _round(total["prefill_s"], 3),
        "decode_s": _round(total["decode_s"], 3),
        "draft_s": _round(total["draft_s"], 3),
        "verify_s": _round(total["verify_s"], 3),
        "other_s": _round(other, 3),
        "peak_memory_mb": _round(max(r["peak_memory_mb"] for r in rows), 1),
    }


def _tps(row: dict) -> float | None:
    return _ratio(row["generated_tokens"], row["decode_s"])


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _round(x, digits: int):
    return round(x, digits) if isinstance(x, float) else x


def environment(target: Target, *, max_tokens: int, num_prompts: int, prompts_file=None,
                sampling: SamplingConfig | None = None, draft: Target | None = None,
                num_draft: int | None = None) -> dict:
    """Where and on what the numbers were measured (the report's ``env``)."""
    from . import __version__

    info = blas_info()
    return {
        "backend": _backend(), "device": _device_name(), "blas": f"{info.name} ({info.status})",
        "dtype": target.dtype, "model": target.name, "draft_model": draft.name if draft else None,
        "weights_mb": _weights_mb(target), "draft_weights_mb": _weights_mb(draft) if draft else None,
        "num_draft": num_draft if draft else None, "mlx_version": mx.__version__,
        "edgespec_version": __version__, "max_tokens": max_tokens,
        "prompts_file": str(prompts_file) if prompts_file else None, "num_prompts": num_prompts,
        "sampling": asdict(sampling or SamplingConfig()), "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def _weights_mb(model: Target) -> float:
    """Bytes of a model's parameters: peak memory minus this is what decoding itself used."""
    from mlx.utils import tree_flatten

    return round(sum(v.nbytes for _, v in tree_flatten(model.model.parameters())) / 2**20, 1)


def _backend() -> str:
    if mx.default_device().type == mx.cpu:
        return "cpu"
    return "metal" if mx.metal.is_available() else "cuda"


def _device_name() -> str:
    try:
        return str(mx.device_info().get("device_name") or platform.machine())
    except (AttributeError, RuntimeError):  # older mlx, or no device info for this backend
        return platform.processor() or platform.machine()


def _header(env: dict) -> str:
    s = env.get("sampling") or {}
    decoding = "greedy" if not s.get("temperature") else f"temperature {s['temperature']}"
    draft = f" · draft {env['draft_model']} (k={env['num_draft']})" if env.get("draft_model") else ""
    return (f"edgespec {env['edgespec_version']} · mlx {env['mlx_version']} · {env['backend']} "
            f"({env['device']}, {env['cpu_count']} cores) · BLAS {env['blas']} · "
            f"{env['model']} {env['dtype']}{draft} · {env['num_prompts']} "
            f"{'raw ' if env.get('prompt_format') == 'raw' else ''}prompts"
            f"{' from ' + env['prompts_file'] if env.get('prompts_file') else ''} · "
            f"max_tokens {env['max_tokens']} · {decoding} · {env['platform']}")


def _cells(s: dict) -> list[str]:
    """One summary as table cells, in ``_COLUMNS`` order."""
    decode = s["decode_s"] or 0.0
    split = ("—" if not decode else
             "/".join(f"{100 * s[k] / decode:.0f}" for k in ("draft_s", "verify_s", "other_s")))
    metric = [format_metric(k, s[k]) for k in ("tau", "acceptance_rate", "tokens_per_s", "speedup")]
    kept, rejected = s.get("accepted_prediction_tokens"), s.get("rejected_prediction_tokens")
    predicted = f"{kept}/{rejected}" if kept or rejected else "—"
    return [str(s["prompts"]), *metric, format_metric("speedup", s["median_speedup"]),
            s["exact_match"] or "—", split, format_metric("peak_memory_mb", s["peak_memory_mb"]),
            predicted, s.get("valid") or "—"]


def format_report(report: dict):
    """A rich renderable: the env header, then one table per method (categories, then overall)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    tables = []
    shown = bench_heads.labels(report["methods"])
    for name, m in report["methods"].items():
        table = Table(title=f"method: {shown[name]}", title_justify="left")
        table.add_column("category")
        for col in _COLUMNS:
            table.add_column(col, justify="right")
        for cat, s in m["categories"].items():
            table.add_row(cat, *_cells(s))
        table.add_row("overall", *_cells(m["overall"]), style="bold", end_section=True)
        tables.append(table)
    return Group(Text(_header(report["env"])), *tables)


def report_markdown(report: dict) -> str:
    """The report as one markdown table: every method's overall row first, then method × category."""
    head = ["method", "category", *_COLUMNS]
    lines = [_header(report["env"]), "", "| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * len(_COLUMNS)) + "|"]
    methods = report["methods"]
    rows = [(name, "**overall**", m["overall"]) for name, m in methods.items()]
    categories = dict.fromkeys(c for m in methods.values() for c in m["categories"])
    rows += [(name, c, m["categories"][c]) for c in categories
             for name, m in methods.items() if c in m["categories"]]
    shown = bench_heads.labels(methods)
    lines += ["| " + " | ".join([shown[name], cat, *_cells(s)]) + " |" for name, cat, s in rows]
    return "\n".join(lines) + "\n"
