"""Lossless sampling end to end: with every drafter, what the engine samples follows the target's
distribution over several tokens, not only the first.

The check (``joint_pvalue``): the exact joint distribution of the first ``L`` generated tokens
under ``CFG`` is computed from the target's logits, each prefix run from scratch; one engine
with one drafter then generates ``RUNS`` sequences of ``L`` tokens (seed = run index; the engine
and the drafter are reused, as a server reuses them: with a lossless rule every run still
follows the target whatever the drafter kept from earlier runs); a G-test compares the counts
of the sequences with the exact distribution (cells expecting fewer than 5 pooled). Drafts are
accepted in some steps and rejected in others, so the joint distribution covers the steps after
a rejection (drafter rewound, bonus token from the residual) and after a full acceptance.

Plain decoding checks the harness itself, and two lossy rules must fail the same check (the
check has the power to see a broken rule): a verifier that accepts every draft, and one that
after a rejection draws the bonus token from p instead of the residual max(0, p - q).

Sizes: ``CFG`` leaves 14 possible sequences, and 400 runs of 3 tokens per method keep the file
within the test suite's time budget on a 2-core CPU; the lossy rules come out at p < 1e-15
(accepting every draft also samples sequences the target cannot produce), the lossless ones at
p = 3.5e-4 (early exit; 0.69 on 1500 other seeds) to 0.34. Deterministic: the seeds are fixed.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import power_divergence

import edgespec.verify
from edgespec import Engine, SamplingConfig, SpecConfig, make_drafter
from edgespec.drafters.corpus import CorpusDrafter
from edgespec.drafters.eagle3 import Eagle3Drafter
from edgespec.drafters.layer_skip import LayerSkipDrafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.drafters.medusa import MedusaDrafter
from edgespec.heads.corpus import NgramTable
from edgespec.targets.cost import CostCurve
from edgespec.sampling import probs, sample
from edgespec.tree import DraftTree
from edgespec.verify import Accepted

from .test_eagle3 import OracleHead
from .test_medusa import OracleHeads
from .tiny import logits_from_scratch

L = 3  # tokens per sequence; a step proposes at most L - 1 drafts, so the joint spans steps
CFG = {"temperature": 1.0, "top_k": 4, "top_p": 0.9, "min_p": 0.1}  # every filter, p and q alike
RUNS = 400
ALPHA = 1e-4  # per check: over ~11 checks, a false alarm after a change of random streams ~0.1%
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"


def exact_joint(target, ids: list[int], cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(first L tokens) under plain sampling, from the target's own logits."""
    joint = {(): 1.0}
    for _ in range(L):
        longer = {}
        for seq, pr in joint.items():
            p = probs(logits_from_scratch(target, ids + list(seq))[-1], cfg)
            longer.update({seq + (int(t),): pr * p[t] for t in np.flatnonzero(p)})
        joint = longer
    eos = target.tokenizer.eos_token_ids
    assert not any(t in eos for seq in joint for t in seq), "pick a prompt that cannot end early"
    return joint


def sampled_joint(engine: Engine, ids: list[int], runs: int) -> tuple[Counter, int, int]:
    """Counts of the first L tokens over ``runs`` seeds, and drafts proposed / accepted."""
    counts, proposed, accepted = Counter(), 0, 0
    for seed in range(runs):
        res = engine.generate(ids, max_tokens=L, sampling=SamplingConfig(**CFG, seed=seed))
        counts[tuple(res.token_ids)] += 1
        proposed += res.stats.proposed
        accepted += res.stats.accepted
    return counts, proposed, accepted


def impossible(counts: Counter, exact: dict) -> dict:
    """Sampled sequences that the target cannot produce (outside the filtered support)."""
    return {seq: n for seq, n in counts.items() if seq not in exact}


def joint_pvalue(counts: Counter, exact: dict) -> float:
    """G-test of the counts against the exact distribution; 0 if any sequence is impossible."""
    if impossible(counts, exact):
        return 0.0
    n = sum(counts.values())
    cells = sorted(exact)
    observed = np.array([counts[c] for c in cells], dtype=float)
    expected = np.array([exact[c] for c in cells]) * n / sum(exact.values())
    rare = expected < 5
    if rare.any():
        observed = np.append(observed[~rare], observed[rare].sum())
        expected = np.append(expected[~rare], expected[rare].sum())
    return power_divergence(observed, expected, lambda_="log-likelihood").pvalue


def run_check(engine: Engine, ids: list[int]) -> tuple[float, dict, int, int]:
    """The whole check: (p-value, impossible sequences, drafts proposed, drafts accepted)."""
    exact = exact_joint(engine.target, ids, engine.sampling)
    counts, proposed, accepted = sampled_joint(engine, ids, RUNS)
    return joint_pvalue(counts, exact), impossible(counts, exact), proposed, accepted


# --- the drafters -----------------------------------------------------------------------------

def spec(method: str, **kw):
    """A drafter from the public factory (``draft`` = the fixture's draft model)."""
    return lambda target, draft, s: make_drafter(SpecConfig(method=method, num_draft=2, **kw),
                                                 target, s, draft=draft)


DRAFTERS = {  # for a 2-layer target
    "none": lambda target, draft, s: None,
    "draft": spec("draft", draft="-"),
    "lookup": spec("lookup"),
    "lookahead": spec("lookahead"),
    "early-exit": spec("early-exit", exit_layer=1),
    "layer-skip": lambda target, draft, s: LayerSkipDrafter(target, s, layers=[1], num_draft=2,
                                                            confidence=0.0),
    "quantized": spec("quantized", draft_bits=4),
    "cascade": spec("cascade", draft="-"),
    "auto": spec("auto", draft="-"),
    "eagle3": lambda target, draft, s: greedy_head(target, draft, s, "eagle3"),
    "eagle3-8bit+lookup": lambda target, draft, s: quantized_random_head(target),
    "medusa": lambda target, draft, s: greedy_head(target, draft, s, "medusa"),
    "corpus": lambda target, draft, s: greedy_corpus(target, CorpusDrafter),
    "corpus-table": lambda target, draft, s: greedy_corpus(target, TableOnly),
}


class TableOnly(CorpusDrafter):
    """The corpus drafter without lookup's branch: with 2 drafts a step, its table's runner-up
    then gets a place beside the likeliest token (lookup's branch would take it)."""

    def lookup_tree(self, budget):
        return DraftTree.chain(self.index.tokens[-1], [])


def greedy_corpus(target, kind):
    """A corpus drafter whose table holds the target's greedy continuation of the test's prompt
    (the prompt itself is lookup's material) and random text after the same context, so its
    tree has runners-up beside the target's likeliest tokens; on a flat cost curve."""
    ids = prompt_ids(target)
    seq = ids + Engine(target).generate(ids, max_tokens=2 * L).token_ids
    noise = np.random.default_rng(0).integers(0, target.args.vocab_size, 2 * L)
    docs = [np.array(seq[len(ids) - 4 :]), np.r_[seq[len(ids) - 4 : len(ids)], noise]]
    return kind(NgramTable(docs), CostCurve((1, 64), (10.0, 10.5)))


class EagerLookup(PromptLookupDrafter):
    """Prompt lookup that calls a 2-token match sure: beside an EAGLE-3 head, lookup's branch
    then drafts about 2 steps in 5 of this short, sampled text alone and the head the others
    (a 3-token match, the real threshold, is rare here)."""

    SURE_MATCH = 2


def quantized_random_head(target):
    """A random EAGLE-3 head with its weights in 8 bits (``head_bits``' drafting copy, the
    products through the native kernels where they run) and a draft vocabulary of 48 ids:
    its top-k children are arbitrary proposals, which the target's top-4 sampling rejects; a
    lookup that calls a 2-token match sure drafts some steps alone (the head takes their pairs
    when it next drafts), so drafts are also accepted."""
    from edgespec.heads.eagle3 import quantized_head

    from .test_eagle3 import random_head

    head = random_head(target, seed=5, draft_vocab_size=48)
    head.set_draft_vocab(np.arange(48))
    return Eagle3Drafter(target, quantized_head(head, 8), None, nodes=4, lookup=EagerLookup())


def greedy_head(target, draft, sampling, kind: str):
    """A head that knows the target's greedy continuation of the test's prompt (the oracle heads
    of test_eagle3.py / test_medusa.py): under sampling its top guess is often, not always,
    what the target samples, so drafts are both accepted and rejected; the other children are
    its (arbitrary) next-best tokens."""
    ids = prompt_ids(target)
    seq = ids + Engine(target).generate(ids, max_tokens=2 * L).token_ids
    if kind == "medusa":
        return MedusaDrafter(target, OracleHeads(target, seq, k=2), None, shape=(2, 2), nodes=3)
    return Eagle3Drafter(target, OracleHead(target, seq), None, nodes=3)


MODEL = {"seed": 3, "scale": 1.0, "tie": False}  # untied: a tied random model only repeats itself


@pytest.fixture(scope="module")
def setup(tiny_models):
    """A target with a spread-out distribution, a draft model that partly agrees with it (the
    same weights at another scale), and a prompt made of the target's own greedy output and
    then that output's first token again: lookup (alone, in auto, inside cascade) matches it
    from the first step and proposes what the target is likely to say. (Repeating more tokens
    makes the target so sure of the next one that there is no distribution left to test.)"""
    target = tiny_models.load(**MODEL)
    draft = tiny_models.load(**{**MODEL, "scale": 1.3})
    return target, draft, prompt_ids(target)


def prompt_ids(target) -> list[int]:
    """The test's prompt: PROMPT, the target's greedy output, its first token again."""
    ids = Engine(target).encode(PROMPT)
    greedy = Engine(target).generate(ids, max_tokens=24).token_ids
    return ids + greedy + greedy[:1]


@pytest.mark.parametrize("keyed", [False, True], ids=["rejection", "keyed"])
@pytest.mark.parametrize("method", list(DRAFTERS))
def test_drafter_keeps_the_target_distribution_over_several_tokens(setup, method, keyed):
    """Both sampling rules: recursive rejection, and the seeded requests' keyed draws
    (``verify.verify_sampling_keyed``)."""
    target, draft, ids = setup
    sampling = SamplingConfig(**CFG)
    pvalue, bad, proposed, accepted = run_check(
        Engine(target, DRAFTERS[method](target, draft, sampling), sampling, keyed_seeds=keyed),
        ids)
    assert not bad and pvalue > ALPHA, (pvalue, bad)
    if method != "none":  # speculation happened, with accepted and rejected drafts
        assert 0 < accepted < proposed, (accepted, proposed)


def test_early_exit_on_a_sliding_window_model(tiny_models):
    """Early exit drafts inside the target's cache; with a window of 8 the mask hides most of
    the prompt from every layer, the shared lower one included."""
    target = tiny_models.load(**MODEL, window=8)
    sampling = SamplingConfig(**CFG)
    drafter = DRAFTERS["early-exit"](target, None, sampling)
    pvalue, bad, proposed, accepted = run_check(Engine(target, drafter, sampling),
                                                Engine(target).encode(PROMPT))
    assert not bad and pvalue > ALPHA, (pvalue, bad)
    assert 0 < accepted < proposed, (accepted, proposed)


# --- the check has power ------------------------------------------------------------------------

def accept_every_draft(tree, p, rng) -> Accepted:
    """Lossy: the drafts down the first branch are all kept, the bonus drawn from p."""
    u, path = 0, [0]
    while tree.children(u):
        u = tree.children(u)[0]
        path.append(u)
    return Accepted(path, [tree.tokens[i] for i in path[1:]] + [sample(p[u], rng)])


def forget_the_residual(tree, p, rng) -> Accepted:
    """Lossy: the ratio test is right, but after a rejection the bonus is drawn from p."""
    u, path = 0, [0]
    while tree.children(u):
        c = tree.children(u)[0]
        x = tree.tokens[c]
        q = tree.q[u][x] if tree.q is not None else 1.0
        if rng.random() * q >= p[u][x]:
            break
        u = c
        path.append(u)
    return Accepted(path, [tree.tokens[i] for i in path[1:]] + [sample(p[u], rng)])


@pytest.mark.parametrize("rule, method", [(accept_every_draft, "draft"),
                                          (forget_the_residual, "draft")])
def test_the_check_rejects_a_lossy_rule(setup, monkeypatch, rule, method):
    target, draft, ids = setup
    sampling = SamplingConfig(**CFG)
    monkeypatch.setenv("EDGESPEC_METAL_KERNELS", "off")  # the host rule, which is what is replaced
    monkeypatch.setattr(edgespec.verify, "verify_sampling", rule)
    pvalue, _, _, _ = run_check(Engine(target, DRAFTERS[method](target, draft, sampling), sampling,
                                       keyed_seeds=False), ids)
    assert pvalue < ALPHA / 100


def test_the_check_rejects_keyed_draws_that_repeat_a_uniform(setup, monkeypatch):
    """Lossy: every position of a sequence drawn with the same uniform (keyed by seed only)."""
    target, draft, ids = setup
    sampling = SamplingConfig(**CFG)
    real = edgespec.verify.keyed_uniform
    monkeypatch.setattr(edgespec.verify, "keyed_uniform", lambda seed, position: real(seed, 0))
    pvalue, _, _, _ = run_check(Engine(target, DRAFTERS["lookup"](target, draft, sampling),
                                       sampling), ids)
    assert pvalue < ALPHA / 100
