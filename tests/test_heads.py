"""Trained heads on tiny random targets: configs and fingerprints, the EAGLE-3 head's drafting
step against its training-time test (the same row either way), Medusa heads, the losses, and
finding a head for a target."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest

from edgespec.errors import HeadError
from edgespec.heads import (Eagle3Head, HeadConfig, MedusaHeads, eagle3_loss, find_head,
                            fingerprint, medusa_loss, save_head, target_lm_head)
from edgespec.heads.config import default_aux_layers
from edgespec.heads.eagle3 import depth_mask
from edgespec.heads.medusa import target_lm_head_weight
from edgespec.tree import chain_mask

LAYERS = 4


@pytest.fixture(scope="module")
def deep(tiny_models):
    return tiny_models.load(layers=LAYERS)


def _eagle(target, vd=100, seed=0) -> Eagle3Head:
    mx.random.seed(seed)
    head = Eagle3Head(HeadConfig.for_target(target, "eagle3", draft_vocab_size=vd))
    ids = np.random.default_rng(seed).permutation(target.args.vocab_size)[:vd]
    head.set_draft_vocab(ids)
    mx.eval(head.parameters())
    return head


def _sequence(target, aux, T=12, seed=1):
    """Tokens x_0..x_T, the features at positions 0..T-1 (T, A*H), emb_next (T, H), and the
    target's argmax at each position (T,)."""
    x = np.random.default_rng(seed).integers(3, target.args.vocab_size, T + 1).tolist()
    out = target.score(x[:T], target.make_cache(), capture=aux)
    feats = mx.concatenate([out.captured[i] for i in aux], axis=-1)
    return x, feats, target.model.embed(mx.array(x[1:])[None])[0], out.logits.argmax(axis=-1)


# -- config


def test_config_defaults_and_json_round_trip(deep):
    c = HeadConfig.for_target(deep, "eagle3", draft_vocab_size=64)
    assert c.aux_layers == (2, LAYERS // 2, LAYERS - 3)
    assert default_aux_layers(32) == (2, 16, 29)
    assert (c.hidden_size, c.vocab_size, c.num_key_value_heads) == (64, deep.args.vocab_size, 2)
    assert HeadConfig.from_dict(c.to_dict()) == c
    assert c.target_fingerprint == fingerprint(deep)
    with pytest.raises(HeadError, match="'eagle7'.*eagle3, medusa"):
        HeadConfig(kind="eagle7", hidden_size=4, vocab_size=8)


def test_fingerprint_tells_weights_apart_but_not_dtypes(tiny_models, deep):
    from edgespec.targets import load_target

    half = load_target(tiny_models.path(layers=LAYERS), dtype="float16")
    assert fingerprint(half) == fingerprint(deep)
    other = tiny_models.load(layers=LAYERS, seed=7)  # same shapes, other weights
    assert fingerprint(other) != fingerprint(deep)


def test_check_refuses_another_target_naming_both_values(tiny_models, deep):
    c = HeadConfig.for_target(deep, "eagle3")
    c.check(deep)  # its own target passes
    wide = tiny_models.load(layers=LAYERS, hidden=32, heads=2, kv_heads=1, intermediate=64)
    with pytest.raises(HeadError, match="hidden size 64.*has hidden size 32"):
        c.check(wide)
    more_vocab = tiny_models.load(layers=LAYERS, extra_tokens=("xyz",))
    with pytest.raises(HeadError, match=f"vocabulary size {c.vocab_size}.*{c.vocab_size + 1}"):
        c.check(more_vocab)
    other = tiny_models.load(layers=LAYERS, seed=7)
    with pytest.raises(HeadError, match=f"fingerprint {c.target_fingerprint}.*{fingerprint(other)}"):
        c.check(other)


# -- EAGLE-3


def test_eagle3_shapes_and_vocab_maps(deep):
    head = _eagle(deep, vd=50)
    x, feats, emb, _ = _sequence(deep, head.config.aux_layers, T=6)
    assert head.fuse(feats).shape == (6, 64)
    logits, out = head.step(emb, head.fuse(feats), 0, chain_mask(6, np.arange(0), 0, None),
                            head.make_cache())
    assert logits.shape == (6, 50) and out.shape == (6, 64)
    ids = np.array(head.to_target_ids(np.arange(50)))
    assert np.array_equal(ids, np.arange(50) + np.array(head.d2t))  # target = draft + d2t
    t2d = np.array(head.t2d)
    assert t2d.sum() == 50 and t2d[ids].all()
    assert np.array_equal(np.array(head.to_draft_ids(mx.array(ids))), np.arange(50))
    full = np.array(head.draft_logits_to_target(logits))
    assert np.array_equal(full[:, ids], np.array(logits)) and np.isneginf(full[:, ~t2d]).all()


@pytest.mark.parametrize("p,j", [(5, 0), (5, 1), (6, 3), (3, 3), (9, 2)])
def test_drafted_row_equals_unrolled_training_row(deep, p, j):
    """Depth j at position p drafted depth by depth in the head's cache (with a decoy sibling
    at every depth, hidden by the mask) equals row p of unroll's depth j."""
    head = _eagle(deep)
    x, feats, emb, _ = _sequence(deep, head.config.aux_layers)
    trained = head.unroll(feats[None], emb[None], depth=4)[j][0, p]

    cache = head.make_cache()
    n0 = p - j + 1  # true entries: positions 0..p-j
    logits, out = head.step(emb[:n0], head.fuse(feats[:n0]), 0,
                            chain_mask(n0, np.arange(0), 0, None), cache)
    cache.commit()
    row, h, drafted = logits[-1], out[-1:], 0
    decoy = mx.array([[0.5] * 64])
    for i in range(1, j + 1):
        q = p - j + i
        rows_emb = mx.concatenate([emb[q : q + 1], decoy * i])  # the true child, then a decoy
        ancestors = np.zeros((2, drafted), dtype=bool)
        ancestors[:, 0:drafted:2] = True  # both descend from the earlier true rows only
        mask = depth_mask(n0, ancestors)
        logits, out = head.step(rows_emb, mx.concatenate([h, h]), np.array([q, q]), mask, cache)
        cache.commit()
        row, h, drafted = logits[0], out[:1], drafted + 2
    assert cache.offset == n0 + 2 * j
    np.testing.assert_allclose(np.array(row), np.array(trained), atol=2e-4, rtol=1e-4)
    cache.trim(2 * j)  # roll the drafts back: the true entries stay
    assert cache.offset == n0


def test_eagle3_loss_trains_and_reports_top1(deep):
    head = _eagle(deep, vd=deep.args.vocab_size)
    x, feats, emb, argmax = _sequence(deep, head.config.aux_layers, T=16)
    labels = mx.concatenate([argmax[1:], mx.array([0])])  # row p: the target's argmax at p+1
    mask = mx.array(np.arange(16) < 15)
    batch = {"features": feats[None], "emb_next": emb[None], "labels": labels[None],
             "mask": mask[None]}
    step = nn.value_and_grad(head, lambda m, b: eagle3_loss(m, b, depth=3))
    opt = optim.Adam(learning_rate=3e-3)
    (first, top1), _ = step(head, batch)
    assert len(top1) == 3 and all(0 <= float(t) <= 1 for t in top1)
    for _ in range(30):
        (loss, top1), grads = step(head, batch)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state)
    assert float(loss) < 0.5 * float(first)
    assert float(top1[0]) > 0.5  # the head memorised the depth-0 labels of this sequence


# -- Medusa


@pytest.mark.parametrize("own", [True, False])
def test_medusa_starts_as_the_target_head(deep, own):
    """Zero-initialised blocks are the identity, so every head first predicts what the target
    predicts next (own LM heads are copied from the target's)."""
    c = HeadConfig.for_target(deep, "medusa", num_heads=3, num_layers=2, own_lm_head=own)
    heads = MedusaHeads(c)
    heads.init_from_target(deep)
    out = deep.score([5, 9, 11, 40], deep.make_cache())
    normed = deep.model.model.norm(out.hidden)
    logits = heads(normed, target_lm_head(deep))
    assert logits.shape == (3, 4, deep.args.vocab_size)
    for i in range(3):
        np.testing.assert_allclose(np.array(logits[i]), np.array(out.logits), atol=1e-4)
    assert ("lm_head" in heads.heads[0]) == own


def test_medusa_loss_trains(deep):
    c = HeadConfig.for_target(deep, "medusa", num_heads=2, num_layers=1, own_lm_head=False)
    heads = MedusaHeads(c)
    x, _, _, argmax = _sequence(deep, (1,), T=16)
    out = deep.score(x[:16], deep.make_cache())
    batch = {"hidden": deep.model.model.norm(out.hidden)[None], "argmax": argmax[None],
             "mask": mx.ones((1, 16))}
    lm = target_lm_head(deep)
    step = nn.value_and_grad(heads, lambda m, b: medusa_loss(m, b, lm))
    opt = optim.Adam(learning_rate=1e-2)
    (first, _), _ = step(heads, batch)
    for _ in range(30):
        (loss, top1), grads = step(heads, batch)
        opt.update(heads, grads)
        mx.eval(heads.parameters(), opt.state)
    assert float(loss) < 0.7 * float(first) and len(top1) == 2



def test_medusa_loss_over_a_draft_vocabulary(deep):
    """With a draft vocabulary the loss is the cross-entropy over its rows of the shared head,
    labels outside it are left out of the loss and count as misses; it still trains."""
    V = deep.args.vocab_size
    x, _, _, argmax = _sequence(deep, (1,), T=16)
    out = deep.score(x[:16], deep.make_cache())
    hidden = deep.model.model.norm(out.hidden)
    labels = np.array(argmax)
    ids = np.unique(np.concatenate([labels[1:9], np.arange(0, V, 5)]))  # some labels missing
    ids = ids[~np.isin(ids, labels[9:12])]
    c = HeadConfig.for_target(deep, "medusa", num_heads=1, num_layers=1, own_lm_head=False,
                              draft_vocab_size=len(ids))
    heads = MedusaHeads(c)
    heads.set_draft_vocab(ids)
    batch = {"hidden": hidden[None], "argmax": argmax[None], "mask": mx.ones((1, 16))}
    loss, (top1,) = medusa_loss(heads, batch, target_lm_head(deep, ids))
    logits = np.array(hidden @ target_lm_head_weight(deep).T)[:, ids]  # blocks start as identity
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    index = {int(t): i for i, t in enumerate(ids)}
    inside = [t for t in range(15) if int(labels[t + 1]) in index]
    want = -np.mean([logp[t, index[int(labels[t + 1])]] for t in inside])
    hits = sum(int(ids[logits[t].argmax()]) == int(labels[t + 1]) for t in inside)
    assert 0 < len(inside) < 15
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    np.testing.assert_allclose(float(top1), hits / 15, rtol=1e-6)
    with pytest.raises(ValueError, match=f"draft vocabulary of {len(ids)}"):
        medusa_loss(heads, batch, target_lm_head(deep))  # the whole head's logits
    with pytest.raises(HeadError, match="own LM heads"):
        HeadConfig.for_target(deep, "medusa", own_lm_head=True, draft_vocab_size=8)
    with pytest.raises(HeadError, match="distinct target ids"):
        heads.set_draft_vocab(ids[:-1])


# -- finding a head


def test_find_head_by_fingerprint(deep, tiny_models, tmp_path, monkeypatch):
    head = _eagle(deep, vd=32)
    save_head(tmp_path / "tiny" / "eagle3", head.config, head)
    monkeypatch.setenv("EDGESPEC_HEADS", str(tmp_path))
    assert find_head(deep, "eagle3") == tmp_path / "tiny" / "eagle3"
    assert find_head(deep, "medusa") is None
    assert find_head(tiny_models.load(layers=LAYERS, seed=7), "eagle3") is None
    monkeypatch.setenv("EDGESPEC_HEADS", str(tmp_path / "tiny" / "eagle3"))  # a head dir itself
    assert find_head(deep, "eagle3") == tmp_path / "tiny" / "eagle3"


def test_eagle3_soft_loss_is_the_cross_entropy_against_the_renormalised_top_k(deep):
    """With soft labels the loss is -sum p log q over the given top-K ids that the draft
    vocabulary has, p renormalised over them; a one-hot soft label gives the argmax loss."""
    vd = 40
    head = _eagle(deep, vd=vd)
    head.set_draft_vocab(np.arange(vd) * 2)  # even target ids only
    x, feats, emb, argmax = _sequence(deep, head.config.aux_layers, T=12)
    T = 12
    labels = np.array(mx.concatenate([argmax[1:], mx.array([0])]))
    labels = (labels // 2 * 2) % (2 * vd)  # every label in the draft vocabulary
    mask = np.arange(T) < T - 1
    hard = {"features": feats[None], "emb_next": emb[None], "labels": mx.array(labels)[None],
            "mask": mx.array(mask)[None]}
    one_hot = dict(hard, soft_ids=mx.array(np.stack([labels, -np.ones(T, int)], -1))[None],
                   soft_p=mx.array(np.stack([np.full(T, 0.7), np.zeros(T)], -1), mx.float32)[None])
    np.testing.assert_allclose(float(eagle3_loss(head, hard, 2)[0]),
                               float(eagle3_loss(head, one_hot, 2)[0]), rtol=1e-5)
    rng = np.random.default_rng(0)
    ids = np.stack([labels, labels ^ 2, rng.integers(0, 2 * vd, T) | 1], -1)  # the last: odd, outside
    probs = np.stack([np.full(T, 0.5), np.full(T, 0.2), np.full(T, 0.3)], -1)
    soft = dict(hard, soft_ids=mx.array(ids)[None], soft_p=mx.array(probs, mx.float32)[None])
    loss, _ = eagle3_loss(head, soft, 1)
    lg = np.array(head.unroll(feats[None], emb[None], 1)[0][0], dtype=np.float64)
    logq = lg - np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lg.max(-1, keepdims=True)
    d = ids[:, :2] // 2  # draft ids of the two in-vocabulary tokens
    p = probs[:, :2] / probs[:, :2].sum(-1, keepdims=True)
    ce = -(p * np.take_along_axis(logq, d, -1)).sum(-1)
    np.testing.assert_allclose(float(loss), ce[mask].mean(), rtol=1e-4)
