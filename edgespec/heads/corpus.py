"""A model's own n-gram table ("corpus"): what the target tends to write next after 1-4 tokens,
counted over answers it wrote itself (``edgespec train corpus``), for the corpus drafter.

Contract: ``NgramTable(documents)`` counts, for every context of ``1..MAX_CONTEXT`` tokens in the
documents, which ``TOP`` tokens followed it most often (ties: the smaller id) and their shares of
the context's occurrences. ``guesses(history)`` reads the longest context of the history's last
tokens that the documents hold: ``[(token, share), ...]``, most frequent first; ``guess`` the
first of them, or None. Contexts are stored as 64-bit hashes
in a sorted array, looked up by binary search: a hash collision can only make a draft wrong, and
a wrong draft is rejected by the verifier, so the output never depends on it.

On disk (``save_corpus``; ``load_corpus`` counts its table) a corpus is the answers' token ids:
``corpus.safetensors`` holds ``tokens/<i>`` and ``offsets/<i>`` per source ``i`` (one source per
``edgespec train corpus`` run: its prompts' origin), and ``config.json`` an ``edgespec`` section
with kind ``corpus``, the target's fingerprint and vocabulary size, and the sources. The table is
not stored: it is counted from the tokens when loaded. A corpus made for another target is
refused with :class:`HeadError` naming both.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import HeadError
from .config import fingerprint

MAX_CONTEXT = 4
TOP = 3  # next tokens kept per context
_MIX = 0x9E3779B97F4A7C15  # odd 64-bit multiplier of the context hash
_MASK = (1 << 64) - 1
FILE = "corpus.safetensors"


def context_hash(tokens) -> int:
    """The hash of one context (a sequence of 1..MAX_CONTEXT token ids), as ``NgramTable`` keys it."""
    h = len(tokens)
    for t in tokens:
        h = (h * _MIX + int(t) + 1) & _MASK
    return h


class NgramTable:
    """For each context of 1..``max_context`` tokens: the ``TOP`` tokens that followed it most
    often, and their shares of the context's occurrences."""

    def __init__(self, documents: list[np.ndarray], max_context: int = MAX_CONTEXT):
        self.max_context = max_context
        self.tables = [self._count(documents, n) for n in range(1, max_context + 1)]
        self.tokens = int(sum(len(d) for d in documents))

    @staticmethod
    def _count(documents: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keys, nexts = [], []
        for doc in documents:
            doc = np.asarray(doc, dtype=np.uint64)
            if len(doc) <= n:
                continue
            h = np.full(len(doc) - n, n, dtype=np.uint64)
            for j in range(n):  # the same arithmetic as context_hash, wrapping at 64 bits
                h = h * np.uint64(_MIX) + doc[j : len(doc) - n + j] + np.uint64(1)
            keys.append(h)
            nexts.append(doc[n:].astype(np.int64))
        if not keys:
            return np.zeros(0, np.uint64), np.zeros((0, TOP), np.int32), np.zeros((0, TOP), np.float32)
        k, t = np.concatenate(keys), np.concatenate(nexts)
        order = np.lexsort((t, k))
        k, t = k[order], t[order]
        pair = np.r_[True, (k[1:] != k[:-1]) | (t[1:] != t[:-1])]  # first of each (context, next)
        starts = np.flatnonzero(pair)
        pk, pt, pc = k[starts], t[starts], np.diff(np.r_[starts, len(k)])
        first_of_key = np.r_[True, pk[1:] != pk[:-1]]
        key_id = np.cumsum(first_of_key) - 1
        total = np.bincount(key_id, weights=pc)
        best = np.lexsort((pt, -pc, key_id))  # per context: most often first, then smaller id
        rows = key_id[best]
        firsts = np.r_[0, np.flatnonzero(rows[1:] != rows[:-1]) + 1]
        rank = np.arange(len(best)) - np.repeat(firsts, np.diff(np.r_[firsts, len(best)]))
        keep = rank < TOP
        tokens = np.full((len(total), TOP), -1, np.int32)
        shares = np.zeros((len(total), TOP), np.float32)
        tokens[rows[keep], rank[keep]] = pt[best][keep]
        shares[rows[keep], rank[keep]] = pc[best][keep] / total[rows[keep]]
        return pk[first_of_key], tokens, shares

    def __len__(self) -> int:
        return sum(len(keys) for keys, _, _ in self.tables)

    def guesses(self, history) -> list[tuple[int, float]]:
        """Up to ``TOP`` (next token, its share) after the longest context ending ``history``
        that the documents hold, most frequent first; [] when none."""
        for n in range(min(self.max_context, len(history)), 0, -1):
            keys, tokens, shares = self.tables[n - 1]
            h = np.uint64(context_hash(history[len(history) - n :]))
            i = int(np.searchsorted(keys, h))
            if i < len(keys) and keys[i] == h:
                return [(int(t), float(p)) for t, p in zip(tokens[i], shares[i]) if t >= 0]
        return []

    def guess(self, history) -> tuple[int, float] | None:
        """(most frequent next token, its share) after the longest context ending ``history``."""
        found = self.guesses(history)
        return found[0] if found else None


def _documents(tokens: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def save_corpus(path, target, sources: dict[str, list[list[int]]], recipe: dict | None = None) -> dict:
    """Write ``sources`` (source name -> its documents' token ids) as a corpus for ``target``;
    returns the config section written."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    arrays, listed = {}, []
    for i, (name, docs) in enumerate(sources.items()):
        offsets = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
        flat = np.concatenate([np.asarray(d, np.int64) for d in docs]) if docs else np.zeros(0)
        arrays[f"tokens/{i}"] = mx.array(flat.astype(np.int32))
        arrays[f"offsets/{i}"] = mx.array(offsets)
        listed.append({"name": name, "documents": len(docs), "tokens": int(offsets[-1])})
    section = {"kind": "corpus", "vocab_size": target.args.vocab_size,
               "target_fingerprint": fingerprint(target), "target_name": target.name,
               "max_context": MAX_CONTEXT, "sources": listed}
    mx.save_safetensors(str(path / FILE), arrays)
    (path / "config.json").write_text(json.dumps({"edgespec": section}, indent=1))
    if recipe is not None:
        (path / "recipe.json").write_text(json.dumps(recipe, indent=1))
    return section


def read_sources(path) -> tuple[dict[str, list[np.ndarray]], dict]:
    """(source name -> documents, config section) of the corpus at ``path``; HeadError naming
    the folder and what is wrong if it is not one."""
    path = Path(path)
    section = corpus_section(path)
    try:
        arrays = mx.load(str(path / FILE))
        sources = {}
        for i, s in enumerate(section["sources"]):
            tokens = np.array(arrays[f"tokens/{i}"]).astype(np.int64)
            offsets = np.array(arrays[f"offsets/{i}"]).astype(np.int64)
            sources[s["name"]] = _documents(tokens, offsets)
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
        raise HeadError(f"{_not_one(path)}: {FILE} is missing, damaged or does not match "
                        f"config.json ({type(e).__name__}: {e})") from None
    return sources, section


def load_corpus(path, target=None) -> NgramTable:
    """The table of the corpus at ``path``; with ``target``, HeadError unless it was made for
    that target."""
    sources, section = read_sources(path)
    if target is not None:
        check_corpus(section, target)
    return NgramTable([d for docs in sources.values() for d in docs],
                      int(section.get("max_context", MAX_CONTEXT)))


def corpus_section(path) -> dict:
    """The config section of the corpus at ``path`` (its documents are not read); HeadError
    naming the folder and what is wrong if it is not one."""
    try:
        section = json.loads((Path(path) / "config.json").read_text())["edgespec"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HeadError(f"{_not_one(path)}: its config.json has no edgespec section "
                        f"({type(e).__name__}: {e})") from None
    kind = section.get("kind") if isinstance(section, dict) else None
    if kind != "corpus":
        raise HeadError(f"{_not_one(path)}: its config.json names kind {kind!r}, not 'corpus'")
    return section


def _not_one(path) -> str:
    return f"{str(path)!r} is not a corpus written by `edgespec train corpus`"


def check_corpus(section: dict, target) -> None:
    """HeadError naming both values unless the corpus section belongs to ``target``."""
    V = target.args.vocab_size
    if section.get("vocab_size") != V:
        raise HeadError(f"this corpus was made for a target with vocabulary size "
                        f"{section.get('vocab_size')}, but {target.name} has vocabulary size {V}")
    theirs = fingerprint(target)
    if section.get("target_fingerprint") != theirs:
        raise HeadError(
            f"this corpus was made for target fingerprint {section.get('target_fingerprint')} "
            f"({section.get('target_name')}), but {target.name} has fingerprint {theirs}: "
            f"its n-grams are another model's")
