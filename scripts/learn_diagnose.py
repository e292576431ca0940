"""Where a learned head's gain goes: two heads' top-1 agreement with the target, offline.

Builds a feature store (``learn/dataset.py``) from the records a learn run held out for its
guard (``train/last_run.json`` names the run's split only while it is active, so the held-out
slice is taken again with ``learn.run.split_history``, as the run took it) and evaluates each
head's EAGLE-3 loss and per-depth top-1 there (``training.trainer.evaluate``, the float head,
what training optimises), and the share of answer tokens the head's draft vocabulary holds.

    EDGESPEC_LEARN_DIR=... .venv/bin/python scripts/learn_diagnose.py --old shipped \\
        --new PATH/heads/rejected/eagle3-v0001
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--old", default="shipped")
    ap.add_argument("--new", required=True)
    ap.add_argument("--train-too", action="store_true",
                    help="also evaluate on the records the run trained on")
    a = ap.parse_args()

    import numpy as np

    from edgespec.heads.formats import load_head
    from edgespec.heads.learned import resolve_alias
    from edgespec.learn.dataset import build
    from edgespec.learn.run import LearnSettings, split_history
    from edgespec.learn.session import record_store
    from edgespec.targets import load
    from edgespec.training import trainer
    from edgespec.training.objectives import Eagle3Objective
    from edgespec.training.vocab import vocab_coverage

    target = load(a.model, progress=False)
    train, held = split_history(record_store(target).records(), LearnSettings())
    sets = {"held_out": held, **({"trained_on": train} if a.train_too else {})}
    out = {}
    for name, recs in sets.items():
        folder = Path(tempfile.mkdtemp()) / "data"
        for which, alias in (("old", a.old), ("new", a.new)):
            config, head = load_head(resolve_alias(alias, target, "eagle3"), target)
            data = build(folder, recs, None, target.args.hidden_size, config.aux_layers)
            objective = Eagle3Objective(head, target, data, 3)
            windows = trainer.windows(data, list(range(len(data))), objective, 512)
            ids = np.array(head.to_target_ids(np.arange(config.draft_vocab_size)))
            out.setdefault(name, {})[which] = {
                "conversations": len(recs), **trainer.evaluate(objective, windows, 8),
                "draft_vocab_coverage": vocab_coverage(data, list(range(len(data))), ids,
                                                       target.args.vocab_size)}
        print(json.dumps({name: out[name]}, indent=1), flush=True)


if __name__ == "__main__":
    main()
