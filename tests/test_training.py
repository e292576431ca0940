"""The training pieces on a tiny random model: the feature store (what teacher forcing writes,
resumed after a stop), the draft vocabulary, the trainer (split, schedule, a stopped-and-resumed
run equal to an uninterrupted one), the settings' validation and their generated options."""

from __future__ import annotations

import dataclasses
import json

import click
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edgespec.errors import ConfigError
from edgespec.heads.config import HeadConfig
from edgespec.heads.eagle3 import Eagle3Head
from edgespec.heads.medusa import MedusaHeads
from edgespec.training import trainer
from edgespec.training.features import FeatureStore, StoreMismatch, write_features
from edgespec.training.objectives import Eagle3Objective, MedusaObjective
from edgespec.training.settings import FLAGS, TrainSettings, click_options, settings_from
from edgespec.training.vocab import draft_vocabulary

AUX = (1, 2, 3)


class StopAfter:
    """A deadline that passes after ``n`` checks (a time budget running out at a known point)."""

    def __init__(self, n: int):
        self.left = n

    def passed(self) -> bool:
        self.left -= 1
        return self.left < 0


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return tiny_models.load(layers=4, tie=False)


def fake_answers(vocab: int, n: int = 6, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"id": i, "ids": rng.integers(3, vocab, 5 + i).tolist(),
             "answer": rng.integers(3, vocab, 9 + 2 * i).tolist()} for i in range(n)]


@pytest.fixture(scope="module")
def store(tiny, tmp_path_factory) -> FeatureStore:
    folder = tmp_path_factory.mktemp("store")
    write_features(tiny, fake_answers(tiny.args.vocab_size, n=12), folder, aux_layers=AUX,
                   max_seq=64, chunk=7)
    return FeatureStore.open(folder)


def test_the_store_holds_what_the_target_computes(tiny, tmp_path):
    answers = fake_answers(tiny.args.vocab_size)
    info = write_features(tiny, answers, tmp_path, aux_layers=AUX, max_seq=20, chunk=6)
    assert info["complete"] and info["sequences"] == 6
    st = FeatureStore.open(tmp_path)
    for s, rec in enumerate(answers):
        ids = (rec["ids"] + rec["answer"])[:20]  # cut at max_seq
        P = len(rec["ids"])
        out = tiny.score(ids, tiny.make_cache(), capture=AUX)
        rows = st.rows(s)
        want = np.concatenate([np.array(out.captured[i]) for i in AUX], axis=-1)
        np.testing.assert_allclose(st.aux[rows], want, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(st.hidden[rows], np.array(out.hidden), rtol=2e-3, atol=2e-3)
        assert st.ids[rows].tolist() == ids
        assert st.mask[rows].tolist() == [0] * (P - 1) + [1] * (len(ids) - P + 1)
        labels = np.array(mx.argmax(out.logits, axis=-1))
        assert (st.labels[rows][P - 1:] == labels[P - 1:]).all()
        assert (st.labels[rows][: P - 1] == -1).all()
    assert st.aux.dtype == np.float16 and st.aux.shape[1] == 3 * tiny.args.hidden_size


def test_a_stopped_store_resumes_to_the_same_arrays(tiny, tmp_path):
    answers = fake_answers(tiny.args.vocab_size)
    full = tmp_path / "full"
    write_features(tiny, answers, full, aux_layers=AUX, max_seq=64)
    part = tmp_path / "part"
    first = write_features(tiny, answers, part, aux_layers=AUX, max_seq=64, deadline=StopAfter(2))
    assert first["done"] == 2 and not first["complete"]
    second = write_features(tiny, answers, part, aux_layers=AUX, max_seq=64)
    assert second["complete"] and second["new_tokens"] == first["tokens"] - first["all_runs"]["tokens"]
    a, b = FeatureStore.open(full), FeatureStore.open(part)
    for name in ("aux", "hidden", "ids", "labels", "mask", "offsets"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    with pytest.raises(StoreMismatch, match="aux_layers"):
        write_features(tiny, answers, part, aux_layers=(0, 1, 2), max_seq=64)


def test_draft_vocabulary_counts_the_training_split_only():
    labels = np.array([5, 5, 5, 7, 7, 2, 9, 9, 9, 9, 1, 1], dtype=np.int32)
    mask = np.array([1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1], dtype=np.uint8)
    st = FeatureStore(None, {}, np.array([0, 6, 12]), aux=None, ids=None, labels=labels, mask=mask)
    ids, coverage = draft_vocabulary(st, [0], [1], size=2, vocab_size=12)
    assert ids.tolist() == [5, 7]  # 5 x3, 7 x2 in sequence 0; 2 is masked out; 9 is held out
    assert coverage == 0.0  # held-out labels are 9, 9, 9, 9, 1, 1
    ids, coverage = draft_vocabulary(st, [0, 1], [1], size=3, vocab_size=12)
    assert ids.tolist() == [1, 5, 9] and coverage == 1.0  # 7 and 1 tie (x2): the smaller id
    ids, coverage = draft_vocabulary(st, [0, 1], [1], size=1, vocab_size=12)
    assert ids.tolist() == [9] and coverage == round(4 / 6, 4)


def test_split_is_seeded_disjoint_and_keeps_one_of_each():
    train, held = trainer.split(40, 0.1, seed=3)
    assert sorted(train + held) == list(range(40)) and len(held) == 4
    assert (train, held) == trainer.split(40, 0.1, seed=3) != trainer.split(40, 0.1, seed=4)
    assert [len(x) for x in trainer.split(2, 0.01, 0)] == [1, 1]


def test_schedule_warms_up_then_decays():
    plan = trainer.Plan(steps=100, batch_size=2, window=16, lr=1e-3, warmup=10, weight_decay=0.0,
                        clip=1.0, seed=0, eval_every=50, checkpoint_every=50)
    lr = trainer.schedule(plan)
    values = [float(lr(mx.array(i))) for i in (0, 5, 10, 50, 99)]
    assert 0 < values[0] < values[1] < values[2] == pytest.approx(1e-3)
    assert values[2] > values[3] > values[4] >= 1e-3 / 20 - 1e-9


def test_epoch_batches_cover_each_window_once_grouped_by_length():
    rng = np.random.default_rng(0)
    train = [(s, 0, int(n)) for s, n in enumerate(rng.integers(1, 300, 203))]
    batches = [trainer.batch_at(k, train, 4, seed=2) for k in range(trainer.steps_per_epoch(203, 4))]
    seen = [w for b in batches for w in b]
    assert len(seen) == len(set(seen)) == 200 and all(len(b) == 4 for b in batches)
    assert batches == [trainer.batch_at(k, train, 4, seed=2) for k in range(50)]
    assert batches[0] != trainer.batch_at(50, train, 4, seed=2)  # the next epoch, reshuffled
    spread = np.mean([max(w[2] for w in b) - min(w[2] for w in b) for b in batches])
    assert spread < 60  # random batches of 4 lengths in 1..300 spread ~150 apart


def _head(kind, tiny, store):
    mx.random.seed(0)
    if kind == "eagle3":
        head = Eagle3Head(HeadConfig.for_target(tiny, "eagle3", draft_vocab_size=64, aux_layers=AUX))
        head.set_draft_vocab(np.arange(64) * 2)
        return Eagle3Objective(head, tiny, store, depth=2)
    return MedusaObjective(MedusaHeads(HeadConfig.for_target(tiny, "medusa", num_heads=2,
                                                             own_lm_head=False)), tiny, store)


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(kind, tiny, store, tmp_path):
    train, held = trainer.split(len(store), 0.2, seed=1)
    plan = trainer.Plan(steps=7, batch_size=3, window=9, lr=3e-3, warmup=2, weight_decay=0.01,
                        clip=0.5, seed=1, eval_every=3, checkpoint_every=2)

    def run(folder, deadline=None):
        objective = _head(kind, tiny, store)
        result = trainer.train(objective, store, plan, folder, train_seqs=train, held_seqs=held,
                               deadline=deadline)
        return objective.module, result

    whole, r_whole = run(tmp_path / "whole")
    _, r_cut = run(tmp_path / "cut", deadline=StopAfter(3))
    assert r_cut["stopped_by_budget"] and r_cut["done"] == 3
    resumed, r_resumed = run(tmp_path / "cut")
    assert r_resumed["resumed_from"] == 3 and r_resumed["done"] == 7
    for (name, a), (_, b) in zip(tree_flatten(whole.parameters()), tree_flatten(resumed.parameters())):
        np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=name)
    assert r_whole["history"] == r_resumed["history"]  # the held-out evaluations, step by step
    assert set(r_whole["held_out"]) == {"step", "loss", *_head(kind, tiny, store).names}
    # only the newest two checkpoints are kept, and `latest` names the last
    kept = sorted(p.name for p in (tmp_path / "cut").glob("step-*"))
    assert kept == ["step-6", "step-7"] and (tmp_path / "cut" / "latest").read_text() == "step-7"


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_training_fits_the_training_windows(kind, tiny, store, tmp_path):
    """Random-token data has nothing to generalise, but the wiring (loss, gradients, clipping,
    AdamW, schedule) must fit what it trains on."""
    train, held = trainer.split(len(store), 0.25, seed=0)
    objective = _head(kind, tiny, store)
    train_w = trainer.windows(store, train, objective, 64)
    before = trainer.evaluate(objective, train_w, 4)
    plan = trainer.Plan(steps=30, batch_size=4, window=64, lr=1e-2, warmup=3, weight_decay=0.0,
                        clip=1.0, seed=0, eval_every=30, checkpoint_every=30)
    trainer.train(objective, store, plan, tmp_path, train_seqs=train, held_seqs=held)
    after = trainer.evaluate(objective, train_w, 4)
    assert after["loss"] < before["loss"] / 2
    assert after[objective.names[0]] > before[objective.names[0]]


def test_windows_split_long_sequences_and_skip_untrained_pieces(store):
    for objective in (Eagle3Objective, MedusaObjective):
        w = trainer.windows(store, list(range(len(store))), objective.__new__(objective), 4)
        for s in range(len(store)):
            r = store.rows(s)
            pieces = [(a, b) for t, a, b in w if t == s]
            assert all(b - a <= 4 for a, b in pieces)
            trained = [p for p in range(r.stop - r.start - 1) if store.mask[r.start + p + 1]]
            covered = [p for a, b in pieces for p in range(a, b)]
            assert set(trained) <= set(covered) and covered == sorted(set(covered))
            first = int(np.argmax(store.mask[r] > 0))  # P-1
            # eagle3 pieces start at 0, 4, 8, ... (prompt rows are context); medusa's at row P-2
            assert covered[0] == ((first - 1) // 4 * 4 if objective is Eagle3Objective else first - 1)


# --- settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, needle", [
    ("kind", "hydra", "kind must be one of: eagle3, medusa, corpus; got 'hydra'"),
    ("out", None, "out must be a non-empty string"),
    ("draft_vocab", 1, "draft_vocab must be an integer in [2, 10000000], got 1"),
    ("depths", 0, "depths must be an integer in [1, 16], got 0"),
    ("lr", 2.0, "lr must be a number in (0, 1] or None, got 2.0"),
    ("held_out", 0.0, "held_out must be a number in (0.0, 0.5], got 0.0"),
    ("time_budget", "soon", "time_budget must be a positive duration such as 900, 900s, 45m or 1.5h; got 'soon'"),
    ("steps", 0, "steps must be an integer in [1, 1000000000] or None, got 0"),
    ("questions", True, "questions must be an integer in [1, 10000000], got True"),
])
def test_bad_settings_name_the_value_and_the_range(field, value, needle):
    with pytest.raises(ConfigError) as e:
        TrainSettings(**{"out": "x", field: value})
    assert needle in str(e.value)


def test_budget_units_and_kind_defaults():
    assert TrainSettings(out="x", time_budget="45m").budget_s == 2700
    assert TrainSettings(out="x", time_budget="1.5h").budget_s == 5400
    assert TrainSettings(out="x", time_budget="90").budget_s == 90
    assert TrainSettings(out="x", kind="medusa").lr_for_kind == 1e-3
    assert TrainSettings(out="x", lr=0.01).lr_for_kind == 0.01


def test_every_setting_is_an_option():
    @click.command()
    @click_options
    def cmd(**kw):
        pass

    names = {p.name for p in cmd.params}
    assert names == {f.name for f in dataclasses.fields(TrainSettings)} - {"kind"}
    assert {f.name for f in FLAGS} == names
    s = settings_from("medusa", {"out": "o", "lr": None, "resume": False, "steps": 5})
    assert (s.kind, s.out, s.lr, s.resume, s.steps) == ("medusa", "o", None, False, 5)


def test_answers_resume_after_a_kill(tiny_models, tmp_path):
    """A kill leaves whole records and maybe a torn line: a rerun drops the torn line, keeps the
    finished answers and writes only the missing ones (greedy, so they equal a full run's)."""
    from edgespec.training.answers import load_batch_model, read_records, write_answers

    path = tiny_models.path(layers=2)
    target = tiny_models.load(layers=2)
    model = load_batch_model(path)
    questions = [{"id": i, "prompt": f"Question number {i}?"} for i in range(4)]
    full = tmp_path / "full.jsonl"
    info = write_answers(model, target.tokenizer, questions, full, batch=4, max_tokens=6)
    assert info["complete"] and info["answers"] == 4
    records = read_records(full)
    cut = tmp_path / "cut.jsonl"
    kept = "".join(json.dumps(r) + "\n" for r in records[:2])
    cut.write_text(kept + json.dumps(records[2])[:25])  # killed while writing the third
    assert len(read_records(cut)) == 2
    again = write_answers(model, target.tokenizer, questions, cut, batch=4, max_tokens=6)
    assert again["complete"] and again["new_tokens"] == 2 * 6
    by_id = lambda rs: {r["id"]: r for r in rs}  # noqa: E731
    assert by_id(read_records(cut)) == by_id(records)
    assert cut.read_text().startswith(kept)


def test_magpie_openers_start_each_question_and_resume_the_same(tiny_models, tmp_path, monkeypatch):
    """With openers each generator row is the user-turn prefix plus one opener's ids and the
    question is that opener followed by the model's text; the draw is seeded, so a run killed
    after some questions and rerun writes what an uninterrupted one writes."""
    from edgespec.training import answers

    target = tiny_models.load(layers=2)
    tok = target.tokenizer
    prefix = answers._user_turn_prefix(tok)
    seen = []

    def fake_generate(model, rows, *, on_done, **_):
        for i, row in enumerate(rows):
            seen.append(row)
            on_done(i, tok.encode(f" about thing {len(seen)} in detail.", add_special_tokens=False),
                    "stop")
        return sum(len(r) for r in rows)

    monkeypatch.setattr(answers, "generate_batched", fake_generate)
    openers = ("Write", "Solve", "Compare")
    full = tmp_path / "full.jsonl"
    answers.write_questions(None, tok, full, 10, seed=5, batch=2, openers=openers)
    records = answers.read_records(full)
    assert len(records) == 10
    used = set()
    for row, rec in zip(seen, records):
        opener = rec["prompt"].split()[0]
        assert opener in openers and rec["prompt"].startswith(opener + " about thing")
        assert row == prefix + tok.encode(opener, add_special_tokens=False)
        used.add(opener)
    assert used == set(openers)  # a seeded draw over 10 rows uses every opener here
    cut = tmp_path / "cut.jsonl"  # killed after the first round (batch 2: 8 rows a round)
    cut.write_text("".join(json.dumps(r) + "\n" for r in records[:8]))
    answers.write_questions(None, tok, cut, 10, seed=5, batch=2, openers=openers)
    assert [r["prompt"].split()[0] for r in answers.read_records(cut)] == \
        [r["prompt"].split()[0] for r in records]
    plain = tmp_path / "plain.jsonl"
    seen.clear()
    answers.write_questions(None, tok, plain, 3, seed=5, batch=4)
    assert all(row == prefix for row in seen)
    # the evaluation filter (``keep``) judges the whole question, opener included
    kept = tmp_path / "kept.jsonl"
    answers.write_questions(None, tok, kept, 6, seed=5, batch=2, openers=openers,
                            keep=lambda q: not q.startswith("Solve about"))
    assert {r["prompt"].split()[0] for r in answers.read_records(kept)} <= {"Write", "Compare"}


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_padding_a_batch_changes_neither_loss_nor_agreement(kind, tiny, store, monkeypatch):
    """Batches are padded to a multiple of ``objectives.PAD_TO`` rows (few shapes for the compiled
    step); the padded rows train nothing and are seen by no earlier row."""
    from edgespec.training import objectives

    train, _ = trainer.split(len(store), 0.2, seed=1)
    objective = _head(kind, tiny, store)
    w = trainer.windows(store, train, objective, 64)[:3]
    monkeypatch.setattr(objectives, "PAD_TO", 1)
    plain = objective.batch(w)
    loss_a, m_a = objective.loss(objective.module, plain)
    monkeypatch.setattr(objectives, "PAD_TO", 64)
    padded = objective.batch(w)
    assert padded["mask"].shape[1] == 64 > plain["mask"].shape[1]
    loss_b, m_b = objective.loss(objective.module, padded)
    np.testing.assert_allclose(float(loss_a), float(loss_b), rtol=1e-5)
    np.testing.assert_allclose([float(m) for m in m_a], [float(m) for m in m_b], atol=1e-6)


def test_a_store_with_soft_labels_holds_the_targets_top_k(tiny, tmp_path):
    answers = fake_answers(tiny.args.vocab_size, n=3)
    write_features(tiny, answers, tmp_path, aux_layers=AUX, max_seq=20, chunk=6, soft_k=4)
    st = FeatureStore.open(tmp_path)
    assert st.soft_ids.shape == (st.tokens, 4) and st.soft_p.dtype == np.float16
    for s, rec in enumerate(answers):
        ids = (rec["ids"] + rec["answer"])[:20]
        P = len(rec["ids"])
        probs = np.array(mx.softmax(tiny.score(ids, tiny.make_cache()).logits, axis=-1))
        rows = st.rows(s)
        want = np.argsort(-probs, axis=-1, kind="stable")[:, :4]
        assert (st.soft_ids[rows][P - 1:] == want[P - 1:]).all()
        assert (st.soft_ids[rows][P - 1:, 0] == st.labels[rows][P - 1:]).all()
        np.testing.assert_allclose(st.soft_p[rows][P - 1:],
                                   np.take_along_axis(probs, want, -1)[P - 1:], atol=2e-3)
        assert (st.soft_ids[rows][: P - 1] == -1).all() and (st.soft_p[rows][: P - 1] == 0).all()
    with pytest.raises(StoreMismatch, match="soft_k"):
        write_features(tiny, answers, tmp_path, aux_layers=AUX, max_seq=20, soft_k=0)
    write_features(tiny, answers, tmp_path / "plain", aux_layers=AUX, max_seq=20)
    plain = FeatureStore.open(tmp_path / "plain")
    assert plain.soft_ids is None
    with pytest.raises(ValueError, match="no soft labels"):
        Eagle3Objective(_head("eagle3", tiny, plain).module, tiny, plain, depth=1, soft=True)


@pytest.mark.parametrize("vocab", [None, 40])
def test_medusa_topk_accuracy_counts_labels_among_the_best_guesses(tiny, store, vocab):
    """Per head and k, the share of trained rows whose label (argmax at t+1+head) is among the
    head's k best guesses (over the draft vocabulary when there is one, a label outside it a
    miss): checked against a direct count, non-decreasing in k."""
    V = tiny.args.vocab_size
    mx.random.seed(3)
    c = HeadConfig.for_target(tiny, "medusa", num_heads=2, own_lm_head=False,
                              draft_vocab_size=vocab or 0)
    heads = MedusaHeads(c)
    for head in heads.heads:
        head.blocks[0].linear.weight = mx.random.normal(head.blocks[0].linear.weight.shape) * 0.3
    ids = np.arange(V)
    if vocab:
        ids = np.arange(0, V, 2)[:vocab]
        heads.set_draft_vocab(ids)
    objective = MedusaObjective(heads, tiny, store)
    held = trainer.windows(store, list(range(len(store))), objective, 64)
    acc = np.array(objective.topk_accuracy(held, k=4))
    assert acc.shape == (2, 4) and np.all(np.diff(acc, axis=1) >= 0) and acc[:, -1].max() > 0
    hits, rows = np.zeros((2, 4)), np.zeros(2)
    for w in held:
        b = objective.batch([w])
        T = b["hidden"].shape[1]
        logits = np.array(heads(b["hidden"][0], objective.target_head))  # (2, T, |ids|)
        labels, mask = np.array(b["argmax"][0]), np.array(b["mask"][0]) > 0
        for h in range(2):
            for t in range(T - 1 - h):
                if mask[t]:
                    best = ids[np.argsort(-logits[h, t], kind="stable")[:4]]
                    hits[h] += np.cumsum(best == labels[t + 1 + h]) > 0
                    rows[h] += 1
    np.testing.assert_allclose(acc, np.round(hits / rows[:, None], 4), atol=1e-4)
