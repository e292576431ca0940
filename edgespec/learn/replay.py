"""General data mixed into learning, so a head fitted to one user does not forget the rest.

Contract: ``replay_store(target, model_dir, folder, tokens, deadline, aux_layers)`` makes (once per target;
later runs reuse it) a teacher-forced feature store of the recipe's kind of data: Magpie
questions the model writes itself, started with the recipe's generic task words
(``training.answers.OPENERS``), evaluation prompts excluded, answered greedily by the target,
about ``tokens`` tokens in all. Every phase is resumable, so a run stopped by its budget (or
paused for a request) continues where it was. Returns the store cut to the sequences finished
so far (None when none is), and what it cost.

Why regenerate rather than ship the original data: the shipped head's training data is millions
of tokens made on a GPU; a few thousand general sequences are enough to anchor a fine-tune, and
they come from the same model and recipe.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..heads.config import fingerprint
from ..training.answers import OPENERS, load_batch_model, read_records, write_answers, write_questions
from ..training.clock import passed
from ..training.exclusion import EvalExclusion
from ..training.features import FeatureStore, write_features
from .store import private_dir

ANSWER_TOKENS = 192
QUESTION_TOKENS = 96
SEED = 23


def replay_store(target, model_dir: Path, folder: Path, tokens: int, deadline,
                 aux_layers: tuple[int, ...], gen_batch: int = 32) -> tuple[FeatureStore | None, dict]:
    """The general feature store (see the module doc) and a report."""
    folder = private_dir(Path(folder))
    t0 = time.perf_counter()
    count = max(4, tokens // (ANSWER_TOKENS + 40))
    exclusion = EvalExclusion.from_dir()
    model = None

    def generator():
        nonlocal model
        if model is None:
            model = load_batch_model(model_dir)
        return model

    questions = read_records(folder / "questions.jsonl")
    if len(questions) < count and not passed(deadline):
        write_questions(generator(), target.tokenizer, folder / "questions.jsonl", count,
                        seed=SEED, batch=gen_batch, max_tokens=QUESTION_TOKENS,
                        keep=exclusion.keep, openers=OPENERS, deadline=deadline)
        questions = read_records(folder / "questions.jsonl")
    questions = questions[:count]
    answers = read_records(folder / "answers.jsonl")
    if {q["id"] for q in questions} - {a["id"] for a in answers} and not passed(deadline):
        write_answers(generator(), target.tokenizer, questions, folder / "answers.jsonl",
                      batch=gen_batch, max_tokens=ANSWER_TOKENS, deadline=deadline)
        answers = read_records(folder / "answers.jsonl")
    model = None
    report = {"questions": len(questions), "wanted": count, "answers": len(answers)}
    if len(answers) < len(questions) or not answers:
        report["seconds"] = round(time.perf_counter() - t0, 1)
        return None, report
    features = write_features(target, answers, folder / "features",
                              aux_layers=aux_layers,
                              max_seq=1024, fingerprint=fingerprint(target), deadline=deadline)
    report.update(features=features["done"], seconds=round(time.perf_counter() - t0, 1))
    if not features["done"]:
        return None, report
    store = FeatureStore.open(folder / "features")
    done = store.offsets[: features["done"] + 1]
    return dataclasses.replace(store, offsets=done), report
