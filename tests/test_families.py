"""Every model family against mlx-lm, the oracle for model math, on tiny random weights
(float32, logits within 1e-4, or 1e-5 of the largest logit where that is over 10: Gemma's
scaled embedding makes logits of ~40, where float32's own rounding is 4e-6): a prefill, a
decode chain after a prefix (mlx-lm with its own cache, one token at a time; edgespec scores
the chain in one pass), and a tree whose branches are each checked as a separate chain. Then greedy speculation per family (lookup and the self-draft
oracle reproduce plain decoding), a sliding/global model through rollback (compared with plain
decoding: mlx-lm's rotating cache gets rollback wrong, ml-explore/mlx-lm#1914), and the error
for model types no family runs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from edgespec import Engine, SamplingConfig
from edgespec.drafters.draft_model import DraftModelDrafter
from edgespec.drafters.early_exit import EarlyExitDrafter
from edgespec.drafters.layer_skip import LayerSkipDrafter
from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.errors import ModelLoadError, UnsupportedModelError
from edgespec.targets import load_target
from edgespec.targets.families import FAMILIES, UNSUPPORTED, family_of
from edgespec.tree import DraftTree

from .oracle import (CONFIGS, WINDOWED, load_oracle, make_oracle_model, oracle_decode,
                     oracle_logits, quantize_oracle_model)

pytest.importorskip("mlx_lm")

ATOL = 1e-4
PROMPT = "the cat sat on the mat and then the cat sat on the mat again"
GREEDY = SamplingConfig()


def _ids(n: int, seed: int, vocab: int = 250) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, n)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(name: str, seed: int = 0):
        if (name, seed) not in made:
            made[name, seed] = make_oracle_model(root / f"{name}-{seed}", CONFIGS[name], seed)
        return made[name, seed]
    return get


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, dirs):
    """(edgespec target, mlx-lm model) over the same directory."""
    path = dirs(request.param)
    return load_target(path, dtype="float32"), load_oracle(path)


def _close(ours, want, what: str) -> None:
    diff = float(np.max(np.abs(np.array(ours) - want)))
    tol = ATOL * max(1.0, float(np.max(np.abs(want))) / 10)
    assert diff < tol, f"{what}: max |logit difference| {diff:.2e} (tolerance {tol:.2e})"


def _prefilled(target, prefix: list[int]):
    cache = target.make_cache()
    target.score(prefix, cache, head=False)
    cache.commit()
    return cache


def test_prefill_matches_mlx_lm(pair):
    target, oracle = pair
    ids = _ids(40, 1)  # past the sliding windows (8) of the windowed configs
    _close(target.score(ids, target.make_cache()).logits, oracle_logits(oracle, ids), "prefill")


@pytest.mark.parametrize("prefix_len", [30, 340])  # 340: sliding layers compact their cache
def test_decode_chain_matches_mlx_lm(pair, prefix_len):
    target, oracle = pair
    ids = _ids(prefix_len + 12, 2)
    prefix, chain = ids[:prefix_len], ids[prefix_len:]
    cache = _prefilled(target, prefix)
    _close(target.score(chain, cache).logits, oracle_decode(oracle, prefix, chain), "decode chain")
    if prefix_len > 300:
        sliding = [i for i, w in enumerate(cache.windows) if w is not None and w < 100]
        assert all(cache.starts[i] > 0 for i in sliding), "sliding layers should have compacted"
        assert all(cache.starts[i] == 0 for i, w in enumerate(cache.windows) if w is None)


def test_tree_branches_match_separate_chains(pair):
    target, oracle = pair
    ids = _ids(20, 3)
    tree = DraftTree([ids[-1], 11, 12, 13, 14, 15, 16, 17, 18],
                     [-1, 0, 0, 1, 1, 2, 3, 6, 7])  # depth 5: the window (8) slides inside it
    cache = _prefilled(target, ids[:-1])
    logits = np.array(target.score(tree, cache).logits)
    for u in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path_to(u)]
        _close(logits[u], oracle_logits(oracle, ids[:-1] + path)[-1], f"tree node {u}")



def _verify_rows_equal_decode_steps(target, seed: int = 3) -> None:
    ids = _ids(19, seed)
    together, alone = target.make_cache(), target.make_cache()
    for cache in (together, alone):
        mx.eval(target.score(ids[:10], cache).logits)
        cache.commit()
    want = np.array(target.score(ids[10:], together).logits)
    got = []
    for i in ids[10:]:
        got.append(np.array(target.score([i], alone).logits)[0])
        alone.commit()
    assert np.array_equal(want, np.stack(got)), np.abs(want - np.stack(got)).max()


def test_a_verify_row_gets_the_bits_of_a_decode_step(pair):
    """Greedy speculation is exact only if scoring several tokens at once gives each the bits
    it gets alone: a chain of 9 tokens scored together against 9 one-token steps, every
    family's float32 forward, whichever path its blocks take, with the kernels' own size
    thresholds (a tiny model's products are all small). The MoE families' experts
    (``experts.SwitchGLU.__call__``: a decode step's one row took MLX's ``gather_mm``) and
    biased projections (lfm2's convolution layers: MLX's fused product with the bias,
    ``kernels.matmul.linear``) once failed it."""
    from edgespec.kernels import backend

    if not backend.native_enabled():
        pytest.skip("the native kernels do not run here: MLX's products decide the rows")
    _verify_rows_equal_decode_steps(pair[0])


def test_the_module_paths_float_products_are_row_exact(tmp_path, monkeypatch):
    """The module path (Gemma 3's blocks with their native form set aside, as a family without
    one runs) on float32 weights: its products go through the native kernel, whose rows do not
    depend on each other, not MLX's product (BLAS), whose rows do once a product has 256
    outputs (this model's gate|up)."""
    from edgespec.kernels import backend

    if not backend.native_enabled():
        pytest.skip("the native kernels do not run here: MLX's products decide the rows")
    monkeypatch.setattr(backend, "MIN_WORK", 0)
    config = {**CONFIGS["gemma3"], "intermediate_size": 512}
    target = load_target(make_oracle_model(tmp_path / "g", config, 0), dtype="float32")
    for block in target.model.model.layers:
        block._fused = None
    assert not target.model.native_blocks()
    _verify_rows_equal_decode_steps(target)


def test_module_path_matches_mlx_lm(dirs):
    """The fused blocks are checked above; here the module path they are the twin of."""
    for name in ("llama", "qwen2", "qwen3", "phi3-longrope-partial", "smollm3", "gemma3"):
        path = dirs(name)
        target, oracle = load_target(path, dtype="float32"), load_oracle(path)
        assert target.model.fuse() == target.num_layers  # these families run fused when float
        for block in target.model.model.layers:
            block._fused = None
        ids = _ids(24, 4)
        _close(target.score(ids, target.make_cache()).logits, oracle_logits(oracle, ids), name)


def test_greedy_speculation_is_exact(pair):
    target, _ = pair
    plain = Engine(target).generate(PROMPT, max_tokens=32)
    lookup = Engine(target, PromptLookupDrafter(max_branches=3)).generate(PROMPT, max_tokens=32)
    assert lookup.token_ids == plain.token_ids and lookup.stats.proposed > 0
    self_draft = DraftModelDrafter(target, GREEDY, num_draft=3, max_draft=3, adaptive=False)
    res = Engine(target, self_draft).generate(PROMPT, max_tokens=32)
    assert res.token_ids == plain.token_ids and res.stats.acceptance_rate == 1.0


def _naive_greedy(target, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(mx.argmax(target.score(seq, target.make_cache()).logits[-1]).item()))
    return seq[len(ids):]


def drafters_through_rollback(target, other, prompt: list[int], n: int, exit_layer: int,
                              layers: list[int]) -> tuple[list[int], tuple]:
    """Plain decoding of ``n`` tokens equals naive recomputation, and early exit at
    ``exit_layer``, layer skip over ``layers`` and ``other`` as a draft model (which disagrees,
    so drafts get rejected and caches roll back) each give plain decoding's tokens. Returns
    those tokens and the three drafters, for checks of their caches."""
    want = Engine(target).generate(prompt, max_tokens=n).token_ids
    assert want == _naive_greedy(target, prompt, n)
    early = EarlyExitDrafter(target, GREEDY, exit_layer=exit_layer, num_draft=4, adaptive=False)
    skip = LayerSkipDrafter(target, GREEDY, layers=layers, num_draft=4, adaptive=False)
    draft = DraftModelDrafter(other, GREEDY, num_draft=4, max_draft=4, adaptive=False)
    for d in (early, skip, draft):
        res = Engine(target, d).generate(prompt, max_tokens=n)
        assert res.token_ids == want, d.name
        assert res.stats.proposed > 0 and res.stats.acceptance_rate < 1.0, d.name
    return want, (early, skip, draft)


def test_sliding_and_global_layers_through_rollback(dirs):
    """Rejected drafts past the window boundary: the sliding layers' caches have compacted,
    the global ones kept everything, and every drafter's output is plain decoding's. (An untied
    model: tied random ones mostly repeat their last token, and every draft is then right.)"""
    name = "gemma3-untied-scaled"  # 6 layers: 2 and 5 global, the others sliding (window 8)
    target = load_target(dirs(name), dtype="float32")
    other = load_target(dirs(name, seed=5), dtype="float32")  # disagrees: its drafts get rejected
    prompt = _ids(360, 7)  # past window + rollback + 256 slots: the sliding layers compact
    want, (early, skip, draft) = drafters_through_rollback(target, other, prompt, 24, 2,
                                                           [0, 1, 3, 5])
    for d in (skip, draft):  # a draft cache holds each token once, also after it compacted
        assert max(d.cache.starts) > 0 and d.cache.offset <= len(prompt) + 24
    oracle = DraftModelDrafter(target, GREEDY, num_draft=4, max_draft=4, adaptive=False)
    res = Engine(target, oracle).generate(prompt, max_tokens=24)
    assert res.token_ids == want and res.stats.acceptance_rate == 1.0
    cache = early.lower.cache  # the target's own cache, trimmed by early exit every step
    assert [s > 0 for s in cache.starts] == [w is not None for w in cache.windows]
    assert cache.windows == (8, 8, None, 8, 8, None)


def test_gemma2_windows_through_rollback(tmp_path):
    """Gemma 2's alternating sliding (window 8) and global layers, soft-capped, through rejected
    drafts past the window: plain decoding equals naive full recomputation, and every drafter's
    greedy output equals plain decoding's."""
    config = WINDOWED["gemma2-windowed"]
    target = load_target(make_oracle_model(tmp_path / "t", config), dtype="float32")
    other = load_target(make_oracle_model(tmp_path / "d", config, seed=5), dtype="float32")
    assert target.make_cache().windows == (8, None, 8, None)
    prompt = _ids(360, 8)  # past window + rollback + 256 slots: the sliding layers compact
    want = Engine(target).generate(prompt, max_tokens=16).token_ids
    assert want == _naive_greedy(target, prompt, 16)
    skip = LayerSkipDrafter(target, GREEDY, layers=[0, 1, 3], num_draft=4, adaptive=False)
    draft = DraftModelDrafter(other, GREEDY, num_draft=4, max_draft=4, adaptive=False)
    for d in (skip, draft):
        res = Engine(target, d).generate(prompt, max_tokens=16)
        assert res.token_ids == want, d.name
        assert res.stats.proposed > 0 and res.stats.acceptance_rate < 1.0, d.name
    lookup = PromptLookupDrafter(max_branches=3)
    assert Engine(target, lookup).generate(prompt, max_tokens=16).token_ids == want
    assert draft.cache.starts[0] > 0 and draft.cache.starts[1] == 0  # sliding compacted, global not


@pytest.mark.parametrize("name", ["phi3", "phi3-longrope-partial", "smollm3"])
@pytest.mark.usefixtures("float_activations")
def test_quantized_checkpoint_matches_mlx_lm(tmp_path, name):
    """A 4-bit checkpoint kept quantized: phi3's fused q|k|v and gate|up split row-wise with
    their scales and biases, smollm3's NoPE layers on the module path."""
    path = make_oracle_model(tmp_path, CONFIGS[name])
    quantize_oracle_model(path)
    target, oracle = load_target(path, dtype="auto"), load_oracle(path)
    assert target.quantized
    ids = _ids(24, 9)
    _close(target.score(ids, target.make_cache()).logits, oracle_logits(oracle, ids), name)


@pytest.mark.parametrize("scaling", [
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},  # Llama 3.1 8B
    {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192}])  # Llama 3.2 1B / 3B
@pytest.mark.parametrize("head_dim", [64, 128])
def test_llama3_rope_frequencies_match_mlx_lm(scaling, head_dim):
    """The real Llama 3.x settings (the oracle configs only use a tiny original context)."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    from edgespec.targets.parts import Rope

    ours = Rope.from_config(head_dim, 500000.0, {"rope_type": "llama3", **scaling}).freqs
    theirs = Llama3RoPE(head_dim, base=500000.0, scaling_config=scaling)._freqs
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=1e-6)


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_unsupported_types_name_themselves_and_mlx_lm(model_type):
    with pytest.raises(UnsupportedModelError) as e:
        family_of({"model_type": model_type})
    message = str(e.value)
    assert repr(model_type) in message and "qwen3" in message and "gemma3_text" in message
    if "vision" in UNSUPPORTED[model_type][0]:  # what runs its images
        assert "mlx_vlm.generate" in message
    if UNSUPPORTED[model_type][1] is None:
        return
    module = message.split("mlx_lm.models.")[1].split(",")[0]
    assert importlib.util.find_spec(f"mlx_lm.models.{module}") is not None, module


def test_unknown_type_lists_the_supported_ones():
    listed = re.escape(", ".join(sorted(FAMILIES)))  # sorted: gemma2, gemma3_text, ...
    with pytest.raises(UnsupportedModelError, match=f"'bogus'.*supported: {listed}$"):
        family_of({"model_type": "bogus"})
    assert set(FAMILIES) >= {"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma2", "phi3",
                             "smollm3", "gemma4_text", "gemma4"}


BAD_LAYERS = [  # (config, its change, what the error names)
    ("qwen3_next", {"full_attention_interval": 0}, "full_attention_interval is 0.*>= 1"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step is 0.*>= 1"),
    ("gemma3", {"sliding_window_pattern": 0}, "sliding_window_pattern is 0.*>= 1"),
    ("smollm3", {"no_rope_layer_interval": -4}, "no_rope_layer_interval is -4.*>= 1"),
    ("gpt_oss", {"layer_types": ["sliding_attention", "full_attention"]},
     "layer_types must list one of sliding_attention, full_attention for each of its "
     r"num_hidden_layers \(4\); got 2 entries$"),
    ("gemma2", {"layer_types": ["sliding_attention"]}, r"layer_types.*\(3\); got 1 entries"),
    ("llama-layer-types", {"layer_types": ["sliding_attention", "full_attention", "chunked"]},
     r"layer_types.*got 3 entries \(not allowed: \['chunked'\]\)"),
    ("lfm2", {"layer_types": ["conv", "full_attention", "conv"]}, r"conv, full_attention.*\(4\)"),
    ("qwen3_5", {"layer_types": ["linear_attention"] * 5}, r"linear_attention.*\(4\); got 5"),
]


@pytest.mark.parametrize("name, change, message", BAD_LAYERS, ids=[b[0] for b in BAD_LAYERS])
def test_a_malformed_layer_pattern_is_a_model_load_error(name, change, message):
    """A period below 1, or ``layer_types`` not one allowed type per layer: ModelLoadError
    naming the field and what it allows, not a ZeroDivisionError at load or an IndexError
    when the cache is made."""
    config = {**CONFIGS[name], **change, "vocab_size": 300}
    with pytest.raises(ModelLoadError, match=message):
        family_of(config).args.from_dict(config)


def test_a_malformed_layer_pattern_fails_the_load(tmp_path):
    path = make_oracle_model(tmp_path, CONFIGS["qwen3_next"])
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "full_attention_interval": 0}))
    with pytest.raises(ModelLoadError, match="qwen3_next config: full_attention_interval is 0"):
        load_target(path, dtype="float32")


@pytest.mark.parametrize("model_type", ["dbrx", "mamba", "bogus"])
def test_cli_unsupported_family_is_one_line_exit_2(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", "--model",
                           str(tmp_path), "hello"], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and repr(model_type) in lines[0] and "Traceback" not in proc.stderr
