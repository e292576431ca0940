"""Hybrid models (recurrent layers beside attention: Qwen3.5's gated DeltaNet, LFM2's short
convolutions) under speculation, on tiny random weights: every drafter's greedy output is plain
decoding's, sampled output keeps the target's distribution (``test_lossless``'s check), the
recurrent states roll back as the KV does (commit of a tree path, trim to a kept commit, prefix
reuse across requests, a stream closed mid-step), and 4-bit checkpoints kept quantized match
mlx-lm. The families' float logits against mlx-lm are ``test_families.py``'s (``oracle.CONFIGS``).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.drafters.cascade import CascadeDrafter
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.drafters.early_exit import EarlyExitDrafter
from edgespec.drafters.layer_skip import LayerSkipDrafter
from edgespec.errors import CacheRollbackError, ModelLoadError
from edgespec.kernels import backend
from edgespec.targets import load_target
from edgespec.targets.state_cache import HybridCache
from edgespec.tree import DraftTree

from .oracle import CONFIGS, load_oracle, make_oracle_model, oracle_logits, quantize_oracle_model
from .test_families import _ids
from .test_lossless import (ALPHA, CFG, DRAFTERS, exact_joint, impossible, joint_pvalue,
                            sampled_joint)

pytest.importorskip("mlx_lm")

GREEDY = SamplingConfig()
PROMPT = "the cat sat on the mat and then the cat sat on the mat again"
# Qwen3.5, untied (a tied random model mostly repeats its last token): D A D A
QWEN = CONFIGS["qwen3_5"]


def _perturbed(src, out, scale: float, seed: int):
    """A copy of model directory ``src`` whose weights are moved by ``scale`` (relative) noise:
    a draft model that agrees with it often, not always."""
    import shutil

    shutil.copytree(src, out)
    rng = np.random.default_rng(seed)
    weights = mx.load(str(out / "model.safetensors"))
    moved = {k: v + mx.array(rng.normal(0, scale, v.shape).astype(np.float32)) * mx.abs(v).mean()
             for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), moved)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The target (its head scaled by 3: sampling then leaves a few dozen sequences of 3
    tokens, few enough to count) and a draft model that is a perturbed copy of it."""
    root = tmp_path_factory.mktemp("hybrid")
    path = make_oracle_model(root / "qwen", QWEN)
    weights = mx.load(str(path / "model.safetensors"))
    weights["language_model.lm_head.weight"] *= 3
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    target = load_target(path, dtype="float32")
    draft = load_target(_perturbed(path, root / "draft", 0.1, 1), dtype="float32")
    return target, draft


def test_the_cache_is_hybrid(models):
    target, _ = models
    cache = target.make_cache()
    assert isinstance(cache, HybridCache) and cache.recurrent == (0, 2) and cache.owners == [1, 3]
    assert isinstance(target.make_cache([0, 1]), HybridCache)
    assert not isinstance(target.make_cache([1, 3]), HybridCache)  # attention layers only


def test_a_committed_tree_path_is_the_chain_of_its_tokens(models):
    """Score a tree, commit one branch: the next logits are those of a cache that saw the
    branch as a chain (the recurrent states are the path's, not the last node's)."""
    target, _ = models
    ids = _ids(12, 1)
    tree = DraftTree([ids[-1], 5, 6, 7, 8, 9], [-1, 0, 0, 2, 2, 3])
    a = target.make_cache()
    target.score(ids[:-1], a, head=False)
    a.commit()
    target.score(tree, a)
    a.commit([0, 2, 3])  # root, 6, 7
    b = target.make_cache()
    target.score(ids[:-1] + [ids[-1], 6, 7], b, head=False)
    b.commit()
    got, want = target.score([11, 12], a).logits, target.score([11, 12], b).logits
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-4)


def test_trim_goes_back_to_a_kept_commit_or_says_why(models):
    """Kept: the last 2 commits, the pinned one, every commit from the held offset on."""
    target, _ = models
    cache = target.make_cache()
    ids = _ids(30, 2)
    target.score(ids[:20], cache, head=False)
    cache.commit()
    cache.pin()  # offset 20
    for t in ids[20:]:
        target.score([t], cache, head=False)
        cache.commit()
    cache.hold()  # offset 30
    want = np.array(target.score([3], cache).logits)
    for t in (4, 5, 6):
        target.score([t], cache, head=False)
        cache.commit()
    cache.trim(3)  # back to the held offset
    np.testing.assert_allclose(np.array(target.score([3], cache).logits), want, atol=1e-5)
    with pytest.raises(CacheRollbackError, match="recurrent layer state cannot roll back 5"):
        cache.trim(5)  # offset 25: a single-token commit, no longer kept
    with pytest.raises(CacheRollbackError, match="recurrent layer state cannot roll back 12"):
        cache.trim(12)  # offset 18 is inside the prefill chunk: never a commit
    assert cache.offset == 30 and cache.reachable(29) == 20 and cache.reachable(19) == 0
    cache.trim(10)  # the pinned prefill's end


def _drafters(target, draft):
    """Every drafter, greedy, on this target (``test_lossless``'s list and the layer subsets)."""
    made = {name: make(target, draft, GREEDY) for name, make in DRAFTERS.items()}
    made["layer-skip"] = LayerSkipDrafter(target, GREEDY, layers=[0, 1, 3], num_draft=3,
                                          confidence=0.0)
    made["early-exit"] = EarlyExitDrafter(target, GREEDY, exit_layer=2, num_draft=3, adaptive=False)
    made["self-draft"] = DraftModelDrafter(target, GREEDY, num_draft=3, max_draft=3, adaptive=False)
    return made


def test_every_drafter_is_plain_decoding_greedy(models):
    target, draft = models
    prompt = Engine(target).encode(PROMPT)
    want = Engine(target).generate(prompt, max_tokens=20).token_ids
    logits = oracle_logits(load_oracle(target.path), prompt + want[:-1])  # mlx-lm agrees
    assert [int(t) for t in logits[len(prompt) - 1 :].argmax(-1)] == want
    for name, drafter in _drafters(target, draft).items():
        res = Engine(target, drafter).generate(prompt, max_tokens=20)
        assert res.token_ids == want, name
        if name == "self-draft":
            assert res.stats.acceptance_rate == 1.0
    mixed = Engine(target, _drafters(target, draft)["draft"]).generate(prompt, max_tokens=20)
    assert 0 < mixed.stats.accepted < mixed.stats.proposed  # drafts accepted and rejected


def test_a_wrong_rollback_is_seen(models, monkeypatch):
    """The checks above have power: a commit that keeps the last scored node's recurrent state
    instead of the accepted path's (rejected drafts left in the state) changes the output."""
    from edgespec.targets import recurrent

    target, draft = models
    prompt = Engine(target).encode(PROMPT)
    want = Engine(target).generate(prompt, max_tokens=20).token_ids
    after = recurrent.KeptStates.after
    monkeypatch.setattr(recurrent.KeptStates, "after",
                        lambda self, u: after(self, max(self.states or {u: 0})))
    drafter = DraftModelDrafter(draft, GREEDY, num_draft=3, adaptive=False)
    res = Engine(target, drafter).generate(prompt, max_tokens=20)
    assert res.stats.accepted < res.stats.proposed and res.token_ids != want


def test_sampling_keeps_the_target_distribution(models):
    """A draft model's chains under sampling (its own hybrid cache trimmed after rejections,
    the target's states committed along accepted prefixes): ``test_lossless``'s check, on 150
    runs (a broken state would also break the greedy tests above, which check every drafter)."""
    target, draft = models
    sampling = SamplingConfig(**CFG)
    ids = Engine(target).encode(PROMPT)
    greedy = Engine(target).generate(ids, max_tokens=24).token_ids
    ids = ids + greedy + greedy[:1]  # the draft (and lookup) then often propose what follows
    engine = Engine(target, DRAFTERS["draft"](target, draft, sampling), sampling)
    exact = exact_joint(target, ids, sampling)
    counts, proposed, accepted = sampled_joint(engine, ids, 150)
    assert not impossible(counts, exact) and joint_pvalue(counts, exact) > ALPHA
    assert 0 < accepted < proposed, (accepted, proposed)


def test_prefix_reuse_across_requests(models):
    """A follow-up that extends the last sequence reuses the whole cache; one that shares less
    than the last commit starts afresh (the recurrent state there was not kept). Both decode
    as a fresh engine does."""
    target, draft = models
    engine = Engine(target, DraftModelDrafter(draft, GREEDY, num_draft=3, adaptive=False))
    first = engine.encode(PROMPT)
    out = engine.generate(first, max_tokens=8).token_ids
    follow = first + out + _ids(5, 3)
    res = engine.generate(follow, max_tokens=8)
    assert res.stats.cached_tokens == len(first) + len(out) - 1
    assert res.token_ids == Engine(target).generate(follow, max_tokens=8).token_ids
    edited = first[:-3] + _ids(4, 4)
    res = engine.generate(edited, max_tokens=8)
    assert res.stats.cached_tokens == 0
    assert res.token_ids == Engine(target).generate(edited, max_tokens=8).token_ids


def test_long_draft_chains_keep_enough_states(models):
    """Chains of 20 drafts (more than the last 2 commits a hybrid cache keeps unless held):
    early exit trims the target's cache back over 21 fed nodes, the draft model over 19."""
    target, draft = models
    prompt = Engine(target).encode(PROMPT)
    want = Engine(target).generate(prompt, max_tokens=24).token_ids
    early = EarlyExitDrafter(target, GREEDY, exit_layer=2, num_draft=20, max_draft=20,
                             adaptive=False)
    chain = DraftModelDrafter(draft, GREEDY, num_draft=20, max_draft=20, adaptive=False)
    for drafter in (early, chain):
        res = Engine(target, drafter).generate(prompt, max_tokens=24)
        assert res.token_ids == want and res.stats.proposed > 16, drafter.name


def test_the_longest_chain_commits_any_prefix(models):
    """A verify of the longest chain SpecConfig allows (the root + 64 drafts) keeps every
    node's state: committing a prefix of it is the cache that saw that prefix."""
    target, _ = models
    ids, drafts = _ids(8, 6), _ids(64, 7)
    a, b = target.make_cache(), target.make_cache()
    target.score(ids[:-1], a, head=False)
    a.commit()
    target.score(DraftTree.chain(ids[-1], drafts), a, head=False)
    a.commit([0, 1, 2])
    target.score(ids + drafts[:2], b, head=False)
    b.commit()
    got, want = target.score([11, 12], a).logits, target.score([11, 12], b).logits
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-4)


def test_a_hybrid_cache_holds_few_states(models):
    """A prefill chunk's forward keeps its last recurrent state only (it is committed whole), a
    draft's forward every node's until its commit; after it, the cache keeps the last 2 commits
    and the pinned prompt end, however many steps ran (a drafter's own cache also its last
    held run of drafts; early exit's target cache its last run of feeds)."""
    target, draft = models
    cache = target.make_cache()
    slots = len(cache.recurrent)
    ids = _ids(40, 8)
    target.score(ids[:-1], cache, head=False)
    assert cache.held()[0] == slots  # the chunk's last state, not 39
    cache.commit()
    cache.pin()
    assert cache.held()[0] == slots
    target.score(DraftTree.chain(ids[-1], [5, 6, 7, 8]), cache)
    assert cache.held()[0] == slots * (1 + 5)
    cache.commit([0, 1])
    count, size = cache.held()
    assert count == slots * 2
    one = size / count  # bytes of one slot's state
    prompt = Engine(target).encode(PROMPT)
    for drafter, most in ((None, 3), (DraftModelDrafter(draft, GREEDY, num_draft=3,
                                                        adaptive=False), 3),
                          (EarlyExitDrafter(target, GREEDY, exit_layer=2, num_draft=3,
                                            adaptive=False), 3 + 4)):
        engine = Engine(target, drafter)
        res = engine.generate(prompt, max_tokens=24)
        assert res.stats.target_forwards > 5
        count, size = engine.prefixes._entries[next(reversed(engine.prefixes._entries))].cache.held()
        assert 0 < count <= most * slots and size == count * one, (drafter, count)
    chain = DraftModelDrafter(draft, GREEDY, num_draft=3, adaptive=False)
    Engine(target, chain).generate(prompt, max_tokens=24)
    assert 0 < chain.cache.held()[0] <= (3 + 3) * len(chain.cache.recurrent)


def test_a_follow_up_turn_reuses_the_pinned_prompt_end(models):
    """The engine pins the end of each prompt's prefill (a drafter's hybrid cache the end of
    its own read of the prompt): a next request that repeats the prompt and goes on
    differently (another answer, a new turn) resumes there after many steps, and decodes as a
    fresh engine does."""
    target, draft = models
    for drafter in (None, DraftModelDrafter(draft, GREEDY, num_draft=3, adaptive=False)):
        engine = Engine(target, drafter)
        first = engine.encode(PROMPT)
        engine.generate(first, max_tokens=24)  # more steps than the last 2 commits kept
        follow = first + _ids(6, 10) + _ids(4, 11)
        if drafter is not None:
            drafter.prefill(follow, None, GREEDY)
            assert drafter.cache.offset == len(first)  # its pinned read of the prompt
        res = engine.generate(follow, max_tokens=8)
        assert res.stats.cached_tokens == len(first) - 1
        assert res.token_ids == Engine(target).generate(follow, max_tokens=8).token_ids


def test_cascade_with_a_hybrid_draft_model(models):
    """The cascade commits each inner step's accepted tokens at once, so its hybrid draft
    model keeps no state where the outer verify may cut its chain: the draft re-reads the
    history instead of raising CacheRollbackError, and the output stays plain decoding's."""
    target, draft = models
    prompt = Engine(target).encode(PROMPT)
    ids = prompt + _ids(6, 0) + prompt  # lookup (the inner drafter) proposes runs
    want = Engine(target).generate(ids, max_tokens=40).token_ids
    drafter = CascadeDrafter(draft, GREEDY, num_draft=8, max_draft=8, adaptive=False)
    res = Engine(target, drafter).generate(ids, max_tokens=40)
    assert res.token_ids == want and 0 < res.stats.accepted < res.stats.proposed


@pytest.mark.parametrize("method", ["none", "draft"])
def test_a_stream_closed_mid_step_leaves_a_consistent_cache(models, method):
    """Plain greedy decoding closed with a forward in flight (rolled back: ``trim(1)`` to the
    last commit), or a speculative stream cancelled: the next request reusing the cache
    decodes as a fresh engine does."""
    target, draft = models
    drafter = None if method == "none" else DraftModelDrafter(draft, GREEDY, num_draft=3)
    engine = Engine(target, drafter)
    prompt = engine.encode(PROMPT)
    stream = engine.stream(prompt, max_tokens=30)
    seen = [t for _, step in zip(range(3), stream) for t in step.token_ids]
    engine.cancel() if drafter else None
    stream.close()
    follow = prompt + seen + _ids(3, 5)
    res = engine.generate(follow, max_tokens=10)
    assert res.stats.cached_tokens > len(prompt)
    assert res.token_ids == Engine(target).generate(follow, max_tokens=10).token_ids


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next", "lfm2-conv-bias"])
def test_quantized_checkpoint_matches_mlx_lm(tmp_path, monkeypatch, name):
    """4-bit kept quantized (the experts too, in qwen3_next); conv weights stay float. The
    logits with MLX's quantized product (the native kernel's rounding order, checked against
    it in test_kernels.py, moves this random model's logits by up to ~2e-4), then greedy
    speculation with the kernels this machine runs."""
    path = make_oracle_model(tmp_path, CONFIGS[name])
    quantize_oracle_model(path)
    target, oracle = load_target(path, dtype="auto"), load_oracle(path)
    assert target.quantized
    ids = _ids(24, 9)
    monkeypatch.setattr(backend, "_enabled", [False])  # set_native_enabled(False), undone after
    got = np.array(target.score(ids, target.make_cache()).logits)
    assert np.abs(got - oracle_logits(oracle, ids)).max() < 1e-4
    monkeypatch.undo()
    plain = Engine(target).generate(PROMPT, max_tokens=12).token_ids
    self_draft = DraftModelDrafter(target, GREEDY, num_draft=3, max_draft=3, adaptive=False)
    assert Engine(target, self_draft).generate(PROMPT, max_tokens=12).token_ids == plain


def test_a_multimodal_checkpoint_loads_its_text_model(tmp_path):
    """Qwen3.5 as Hugging Face ships it: ``model.language_model.*`` beside a vision tower
    (``model.visual.*``), RMSNorm weights as offsets from one, conv weights (C, 1, K): the text
    model loads and matches mlx-lm's (which converts the same way)."""
    config = {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": QWEN,
              "vision_config": {"depth": 1}}
    path = make_oracle_model(tmp_path, config)
    weights = mx.load(str(path / "model.safetensors"))
    hf = {}
    for k, v in weights.items():
        k = k.replace("language_model.model.", "model.language_model.").replace(
            "language_model.lm_head", "lm_head")
        if "conv1d.weight" in k:
            v = v.moveaxis(2, 1)  # (C, 1, K)
        elif k.endswith(("layernorm.weight", "model.language_model.norm.weight",
                         "q_norm.weight", "k_norm.weight")):
            v = v - 1.0
        hf[k] = v
    hf["model.visual.patch_embed.proj.weight"] = mx.zeros((8, 3, 2, 2))
    mx.save_safetensors(str(path / "model.safetensors"), hf)
    target = load_target(path, dtype="float32")
    ids = _ids(20, 6)
    got = np.array(target.score(ids, target.make_cache()).logits)
    assert np.abs(got - oracle_logits(load_oracle(path), ids)).max() < 1e-4


def test_a_checkpoint_without_its_text_model_says_what_runs_it(tmp_path):
    config = {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": QWEN,
              "vision_config": {"depth": 1}}
    path = make_oracle_model(tmp_path, config)
    mx.save_safetensors(str(path / "model.safetensors"),
                        {"model.visual.patch_embed.proj.weight": mx.zeros((8, 3, 2, 2))})
    with pytest.raises(ModelLoadError, match="qwen3_5 checkpoint has no text-model.*mlx-vlm"):
        load_target(path, dtype="float32")


def test_configs_as_checkpoints_ship_them():
    """Hugging Face's ``layer_types`` decide which layers are DeltaNets; a Qwen3.5 config
    without ``rope_parameters`` keeps its flat RoPE keys; LFM2's width from ``block_ff_dim``."""
    from edgespec.targets import lfm2, qwen3_5

    types = ["linear_attention", "full_attention", "full_attention", "linear_attention"]
    a = qwen3_5.ModelArgs.from_dict({**QWEN, "vocab_size": 300, "layer_types": types})
    assert [a.linear(i) for i in range(4)] == [True, False, False, True]
    flat = {k: v for k, v in QWEN.items() if k != "rope_parameters"} | {"vocab_size": 300}
    b = qwen3_5.ModelArgs.from_dict({**flat, "rope_theta": 5e6, "partial_rotary_factor": 0.5})
    assert (b.rope_theta, b.partial_rotary_factor) == (5e6, 0.5)
    c = lfm2.ModelArgs.from_dict({**CONFIGS["lfm2"], "vocab_size": 300})
    assert c.intermediate_size == 128 and c.ff_dim() == 96 and c.full_attn_idxs == [1]
