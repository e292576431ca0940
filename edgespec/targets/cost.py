"""This device's verify-cost curve, and the tree budget it pays to verify.

Contract: ``verify_cost_curve(target)`` is the time (ms) one target forward takes to score N
tree nodes (N = 1..64) after a 128-token context, measured at a few sizes and interpolated. It
is measured once per (model shape, dtype, device, BLAS) and cached as json under
``<cache>/cost/`` (``$EDGESPEC_CACHE``, else ``~/.cache/edgespec``), and memoized in the
process. The key covers what decides the cost — the config's shapes, the dtype and
quantization, the device and the CPU model, the BLAS serving MLX — and not the weights'
values: two fine-tunes of one architecture cost the same.

``best_budget(path_probs, curve, draft_ms)`` picks how many drafted nodes to verify: with
nodes sorted by their (calibrated) probability of being accepted, the best N-node tree is the
first N, its expected committed tokens are 1 + the sum of their probabilities, and N is the one
maximising that over (draft ms + verify ms(N + 1)) (Sequoia's idea: the tree is sized by this
device's costs, not by constants tuned on a datacenter GPU). On a CPU the curve rises much
sooner than on a GPU (see docs/measurements.md, "a flatter verify-cost curve"), so trees stay
small.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..loading.hub import cache_dir
from ..tree import DraftTree

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # nodes scored per measured forward
CONTEXT = 128
MAX_NODES = 64
# The measured curve's weight, in observed verify forwards, in what the sizing reads (``table``).
PRIOR_FORWARDS = 8
# An observed verify counts at most this many times the measured figure (``observe``).
OBSERVED_CAP = 2.0
_observing_lock = threading.Lock()  # observations and the estimate made from them


def observing() -> bool:
    """Whether the engine's verify times refine the sizing (``CostCurve.observe``): on unless
    ``EDGESPEC_OBSERVED_COSTS=0`` (the tests, whose tree sizes must not depend on timings)."""
    return os.environ.get("EDGESPEC_OBSERVED_COSTS", "1") != "0"


_memo: dict[str, CostCurve] = {}
_by_target: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> its curve


def memoized_curve(target) -> CostCurve | None:
    """The curve ``verify_cost_curve`` gave for ``target`` in this process, else None: never
    measures, nor computes the key."""
    return _by_target.get(target)


# where a measurement also reports its progress, as lines (besides its tqdm bar on stderr):
# set by ``reporting`` around building a drafter, e.g. by the chat, whose screen hides stderr
_report: ContextVar[Callable[[str], None] | None] = ContextVar("cost_report", default=None)


@contextmanager
def reporting(line: Callable[[str], None]) -> Iterator[None]:
    """Within the block, a verify-cost measurement also calls ``line`` with its progress
    ("measuring ... 12/132 forwards") after each forward (this context, this thread)."""
    token = _report.set(line)
    try:
        yield
    finally:
        _report.reset(token)


@dataclass(frozen=True)
class CostCurve:
    """Measured ms per forward over ``sizes[i]`` nodes; ``ms(n)`` interpolates between them."""

    sizes: tuple[int, ...]
    times: tuple[float, ...]  # ms, one per size
    key: str = ""

    def ms(self, n: int) -> float:
        """ms to score ``n`` nodes (linear between measured sizes, extended past the last two)."""
        xs, ys = self.sizes, self.times
        if n <= xs[0] or len(xs) == 1:
            return ys[0]
        if n >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (n - xs[-1])
        return float(np.interp(n, xs, ys))

    def ratio_8(self) -> float:
        """What 8 nodes cost against 1."""
        return self.ms(8) / self.ms(1)

    @cached_property
    def measured(self) -> np.ndarray:
        """``ms(n)`` for n = 0 .. 2 * MAX_NODES, made once: a drafting step sizes its tree
        several times, and one ``np.interp`` per candidate size was a measurable share of a
        step."""
        return np.array([self.ms(n) for n in range(2 * MAX_NODES + 1)])

    @cached_property
    def _seen(self) -> np.ndarray:
        """Per tree size: verify forwards the engine timed (row 0) and their ms summed (row 1)."""
        return np.zeros((2, 2 * MAX_NODES + 1))

    def observe(self, n: int, ms: float) -> None:
        """The engine timed a verify of an ``n``-node tree (``n`` >= 2; no more than
        2 * MAX_NODES) at ``ms``, its forward alone (not batched with other sequences): the
        sizing's estimate for ``n`` moves toward what the engine sees (``table``). One
        observation counts at most OBSERVED_CAP times the measured figure: a pause of the
        process (a collection, the machine's other work) would otherwise price a size, and
        every larger one, out of the sizing for the rest of the process. Thread-safe."""
        if 2 <= n < len(self.measured) and ms > 0 and observing():
            with _observing_lock:
                self._seen[0, n] += 1.0
                self._seen[1, n] += min(ms, OBSERVED_CAP * self.measured[n])
                self.__dict__.pop("_estimate", None)

    @cached_property
    def _estimate(self) -> np.ndarray:
        with _observing_lock:
            count, total = self._seen
            est = (PRIOR_FORWARDS * self.measured + total) / (PRIOR_FORWARDS + count)
        est[:2] = self.measured[:2]  # one node: plain decoding, which runs pipelined
        return np.maximum.accumulate(est)

    @property
    def table(self) -> np.ndarray:
        """What the sizing reads: for n = 0 .. 2 * MAX_NODES, the measured ``ms(n)`` blended
        with the verify times the engine observed for n-node trees (``observe``), as if the
        curve's value were PRIOR_FORWARDS of them; never lower than a smaller size's. The
        measured curve is taken once, after 128 tokens, in seconds a shared machine may spend
        in a slow spell, and a verify in the engine costs what its context and host work make
        it (docs/measurements.md, "the curve the sizing reads is not what a verify costs in
        the engine"). One node stays the measured figure: plain decoding, which the engine
        pipelines, is what drafting competes with."""
        with _observing_lock:
            seen = self._seen[0].any()
        return self._estimate if seen else self.measured

    def ms_range(self, first: int, count: int) -> np.ndarray:
        """The sizing's ``ms(n)`` (``table``) for n = first .. first + count - 1."""
        if first + count <= len(self.table):
            return self.table[first : first + count]
        return np.array([self.ms(n) for n in range(first, first + count)])

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> CostCurve:
        d = json.loads(text)
        return cls(tuple(d["sizes"]), tuple(d["times"]), d.get("key", ""))


@dataclass(frozen=True)
class Budget:
    """How many drafted nodes to verify, and the tokens per ms that choice is expected to give."""

    nodes: int
    rate: float  # expected committed tokens per ms
    expected: float  # expected committed tokens (1 + the chosen nodes' probabilities)


def best_budget(path_probs, curve: CostCurve, draft_ms: float = 0.0,
                limit: int = MAX_NODES - 1, in_tree: int = 0) -> Budget:
    """The number of nodes (the first ones of ``path_probs``, sorted in decreasing order, each a
    node's calibrated probability of being accepted) maximising expected committed tokens per ms:
    (1 + sum of the first N) / (draft_ms + curve.ms(N + 1 + in_tree)); N = 0 (plain decoding)
    included. ``in_tree``: drafted nodes the tree holds already (another drafter's), which the
    forward scores too."""
    p = np.asarray(path_probs, dtype=np.float64)[:limit]
    expected = 1.0 + np.concatenate([[0.0], np.cumsum(p)])
    cost = draft_ms + curve.ms_range(1 + in_tree, len(p) + 1)
    rate = expected / cost
    n = int(np.argmax(rate))
    return Budget(n, float(rate[n]), float(expected[n]))


def curve_key(target) -> str:
    """What the cost depends on: shapes, dtype, quantization, device, CPU model, BLAS, which
    matmul kernels run (the native small-M kernel on or off) and their source (a changed
    kernel is measured again)."""
    from ..kernels import native
    from ..kernels.backend import choice_key
    from ..loading._blas import blas_info

    args = {k: v for k, v in vars(target.args).items() if isinstance(v, (int, float, str, bool))
            or (isinstance(v, list) and v and all(isinstance(x, (int, str)) for x in v))}
    # lists too: which layers are sparse (mlp_only_layers) or slide (layer_types) change the cost
    parts = {"args": args, "dtype": target.dtype, "quantized": target.quantized,
             "device": str(mx.default_device()), "cpu": _cpu_name(), "blas": blas_info().name,
             "kernels": list(choice_key()),
             "kernel_source": native.source_digest() if choice_key()[0] else None,
             "measure": 3}  # how it is measured: 3 = interleaved rounds of pairs, monotone
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def primed_cache(target, context: int, more: int) -> tuple:
    """A cache holding ``context`` scored tokens, and the ids: those ``context`` and ``more``
    after them to score (spread over the vocabulary), for timing forwards after a context."""
    cache = target.make_cache()
    vocab = target.args.vocab_size
    ids = [(7 * i) % max(vocab - 10, 1) + 5 for i in range(context + more)]
    target.score(ids[:context], cache, head=False)
    cache.commit()
    mx.eval(cache.state())
    return cache, ids


def measure_cost_curve(target, sizes: tuple[int, ...] = SIZES, context: int = CONTEXT,
                       repeats: int = 5) -> CostCurve:
    """Median ms of scoring a tree of each size after ``context`` cached tokens: one warm-up
    pass over every size (compiled functions are built per input shape), then ``repeats``
    rounds that visit every size in turn, so a slow spell of a shared machine lands on all
    sizes alike instead of on one; then ``monotone``. In a round each size is scored twice
    and the second is timed: right after a 64-node forward a 1-node one was measured slower
    than in a run of its own size, as decoding runs it (see docs/measurements.md, "The
    verify-cost curve measured in rounds")."""
    cache, ids = primed_cache(target, context, max(sizes))
    trees = [DraftTree(ids[context : context + n], [-1] + [(i - 1) // 2 for i in range(1, n)])
             for n in sizes]
    runs: list[list[float]] = [[] for _ in sizes]
    # seconds for a small model on a CPU, once per machine: a bar says what the wait is
    total, report = len(sizes) * (1 + 2 * repeats), _report.get()
    desc = "measuring this machine's verify cost (once; cached)"
    bar = tqdm(total=total, unit="forward", leave=False, desc=desc)
    for round_ in range(repeats + 1):
        for i, tree in enumerate(trees):
            for timed in (False, True) if round_ else (False,):  # round 0 is the warm-up
                t = time.perf_counter()
                out = target.score(tree, cache)
                mx.eval(out.logits)
                if timed:
                    runs[i].append((time.perf_counter() - t) * 1e3)
                bar.update()
                if report is not None:
                    report(f"{desc}: {bar.n}/{total} forwards")
    bar.close()
    return CostCurve(tuple(sizes), monotone([statistics.median(r) for r in runs]))


def monotone(times) -> tuple[float, ...]:
    """Each size's time no more than any larger size's: scoring fewer nodes never costs more
    (a shorter forward could be padded), so a slow measurement of a small size (seen: a
    1-node time above the 2-node one, cached for good) is replaced by the cheapest larger
    one."""
    out = [float(t) for t in times]
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return tuple(out)


def verify_cost_curve(target, measure=measure_cost_curve) -> CostCurve:
    """This device's curve for ``target``: memoized, else read from the cache, else measured
    (``measure(target)``) and written there."""
    key = curve_key(target)
    if key in _memo:
        _by_target[target] = _memo[key]
        return _memo[key]
    path = cache_dir() / "cost" / f"{key}.json"
    curve = None
    if path.exists():
        try:
            curve = CostCurve.from_json(path.read_text())
        except (ValueError, KeyError, TypeError):
            curve = None  # a damaged file is measured again
    if curve is None:
        curve = CostCurve(*_fields(measure(target)), key=key)
        _write(path, curve.to_json())
    _memo[key] = curve
    _by_target[target] = curve
    return curve


def _fields(curve: CostCurve) -> tuple:
    return curve.sizes, curve.times


def _write(path: Path, text: str) -> None:
    """Write atomically (two processes measuring at once leave one whole file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
