"""scripts/gpu_distill.py and its halves gpu_target.py and gpu_head.py (PyTorch, run on a lent
CUDA machine) against edgespec's MLX code, on the CPU: the same target weights, logits and greedy continuations (batched, left-padded rows
against plain decoding), the same EAGLE-3 training-time test and loss as ``Eagle3Head``, and a
head written by the script read back by ``gpu_bundle.py import``. Skipped where PyTorch is not
installed (it is not one of edgespec's dependencies); run here with ``pip install torch``."""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgespec.heads.config import HeadConfig  # noqa: E402
from edgespec.heads.eagle3 import Eagle3Head, eagle3_loss  # noqa: E402
from edgespec.heads.formats import load_head, save_head  # noqa: E402
from edgespec.targets.load import load_target  # noqa: E402
from tests.script_module import load_script  # noqa: E402
from tests.tiny import make_tiny_model  # noqa: E402

g = load_script("gpu_distill")  # it imports its halves, gpu_target and gpu_head, by name
gt, gh = sys.modules["gpu_target"], sys.modules["gpu_head"]
bundle = load_script("gpu_bundle")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random llama (untied: a spread-out distribution to sample questions from) saved
    quantized (4-bit blocks, 8-bit embedding, as the demo model is), the
    torch twin loaded from the same folder."""
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny"), layers=3, tie=False)
    weights = mx.load(str(folder / "model.safetensors"))
    quantized = {}
    for k, w in weights.items():
        if w.ndim == 2:
            bits = 8 if "embed" in k else 4
            base = k[: -len(".weight")]
            quantized[k], quantized[base + ".scales"], quantized[base + ".biases"] = mx.quantize(
                w, group_size=32, bits=bits)
            quantized[base + ".scales"] = quantized[base + ".scales"].astype(mx.float16)
            quantized[base + ".biases"] = quantized[base + ".biases"].astype(mx.float16)
        else:
            quantized[k] = w
    mx.save_safetensors(str(folder / "model.safetensors"), quantized)
    config = json.loads((folder / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4,
                              "model.embed_tokens": {"group_size": 32, "bits": 8}}
    (folder / "config.json").write_text(json.dumps(config))
    target = load_target(folder, "float32")
    cfg, w = gt.load_weights(folder)
    return target, gt.Target(cfg, w, "cpu"), folder


def test_weights_and_logits_match_edgespec(tiny):
    from mlx.utils import tree_flatten

    target, twin, _ = tiny
    ours = dict(tree_flatten(target.model.parameters()))
    for k, v in twin.w.items():
        np.testing.assert_array_equal(np.array(ours[k].astype(mx.float32)), v.numpy(), err_msg=k)
    ids = [3, 17, 42, 5, 9, 11, 2, 30]
    out = target.score(ids, target.make_cache(), capture=(1, 2))
    T = len(ids)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        logits, _, feats = twin.forward(torch.tensor(ids)[None], pos,
                                        (pos[0][:, None] >= pos[0][None])[None], aux=(1, 2))
    np.testing.assert_allclose(logits[0].numpy(), np.array(out.logits), atol=1e-4)
    for f, i in zip(feats, (1, 2)):
        np.testing.assert_allclose(f[0].numpy(), np.array(out.captured[i]), atol=1e-4)


def greedy(target, ids, n):
    cache = target.make_cache()
    out = []
    for _ in range(n):
        o = target.score(ids, cache)
        cache.commit()
        ids = [int(mx.argmax(o.logits[-1]))]
        out.append(ids[0])
    return out


def test_batched_generation_equals_plain_greedy(tiny):
    """Rows of different lengths (left padding) continue exactly as plain decoding does, and a
    row stops at its stop token while the others go on."""
    target, twin, _ = tiny
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20]]
    want = [greedy(target, p, 12) for p in prompts]
    got = gt.generate(twin, prompts, 12, stop={-1})
    assert [ids for ids, _ in got] == want
    stop = want[1][4]
    got = gt.generate(twin, prompts, 12, stop={stop})
    cut = want[1].index(stop)
    assert got[1] == (want[1][:cut], True)
    # rows that stopped leave the batch (compaction) while the others go on, unchanged
    many = [[5 + i, 6, 7 + i] for i in range(8)]
    want = [greedy(target, p, 40) for p in many]
    stops = {w[2] for w in want[:6]}  # most rows stop early
    monkey_every, gt.COMPACT_EVERY = gt.COMPACT_EVERY, 2
    try:
        got = gt.generate(twin, many, 40, stop=stops)
    finally:
        gt.COMPACT_EVERY = monkey_every
    for (ids, stopped), w in zip(got, want):
        cut = next((i for i, x in enumerate(w) if x in stops), None)
        assert (ids, stopped) == ((w, False) if cut is None else (w[:cut], True))


def test_sampled_generation_uses_top_p(tiny):
    """top-p 0.0001 keeps only the most probable token: sampling then equals greedy."""
    target, twin, _ = tiny
    gen = torch.Generator().manual_seed(0)
    got = gt.generate(twin, [[5, 6, 7]], 6, stop={-1}, sampling=(1.0, 1e-4), gen=gen)
    assert got[0][0] == greedy(target, [5, 6, 7], 6)


def test_head_unroll_and_loss_match_eagle3head(tiny):
    target, _, _ = tiny
    c = target.args
    Vd = 16
    config = HeadConfig.for_target(target, "eagle3", draft_vocab_size=Vd, aux_layers=(1, 2, 2))
    mx.random.seed(3)
    head = Eagle3Head(config)
    ids = np.sort(np.random.default_rng(0).choice(c.vocab_size, Vd, replace=False))
    head.set_draft_vocab(ids)
    for m in (head.layer.input_layernorm, head.layer.hidden_norm, head.norm):
        m.weight = mx.random.uniform(0.5, 1.5, m.weight.shape)
    twin = gh.Eagle3(c.hidden_size, 3, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                    c.intermediate_size, Vd, c.rms_norm_eps, c.rope_theta)
    from mlx.utils import tree_flatten

    twin.load_edgespec({k: np.array(v) for k, v in tree_flatten(head.parameters())})
    B, T, H = 2, 11, c.hidden_size
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((B, T, 3 * H)).astype(np.float32)
    emb = rng.standard_normal((B, T, H)).astype(np.float32)
    want = head.unroll(mx.array(feats), mx.array(emb), 3)
    with torch.no_grad():
        got = twin.unroll(torch.tensor(feats), torch.tensor(emb), 3)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o.numpy(), np.array(w), atol=2e-4)
    labels = ids[rng.integers(0, Vd, (B, T))]
    labels[0, 3] = next(i for i in range(c.vocab_size) if i not in set(ids))  # outside: masked
    mask = (rng.random((B, T)) < 0.8).astype(np.uint8)
    loss, top1 = eagle3_loss(head, {"features": mx.array(feats), "emb_next": mx.array(emb),
                                    "labels": mx.array(labels), "mask": mx.array(mask)}, 3)
    index = torch.full((c.vocab_size,), -1, dtype=torch.long)
    index[torch.tensor(ids)] = torch.arange(Vd)
    lab = torch.tensor(labels)
    with torch.no_grad():
        tloss, ttop1 = gh.head_loss(twin, {"features": torch.tensor(feats), "emb_next": torch.tensor(emb),
                                          "labels": lab, "draft": index[lab],
                                          "mask": torch.tensor(mask).bool(), "ids": torch.tensor(ids)}, 3)
    assert float(tloss) == pytest.approx(float(loss), rel=1e-4)
    assert ttop1 == pytest.approx([float(t) for t in top1], abs=1e-6)


def test_run_end_to_end_and_import(tiny, tmp_path, monkeypatch):
    """The whole script on the CPU with the tiny model (its tokenizer, a bundle made by
    ``gpu_bundle.prepare``): questions, answers, features, a few training steps; then ``import``
    saves an edgespec head that loads for the target and drafts from the script's vocabulary."""
    target, _, folder = tiny
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "e.jsonl").write_text(json.dumps({"turns": ["a question nobody asks here"]}) + "\n")
    monkeypatch.setenv("EDGESPEC_EVAL_DIR", str(eval_dir))
    monkeypatch.setattr(bundle, "load", lambda model: target)
    b = tmp_path / "bundle"
    bundle.main(["prepare", str(b)])
    recipe = json.loads((b / "recipe.json").read_text())
    # a random model seldom ends its turn: every 10th token ends it here, so questions of 12+
    # characters (the byte-level tokens are single characters) finish within 16 tokens
    recipe.update(question_tokens=16, answer_tokens=12, stop_ids=list(range(40, 250, 10)))
    (b / "recipe.json").write_text(json.dumps(recipe))
    out = tmp_path / "out"
    g.main(["--bundle", str(b), "--out", str(out), "--questions", "12", "--gen-batch", "8",
            "--draft-vocab", "32", "--depths", "2", "--epochs", "2", "--batch-tokens", "256",
            "--held-out", "0.25", "--question-minutes", "1", "--answer-minutes", "1"])
    report = json.loads((out / "report.json").read_text())
    assert report["answers"]["answers"] > 0 and report["features"]["tokens"] > 0
    assert len(report["train"]["evals"]) == 2 and report["train"]["steps_done"] > 0
    head_dir = tmp_path / "head"
    bundle.main(["import", str(out), "--out", str(head_dir), "--bundle", str(b)])
    config, head = load_head(head_dir, target)
    assert config.kind == "eagle3" and config.draft_vocab_size == 32
    from safetensors.numpy import load_file

    np.testing.assert_array_equal(np.array(head.to_target_ids(np.arange(32))),
                                  load_file(str(out / "head_lm.safetensors"))["draft_ids"])
    save_head(tmp_path / "again", config, head)  # and it writes like any other head
