"""The learning pieces that need no model: the record store (round trip, age order, the byte
budget, crash safety, private modes), the training set built from records, the head versions
(promote, reject, rollback, the pointer ``find_head`` follows) and the learning switches."""

from __future__ import annotations

import json
import os
import stat
import time

import numpy as np
import pytest

from edgespec.errors import ConfigError
from edgespec.learn import versions
from edgespec.learn.dataset import build
from edgespec.learn.flags import learning_from
from edgespec.learn.session import learning_on
from edgespec.learn.store import STALE_S, RecordStore


def _record(rows: int, width: int = 6, seed: int = 0, answer_row: int = 1):
    rng = np.random.default_rng(seed)
    aux = rng.standard_normal((rows, width)).astype(np.float16)
    tokens = rng.integers(3, 200, rows + 1).astype(np.int32)
    meta = {"prompt_ids": tokens[: answer_row + 1].tolist(), "first": 0,
            "answer_row": answer_row, "answer_tokens": rows - answer_row}
    return aux, tokens, meta


def _size(rows: int, width: int = 6) -> int:
    """A record's bytes on disk (its two arrays with their headers, and meta.json)."""
    return rows * width * 2 + (rows + 1) * 4 + 2 * 128 + 200


def test_a_record_reads_back_as_written_oldest_first(tmp_path):
    store = RecordStore(tmp_path / "records")
    assert store.records() == []  # no folder yet
    written = [_record(5 + i, seed=i) for i in range(3)]
    kept = [store.add(*w) for w in written]
    records = store.records()
    assert [r.name for r in records] == [k.name for k in kept] == sorted(k.name for k in kept)
    for rec, (aux, tokens, meta) in zip(records, written):
        a, t = rec.arrays()
        np.testing.assert_array_equal(a, aux)
        np.testing.assert_array_equal(t, tokens)
        assert a.dtype == np.float16 and t.dtype == np.int32
        assert rec.rows == aux.shape[0] and rec.answer_tokens == meta["answer_tokens"]
        assert rec.meta["prompt_ids"] == meta["prompt_ids"]
        assert rec.bytes == sum(f.stat().st_size for f in rec.path.iterdir())
    assert store.bytes() == sum(r.bytes for r in records)


def test_the_budget_evicts_the_oldest_and_refuses_a_record_bigger_than_it(tmp_path):
    budget = 3 * _size(40)
    store = RecordStore(tmp_path / "records", budget_bytes=budget)
    names = [store.add(*_record(40, seed=i)).name for i in range(6)]
    left = [r.name for r in store.records()]
    assert 1 <= len(left) < 6 and left == names[-len(left):]  # the newest stay
    assert store.bytes() <= budget
    assert store.add(*_record(budget // 12 + 10)) is None  # its arrays alone exceed the budget
    assert [r.name for r in store.records()] == left


def test_a_killed_write_is_never_read_and_a_stale_one_is_cleared(tmp_path):
    folder = tmp_path / "records"
    store = RecordStore(folder)
    good = store.add(*_record(4))
    whole = folder / ".tmp-00000000000000000001-1-aaaa"  # killed just before its rename
    whole.mkdir()
    np.save(whole / "aux.npy", np.zeros((2, 6), np.float16))
    np.save(whole / "tokens.npy", np.zeros(3, np.int32))
    (whole / "meta.json").write_text(json.dumps({"rows": 2, "answer_row": 0, "prompt_ids": [1]}))
    half = folder / ".tmp-00000000000000000002-1-bbbb"  # killed mid-write: no meta.json
    half.mkdir()
    (half / "aux.npy").write_bytes(b"\x93NUMPY partial")
    assert [r.name for r in store.records()] == [good.name]
    assert whole.exists() and half.exists()  # fresh: maybe another process still writing it
    old = time.time() - STALE_S - 60
    os.utime(half, (old, old))
    assert [r.name for r in RecordStore(folder).records()] == [good.name]
    assert not half.exists() and whole.exists()


def test_an_unreadable_record_is_skipped(tmp_path):
    store = RecordStore(tmp_path / "records")
    bad, good = store.add(*_record(4, seed=1)), store.add(*_record(5, seed=2))
    (bad.path / "meta.json").write_text('{"rows": 4, "answer_')  # a torn edit
    lacking = tmp_path / "records" / "00000000000000000009-1-cccc"
    lacking.mkdir()
    (lacking / "meta.json").write_text(json.dumps({"rows": 3}))  # not a record's fields
    assert [r.name for r in store.records()] == [good.name]
    assert store.add(*_record(3, seed=3)) is not None  # the store still takes records


def test_records_are_private_to_the_user(tmp_path):
    store = RecordStore(tmp_path / "learn" / "records")
    rec = store.add(*_record(4))
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(store.folder) == 0o700 and mode(rec.path) == 0o700
    assert {f.name: mode(f) for f in rec.path.iterdir()} == {
        "aux.npy": 0o600, "tokens.npy": 0o600, "meta.json": 0o600}


def test_the_training_set_is_the_records_rows_with_next_tokens_and_answer_mask(tmp_path):
    store = RecordStore(tmp_path / "records")
    width, layers = 6, (0, 1, 2)
    one, two = _record(5, width, seed=1, answer_row=2), _record(4, width, seed=2, answer_row=0)
    records = [store.add(*one), store.add(*two)]
    data = build(tmp_path / "data", records, None, hidden_size=2, aux_layers=layers)
    assert data.offsets.tolist() == [0, 5, 9] and data.hidden is None
    np.testing.assert_array_equal(data.aux, np.concatenate([one[0], two[0]]))
    for (aux, tokens, meta), rows in zip((one, two), (slice(0, 5), slice(5, 9))):
        np.testing.assert_array_equal(data.ids[rows], tokens[:-1])
        np.testing.assert_array_equal(data.labels[rows], tokens[1:])
        want = np.zeros(len(aux), np.uint8)
        want[meta["answer_row"]:] = 1
        np.testing.assert_array_equal(data.mask[rows], want)
    assert data.meta["user_sequences"] == 2 and data.meta["user_answer_tokens"] == 3 + 4
    assert data.meta["aux_layers"] == list(layers) and data.meta["replay_sequences"] == 0
    assert build(tmp_path / "data", records[:1], None, 2, layers).offsets.tolist() == [0, 5, 9]


# ---- versions -------------------------------------------------------------------------------

def _candidate(fp: str, tag: str):
    path = versions.candidate_dir(fp, "eagle3")
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"tag": tag}))
    return path


def test_promote_reject_and_roll_back_to_the_shipped_head(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_LEARN_DIR", str(tmp_path))
    fp = "f" * 16
    with pytest.raises(ConfigError, match="nothing to roll back"):
        versions.rollback(fp, "eagle3")
    v1 = versions.promote(fp, "eagle3", _candidate(fp, "a"), {"decision": "won"})
    lost = versions.reject(fp, "eagle3", _candidate(fp, "b"), {"decision": "lost"})
    v3 = versions.promote(fp, "eagle3", _candidate(fp, "c"), {"decision": "won again"})
    heads = tmp_path / fp / "heads"
    assert (v1, lost, v3) == (heads / "eagle3-v0001", heads / "rejected" / "eagle3-v0002",
                              heads / "eagle3-v0003")
    assert json.loads((lost / "learned.json").read_text()) == {"decision": "lost"}
    assert json.loads((heads / "current.json").read_text()) == {"eagle3": "eagle3-v0003"}
    assert not list(heads.glob(".candidate-*"))
    assert [(e["event"], e["version"]) for e in versions.history(fp)] == [
        ("promoted", "eagle3-v0001"), ("rejected", "eagle3-v0002"), ("promoted", "eagle3-v0003")]
    found = versions.versions(fp)
    assert [v["version"] for v in found["promoted"]] == ["eagle3-v0001", "eagle3-v0003"]
    assert [v["decision"] for v in found["rejected"]] == ["lost"]

    assert versions.rollback(fp, "eagle3") == ("eagle3-v0003", "eagle3-v0001")
    assert json.loads((heads / "current.json").read_text()) == {"eagle3": "eagle3-v0001"}
    assert versions.rollback(fp, "eagle3") == ("eagle3-v0001", None)  # the shipped head
    assert json.loads((heads / "current.json").read_text()) == {}
    assert v3.is_dir() and v1.is_dir()  # rolled back, still on disk
    with pytest.raises(ConfigError, match="nothing to roll back"):
        versions.rollback(fp, "eagle3")
    assert [e["event"] for e in versions.history(fp)][-2:] == ["rolled back", "rolled back"]


def test_rolling_back_to_a_deleted_version_lands_on_the_shipped_head(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_LEARN_DIR", str(tmp_path))
    fp = "e" * 16
    v1 = versions.promote(fp, "eagle3", _candidate(fp, "a"), {})
    versions.promote(fp, "eagle3", _candidate(fp, "b"), {})
    (v1 / "config.json").unlink()
    assert versions.rollback(fp, "eagle3") == ("eagle3-v0002", None)


# ---- switches -------------------------------------------------------------------------------

def test_learning_is_on_by_the_flag_else_the_default_and_off_by_environment(monkeypatch):
    monkeypatch.delenv("EDGESPEC_LEARN", raising=False)
    assert learning_on(None, True) and not learning_on(None, False)
    assert learning_on(True, False) and not learning_on(False, True)
    for off in ("0", "false", "No", " off "):
        monkeypatch.setenv("EDGESPEC_LEARN", off)
        assert not learning_on(True, True) and learning_from("serve", True) is None
    monkeypatch.setenv("EDGESPEC_LEARN", "1")
    learning = learning_from("serve", None, budget_mb=7, when_idle=True)
    assert (learning.surface, learning.budget_mb, learning.when_idle) == ("serve", 7, True)
    assert learning_from("chat", False) is None


def test_load_rejects_a_learn_that_is_not_a_bool_before_loading_anything():
    import edgespec

    with pytest.raises(ConfigError, match="learn must be True or False, got 'yes'"):
        edgespec.load("no/such-model-anywhere", learn="yes")
