"""What does a grammar's token mask cost per token, and as a share of a decoding step?

Usage:
  python scripts/grammar_mask_cost.py engines [REPEATS]   # llguidance, xgrammar, outlines-core
  python scripts/grammar_mask_cost.py step [MODEL] [REPEATS] [MAX_NODES]  # GrammarRule vs forward

``engines``: the demo model's tokenizer (49k tokens), one JSON schema (``SCHEMA``) compiled by
each engine that imports (xgrammar needs torch: run it from a venv that has both, with
PYTHONPATH at the repository root). Each engine walks ``DOCUMENT``'s tokens: at every token the
mask of allowed tokens (into a bitmask), then the token consumed. Reported: compile time (the
tokenizer's one-time preparation separately), mean and p99 mask time per token, and the cost of
checking one drafted token (consume it, then roll it back: what verifying a draft costs a node
whose mask is not needed).

``step``: the per-node cost of ``GrammarRule.apply`` on a chain of N nodes (the mask of every
node, from its own history) next to the target's forward over the same N nodes, for every tree
size the engine uses (plain decoding N=1, drafts of 1..``MAX_DRAFT`` tokens, the medusa trees).
Run it on a quiet machine: timings on a loaded one are noisy.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "country": {"enum": ["France", "Germany", "Italy", "Spain"]}},
            "required": ["city", "country"], "additionalProperties": False,
        },
        "score": {"type": "number"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "score", "active"],
    "additionalProperties": False,
}
DOCUMENT = json.dumps({
    "name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
    "tags": ["mathematics", "poetry of science", "analytical engine"],
    "address": {"city": "London", "country": "France"}, "score": 98.5, "active": True,
})


def _demo_tokenizer():
    from edgespec.loading.hub import resolve_model
    from edgespec.loading.tokenizer import Tokenizer
    return Tokenizer.from_dir(resolve_model("demo", progress=False))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _token_bytes(tok) -> list[bytes]:
    """Each id's raw bytes (byte-level BPE vocabulary; special tokens as their text)."""
    dec, out = _byte_decoder(), [b""] * tok.vocab_size
    for s, i in tok.vocab().items():
        out[i] = bytes(dec[c] for c in s) if all(c in dec for c in s) else s.encode()
    return out


def _walk(mask, consume, tokens: list[int]) -> list[float]:
    times = []
    for t in tokens:
        t0 = time.perf_counter()
        mask()
        times.append(time.perf_counter() - t0)
        consume(t)
    return times


def _draft_check(check, tokens: list[int], consume) -> float:
    """Mean seconds to consume-and-roll-back the next token, at every point of the walk."""
    times = []
    for t in tokens:
        t0 = time.perf_counter()
        check(t)
        times.append(time.perf_counter() - t0)
        consume(t)
    return statistics.mean(times)


def llguidance_engine(tok, tokens):
    import llguidance
    import llguidance.numpy as lnp
    t0 = time.perf_counter()
    lt = llguidance.LLTokenizer(tok.backend_json(), n_vocab=tok.vocab_size,
                                eos_token=sorted(tok.eos_token_ids))
    prep = time.perf_counter() - t0

    def make():
        m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA))
        assert not m.is_error(), m.get_error()
        return m

    t0 = time.perf_counter()
    m = make()
    compile_s = time.perf_counter() - t0
    bm = lnp.allocate_token_bitmask(1, tok.vocab_size)
    walk = _walk(lambda: lnp.fill_next_token_bitmask(m, bm), m.consume_token, tokens)
    m = make()

    def check(t):
        assert m.try_consume_tokens([t]) == 1
        m.rollback(1)
    return prep, compile_s, walk, _draft_check(check, tokens, m.consume_token)


def xgrammar_engine(tok, tokens):
    import xgrammar as xgr
    vocab = [""] * tok.vocab_size
    for s, i in tok.vocab().items():
        vocab[i] = s
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size,
                             stop_token_ids=sorted(tok.eos_token_ids))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    cg = compiler.compile_json_schema(json.dumps(SCHEMA), strict_mode=True)
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(cg)
    bm = xgr.allocate_token_bitmask(1, tok.vocab_size)
    walk = _walk(lambda: m.fill_next_token_bitmask(bm), m.accept_token, tokens)
    m = xgr.GrammarMatcher(cg)

    def check(t):
        assert m.accept_token(t)
        m.rollback(1)
    return prep, compile_s, walk, _draft_check(check, tokens, m.accept_token)


def outlines_engine(tok, tokens):
    import outlines_core as oc
    raw, eos = _token_bytes(tok), min(tok.eos_token_ids)
    t0 = time.perf_counter()
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(raw):
        if i != eos and b:
            by_bytes.setdefault(b, []).append(i)
    vocab = oc.Vocabulary(eos, by_bytes)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = oc.Index(oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA)), vocab)
    compile_s = time.perf_counter() - t0
    g = oc.Guide(index)
    bm = np.zeros((tok.vocab_size + 31) // 32, dtype=np.int32)
    walk = _walk(lambda: g.write_mask_into(bm.ctypes.data, bm.size, 4),
                 lambda t: g.advance(t, return_tokens=False), tokens)
    g = oc.Guide(index)

    def check(t):
        g.advance(t, return_tokens=False)
        g.rollback_state(1)
    return prep, compile_s, walk, _draft_check(check, tokens,
                                               lambda t: g.advance(t, return_tokens=False))


ENGINES = {"llguidance": llguidance_engine, "xgrammar": xgrammar_engine,
           "outlines-core": outlines_engine}


def engines(repeats: str = "3") -> None:
    tok = _demo_tokenizer()
    tokens = tok.encode(DOCUMENT, add_special_tokens=False)
    print(f"demo tokenizer: {tok.vocab_size} tokens; document: {len(tokens)} tokens; "
          f"best of {repeats} runs (compile: first run)")
    print(f"{'engine':<14} {'prep ms':>8} {'compile ms':>10} {'mask mean us':>12} "
          f"{'mask p99 us':>11} {'draft check us':>14}")
    rows = {}
    for name, run in ENGINES.items():
        try:
            runs = [run(tok, tokens) for _ in range(int(repeats))]
        except ImportError as e:
            print(f"{name:<14} not installed ({e})")
            continue
        prep, compile_s = runs[0][0], runs[0][1]
        best = min(runs, key=lambda r: statistics.mean(r[2]))
        walk = sorted(best[2])
        row = {"prep_ms": prep * 1e3, "compile_ms": compile_s * 1e3,
               "mask_mean_us": statistics.mean(walk) * 1e6,
               "mask_p99_us": walk[min(len(walk) - 1, int(0.99 * len(walk)))] * 1e6,
               "draft_check_us": min(r[3] for r in runs) * 1e6}
        rows[name] = row
        print(f"{name:<14} {row['prep_ms']:8.1f} {row['compile_ms']:10.1f} "
              f"{row['mask_mean_us']:12.1f} {row['mask_p99_us']:11.1f} "
              f"{row['draft_check_us']:14.1f}")
    print(json.dumps(rows))


SIZES = (1, 2, 3, 5, 9, 13, 17, 33, 65)
"""Tree nodes per step: plain decoding, chains of 1, 2, 4, 8 and 12 drafts (``num_draft``'s
default and ``max_draft``'s), trees of 16, 32 and 64 drafts (EAGLE-3 / Medusa); each measured
as a chain of the document's tokens (the rule's work is per node: a mask and a rollback)."""


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step(ref: str = "demo", repeats: str = "7", max_nodes: str = "65") -> None:
    import mlx.core as mx

    import edgespec
    from edgespec.grammar import Grammar, GrammarRule
    from edgespec.tree import DraftTree

    target = edgespec.load_target(ref, progress=False)
    tok = target.tokenizer
    prompt = tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "Describe Ada Lovelace as JSON."}]), add_special_tokens=False)
    doc = tok.encode(DOCUMENT, add_special_tokens=False)
    cache = target.make_cache()
    target.score(prompt[:-1], cache, head=False)
    cache.commit()
    mx.eval(cache.state())
    rule = GrammarRule(Grammar.json_schema(SCHEMA), tok)
    rule.reset(prompt)
    print(f"{ref}: prompt {len(prompt)} tokens; median of {repeats}; grammar = allows + forced + "
          f"apply (masks of every node, applied to the logits)")
    print(f"{'nodes':>5} {'forward ms':>10} {'grammar ms':>10} {'per node us':>11} {'share':>7}")
    rows = []
    for n in [s for s in SIZES if s <= int(max_nodes)]:
        tree = DraftTree.chain(prompt[-1], doc[: n - 1])
        logits = target.score(tree, cache).logits
        mx.eval(logits)

        def forward():
            mx.eval(target.score(tree, cache).logits)

        def grammar():
            rule.allows(tree)
            rule.forced(doc[: n - 1], 16)
            mx.eval(rule.apply(tree, logits))

        f, g = _median_s(forward, int(repeats)), _median_s(grammar, int(repeats))
        rows.append({"nodes": n, "forward_ms": f * 1e3, "grammar_ms": g * 1e3, "share": g / f})
        print(f"{n:5d} {f * 1e3:10.2f} {g * 1e3:10.3f} {g / n * 1e6:11.1f} {g / f:7.1%}")
    print(json.dumps(rows))


if __name__ == "__main__":
    args = sys.argv[1:] or ["engines"]
    {"engines": engines, "step": step}[args[0]](*args[1:])
