"""``edgespec bench --plot FILE``: a bench report drawn as speedup and τ per method × category.

Contract: ``plot_report(report, path)`` writes one figure, PNG or SVG by the file's extension:
speedup over plain decoding (top) and τ, tokens per target forward (bottom), as grouped bars,
one group per category with the overall numbers first and one bar per method; plain decoding is
the dashed line at 1.0 in both panels (its speedup and its τ are 1 by definition). matplotlib is
imported only here, through its object API (no pyplot state, no display needed).
"""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError, EdgespecError
from .extras import missing_extra

FORMATS = ("png", "svg")
BASELINE = "none"
_PANELS = (("speedup", "speedup over plain decoding (×)"), ("tau", "τ: tokens per target forward"))


def check_plot_path(path) -> str:
    """The format of ``path`` ('png' or 'svg'); ConfigError for any other extension."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ConfigError(f"--plot file must end in .png or .svg, got {str(path)!r}")
    try:  # before the bench runs, not after
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as e:
        raise missing_extra("edgespec bench --plot", e) or e
    return fmt


def plot_report(report: dict, path) -> Path:
    """Draw ``report`` (``bench.run_bench``'s result) to ``path``; returns the path written."""
    fmt = check_plot_path(path)
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise EdgespecError("bench --plot needs matplotlib; install it with: pip install matplotlib") from e
    methods = [m for m in report["methods"] if m != BASELINE] or [BASELINE]
    groups = ["overall", *dict.fromkeys(c for m in report["methods"].values() for c in m["categories"])]
    width = min(16.0, max(8.0, 0.2 * len(groups) * (len(methods) + 1) + 2))
    fig = Figure(figsize=(width, 7.0), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (key, label) in zip(axes, _PANELS):
        _draw_panel(ax, report["methods"], methods, groups, key, label)
    axes[1].set_xticks(range(len(groups)), groups, rotation=20 if len(groups) > 6 else 0, ha="right"
                       if len(groups) > 6 else "center")
    handles, labels = axes[0].get_legend_handles_labels()
    # as many columns as the longest label lets fit across the figure (about 0.06 in a character
    # and 0.5 in for the swatch and gap): long METHOD@HEAD labels wrap instead of running off
    fit = int(width / (0.06 * max(map(len, labels)) + 0.5))
    fig.legend(handles, labels, loc="outside lower center", ncols=max(1, min(len(labels), 8, fit)),
               frameon=False)
    fig.suptitle(_title(report.get("env", {})), fontsize="medium")
    fig.savefig(path, format=fmt, dpi=120)
    return Path(path)


def _draw_panel(ax, results: dict, methods: list[str], groups: list[str], key: str, label: str):
    from .bench_heads import labels

    shown = labels(methods)  # METHOD@FOLDER: the folder's telling tail, as in the tables
    width = 0.8 / len(methods)
    colors = [f"C{i}" for i in range(len(methods))]
    for i, (name, color) in enumerate(zip(methods, colors)):
        xs = [g + (i - (len(methods) - 1) / 2) * width for g in range(len(groups))]
        ys = [_value(results[name], group, key) for group in groups]
        bars = ax.bar(xs, [y if y is not None else 0.0 for y in ys], width * 0.92, color=color,
                      label=shown[name])
        ax.bar_label(bars, labels=[f"{ys[0]:.2f}" if ys[0] is not None else "—"] + [""] * (len(ys) - 1),
                     fontsize="x-small", padding=2, rotation=90)  # numbers: overall group only
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2, label="plain decoding (1.0)")
    ax.axvline(0.5, color="0.75", linewidth=0.8)  # overall | categories
    ax.set_ylabel(label)
    ax.set_ylim(0, max(1.2, ax.get_ylim()[1] * 1.08))
    ax.grid(axis="y", color="0.9")
    ax.set_axisbelow(True)


def _value(result: dict, group: str, key: str) -> float | None:
    summary = result["overall"] if group == "overall" else result["categories"].get(group)
    return None if summary is None else summary.get(key)


def _title(env: dict) -> str:
    s = env.get("sampling") or {}
    decoding = "greedy" if not s.get("temperature") else f"temperature {s['temperature']}"
    parts = [env.get("model"), env.get("dtype"), env.get("backend"),
             f"{env['num_prompts']} prompts" if env.get("num_prompts") else None,
             f"max_tokens {env['max_tokens']}" if env.get("max_tokens") else None, decoding]
    return "edgespec bench · " + " · ".join(str(p) for p in parts if p)
