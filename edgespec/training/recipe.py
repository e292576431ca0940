"""``edgespec train eagle3|medusa|corpus``: the whole recipe, in five resumable phases.

    1 prompts   --data (read_prompts) or Magpie questions from the target; eval prompts excluded
    2 answers   the target's greedy answers, batched (mlx-lm BatchGenerator)
    3 features  teacher forcing through Target.score -> the float16 memory-mapped store
    4 train     AdamW + warm-up/cosine + clipping on the store; held-out top-1 per depth/head
    5 save      save_head (edgespec layout) + recipe.json (settings, data sizes, timings, metrics)

``corpus`` stops after phase 2: its answers' token ids become (or join, as one more source) the
corpus at ``--out`` (``heads/corpus.py``), with the table's top-1 agreement on a held-out split.

Contract: ``run(settings)`` does all five and returns the recipe (a dict, also written to
``<out>/recipe.json``). Everything it makes on the way lives in a work dir (default
``~/.cache/edgespec/train/<target fingerprint>/<source>``, never the repository): the
question/answer jsonl files, ``features/``, ``train-<kind>-<settings key>/`` checkpoints and
``timings.json`` (seconds per phase, summed over runs). A rerun of the same command skips what is
done and continues what was cut (by a kill or ``--time-budget``); a time budget that runs out in
phases 1-3 stops there (status ``incomplete``), in phase 4 the head is saved as trained so far.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import ConfigError, HeadError
from ..heads.config import HeadConfig, fingerprint
from ..heads.corpus import NgramTable, check_corpus, corpus_section, read_sources, save_corpus
from ..heads.find import a_head, head_kind
from ..heads.eagle3 import Eagle3Head
from ..heads.formats import load_head, save_head
from ..heads.medusa import MedusaHeads, target_lm_head_rows
from ..loading.hub import cache_dir, resolve_model
from ..targets import load_target
from . import trainer
from .clock import Deadline, PhaseTimes
from .answers import OPENERS, load_batch_model, read_records, write_answers, write_questions
from .exclusion import EvalExclusion
from .features import FeatureStore, write_features
from .objectives import Eagle3Objective, MedusaObjective
from .prompts import TrainingDataError, read_prompts
from .settings import TrainSettings
from .vocab import draft_vocabulary, vocab_coverage

PHASES = ("prompts", "answers", "features", "train", "save")
TRAIN_KEYS = ("kind", "draft_vocab", "depths", "medusa_heads", "medusa_layers", "own_lm_head",
              "epochs", "steps", "lr", "warmup", "weight_decay", "clip", "held_out", "seed",
              "batch_size", "window", "max_seq")


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def source_name(s: TrainSettings) -> str:
    """What the data depends on: the prompts' origin and the answer length."""
    if s.data is None:
        return (f"magpie{'-open' if s.question_openers else ''}-seed{s.seed}-q{s.question_tokens}"
                f"-a{s.answer_tokens}")
    return f"data-{hashlib.sha256(Path(s.data).read_bytes()).hexdigest()[:12]}-a{s.answer_tokens}"


def work_dir(s: TrainSettings, target_fp: str) -> Path:
    if s.work_dir is not None:
        return Path(s.work_dir).expanduser()
    return cache_dir() / "train" / target_fp / source_name(s)


def _check_manifest(folder: Path, manifest: dict) -> None:
    """A work dir holds one source's data for one target: refuse to mix."""
    path = folder / "manifest.json"
    if path.exists():
        have = json.loads(path.read_text())
        for key, value in manifest.items():
            if have.get(key) != value:
                raise ConfigError(f"the work dir {folder} holds data with {key}={have.get(key)!r}, "
                                  f"this run needs {value!r}; pass another --work-dir")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=1))


def run(s: TrainSettings, log: Callable[[str], None] = print) -> dict:
    """The recipe (see the module docstring); returns its report."""
    if s.data is not None and not Path(s.data).is_file():
        raise TrainingDataError(f"--data {s.data}: no such file; give a jsonl file of prompts")
    model_dir = resolve_model(s.model)
    target = load_target(model_dir, dtype="float32")
    _check_out(s, target)
    fp = fingerprint(target)
    folder = work_dir(s, fp)
    _check_manifest(folder, {"target": fp, "source": source_name(s), "answer_tokens": s.answer_tokens})
    clock, deadline = PhaseTimes(folder), Deadline(s.budget_s)
    exclusion = EvalExclusion.from_dir()
    log(f"edgespec train {s.kind}: target {target.name} ({fp}), work dir {folder}, "
        f"{len(exclusion)} evaluation prompts excluded")
    report = {"status": "incomplete", "work_dir": str(folder), "target": target.name,
              "target_fingerprint": fp, "settings": s.as_dict(), "timings_s": clock.run,
              "timings_total_s": clock.total}
    batch_model = None

    def generator():
        nonlocal batch_model
        if batch_model is None:
            batch_model = load_batch_model(model_dir)
        return batch_model

    questions, report["prompts"] = clock.timed("prompts", lambda: phase_prompts(
        s, target, folder, exclusion, generator, deadline))
    if len(questions) < report["prompts"]["wanted"]:
        return _stopped(report, "prompts", log)
    answers, report["answers"] = clock.timed("answers", lambda: phase_answers(
        s, target, folder, questions, generator, deadline))
    batch_model = None
    if not report["answers"]["complete"]:
        return _stopped(report, "answers", log)
    if s.kind == "corpus":
        earlier = _earlier_corpus_runs(Path(s.out))
        report["corpus"] = clock.timed("save", lambda: phase_corpus(s, target, answers))
        report["status"] = "done"
        report["earlier_runs"] = earlier
        (Path(s.out) / "recipe.json").write_text(json.dumps(report, indent=1))
        log(corpus_summary(report))
        return report
    features = folder / ("features" if not s.soft_labels else f"features-soft{s.soft_labels}")
    report["features"] = clock.timed("features", lambda: write_features(
        target, answers, features, aux_layers=aux_layers(target), max_seq=s.max_seq,
        soft_k=s.soft_labels, fingerprint=fp, deadline=deadline))
    if not report["features"]["complete"]:
        return _stopped(report, "features", log)
    store = FeatureStore.open(features)
    config, module, report["train"] = clock.timed("train", lambda: phase_train(
        s, target, store, folder, deadline))
    report["status"] = "stopped by the time budget" if report["train"]["stopped_by_budget"] else "done"
    if "topk_accuracy" in report["train"]:  # per head, top-1..8 on the held-out split
        report["topk_accuracy"] = report["train"]["topk_accuracy"]
    report["data"] = {"sequences": len(store), "tokens": store.tokens,
                      "answer_tokens": int(store.mask.sum())}
    clock.timed("save", lambda: save_head(s.out, config, module, recipe=report))
    (Path(s.out) / "recipe.json").write_text(json.dumps(report, indent=1))  # with the save's time
    log(summary(report))
    return report


def aux_layers(target) -> tuple[int, ...]:
    return HeadConfig.for_target(target, "eagle3").aux_layers


def _stopped(report: dict, phase: str, log) -> dict:
    report["stopped_in"] = phase
    log(f"time budget reached in phase {phase}: what is done is kept in {report['work_dir']}; "
        "run the same command again to continue")
    return report


def phase_prompts(s: TrainSettings, target, folder: Path, exclusion: EvalExclusion,
                  generator, deadline) -> tuple[list[dict], dict]:
    path = folder / "questions.jsonl"
    if s.data is not None:
        records, counts = read_prompts(s.data, exclusion)
        if read_records(path) != records:
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return records, {"source": s.data, "wanted": len(records), **counts}
    refused = {"eval": 0}

    def keep(text: str) -> bool:
        ok = exclusion.keep(text)
        refused["eval"] += not ok
        return ok

    have = read_records(path)
    counts = {}
    if len(have) < s.questions:
        counts = write_questions(generator(), target.tokenizer, path, s.questions, seed=s.seed,
                                 batch=s.gen_batch, max_tokens=s.question_tokens, keep=keep,
                                 openers=OPENERS if s.question_openers else (), deadline=deadline)
    records = read_records(path)[: s.questions]
    other = counts.get("dropped", 0) - refused["eval"]  # cut off, too short
    return records, {"source": "magpie", "wanted": s.questions, "kept": len(records),
                     "dropped_eval": refused["eval"], "dropped_other": other}


def phase_answers(s: TrainSettings, target, folder: Path, questions: list[dict], generator,
                  deadline) -> tuple[list[dict], dict]:
    path = folder / "answers.jsonl"
    wanted = {q["id"] for q in questions}
    have = {r["id"] for r in read_records(path)}
    counts = {"complete": True, "new_tokens": 0}
    if not wanted <= have:
        counts = write_answers(generator(), target.tokenizer, questions, path, batch=s.gen_batch,
                               max_tokens=s.answer_tokens, deadline=deadline)
    counts["plain_tokens_per_s"] = plain_decoding_rate(target)  # same machine, same moment
    answers = [r for r in read_records(path) if r["id"] in wanted]
    counts["all_runs"] = _add_up(folder / "answers_stats.json", counts)
    counts["answers"] = len(answers)
    counts["answer_tokens"] = sum(len(r["answer"]) for r in answers)
    return answers, counts


def _check_out(s: TrainSettings, target) -> None:
    """Before any work: ``--out`` must not hold another kind of head, nor a corpus of another
    model (a corpus run adds to a corpus of the same model there)."""
    out = Path(s.out)
    if not (out / "config.json").is_file():
        return
    have = head_kind(out)
    if have is not None and have != s.kind:
        raise ConfigError(f"--out {out} holds {a_head(have)}; pass another --out for this "
                          f"{s.kind} run")
    if s.kind == "corpus":
        try:
            check_corpus(corpus_section(out), target)
        except HeadError as e:
            raise ConfigError(f"--out {out}: {e}; pass another --out") from None


def phase_corpus(s: TrainSettings, target, answers: list[dict]) -> dict:
    """The answers' token ids as this source's documents in the corpus at ``s.out`` (a corpus
    there for the same target keeps its other sources; this source's earlier documents are
    replaced); its held-out top-1 agreement is measured on a split of this source."""
    out, name = Path(s.out), source_name(s)
    sources = {}
    if (out / "config.json").is_file():  # a corpus of this model (``_check_out``)
        sources, _ = read_sources(out)
    docs = [list(r["answer"]) for r in answers if r["answer"]]
    if not docs:
        raise TrainingDataError(f"the model wrote no answer tokens for the {len(answers)} prompts "
                                f"of {name}: nothing to count into a corpus")
    sources[name] = docs
    held = max(1, round(len(docs) * s.held_out)) if len(docs) > 1 else 0
    rng = np.random.default_rng(s.seed)
    order = rng.permutation(len(docs))
    held_docs = [np.asarray(docs[i]) for i in order[:held]]
    train_docs = [np.asarray(docs[i]) for i in order[held:]]
    others = [np.asarray(d) for n, ds in sources.items() if n != name for d in ds]
    section = save_corpus(out, target, sources)
    return {"sources": section["sources"], "documents": sum(len(d) for d in sources.values()),
            "tokens": sum(x["tokens"] for x in section["sources"]),
            "held_out_documents": held,
            "held_out_top1": table_agreement(NgramTable(train_docs + others), held_docs)}


def _earlier_corpus_runs(out: Path) -> list[dict]:
    """What the earlier runs into the corpus at ``out`` did (its recipe keeps every run)."""
    try:
        prev = json.loads((out / "recipe.json").read_text())
    except (OSError, ValueError):
        return []
    if prev.get("settings", {}).get("kind") != "corpus":
        return []
    keep = ("settings", "prompts", "answers", "timings_s", "timings_total_s")
    return prev.get("earlier_runs", []) + [{k: prev[k] for k in keep if k in prev}]


def table_agreement(table: NgramTable, docs: list[np.ndarray]) -> float | None:
    """How often the table's guess after each position's history is the token that came next."""
    hits = total = 0
    for doc in docs:
        for i in range(1, len(doc)):
            guess = table.guess(doc[max(0, i - table.max_context) : i].tolist())
            hits += guess is not None and guess[0] == doc[i]
            total += 1
    return round(hits / total, 4) if total else None


def corpus_summary(r: dict) -> str:
    c = r["corpus"]
    return "\n".join([
        f"status: {r['status']}",
        f"data: {r['prompts'].get('kept')} prompts ({r['prompts'].get('dropped_eval', 0)} dropped: "
        f"overlap with evaluation prompts), {r['answers']['answer_tokens']} answer tokens",
        f"corpus: {c['documents']} answers, {c['tokens']} tokens in {len(c['sources'])} source(s); "
        f"held-out top-1 agreement {c['held_out_top1']}",
        "time (this run): " + ", ".join(f"{k} {v:.0f}s" for k, v in r["timings_s"].items()),
    ])


def _add_up(path: Path, counts: dict) -> dict:
    """Batched-generation tokens and seconds summed over every run in this work dir."""
    total = json.loads(path.read_text()) if path.exists() else {"tokens": 0, "seconds": 0.0}
    if counts.get("new_tokens"):
        total["tokens"] += counts["new_tokens"]
        total["seconds"] = round(total["seconds"] + counts["seconds"], 1)
        path.write_text(json.dumps(total))
    total["tokens_per_s"] = round(total["tokens"] / total["seconds"], 1) if total["seconds"] else None
    return total


def plain_decoding_rate(target, tokens: int = 32) -> float:
    """Tokens/s of one-at-a-time greedy decoding with edgespec's own target (the baseline the
    batched answers are compared to)."""
    cache = target.make_cache()
    out = target.score(target.tokenizer.encode("Write a short story about a lighthouse."), cache)
    cache.commit()
    tok = int(mx.argmax(out.logits[-1]))
    t0 = time.perf_counter()
    for _ in range(tokens):
        out = target.score([tok], cache)
        cache.commit()
        tok = int(mx.argmax(out.logits[-1]))
    return round(tokens / (time.perf_counter() - t0), 1)


def build_head(s: TrainSettings, target, store: FeatureStore, train_seqs, held_seqs):
    """A fresh head for ``s.kind`` (seeded), or the ``init_from`` head, and what its draft
    vocabulary covers."""
    mx.random.seed(s.seed)
    if s.init_from is not None:
        return warm_start(s, target, store, train_seqs, held_seqs)
    ids, coverage = draft_vocabulary(store, train_seqs, held_seqs, s.draft_vocab,
                                     target.args.vocab_size)
    vocab = {"draft_vocab": len(ids), "held_out_label_coverage": coverage}
    if s.kind == "medusa":
        reduced = not s.own_lm_head and len(ids) < target.args.vocab_size
        config = HeadConfig.for_target(target, "medusa", num_heads=s.medusa_heads,
                                       num_layers=s.medusa_layers, own_lm_head=s.own_lm_head,
                                       draft_vocab_size=len(ids) if reduced else 0)
        heads = MedusaHeads(config)
        heads.init_from_target(target)
        if reduced:
            heads.set_draft_vocab(ids)
        return config, heads, vocab if reduced else {}
    config = HeadConfig.for_target(target, "eagle3", draft_vocab_size=len(ids),
                                   aux_layers=tuple(store.meta["aux_layers"]))
    head = Eagle3Head(config)
    head.set_draft_vocab(ids)
    head.lm_head.weight = target_lm_head_rows(target, ids)
    return config, head, vocab


def warm_start(s: TrainSettings, target, store: FeatureStore, train_seqs, held_seqs):
    """The ``init_from`` head, float32, checked to be of ``s.kind`` and for this target; an
    EAGLE-3 head keeps its own draft vocabulary (its LM head rows are tied to it)."""
    config, module = load_head(s.init_from, target)
    if config.kind != s.kind:
        raise ConfigError(f"init_from {s.init_from!r} holds a head of kind {config.kind}; "
                          f"training {s.kind} starts only from a head of kind {s.kind}")
    if s.kind == "medusa":
        ids = module.draft_ids
        if ids is None:  # the whole vocabulary
            return config, module, {}
    else:
        ids = np.array(module.to_target_ids(np.arange(config.draft_vocab_size)))
    coverage = vocab_coverage(store, held_seqs, ids, target.args.vocab_size)
    return config, module, {"draft_vocab": len(ids), "held_out_label_coverage": coverage,
                            "init_from": s.init_from}


def phase_train(s: TrainSettings, target, store: FeatureStore, folder: Path, deadline):
    train_seqs, held_seqs = trainer.split(len(store), s.held_out, s.seed)
    config, module, vocab = build_head(s, target, store, train_seqs, held_seqs)
    objective = (Eagle3Objective(module, target, store, s.depths, soft=s.soft_labels > 0)
                 if s.kind == "eagle3"
                 else MedusaObjective(module, target, store))
    n_windows = len(trainer.windows(store, train_seqs, objective, s.window))
    steps = trainer.plan_steps(n_windows, s.batch_size, s.epochs, s.steps)
    plan = trainer.Plan(steps=steps, batch_size=s.batch_size, window=s.window, lr=s.lr_for_kind,
                        warmup=round(s.warmup * steps), weight_decay=s.weight_decay, clip=s.clip,
                        seed=s.seed, eval_every=s.eval_every, checkpoint_every=s.checkpoint_every)
    soft = {"soft_labels": s.soft_labels} if s.soft_labels else {}  # older folders keep their key
    # Medusa heads with a draft vocabulary train another loss than the full-vocabulary ones of
    # older folders with the same settings: their own folder
    vocab_loss = ({"medusa_draft_vocab": True}
                  if s.kind == "medusa" and module.draft_ids is not None else {})
    key = _digest({**{k: getattr(s, k) for k in TRAIN_KEYS}, **_start_key(s), **soft, **vocab_loss})
    result = trainer.train(objective, store, plan, folder / f"train-{s.kind}-{key}",
                           train_seqs=train_seqs, held_seqs=held_seqs, deadline=deadline,
                           resume=s.resume)
    result.update(vocab, train_sequences=len(train_seqs), held_sequences=len(held_seqs))
    if s.kind == "medusa":  # what the drafter chooses its tree's shape from
        acc = objective.topk_accuracy(trainer.windows(store, held_seqs, objective, s.window))
        if acc is not None:
            result["topk_accuracy"] = acc
    return config, module, result


def _start_key(s: TrainSettings) -> dict:
    """A warm start trains in its own folder, named also by the starting weights' bytes."""
    if s.init_from is None:
        return {}
    digest = hashlib.sha256()
    for f in sorted(Path(s.init_from).glob("*.safetensors")):
        digest.update(f.read_bytes())
    return {"init_from": digest.hexdigest()[:12]}


def summary(r: dict) -> str:
    """The end-of-run report: data, throughput, time per phase, held-out agreement."""
    a, f, t = r["answers"]["all_runs"], r["features"]["all_runs"], r["train"]
    held = {k: v for k, v in t.get("held_out", {}).items() if k != "step"}
    lines = [
        f"status: {r['status']}  ({t.get('done')}/{t.get('steps')} steps)",
        f"data: {r['prompts'].get('kept')} prompts ({r['prompts'].get('dropped_eval', 0)} dropped: "
        f"overlap with evaluation prompts), {r['data']['sequences']} sequences, "
        f"{r['data']['tokens']} tokens ({r['data']['answer_tokens']} trained positions)",
        (f"answers: {a['tokens']} tokens at {a['tokens_per_s']} tok/s batched" if a["tokens"] else
         "answers: written before this work dir kept timings") +
        f" (plain decoding now: {r['answers']['plain_tokens_per_s']} tok/s)",
        f"features: {f['tokens']} tokens at {f['tokens_per_s']} tok/s (labels agree with the "
        f"answers at {r['features']['label_agreement']:.2%} of answer positions)",
        f"train: {t.get('rows_per_s')} rows/s; held-out: " + ", ".join(f"{k} {v}" for k, v in held.items()),
        "time (this run): " + ", ".join(f"{k} {v:.0f}s" for k, v in r["timings_s"].items()),
        "time (every run in this work dir): "
        + ", ".join(f"{k} {v:.0f}s" for k, v in r["timings_total_s"].items()),
    ]
    if "held_out_label_coverage" in t:
        lines.insert(2, f"draft vocabulary: {t['draft_vocab']} tokens cover "
                        f"{t['held_out_label_coverage']:.1%} of held-out labels")
    return "\n".join(lines)
