"""Both ends of ``scripts/gpu_distill.py`` on this machine: the bundle it reads, and the head it
writes turned into an edgespec head.

    python scripts/gpu_bundle.py prepare BUNDLE [--model demo]
        BUNDLE/model/  the converted target (config.json, model.safetensors, tokenizer.json)
        BUNDLE/recipe.json  the chat template around the user's text, the Magpie prefix, the
                       stop ids, the openers, the aux layers, the token limits (edgespec's own
                       values, so the GPU run follows ``edgespec train``'s recipe)
        BUNDLE/eval/   the held-out evaluation prompts: the GPU run refuses to make
                       data without them, and drops every question that overlaps one
    python scripts/gpu_bundle.py import RESULTS --out models/<model>/eagle3 [--model demo]
        reads head_layer.safetensors, head_lm.safetensors and report.json, checks the head
        against the target (fingerprint, shapes) and saves it with ``save_head`` (float16; the
        recipe holds the report of this run and of the ``--earlier`` runs it took data from).

The lent GPU machine of this workplace takes at most 64 MiB of files a call, less than the demo
model's 98 MB: the shipped head's runs carried ``model.safetensors`` in two pieces (``head -c`` /
``tail -c`` here, ``cat`` and a sha256 check there) over two calls on one warm machine. This
script does not split anything itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgespec.heads.config import HeadConfig  # noqa: E402
from edgespec.training.answers import OPENERS, _end_of_turn, _user_turn_prefix  # noqa: E402
from edgespec.training.exclusion import default_eval_dir  # noqa: E402
from edgespec.training.settings import TrainSettings  # noqa: E402

MARK = "\x00QUESTION\x00"


def load(model: str):
    from edgespec.targets.load import load_target
    from edgespec.loading.hub import resolve_model

    return load_target(resolve_model(model), "float32")


def recipe_for(target) -> dict:
    tok = target.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": MARK}], add_generation_prompt=True)
    before, after = text.split(MARK)
    s = TrainSettings(out="-")
    return {"template_before": before, "template_after": after,
            "user_turn_prefix_ids": _user_turn_prefix(tok),
            "stop_ids": sorted(set(tok.eos_token_ids) | _end_of_turn(tok)),
            "openers": list(OPENERS), "aux_layers": list(HeadConfig.for_target(target, "eagle3").aux_layers),
            "question_tokens": s.question_tokens, "answer_tokens": s.answer_tokens,
            "target_name": target.name, "check": greedy_check(target)}


def greedy_check(target, tokens: int = 48) -> dict:
    """One prompt and edgespec's own greedy continuation of it: the GPU run compares its twin's."""
    import mlx.core as mx

    from edgespec.prompt import encode_prompt

    ids = encode_prompt(target.tokenizer, [{"role": "user", "content": "Write a short story "
                                            "about a lighthouse keeper."}])
    cache, out, step = target.make_cache(), [], ids
    for _ in range(tokens):
        o = target.score(step, cache)
        cache.commit()
        step = [int(mx.argmax(o.logits[-1]))]
        out.append(step[0])
    return {"prompt_ids": ids, "answer_ids": out}


def prepare(args) -> None:
    target = load(args.model)
    out = Path(args.bundle)
    (out / "model").mkdir(parents=True, exist_ok=True)
    for f in [target.path / "config.json", target.path / "tokenizer.json",
              *target.path.glob("*.safetensors")]:  # one weights file, or a converter's shards
        shutil.copyfile(f, out / "model" / f.name)
    (out / "recipe.json").write_text(json.dumps(recipe_for(target), indent=1))
    eval_dir = default_eval_dir()
    files = sorted(eval_dir.rglob("*.jsonl")) if eval_dir.is_dir() else []
    if not files:
        raise SystemExit(f"no evaluation prompts in {eval_dir}: the GPU run would refuse to start")
    (out / "eval").mkdir(exist_ok=True)
    for f in files:
        shutil.copyfile(f, out / "eval" / f.name)
    print(f"bundle in {out}: {target.name}, {len(files)} evaluation file(s)")


def import_head(args) -> None:
    import mlx.core as mx
    import numpy as np

    from edgespec.heads.eagle3 import Eagle3Head
    from edgespec.heads.formats import save_head

    target = load(args.model)
    res = Path(args.results)
    layer, lm = mx.load(str(res / "head_layer.safetensors")), mx.load(str(res / "head_lm.safetensors"))
    ids = np.array(lm.pop("draft_ids")).astype(np.int64)
    report = json.loads((res / "report.json").read_text())
    runs = [json.loads((Path(r) / "report.json").read_text()) for r in args.earlier] + [report]
    questions = [r["questions"] for r in runs]
    config = HeadConfig.for_target(target, "eagle3", draft_vocab_size=len(ids),
                                   aux_layers=tuple(json.loads((Path(args.bundle) / "recipe.json")
                                                               .read_text())["aux_layers"]))
    head = Eagle3Head(config)
    head.load_weights([(k, v.astype(mx.float32)) for k, v in {**layer, **lm}.items()], strict=True)
    head.set_draft_vocab(ids)
    config.check(target)
    recipe = {"made_by": "scripts/gpu_distill.py (scripts/gpu_bundle.py import)",
              "prompts": {"source": "magpie", "kept": sum(q["kept"] for q in questions),
                          "dropped_eval": sum(q["dropped_eval"] for q in questions)},
              "runs": runs}
    save_head(args.out, config, head, recipe=recipe)
    print(f"saved {args.out}: draft vocabulary {len(ids)}, held-out {report['train']['evals'][-1]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("bundle")
    p.add_argument("--model", default="demo")
    i = sub.add_parser("import")
    i.add_argument("results")
    i.add_argument("--out", required=True)
    i.add_argument("--bundle", required=True, help="the bundle the run read (its recipe.json)")
    i.add_argument("--model", default="demo")
    i.add_argument("--earlier", nargs="*", default=[],
                   help="results folders of earlier runs whose answers this run trained on too "
                        "(--extra): their reports go into the recipe")
    args = ap.parse_args(argv)
    prepare(args) if args.cmd == "prepare" else import_head(args)


if __name__ == "__main__":
    main()
