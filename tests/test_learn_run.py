"""Learning runs on a tiny random target with a random EAGLE-3 head: the guard (identical
outputs, a decision that follows its τ numbers, stopped between prompts), the run (trains on
recorded conversations, guards, promotes or keeps aside, adds the answers to a corpus version;
paused and resumed from its checkpoint; waiting for more use), ``find_head`` following the
learned pointer, idle learning's trigger, and ``edgespec learn`` on the command line. The
replay data is left out (its generation is ``training``'s, tested there)."""

from __future__ import annotations

import json
import threading

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.engine import Engine
from edgespec.heads import Eagle3Head, HeadConfig, find_head, fingerprint, save_head
from edgespec.heads.corpus import read_sources
from edgespec.heads.learned import target_dir
from edgespec.learn import run as run_mod
from edgespec.learn.guard import compare
from edgespec.learn.recorder import Recorder
from edgespec.learn.run import LearnSettings, run
from edgespec.learn.session import Learning, aux_layers, record_store
from edgespec.learn.store import Record
from edgespec.training import trainer

TEXTS = ["the cat sat on the mat", "hello there, how are you", "tell me about the sea",
         "what is twelve times seven", "write a poem about rain", "the dog ran in the park",
         "name three colours", "where is the river"]


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models.path(tie=False), tiny_models.load(tie=False)


def _head(path, target, seed: int):
    mx.random.seed(seed)
    config = HeadConfig.for_target(target, "eagle3")
    return save_head(path, config, Eagle3Head(config))


@pytest.fixture(scope="module")
def heads(model, tmp_path_factory):
    """Two random EAGLE-3 heads; ``shipped`` as the demo model's shipped one would be."""
    _, target = model
    root = tmp_path_factory.mktemp("heads")
    return {"shipped": _head(root / "models" / "tiny" / "eagle3", target, 1),
            "other": _head(root / "other" / "eagle3", target, 2), "models": root / "models"}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path, model, heads):
    """The shipped head is ``heads['shipped']``; nothing learned yet; recording on."""
    monkeypatch.setenv("EDGESPEC_LEARN_DIR", str(tmp_path / "learn"))
    monkeypatch.setenv("EDGESPEC_HEADS", str(tmp_path / "no-heads"))
    monkeypatch.setattr("edgespec.heads.find.REPO_MODELS", heads["models"])
    monkeypatch.setattr("edgespec.heads.find.WHEEL_MODELS", tmp_path / "no-models")
    monkeypatch.delenv("EDGESPEC_LEARN", raising=False)
    monkeypatch.setattr(model[1].tokenizer, "eos_token_ids", frozenset())


def _held(target, n: int = 2) -> list[Record]:
    return [Record(f"r{i}", None, {"prompt_ids": target.tokenizer.encode(t), "answer_tokens": 6},
                   0) for i, t in enumerate(TEXTS[:n])]


# ---- the guard --------------------------------------------------------------------------------

def test_the_guard_decides_on_tau_with_identical_outputs(model, heads):
    _, target = model
    old, new, held = heads["shipped"], heads["other"], _held(target)
    for min_gain in (-0.5, 0.01, 5.0):
        g = compare(target, old, new, held, max_tokens=8, min_gain=min_gain)
        assert g["prompts"] == 2 and g["identical_outputs"] == 2
        assert g["old"]["tokens"] == g["new"]["tokens"] == 12  # 6 answer tokens a prompt
        for side in ("old", "new"):
            assert g[side]["tau"] == round(g[side]["tokens"] / g[side]["forwards"], 4) >= 1
        assert g["wins"] == (g["new"]["tau"] >= g["old"]["tau"] * (1 + min_gain))
        assert g["wins"] == (min_gain < 0) or min_gain == 0.01
    assert compare(target, old, new, [], 8)["wins"] is False  # nothing to judge on


def test_the_guard_stops_between_prompts(model, heads):
    _, target = model
    assert compare(target, heads["shipped"], heads["other"], _held(target), 8,
                   stop=lambda: True) is None
    asked = []
    assert compare(target, heads["shipped"], heads["other"], _held(target), 8,
                   stop=lambda: asked.append(1) or len(asked) > 1) is None
    assert len(asked) == 2  # the first prompt ran, the second was not started


# ---- find_head and the learned pointer --------------------------------------------------------

def test_find_head_follows_the_learned_pointer(model, heads, tmp_path):
    _, target = model
    assert find_head(target, "eagle3") == heads["shipped"]
    folder = target_dir(fingerprint(target)) / "heads"
    learned = _head(folder / "eagle3-v0001", target, 5)
    (folder / "current.json").write_text(json.dumps({"eagle3": "eagle3-v0001"}))
    assert find_head(target, "eagle3") == learned
    assert find_head(target, "eagle3", learned=False) == heads["shipped"]
    (folder / "current.json").write_text(json.dumps({"eagle3": "eagle3-v0009"}))  # gone
    assert find_head(target, "eagle3") == heads["shipped"]


# ---- the run --------------------------------------------------------------------------------

def _record(target, texts=TEXTS, tokens: int = 16) -> list[list[int]]:
    """Decode each text with a recorder on (as a surface does); the answers."""
    recorder = Recorder(record_store(target), aux_layers(target), "test")
    engine = Engine(target, None, recorder=recorder)
    answers = [engine.generate(target.tokenizer.encode(t), max_tokens=tokens).token_ids
               for t in texts]
    recorder.close()
    return answers


def _settings(**kw) -> LearnSettings:
    base = dict(budget_s=600, min_answer_tokens=40, held_min=2, held_max=2, epochs=2,
                batch_size=2, window=64, depths=2, checkpoint_every=2, guard_tokens=6)
    return LearnSettings(**{**base, **kw})


@pytest.fixture
def no_replay(monkeypatch):
    calls = []
    monkeypatch.setattr(run_mod, "replay_store",
                        lambda *a, **k: calls.append(a) or (None, {"questions": 0}))
    return calls


@pytest.mark.parametrize("min_gain", [-0.5, 5.0])
def test_a_run_trains_guards_and_settles_the_head(min_gain, model, heads, no_replay):
    path, target = model
    answers = _record(target)
    fp = fingerprint(target)
    report = run(target, path, _settings(min_gain=min_gain), log=lambda m: None)
    want = {"records": 8, "train_records": 6, "held_records": 2, "train_answer_tokens": 6 * 16,
            "replay_sequences": 0}
    assert {k: report["data"][k] for k in want} == want and report["data"]["rows"] > 6 * 16
    assert report["base"] == str(heads["shipped"]) and len(no_replay) == 1
    t = report["train"]
    assert t["done"] == t["steps"] == report["plan"]["steps"] >= 2 and t["resumed_from"] == 0
    g = report["guard"]
    assert g["prompts"] == 2 and g["identical_outputs"] == 2 and g["wins"] == (min_gain < 0)
    head = target_dir(fp) / "heads" / ("eagle3-v0001" if g["wins"] else "rejected/eagle3-v0001")
    assert report["head"] == str(head) and (head / "config.json").is_file()
    assert json.loads((head / "learned.json").read_text())["guard"] == g
    if g["wins"]:
        assert report["status"] == "promoted" and find_head(target, "eagle3") == head
    else:
        assert report["status"].startswith("rejected")
        assert find_head(target, "eagle3") == heads["shipped"]
    train = target_dir(fp) / "train"
    assert not (train / "active.json").exists() and not list(train.glob("run-*"))
    assert json.loads((train / "last_run.json").read_text())["status"] == report["status"]
    assert not list((target_dir(fp) / "heads").glob(".candidate-*"))
    # the answers joined the corpus as its `user` source, a new version found for the target
    assert report["corpus"]["user_documents"] == 8
    corpus = target_dir(fp) / "heads" / report["corpus"]["version"]
    assert find_head(target, "corpus") == corpus
    users = read_sources(corpus)[0]["user"]
    assert sorted(d.tolist()[:16] for d in users) == sorted(answers)


def test_a_paused_run_resumes_from_its_checkpoint(model, heads, no_replay, monkeypatch):
    path, target = model
    _record(target)
    fp = fingerprint(target)
    pause = threading.Event()
    train = trainer.train
    calls = []

    class PauseAfterTwoSteps:
        def __init__(self, deadline):
            self.deadline, self.checks = deadline, 0

        def passed(self):  # asked before each step
            self.checks += 1
            if self.checks == 3:
                pause.set()  # as a request arriving during the third step would
            return self.deadline.passed()

    def paused_train(*args, deadline=None, **kw):
        calls.append(1)
        return train(*args, deadline=PauseAfterTwoSteps(deadline) if len(calls) == 1
                     else deadline, **kw)

    monkeypatch.setattr(trainer, "train", paused_train)
    s = _settings(epochs=3)
    first = run(target, path, s, pause=pause, log=lambda m: None)
    assert first["status"] == "paused" and first["train"]["done"] == 2
    assert first["train"]["stopped_by_budget"] and "guard" not in first
    train_dir = target_dir(fp) / "train"
    active = json.loads((train_dir / "active.json").read_text())
    assert active["plan"]["steps"] == first["plan"]["steps"] > 2
    assert not (target_dir(fp) / "heads" / "eagle3-v0001").exists()
    assert not list((target_dir(fp) / "heads" / "rejected").glob("*"))

    second = run(target, path, s, pause=threading.Event(), log=lambda m: None)
    assert second["train"]["resumed_from"] == 2
    assert second["train"]["done"] == second["plan"]["steps"] == first["plan"]["steps"]
    assert second["status"] in ("promoted", "rejected (kept aside, not used)")
    assert second["status"] == ("promoted" if second["guard"]["wins"] else
                                "rejected (kept aside, not used)")
    assert not (train_dir / "active.json").exists()


def test_a_run_waits_for_more_use(model, heads, no_replay):
    path, target = model
    _record(target, TEXTS[:3], tokens=4)
    report = run(target, path, _settings(), log=lambda m: None)
    assert report["status"] == ("waiting for more use: 8 answer tokens recorded for training, "
                                "40 needed")
    assert report["data"]["records"] == 3 and report["data"]["held_records"] == 1  # the newest
    assert "train" not in report and not no_replay
    assert report["corpus"]["user_documents"] == 3


def test_a_run_without_an_eagle3_head_says_so(model, no_replay, monkeypatch, tmp_path):
    path, target = model
    monkeypatch.setattr("edgespec.heads.find.REPO_MODELS", tmp_path / "no-models")
    _record(target, TEXTS[:1], tokens=4)
    assert run(target, path, _settings(), log=lambda m: None)["status"] == \
        "no eagle3 head to start from"


def _trained_through(target, name: str) -> None:
    """As a run that trained leaves it: its report names the newest record it could use."""
    train = target_dir(fingerprint(target)) / "train"
    train.mkdir(parents=True, exist_ok=True)
    (train / "last_run.json").write_text(json.dumps({"data": {"trained_through": name}}))


def test_idle_learning_is_due_when_a_run_would_train_or_one_is_paused(model, no_replay):
    """``due`` counts as ``run`` does: the training split (the newest records held out) needs
    ``min_answer_tokens``, and that many must be new since the last run that trained."""
    path, target = model
    learning = Learning("serve", min_answer_tokens=20)
    assert not learning.due(target)
    _record(target, TEXTS[:3], tokens=8)  # 24 answer tokens, 16 of them in the training split
    assert not learning.due(target)
    report = run(target, path, _settings(), log=lambda m: None)
    assert report["status"].startswith("waiting for more use")  # as due said
    _record(target, TEXTS[3:5], tokens=8)  # 40 in all: 24 to train on (two held out)
    assert learning.due(target)  # the waiting run did not restart the count
    _trained_through(target, record_store(target).records()[-1].name)
    assert not learning.due(target)  # nothing new since the last run that trained
    _record(target, TEXTS[:3], tokens=8)
    assert learning.due(target)  # 24 new answer tokens
    _trained_through(target, record_store(target).records()[-1].name)
    train = target_dir(fingerprint(target)) / "train"
    (train / "active.json").write_text("{}")
    assert learning.due(target)  # a paused run


def test_idle_learning_sees_new_records_in_a_full_store(model, no_replay):
    """At its byte budget the store drops one old record for each new one: their number stays
    the same, the new ones are still new."""
    path, target = model
    store = record_store(target, 1)
    layers = list(aux_layers(target))

    def add(n=30):
        aux = np.zeros((20_000, 4), np.float16)  # with its tokens ~240 kB: four fit in 1 MiB
        store.add(aux, np.arange(20_001, dtype=np.int32),
                  {"prompt_ids": [1, 2], "first": 0, "answer_row": 1, "answer_tokens": n,
                   "aux_layers": layers})

    for _ in range(5):
        add()
    full = len(store.records())
    assert full == 4
    learning = Learning("serve", budget_mb=1, min_answer_tokens=50)
    assert learning.due(target)
    _trained_through(target, store.records()[-1].name)
    assert not learning.due(target)
    add()
    assert not learning.due(target)  # 30 new answer tokens
    add()
    assert len(store.records()) == full and learning.due(target)  # 60


def test_a_model_s_learn_folders_are_private(model, no_replay):
    import stat

    path, target = model
    _record(target, TEXTS[:1], tokens=4)
    root = target_dir(fingerprint(target))
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(root) == 0o700 and mode(root / "records") == 0o700


# ---- the command line -----------------------------------------------------------------------

def test_learn_status_forget_and_rollback_on_the_command_line(model):
    path, target = model
    _record(target, TEXTS[:2], tokens=5)
    root = target_dir(fingerprint(target))
    runner = CliRunner()
    result = runner.invoke(main, ["learn", "status", "--model", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"folder {root}" in result.output
    assert "recorded: 2 conversations, 10 answer tokens" in result.output
    assert "in use: the shipped heads" in result.output
    result = runner.invoke(main, ["learn", "status", "--model", str(path), "--json"])
    assert json.loads(result.output)["records"]["conversations"] == 2

    result = runner.invoke(main, ["learn", "rollback", "--model", str(path)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "nothing to roll back" in result.output

    result = runner.invoke(main, ["learn", "forget", "--model", str(path), "--yes"])
    assert result.exit_code == 0 and f"deleted {root}" in result.output
    assert not root.exists()
    result = runner.invoke(main, ["learn", "forget", "--model", str(path), "--yes"])
    assert result.exit_code == 0 and "nothing learned" in result.output


def test_learn_run_and_a_rollback_of_a_promoted_head_on_the_command_line(model, tmp_path):
    path, target = model
    _record(target, TEXTS[:3], tokens=4)
    runner = CliRunner()
    out = tmp_path / "run.json"
    result = runner.invoke(main, ["learn", "run", "--model", str(path), "--budget", "1m",
                                  "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "status: waiting for more use" in result.output  # far below the default 2000 tokens
    assert json.loads(out.read_text())["data"]["records"] == 3
    result = runner.invoke(main, ["learn", "run", "--model", str(path), "--budget", "soon"])
    assert result.exit_code == 2 and "soon" in result.output

    fp = fingerprint(target)
    from edgespec.learn import versions

    candidate = versions.candidate_dir(fp, "eagle3")
    _head(candidate, target, 6)
    versions.promote(fp, "eagle3", candidate, {"decision": "test"})
    result = runner.invoke(main, ["learn", "status", "--model", str(path)])
    in_use = next(line for line in result.output.splitlines() if line.startswith("in use: "))
    assert "eagle3 eagle3-v0001" in in_use and "corpus corpus-v0001" in in_use  # the run's corpus
    assert "  promoted eagle3-v0001" in result.output.splitlines()
    result = runner.invoke(main, ["learn", "rollback", "--model", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == ("rolled back eagle3-v0001; in use now: the shipped eagle3 "
                                     "head")


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_the_learning_flags_are_on_serve_and_chat(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    for flag in ("--learn / --no-learn", "--learn-budget-mb", "--learn-when-idle"):
        assert flag in result.output, flag
    result = CliRunner().invoke(main, [command, "--learn-budget-mb", "0"])
    assert result.exit_code == 2 and "learn-budget-mb" in result.output


def test_records_of_other_feature_layers_are_not_trained_on(model, heads, no_replay):
    """Records made while a head with other feature layers was in use hold other features: the
    run does not mix them into the head's training data (their answers still join the corpus)."""
    path, target = model
    layers = aux_layers(target)
    assert tuple(sorted(layers)) != layers  # the tiny head's layers, (2, 1, 0), reordered below
    recorder = Recorder(record_store(target), tuple(sorted(layers)), "test")
    engine = Engine(target, None, recorder=recorder)
    for text in TEXTS:
        engine.generate(target.tokenizer.encode(text), max_tokens=16)
    recorder.close()
    report = run(target, path, _settings(), log=lambda m: None)
    assert report["status"].startswith("waiting for more use: 0 answer tokens")
    assert report["data"]["records"] == 8 and report["data"]["train_records"] == 0
    assert report["corpus"]["user_documents"] == 8
