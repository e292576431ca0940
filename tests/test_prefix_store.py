"""PrefixStore: the longest stored prefix among many entries, whole entries handed out and
partial ones forked, LRU eviction under the byte budget, forks isolated from the stored entry,
and a prompt resumed from a taken cache scoring the bits a trimmed cache scores (plain, sliding
window past its first drop, hybrid recurrent states at the pinned prompt end)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.cache import KVCache
from edgespec.errors import CacheRollbackError, ConfigError
from edgespec.kernels.backend import prefill_chunk
from edgespec.prefix_store import PrefixStore

from .tiny import KINDS


def _holding(tokens, layers: int = 2) -> KVCache:
    """A cache whose keys (values: x10) at each position are that position's token id."""
    cache = KVCache(layers)
    cache.reserve(len(tokens))
    k = mx.array(np.array(tokens, dtype=np.float32).reshape(1, 1, -1, 1))
    for layer in range(layers):
        cache.write(layer, k, k * 10)
    cache.commit()
    return cache


def _tokens(cache: KVCache, layer: int = 0) -> list[int]:
    return np.array(cache.keys[layer][0, 0, : cache.slots(layer), 0]).astype(int).tolist()


def _put(store: PrefixStore, seq: list[int]) -> KVCache:
    cache = _holding(seq[:-1])
    store.put(seq, cache)
    return cache


def _fresh():
    return KVCache(2)


def test_a_miss_makes_a_fresh_cache():
    store = PrefixStore(1 << 20)
    made = _fresh()
    cache, n = store.take([1, 2, 3], lambda: made)
    assert cache is made and n == 0 and (store.hits, store.misses) == (0, 1)
    _put(store, [7, 8, 9])
    assert store.take([1, 2, 3], _fresh)[1] == 0 and store.misses == 2


def test_the_longest_common_prefix_among_entries_is_forked():
    store = PrefixStore(1 << 20)
    _put(store, [1, 2, 3, 4, 5, 6])
    _put(store, [1, 2, 3, 20, 21, 22, 23])
    _put(store, [9, 9, 9, 9])
    cache, n = store.take([1, 2, 3, 20, 21, 99, 98], _fresh)
    assert n == 5 and cache.offset == 5 and _tokens(cache) == [1, 2, 3, 20, 21]
    assert _tokens(cache, 1) == [1, 2, 3, 20, 21]
    assert store.entries == 3 and (store.hits, store.hit_tokens) == (1, 5)  # the entry stays
    assert store.take([1, 2, 3, 4, 77], _fresh)[1] == 4


def test_a_whole_entry_is_handed_out_and_leaves_the_store():
    store = PrefixStore(1 << 20)
    stored = _put(store, [1, 2, 3, 4, 5])
    before = store.nbytes
    cache, n = store.take([1, 2, 3, 4, 5, 6, 7], _fresh)  # a follow-up turn
    assert cache is stored and n == 4 and cache.offset == 4
    assert store.entries == 0 and store.nbytes == 0 < before


def test_the_last_prompt_token_is_always_scored():
    store = PrefixStore(1 << 20)
    _put(store, [1, 2, 3, 4, 5])
    cache, n = store.take([1, 2, 3, 4], _fresh)  # the stored tokens' prefix: all but the last
    assert n == 3 and _tokens(cache) == [1, 2, 3]
    assert store.take([1], _fresh)[1] == 0


def test_ties_go_to_the_most_recently_used_entry():
    size = _holding([0] * 4).nbytes
    store = PrefixStore(2 * size)
    _put(store, [1, 2, 3, 4, 5])
    _put(store, [1, 2, 3, 9, 9])
    cache, n = store.take([1, 2, 3, 7, 0], _fresh)  # both share 3 tokens: the newer one forks
    assert n == 3 and _tokens(cache) == [1, 2, 3]
    _put(store, [8, 8, 8, 8, 8])  # evicts the least recently used: the older one
    assert store.take([1, 2, 3, 4, 0], _fresh)[1] == 3


def test_least_recently_used_entries_are_evicted_under_the_budget():
    size = _holding([0] * 9).nbytes  # each stored cache below holds 9 tokens: same buffers
    store = PrefixStore(2 * size)
    _put(store, [1] * 10)
    _put(store, [2] * 10)
    store.take([1] * 5, _fresh)  # a fork: the entry of 1s is now the most recently used
    _put(store, [3] * 10)
    assert store.entries == 2 and store.nbytes == 2 * size <= store.budget
    assert store.take([2] * 5, _fresh)[1] == 0  # evicted
    assert store.take([1] * 5, _fresh)[1] == 4 and store.take([3] * 5, _fresh)[1] == 4


def test_what_is_not_kept():
    store = PrefixStore(_holding([0] * 9).nbytes)
    store.put([1] * 300, _holding([1] * 299))  # larger than the whole budget
    store.put([2] * 5, _holding([2] * 5))  # offset is not len(seq) - 1
    store.put([3], KVCache(2))  # nothing in it
    assert store.entries == 0 and store.nbytes == 0
    with pytest.raises(ConfigError, match="budget must be a number of bytes >= 0, got -1"):
        PrefixStore(-1)


def test_an_entry_a_new_one_extends_is_dropped_and_vice_versa():
    store = PrefixStore(1 << 20)
    _put(store, [1, 2, 3, 4])
    longer = _put(store, [1, 2, 3, 4, 5, 6])
    assert store.entries == 1  # [1, 2, 3] is served by the longer one
    _put(store, [1, 2, 3, 4, 5])  # served by the stored one: not kept
    assert store.entries == 1 and store.take([1, 2, 3, 4, 5, 6, 7], _fresh)[0] is longer


def test_a_fork_never_changes_the_stored_entry():
    store = PrefixStore(1 << 20)
    _put(store, list(range(1, 11)))
    fork, n = store.take([1, 2, 3, 4, 0], _fresh)
    assert n == 4
    k = mx.full((1, 1, 3, 1), -1.0)
    for back in (5, 0):  # writes past its rows, a trim into them, writes over them
        fork.reserve(3)
        for layer in range(2):
            fork.write(layer, k, k)
        fork.commit()
        fork.trim(back)
    mx.eval(fork.state())
    assert _tokens(fork) == [1, 2, -1, -1, -1]
    again, n = store.take([1, 2, 3, 4, 5, 6, 0], _fresh)
    assert n == 6 and _tokens(again) == [1, 2, 3, 4, 5, 6]


def test_fork_refuses_offsets_the_cache_cannot_return_to():
    cache = _holding([1, 2, 3])
    with pytest.raises(CacheRollbackError, match="cannot fork at offset 4"):
        cache.fork(4)


# --- with a model: a prompt resumed from a taken cache scores as after a trim -------------

def _prefill(target, cache, ids):
    """What the engine's prefill does: ``ids`` after the cache's tokens, in its chunks."""
    step = prefill_chunk(target.model.native_blocks())
    for a in range(cache.offset, len(ids), step):
        target.score(ids[a : a + step], cache, head=False)
        cache.commit()
        mx.eval(cache.state())


def _decode(target, cache, tokens):
    """Commit ``tokens`` one forward each, as plain decoding does."""
    for t in tokens:
        target.score([t], cache)
        cache.commit()
        mx.eval(cache.state())


def _first_logits(target, cache, ids):
    """The logits of the prompt's last token, its rest prefilled after what ``cache`` holds."""
    _prefill(target, cache, ids[:-1])
    out = target.score(ids[-1:], cache)
    mx.eval(out.logits)
    return np.array(out.logits)


def _stored_run(target, prompt, generated, pin: bool = False):
    """A finished request's cache: the prompt prefilled (pinned), ``generated`` decoded."""
    cache = target.make_cache()
    _prefill(target, cache, prompt[:-1])
    if pin:
        cache.pin()
    _decode(target, cache, [prompt[-1], *generated[:-1]])
    return cache


@pytest.mark.parametrize("kind", ["llama", "window"])
def test_a_resumed_prompt_scores_as_after_a_trim(tiny_models, kind):
    """A resend that shares most of a stored request's prompt (an editor's next request): the
    taken fork resumes and scores bit for bit as the stored cache trimmed would; the sliding
    window's cache has dropped entries (its prompt is longer than window + rollback + 256)."""
    target = tiny_models.load(**KINDS[kind])
    rng = np.random.default_rng(1)
    V = target.args.vocab_size
    prompt = rng.integers(3, V, 420).tolist()
    generated = rng.integers(3, V, 6).tolist()
    resend = prompt[:400] + rng.integers(3, V, 30).tolist()
    store = PrefixStore(1 << 30)
    entry = _stored_run(target, prompt, generated)
    if kind == "window":
        assert entry.start > 0 and entry.floor < 400
    store.put(prompt + generated, entry)
    taken, n = store.take(resend, target.make_cache)
    assert n == 400 and taken is not entry
    trimmed = _stored_run(target, prompt, generated)
    trimmed.trim(trimmed.offset - n)
    assert np.array_equal(_first_logits(target, taken, resend),
                          _first_logits(target, trimmed, resend))
    cold = _first_logits(target, target.make_cache(), resend)
    np.testing.assert_allclose(_first_logits(target, store.take(resend, target.make_cache)[0],
                                             resend), cold, atol=1e-4)
    if kind == "window":  # before the window's floor nothing can be resumed
        assert store.take(prompt[: entry.floor - 1] + [0, 0], target.make_cache)[1] == 0


def test_a_used_fork_leaves_the_entry_scoring_as_before(tiny_models):
    target = tiny_models.load()
    rng = np.random.default_rng(2)
    V = target.args.vocab_size
    prompt = rng.integers(3, V, 80).tolist()
    store = PrefixStore(1 << 30)
    store.put(prompt + [5], _stored_run(target, prompt, [5]))
    resend = prompt[:60] + [7, 8, 9]
    first = _first_logits(target, store.take(resend, target.make_cache)[0], resend)
    other = prompt[:50] + rng.integers(3, V, 40).tolist()  # rewrites rows 50.. of its fork
    fork, n = store.take(other, target.make_cache)
    assert n == 50
    _first_logits(target, fork, other)
    fork.trim(fork.offset - 10)
    _decode(target, fork, other[10:45])
    assert np.array_equal(_first_logits(target, store.take(resend, target.make_cache)[0], resend),
                          first)


def test_a_hybrid_cache_resumes_at_its_pinned_prompt_end(tmp_path):
    """Recurrent states are kept at the pinned prompt end only (and offset 0): a resend of the
    whole prompt resumes there, bit for bit as the trimmed cache; a shorter shared prefix misses."""
    pytest.importorskip("mlx_lm")
    from edgespec.targets import load_target
    from edgespec.targets.state_cache import HybridCache

    from .oracle import CONFIGS, make_oracle_model

    target = load_target(make_oracle_model(tmp_path / "qwen", CONFIGS["qwen3_5"]), dtype="float32")
    rng = np.random.default_rng(3)
    V = target.args.vocab_size
    prompt, generated = rng.integers(3, V, 40).tolist(), rng.integers(3, V, 8).tolist()
    entry = _stored_run(target, prompt, generated, pin=True)
    assert isinstance(entry, HybridCache)
    store = PrefixStore(1 << 30)
    store.put(prompt + generated, entry)
    resend = prompt + [4, 5, 6]
    taken, n = store.take(resend, target.make_cache)
    assert n == len(prompt) - 1 and taken is not entry
    trimmed = _stored_run(target, prompt, generated, pin=True)
    trimmed.trim(trimmed.offset - n)
    expect = _first_logits(target, trimmed, resend)
    assert np.array_equal(_first_logits(target, taken, resend), expect)
    assert np.array_equal(_first_logits(target, store.take(resend, target.make_cache)[0], resend),
                          expect)  # the used fork left the entry's states as they were
    assert store.take(prompt[:30] + [4, 5], target.make_cache)[1] == 0


@pytest.mark.parametrize("method", ["none", "lookup"])
def test_the_engine_reuses_any_stored_prefix_and_keeps_its_output(tiny_models, method):
    """Through the engine: a resend, an edited resend and a prompt sent two requests ago all
    reuse stored KV (not only the previous request's), and every output is the one a fresh
    cache gives (greedy)."""
    from edgespec import Engine, SamplingConfig, make_drafter
    from edgespec.config import SpecConfig

    target = tiny_models.load(seed=3, tie=False)
    rng = np.random.default_rng(2)
    file = [int(t) for t in rng.integers(4, 200, size=120)]
    a, b = file + [7, 8, 9], [int(t) for t in rng.integers(4, 200, size=60)]
    edited = file[:80] + [5] + file[81:] + [7, 8, 9]

    def engine(reuse: bool) -> Engine:
        drafter = None if method == "none" else make_drafter(
            SpecConfig(method=method), target, SamplingConfig())
        return Engine(target, drafter, reuse_prefix=reuse)

    warm, cold = engine(True), engine(False)
    for ids, cached in ((a, 0), (a, len(a) - 1), (b, 0), (a, len(a) - 1), (edited, 80)):
        got = warm.generate(ids, max_tokens=12)
        assert got.stats.cached_tokens == cached
        assert got.token_ids == cold.generate(ids, max_tokens=12).token_ids
    assert warm.prefixes.hits == 3 and warm.prefixes.entries >= 2
