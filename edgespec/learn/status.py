"""What ``edgespec learn status`` and ``learn run`` print: the facts as a dict, and as lines.

``status_of(target)`` reads the target's learn folder (nothing is loaded but config files and
record metadata): whether learning is on, the records (count, answer tokens, rows, bytes, bytes
per 1,000 rows, oldest and newest), the heads in use, every promoted and rejected version with
its guard numbers, a paused run, the last run's report.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..heads.config import fingerprint
from ..heads.learned import read_current, target_dir
from .session import learning_on, record_store
from .store import DEFAULT_BUDGET_MB
from .versions import versions


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def status_of(target) -> dict:
    fp = fingerprint(target)
    root = target_dir(fp)
    records = record_store(target).records()
    rows = sum(r.rows for r in records)
    size = sum(r.bytes for r in records)
    return {
        "model": target.name, "fingerprint": fp, "folder": str(root),
        "recording": "on" if learning_on(None, True) else "off (EDGESPEC_LEARN=0)",
        "records": {"conversations": len(records),
                    "answer_tokens": sum(r.answer_tokens for r in records), "rows": rows,
                    "bytes": size, "default_budget_bytes": DEFAULT_BUDGET_MB * 2**20,
                    "bytes_per_1000_rows": round(1000 * size / rows) if rows else None,
                    "oldest": records[0].meta.get("created") if records else None,
                    "newest": records[-1].meta.get("created") if records else None},
        "in_use": read_current(fp), "versions": versions(fp),
        "paused_run": (root / "train" / "active.json").is_file(),
        "last_run": _json(root / "train" / "last_run.json"),
        "total_bytes": folder_bytes(root) if root.exists() else 0,
    }


def describe(info: dict) -> str:
    r = info["records"]
    lines = [f"model {info['model']} (fingerprint {info['fingerprint']})",
             f"folder {info['folder']} ({info['total_bytes'] / 2**20:.1f} MiB in all; "
             "local only, `edgespec learn forget` deletes it)",
             f"recording: {info['recording']}",
             f"recorded: {r['conversations']} conversations, {r['answer_tokens']} answer tokens, "
             f"{r['bytes'] / 2**20:.1f} MiB"
             + (f" ({r['bytes_per_1000_rows'] / 2**20:.2f} MiB per 1,000 tokens), "
                f"{r['oldest']} .. {r['newest']}" if r["conversations"] else "")]
    in_use = info["in_use"]
    lines.append("in use: " + (", ".join(f"{k} {v}" for k, v in in_use.items()) if in_use
                               else "the shipped heads (nothing learned in use)"))
    for kind in ("promoted", "rejected"):
        for v in info["versions"][kind]:
            g = v.get("guard") or {}
            numbers = (f": τ {g['old']['tau']} -> {g['new']['tau']} on {g['prompts']} held-out "
                       "prompts" if g.get("old") else "")
            lines.append(f"  {kind} {v['version']}{numbers}")
    if info["paused_run"]:
        lines.append("a paused run continues at the next `edgespec learn run` (or idle spell)")
    if info["last_run"]:
        lines.append(f"last run: {info['last_run'].get('status')}")
    return "\n".join(lines)


def describe_run(report: dict) -> str:
    lines = [f"status: {report['status']} ({report.get('seconds', 0):.0f} s)"]
    d = report.get("data", {})
    lines.append(f"data: {d.get('train_records', 0)} conversations to train on "
                 f"({d.get('train_answer_tokens', 0)} answer tokens), {d.get('held_records', 0)} "
                 f"held out; {d.get('replay_sequences', 0)} general sequences mixed in")
    if "train" in report:
        t = report["train"]
        lines.append(f"train: {t.get('done')}/{t.get('steps')} steps, {t.get('rows_per_s')} rows/s; "
                     f"held-out conversations before {t.get('held_out_before')}, after "
                     f"{t.get('held_out')}")
    if report.get("guard"):
        lines.append(f"guard: {report['guard']['decision']}")
    if report.get("head"):
        lines.append(f"head: {report['head']}")
    c = report.get("corpus", {})
    if c.get("user_documents"):
        lines.append(f"corpus: {c['user_documents']} recorded answers joined it ({c['version']})")
    return "\n".join(lines)
