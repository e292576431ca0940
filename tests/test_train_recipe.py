"""``edgespec train`` end to end on a tiny random model: both kinds from a small --data file (one
MT-bench prompt in it, dropped and counted), the head and recipe written, the work dir reused;
a run stopped by its time budget and resumed gives the head an uninterrupted run gives; bad
flags are one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.heads.corpus import load_corpus, read_sources
from edgespec.heads.formats import load_head
from edgespec.training import clock, trainer
from edgespec.training.prompts import TrainingDataError
from edgespec.training.recipe import phase_corpus, run
from edgespec.training.settings import settings_from
from edgespec.training.settings import TrainSettings

MT_BENCH_PROMPT = ("Compose an engaging travel blog post about a recent trip to Hawaii, "
                   "highlighting cultural experiences and must-see attractions.")
SMALL = ["--answer-tokens", "16", "--gen-batch", "4", "--steps", "4", "--batch-size", "2",
         "--draft-vocab", "48", "--depths", "2", "--medusa-heads", "2", "--eval-every", "2",
         "--held-out", "0.25"]


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models.path(layers=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    records = [{"prompt": "Tell me about sailing ships."},
               {"messages": [{"role": "user", "content": "What is a prime number?"}]},
               {"conversations": [{"from": "human", "value": "How do bees make honey?"}]},
               {"turns": ["Describe a quiet morning.", "Now as a poem."]},
               {"prompt": MT_BENCH_PROMPT},
               {"prompt": "List five red fruits."},
               {"prompt": "Why is the sky blue?"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_train_both_kinds_from_data(model_dir, data, tmp_path, monkeypatch, tiny_models):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    target = tiny_models.load(layers=4)
    code, out = invoke("train", "eagle3", "--model", model_dir, "--data", data,
                       "--out", tmp_path / "eagle3", *SMALL)
    assert code == 0, out
    recipe = json.loads((tmp_path / "eagle3" / "recipe.json").read_text())
    assert recipe["status"] == "done"
    assert recipe["prompts"]["dropped_eval"] == 1 and recipe["prompts"]["kept"] == 6
    assert "1 dropped: overlap with evaluation prompts" in out
    assert recipe["data"]["sequences"] == 6 and recipe["train"]["done"] == 4
    assert set(recipe["train"]["held_out"]) == {"step", "loss", "d0", "d1"}
    assert recipe["train"]["draft_vocab"] == 48 and 0 < recipe["train"]["held_out_label_coverage"] <= 1
    assert set(recipe["timings_s"]) == {"prompts", "answers", "features", "train", "save"}
    assert recipe["answers"]["all_runs"]["tokens"] == 6 * 16  # random models rarely end a turn
    assert recipe["work_dir"].startswith(str(tmp_path / "cache" / "train"))
    config, head = load_head(tmp_path / "eagle3", target)
    assert config.kind == "eagle3" and config.draft_vocab_size == 48
    # the data were not answered twice: medusa reuses the work dir's answers and features
    code, out = invoke("train", "medusa", "--model", model_dir, "--data", data,
                       "--out", tmp_path / "medusa", *SMALL)
    assert code == 0, out
    recipe = json.loads((tmp_path / "medusa" / "recipe.json").read_text())
    assert recipe["answers"]["new_tokens"] == 0 and recipe["features"]["new_tokens"] == 0
    assert set(recipe["train"]["held_out"]) == {"step", "loss", "h0", "h1"}
    config, heads = load_head(tmp_path / "medusa", target)
    assert config.kind == "medusa" and config.num_heads == 2 and not config.own_lm_head
    # sharing the target's LM head, it drafts from --draft-vocab of its rows
    assert config.draft_vocab_size == 48 and len(heads.draft_ids) == 48
    assert recipe["train"]["draft_vocab"] == 48
    acc = recipe["topk_accuracy"]  # per head, top-1..8 held-out: what the drafter's shape reads
    assert len(acc) == 2 and all(len(a) == 8 and a == sorted(a) for a in acc)
    # soft labels: the same answers, features scored again into their own folder
    code, out = invoke("train", "eagle3", "--model", model_dir, "--data", data, "--soft-labels",
                       3, "--out", tmp_path / "soft", *SMALL)
    assert code == 0, out
    recipe = json.loads((tmp_path / "soft" / "recipe.json").read_text())
    assert recipe["answers"]["new_tokens"] == 0 and recipe["features"]["new_tokens"] > 0
    assert (Path(recipe["work_dir"]) / "features-soft3" / "soft_p.npy").exists()
    assert recipe["train"]["done"] == 4 and load_head(tmp_path / "soft", target)[0].kind == "eagle3"


def test_a_corpus_is_the_answers_and_gains_one_source_per_run(model_dir, data, tmp_path,
                                                            monkeypatch, tiny_models):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    target = tiny_models.load(layers=4)
    out = tmp_path / "corpus"
    code, text = invoke("train", "corpus", "--model", model_dir, "--data", data, "--out", out, *SMALL)
    assert code == 0, text
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["status"] == "done" and recipe["prompts"]["dropped_eval"] == 1
    assert set(recipe["timings_s"]) == {"prompts", "answers", "save"}  # no features, no training
    c = recipe["corpus"]
    assert c["documents"] == 6 and c["tokens"] == 6 * 16 and c["held_out_documents"] == 2
    assert 0 <= c["held_out_top1"] <= 1
    assert load_corpus(out, target).tokens == 6 * 16
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"prompt": "Name a blue flower."}) + "\n")
    code, text = invoke("train", "corpus", "--model", model_dir, "--data", more, "--out", out, *SMALL)
    assert code == 0, text
    sources, section = read_sources(out)
    assert [s["documents"] for s in section["sources"]] == [6, 1]
    code, text = invoke("train", "corpus", "--model", model_dir, "--data", data, "--out", out, *SMALL)
    assert code == 0, text  # the same source again replaces its documents
    assert [s["documents"] for s in read_sources(out)[1]["sources"]] == [6, 1]
    # another model's corpus at --out is not mixed into, nor is a head's folder: said at once
    other = tiny_models.path(layers=4, seed=5)
    code, text = invoke("train", "corpus", "--model", other, "--data", data, "--out", out, *SMALL)
    assert code != 0 and "another model's" in text and str(out) in text
    assert "work dir" not in text  # refused before the run began (its first line names it)
    code, text = invoke("train", "eagle3", "--model", model_dir, "--data", data, "--out", out, *SMALL)
    assert code != 0 and "holds a corpus; pass another --out" in text
    with pytest.raises(TrainingDataError, match="no answer tokens"):
        phase_corpus(settings_from("corpus", {"out": str(tmp_path / "empty")}), target,
                     [{"answer": []}])


def test_a_budget_stop_then_resume_gives_the_uninterrupted_head(model_dir, data, tmp_path, monkeypatch):
    base = dict(kind="eagle3", model=str(model_dir), data=str(data), answer_tokens=12,
                gen_batch=4, steps=6, batch_size=2, draft_vocab=40, depths=2, eval_every=2,
                checkpoint_every=100, held_out=0.25, seed=5)
    quiet = lambda line: None  # noqa: E731
    whole = run(TrainSettings(out=str(tmp_path / "whole"), work_dir=str(tmp_path / "w1"), **base), quiet)

    taken = {"steps": 0}
    batch_at = trainer.batch_at

    def counting(*args, **kw):
        taken["steps"] += 1
        return batch_at(*args, **kw)

    with monkeypatch.context() as m:  # the budget runs out after 3 training steps
        m.setattr(trainer, "batch_at", counting)
        m.setattr(clock, "now", lambda: 0.0 if taken["steps"] < 3 else 1e9)
        cut = run(TrainSettings(out=str(tmp_path / "cut"), work_dir=str(tmp_path / "w2"),
                                time_budget="1h", **base), quiet)
    assert cut["status"] == "stopped by the time budget" and cut["train"]["done"] == 3
    resumed = run(TrainSettings(out=str(tmp_path / "cut"), work_dir=str(tmp_path / "w2"), **base), quiet)
    assert resumed["status"] == "done" and resumed["train"]["resumed_from"] == 3
    a = mx.load(str(tmp_path / "whole" / "head.safetensors"))
    b = mx.load(str(tmp_path / "cut" / "head.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(np.array(a[name]), np.array(b[name]), err_msg=name)
    assert whole["train"]["held_out"] == resumed["train"]["held_out"]


def test_a_model_that_never_ends_a_question_is_an_error(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    code, out = invoke("train", "eagle3", "--model", model_dir, "--questions", "2",
                       "--question-tokens", "8", "--gen-batch", "2", "--out", tmp_path / "x")
    last = out.strip().splitlines()[-1]
    assert code == 2 and last.startswith("edgespec: error: ")
    assert "no usable question in 5 rounds" in last and "pass --data prompts" in last


@pytest.mark.parametrize("args, needle", [
    (["train", "hydra", "--out", "x"], "'hydra' is not one of 'eagle3', 'medusa'"),
    (["train", "eagle3", "--out", "x", "--lr", "abc"], "'abc' is not a valid float"),
    (["train", "eagle3", "--out", "x", "--warmup", "0.9"], "warmup must be a number in [0.0, 0.5], got 0.9"),
    (["train", "eagle3", "--out", "x", "--time-budget", "soon"], "time_budget must be a positive duration"),
    (["train", "eagle3", "--out", "x", "--bogus"], "No such option '--bogus'"),
    (["train", "eagle3"], "out must be a non-empty string"),
    (["train", "eagle3", "--out", "x", "--data", "/no/such.jsonl"], "/no/such.jsonl"),
])
def test_bad_flags_are_one_line_and_exit_2(args, needle):
    code, out = invoke(*args)
    assert code == 2 and needle in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_warm_start_continues_from_a_trained_head(model_dir, data, tmp_path, monkeypatch,
                                                   tiny_models):
    """--init-from trains on top of a finished head (its weights and draft vocabulary, not a
    fresh init), in its own training folder; a head of the other kind is refused in one line."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    target = tiny_models.load(layers=4)
    small = [*SMALL[:SMALL.index("--draft-vocab")], "--draft-vocab", "40", *SMALL[SMALL.index("--depths"):]]
    code, out = invoke("train", "eagle3", "--model", model_dir, "--data", data,
                       "--out", tmp_path / "first", *small)
    assert code == 0, out
    # a learning rate too small to move any weight: the result is the starting head
    code, out = invoke("train", "eagle3", "--model", model_dir, "--data", data, "--lr", "1e-12",
                       "--out", tmp_path / "again", "--init-from", tmp_path / "first", *SMALL)
    assert code == 0, out
    _, first = load_head(tmp_path / "first", target)
    config, again = load_head(tmp_path / "again", target)
    assert config.draft_vocab_size == 40  # the starting head's vocabulary, not --draft-vocab 48
    assert np.array_equal(np.array(first.to_target_ids(np.arange(40))),
                          np.array(again.to_target_ids(np.arange(40))))
    for (name, a), (_, b) in zip(sorted(_flat(first)), sorted(_flat(again))):
        assert np.allclose(np.array(a), np.array(b), atol=1e-3), name  # float16 on disk
    recipe = json.loads((tmp_path / "again" / "recipe.json").read_text())
    assert recipe["train"]["init_from"] == str(tmp_path / "first")
    assert recipe["train"]["done"] == 4 and recipe["train"]["resumed_from"] == 0
    code, out = invoke("train", "medusa", "--model", model_dir, "--data", data,
                       "--out", tmp_path / "m", "--init-from", tmp_path / "first", *SMALL)
    assert code == 2 and "holds a head of kind eagle3" in out and "Traceback" not in out


def _flat(module):
    from mlx.utils import tree_flatten
    return tree_flatten(module.parameters())


def test_without_mlx_lm_the_answers_phase_says_what_to_install(model_dir, data, tmp_path,
                                                                monkeypatch):
    import sys

    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "mlx_lm", None)  # import mlx_lm... raises ImportError
    monkeypatch.setitem(sys.modules, "mlx_lm.utils", None)
    code, out = invoke("train", "eagle3", "--model", model_dir, "--data", data,
                       "--out", tmp_path / "h", *SMALL)
    assert code != 0 and "needs mlx-lm" in out and "pip install" in out
    assert "Traceback" not in out
