"""The corpus: the model's own n-gram table, its file, the corpus drafter, and the method.

The oracle: a corpus made of the target's own greedy continuation of a prompt knows what the
target says next, so its drafts are accepted; greedy output stays token-identical to plain
decoding whatever the corpus holds (a corpus of another model's text included).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec import Engine, SpecConfig, make_drafter
from edgespec.drafters import registry
from edgespec.drafters.corpus import PRIOR_SCALE, CorpusDrafter
from edgespec.errors import ConfigError, HeadError
from edgespec.heads.corpus import NgramTable, context_hash, load_corpus, read_sources, save_corpus
from edgespec.targets.cost import CostCurve
from edgespec.verify import Accepted

FLAT = CostCurve((1, 64), (10.0, 10.5))
STEEP = CostCurve((1, 2, 3, 64), (10.0, 12.0, 20.0, 640.0))  # a second node never pays
PROMPT = "Tell me a short story about a lighthouse keeper."


def test_the_table_keeps_the_most_frequent_next_token_of_the_longest_context():
    docs = [np.array([1, 2, 3, 4]), np.array([1, 2, 3, 5]), np.array([9, 2, 3, 5]),
            np.array([7, 7, 7, 6])]
    t = NgramTable(docs)
    assert t.guess([2, 3]) == (5, pytest.approx(2 / 3))  # "2 3" -> 4 once, 5 twice
    assert t.guess([1, 2, 3]) == (4, 0.5)  # the longer context wins: "1 2 3" -> 4, 5 once each
    assert t.guess([8, 9, 2, 3]) == (5, 1.0)  # "9 2 3" (the 4-token context is unknown)
    assert t.guess([42]) is None and t.guess([]) is None
    assert t.guess([7, 7]) == (6, 0.5)  # "7 7" -> 7 once, 6 once: the tie goes to 6
    assert t.guess([7]) == (7, pytest.approx(2 / 3))
    assert t.tokens == 16


def test_a_tie_goes_to_the_smaller_token_and_documents_do_not_run_into_each_other():
    t = NgramTable([np.array([4, 9]), np.array([4, 3]), np.array([5])])
    assert t.guess([4]) == (3, 0.5)
    assert t.guess([9]) is None  # 9 ends a document: "9 4" is never a context


def test_the_table_agrees_with_a_plain_count():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 6, rng.integers(5, 60)) for _ in range(40)]
    t = NgramTable(docs)
    for _ in range(200):
        hist = rng.integers(0, 6, 5).tolist()
        want = None
        for n in range(4, 0, -1):
            counts = {}
            for d in docs:
                for i in range(n, len(d)):
                    if d[i - n : i].tolist() == hist[-n:]:
                        counts[int(d[i])] = counts.get(int(d[i]), 0) + 1
            if counts:
                best = min(counts, key=lambda k: (-counts[k], k))
                want = (best, counts[best] / sum(counts.values()))
                break
        got = t.guess(hist)
        assert (got is None) == (want is None)
        if got is not None:
            assert got[0] == want[0] and got[1] == pytest.approx(want[1])
    assert context_hash([1, 2]) != context_hash([2, 1]) != context_hash([0, 1, 2])


def greedy(target, text: str, n: int) -> tuple[list[int], list[int]]:
    eng = Engine(target)
    ids = eng.encode(text)
    return ids, eng.generate(ids, max_tokens=n).token_ids


@pytest.fixture
def oracle_dir(target, tmp_path):
    """A corpus of the target's own greedy answers (the one the tests decode, and others)."""
    docs = [greedy(target, p, 48)[1] for p in (PROMPT, "Why is the sea salty?", "List three birds.")]
    save_corpus(tmp_path / "corpus", target, {"oracle": docs})
    return tmp_path / "corpus"


def test_saved_and_loaded_it_is_the_same_table_and_refuses_another_model(target, other, oracle_dir):
    sources, section = read_sources(oracle_dir)
    assert section["kind"] == "corpus" and section["sources"][0]["documents"] == 3
    table = load_corpus(oracle_dir, target)
    ids, out = greedy(target, PROMPT, 48)
    assert table.guess(out[:10]) is not None
    with pytest.raises(HeadError, match="fingerprint .* its n-grams are another model's"):
        load_corpus(oracle_dir, other)
    (oracle_dir / "corpus.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(HeadError, match="corpus.safetensors is missing, damaged"):
        load_corpus(oracle_dir)
    (oracle_dir / "config.json").write_text(json.dumps({"edgespec": {"kind": "eagle3"}}))
    with pytest.raises(HeadError, match="names kind 'eagle3', not 'corpus'"):
        load_corpus(oracle_dir)


def test_greedy_is_exact_and_the_oracle_corpus_is_accepted(target, oracle_dir):
    ids, plain = greedy(target, PROMPT, 48)
    table = load_corpus(oracle_dir, target)
    res = Engine(target, CorpusDrafter(table, FLAT)).generate(ids, max_tokens=48)
    assert res.token_ids == plain
    assert res.stats.accepted > 0.8 * res.stats.proposed > 0
    # another model's text: drafts rejected, output the same
    noise = [np.random.default_rng(1).integers(0, target.args.vocab_size, 200)]
    res = Engine(target, CorpusDrafter(NgramTable(noise), FLAT)).generate(ids, max_tokens=48)
    assert res.token_ids == plain


def test_the_chain_is_as_long_as_this_devices_curve_pays():
    doc = np.arange(100, 140)  # a chain the table is sure of (share 1 all along)
    table = NgramTable([doc] * 3)
    lengths = {}
    for name, curve in (("flat", FLAT), ("steep", STEEP), ("none", None)):
        d = CorpusDrafter(table, curve, max_chain=8)
        d.prefill([7, 100], None)  # lookup finds nothing: the corpus drafts alone
        lengths[name] = d.propose(budget=12).num_drafted
    assert lengths == {"flat": 8, "steep": 1, "none": 8}
    d = CorpusDrafter(table, FLAT, max_chain=8)
    d.prefill([7, 100], None)
    assert d.propose(budget=3).num_drafted == 3 and d.propose(budget=0).num_drafted == 0


def test_the_calibration_follows_what_the_target_confirmed():
    table = NgramTable([np.arange(100, 140)] * 3)
    d = CorpusDrafter(table, FLAT, max_chain=4)
    assert d.scale == pytest.approx(PRIOR_SCALE)
    d.prefill([7, 100], None)
    tree = d.propose(budget=8)
    assert [tree.tokens[i] for i in range(1, 5)] == [101, 102, 103, 104]
    # the target took 101 and then said 55: two chain tokens tested, one confirmed
    d.update(Accepted([0, 1], [101, 55]), tree, None)
    assert d.confirmed == pytest.approx(0.99 ** 2 * PRIOR_SCALE * 10 + 0.99 * 1 + 0)
    assert d.predicted == pytest.approx(0.99 ** 2 * 10 + 0.99 + 1)
    assert d.scale < PRIOR_SCALE
    assert d.index.tokens[-2:] == [101, 55]  # lookup's history moved on as well


def test_the_method_finds_a_corpus_for_its_model_only(target, other, oracle_dir, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HEADS", str(oracle_dir.parent))
    assert "corpus" in registry.heads_for(target)
    assert "corpus" not in registry.heads_for(other)
    drafter = make_drafter(SpecConfig(method="corpus"), target)
    assert isinstance(drafter, CorpusDrafter)
    ids, plain = greedy(target, PROMPT, 32)
    assert Engine(target, drafter).generate(ids, max_tokens=32).token_ids == plain
    auto = make_drafter(SpecConfig(method="auto"), target)
    assert "corpus" in auto.arms and "lookup" not in auto.arms  # corpus proposes lookup's branch
    with pytest.raises(ConfigError, match="needs a trained corpus head and none was found"):
        make_drafter(SpecConfig(method="corpus"), other)
    with pytest.raises(HeadError, match="another model's"):
        registry.heads_for(other, str(oracle_dir))
    assert registry.heads_for(target, str(oracle_dir)) == {"corpus"}
    with pytest.raises(ConfigError, match="is a corpus; method 'eagle3' needs an eagle3 head"):
        make_drafter(SpecConfig(method="eagle3", head=str(oracle_dir)), target)


def test_auto_beside_a_corpus_alone_has_no_plain_arm_and_is_exact(target, oracle_dir,
                                                                  monkeypatch):
    """A corpus sized on the curve proposes nothing where nothing pays, so auto keeps no plain
    arm beside it; its empty proposals are its plain steps. Without the curve (not adaptive) the
    corpus does not gate itself and the plain arm stays. Greedy output is plain decoding's
    either way, on a flat curve and on one where a second node never pays."""
    from edgespec.drafters.auto import PLAIN
    from edgespec.targets import cost

    monkeypatch.setenv("EDGESPEC_HEADS", str(oracle_dir.parent))
    ids, plain = greedy(target, PROMPT, 40)
    noise = [np.random.default_rng(1).integers(0, target.args.vocab_size, 200)]
    for curve in (FLAT, STEEP):
        monkeypatch.setattr(cost, "verify_cost_curve", lambda t, curve=curve: curve)
        auto = make_drafter(SpecConfig(method="auto"), target)
        assert set(auto.arms) == {"corpus"} and auto.arms["corpus"].gates_itself
        assert Engine(target, auto).generate(ids, max_tokens=40).token_ids == plain
        assert auto.pulls["corpus"] > 0 and PLAIN not in auto.value
        auto.arms["corpus"].table = NgramTable(noise)  # drafts the target rejects
        assert Engine(target, auto).generate(ids, max_tokens=40).token_ids == plain
    fixed = make_drafter(SpecConfig(method="auto", adaptive=False), target)
    assert set(fixed.arms) == {PLAIN, "corpus"} and not fixed.arms["corpus"].gates_itself
    assert Engine(target, fixed).generate(ids, max_tokens=40).token_ids == plain


def test_chat_serve_and_the_api_default_to_the_corpus_when_the_model_has_one(
        target, tiny_models, oracle_dir, monkeypatch):
    from edgespec import LLM, GenerationConfig, SamplingConfig
    from edgespec.drafters.default import interactive_method
    from edgespec.server import ServerSettings
    from edgespec.tui.session import open_session

    assert interactive_method(None, target) == "lookup"  # no corpus for it yet
    monkeypatch.setenv("EDGESPEC_HEADS", str(oracle_dir.parent))
    assert interactive_method(None, target) == "corpus"
    assert interactive_method("some-draft", target) == "draft"
    assert interactive_method(None) == "lookup"  # before a model is loaded
    assert interactive_method(None, head=str(oracle_dir)) == "corpus"  # --head names its kind
    assert ServerSettings(model="x", spec_options={"head": str(oracle_dir)}).default_method() == "corpus"
    assert ServerSettings(model="x").default_method(target) == "corpus"
    assert ServerSettings(model="x", method="lookup").default_method(target) == "lookup"
    with LLM(target, progress=False) as llm:
        assert llm.method == "corpus"
    with LLM(target, progress=False, method="lookup") as llm:
        assert llm.method == "lookup"  # a method named is kept
    args = dict(spec=SpecConfig(method="lookup"), sampling=SamplingConfig(),
                generation=GenerationConfig())
    path = str(tiny_models.path())  # the same weights as ``target``: the corpus fits
    assert open_session(path, **args, method_named=False).method == "corpus"
    assert open_session(path, **args, method_named=True).method == "lookup"
    from click.testing import CliRunner

    from edgespec.cli import main

    def generate(*extra):
        res = CliRunner().invoke(main, ["generate", "--model", path, "--json", "--max-tokens", "8",
                                        *extra, PROMPT], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return json.loads(res.output.strip().splitlines()[-1])["method"]

    assert generate() == "corpus"  # `edgespec generate` takes the same default
    assert generate("--method", "none") == "none"
    monkeypatch.delenv("EDGESPEC_HEADS")
    assert generate() == "lookup"


def test_runners_up_are_siblings_and_count_in_the_calibration():
    # after 100 the table saw 101 twice and 7 once; after "100 101" only 102
    table = NgramTable([np.array([100, 101, 102]), np.array([100, 101, 102]), np.array([100, 7])])
    d = CorpusDrafter(table, None, max_chain=2, width=3)
    d.prefill([5, 100], None)
    tree = d.propose(budget=8)
    kids = {tree.tokens[c]: c for c in tree.children(0)}
    assert set(kids) == {101, 7}  # the chain's first token and its runner-up
    assert [tree.tokens[c] for c in tree.children(kids[101])] == [102]
    assert not tree.children(kids[7])
    assert d.propose(budget=1).num_drafted == 1  # the budget keeps the likeliest node: 101
    d.propose(budget=8)
    before = d.confirmed, d.predicted
    d.update(Accepted([0], [7]), tree, None)  # the target said 7: the runner-up was right
    assert d.confirmed == pytest.approx(0.99 ** 2 * before[0] + 0.99 * 0 + 1)  # 101 missed, 7 hit
    assert d.predicted == pytest.approx(0.99 ** 2 * before[1] + 0.99 * (2 / 3) + 1 / 3)


def test_random_tables_give_valid_trees_within_the_budget():
    rng = np.random.default_rng(2)
    for _ in range(50):
        docs = [rng.integers(0, 8, rng.integers(2, 30)) for _ in range(rng.integers(1, 6))]
        d = CorpusDrafter(NgramTable(docs), FLAT if rng.random() < 0.5 else None,
                          max_chain=int(rng.integers(1, 8)), width=int(rng.integers(1, 4)))
        d.prefill(rng.integers(0, 8, rng.integers(1, 12)).tolist(), None)
        budget = int(rng.integers(0, 12))
        tree = d.propose(budget)  # DraftTree itself checks that parents precede children
        assert tree.num_drafted <= budget  # lookup's branch and the table's nodes together
        assert len(d.proposed) <= budget
        assert len({p for p, _ in d.proposed}) == len(d.proposed)
