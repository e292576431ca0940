"""The native small-M matmul (kernels/native, kernels/matmul.py) against its pure-MLX twin.

Tolerance (stated in kernels/matmul.py): |kernel - twin| <= 1e-5 * sum_k |x_k w_k| per output,
and the same against a float64 product. Where the extension is not built the kernel tests
skip, but only on a machine that cannot build it (not x86-64 Linux, or no C++ compiler): with
a compiler present a missing module is a failure (``scripts/test.sh`` builds it first).
The fallback tests (no module: one warning, pure-MLX results) run everywhere.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.kernels import backend, native
from edgespec.kernels.matmul import small_matmul, small_matmul_mlx, small_matmul_native

ROOT = Path(__file__).resolve().parent.parent
AWKWARD = [1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 95, 576, 577, 1000]
RTOL_ABS_SUM = 1e-5


def _can_build() -> str | None:
    """Why this machine cannot build the extension, or None when it can."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"native kernels are built on x86-64 Linux only ({platform.system()} {platform.machine()})"
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        return "no C++ compiler on this machine"
    return None


@pytest.fixture(scope="module")
def mod():
    m = native.load()
    if m is None:
        why = _can_build()
        if why:
            pytest.skip(f"native kernels unavailable: {why}")
        pytest.fail(f"a C++ compiler is here but the native kernels are not: {native.status().reason}")
    return m


def _close(y: mx.array, x: mx.array, w: mx.array) -> None:
    xn, wn = np.array(x, dtype=np.float64), np.array(w, dtype=np.float64)
    xn = xn.reshape(-1, xn.shape[-1])
    bound = RTOL_ABS_SUM * (np.abs(xn) @ np.abs(wn).T) + 1e-30
    got = np.array(y).reshape(xn.shape[0], -1)
    twin = np.array(small_matmul_mlx(x, w)).reshape(got.shape)
    assert (np.abs(got - twin) <= bound).all(), np.abs(got - twin).max()
    assert (np.abs(got - xn @ wn.T) <= bound).all()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(m=st.integers(1, 64), n=st.sampled_from(AWKWARD), k=st.sampled_from(AWKWARD),
       seed=st.integers(0, 2**31 - 1))
def test_kernel_equals_twin(mod, m, n, k, seed):
    rng = np.random.default_rng(seed)
    x = mx.array(rng.standard_normal((m, k), dtype=np.float32))
    w = mx.array(rng.standard_normal((n, k), dtype=np.float32))
    _close(small_matmul_native(x, w), x, w)


def test_threaded_sizes_and_leading_dims(mod):
    """Products big enough to be split over threads (many chunks, a ragged last one)."""
    rng = np.random.default_rng(1)
    for shape, n, k in (((2, 5, 577), 4099, 577), ((33, 1536), 600, 1536), ((1, 1, 64), 5000, 64)):
        x = mx.array(rng.standard_normal(shape, dtype=np.float32))
        w = mx.array(rng.standard_normal((n, k), dtype=np.float32))
        y = small_matmul_native(x, w)
        assert y.shape == (*shape[:-1], n)
        _close(y, x, w)


def test_rows_do_not_depend_on_their_batch(mod):
    """Each row gets the same bits alone as among up to 64 rows (any block position), on every
    ISA the CPU has: the sums are taken four accumulators at a time, and which four an output
    is grouped with (or padded by, in a tail block) must not change it. K = 577 ends on a
    one-value tail; K = 600 on single steps after the four-step groups of 9+ rows (600 % 32)."""
    rng = np.random.default_rng(2)
    before = mod.isa()
    try:
        for k in (577, 600):
            w = mx.array(rng.standard_normal((1003, k), dtype=np.float32))
            x = mx.array(rng.standard_normal((64, k), dtype=np.float32))
            for isa in mod.supported_isas().split(","):
                mod.set_isa(isa)
                full = small_matmul_native(x, w)
                for m in (1, 2, 3, 5, 8, 13, 63):
                    part = small_matmul_native(x[:m], w)
                    assert mx.array_equal(part, full[:m]).item(), (isa, k, m)
                for i in (0, 6, 37, 63):
                    alone = small_matmul_native(x[i : i + 1], w)
                    assert mx.array_equal(alone, full[i : i + 1]).item(), (isa, k, i)
                for n in (1, 2, 3, 5, 7):  # column tails: 1-3 accumulators padded in a group
                    tail = small_matmul_native(x[:5], w[:n])
                    assert mx.array_equal(tail, full[:5, :n]).item(), (isa, k, n)
    finally:
        mod.set_isa(before)


def test_every_isa_the_cpu_has(mod):
    """The AVX-512, AVX2 and generic code all meet the tolerance (a CPU with only AVX2, or
    neither, runs one of the narrower ones)."""
    rng = np.random.default_rng(3)
    before = mod.isa()
    isas = mod.supported_isas().split(",")
    assert before in isas and "generic" in isas
    try:
        for isa in isas:
            assert mod.set_isa(isa) and mod.isa() == isa
            for m, n, k in ((1, 9, 5), (7, 130, 577), (17, 4099, 33), (64, 31, 1000)):
                x = mx.array(rng.standard_normal((m, k), dtype=np.float32))
                w = mx.array(rng.standard_normal((n, k), dtype=np.float32))
                _close(small_matmul_native(x, w), x, w)
        assert not mod.set_isa("no-such-isa") and mod.isa() == isas[-1]
    finally:
        mod.set_isa(before)


def test_strided_inputs_and_compile(mod):
    rng = np.random.default_rng(4)
    base = mx.array(rng.standard_normal((40, 96), dtype=np.float32))
    x = base[3:11, 5:69]  # a strided view (row stride 96)
    w_rows = base[10:30, 10:74]  # another one
    w_t = mx.array(rng.standard_normal((64, 25), dtype=np.float32)).T  # column stride 25
    for w in (w_rows, w_t):
        _close(small_matmul_native(x, w), x, w)
    f = mx.compile(lambda a, b: small_matmul_native(a, b) * 2)
    assert mx.allclose(f(x, w_rows), 2 * (x @ w_rows.T), rtol=1e-5, atol=1e-4).item()


def test_gradients_through_the_op_are_mlxs(mod):
    """The module path's projections go through the op and the drafting heads train through
    that path: its gradients with respect to x and w are those of x @ w.T."""
    x = mx.random.normal((5, 3, 40), key=mx.random.key(1))
    w = mx.random.normal((24, 40), key=mx.random.key(2))
    weights = mx.arange(24, dtype=mx.float32)

    def loss(product):
        return lambda x, w: (product(x, w) * weights).sum()

    ours = mx.grad(loss(mod.small_matmul), argnums=(0, 1))(x, w)
    want = mx.grad(loss(lambda x, w: x @ w.T), argnums=(0, 1))(x, w)
    for got, ref in zip(ours, want):
        np.testing.assert_allclose(np.array(got), np.array(ref), rtol=1e-5, atol=1e-5)
    only_w = mx.grad(loss(mod.small_matmul), argnums=1)(x, w)
    np.testing.assert_allclose(np.array(only_w), np.array(want[1]), rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise_kernel_error(mod):
    x = mx.zeros((2, 8))
    with pytest.raises(backend.KernelError, match=r"same K; got x \(2, 8\) and w \(3, 7\)"):
        small_matmul_native(x, mx.zeros((3, 7)))
    with pytest.raises(backend.KernelError, match="float32 x and w; got mlx.core.float16"):
        small_matmul_native(x.astype(mx.float16), mx.zeros((3, 8), dtype=mx.float16))


def test_op_picks_the_kernel_for_small_inputs_only(mod, monkeypatch):
    assert backend.use_small_matmul(1, 3072, 576) and backend.use_small_matmul(4, 576, 576)
    assert backend.use_small_matmul(1, 576, 576)  # cold weights: the kernel's 2 threads pay
    assert not backend.use_small_matmul(1, 64, 576)  # too little work (measured)
    assert not backend.use_small_matmul(backend.SMALL_M_MAX + 1, 3072, 576)
    monkeypatch.setattr(backend, "MIN_WORK", 0)
    calls = []
    monkeypatch.setattr(mod, "small_matmul", lambda x, w: calls.append(x.shape) or x @ w.T)
    w = mx.ones((16, 8))
    small_matmul(mx.ones((2, 3, 8)), w)
    small_matmul(mx.ones((backend.SMALL_M_MAX + 1, 8)), w)
    small_matmul(mx.ones((2, 8), dtype=mx.float16), w.astype(mx.float16))
    backend.set_native_enabled(False)
    try:
        small_matmul(mx.ones((2, 8)), w)
        assert backend.native_summary().startswith("inactive: turned off")
    finally:
        backend.set_native_enabled(True)
    assert calls == [(2, 3, 8)]
    assert backend.native_summary().startswith("active: small_matmul")


def test_engine_with_the_kernel_in_every_product(mod, monkeypatch, tiny_models):
    """The tiny models' products are below MIN_WORK; with it at 0 every projection and the
    head of a decode step or verify run the kernel: the fused forward still matches the
    module path and greedy speculation still gives plain decoding's tokens."""
    import edgespec
    from edgespec import SpecConfig, make_drafter

    monkeypatch.setattr(backend, "MIN_WORK", 0)
    calls = []
    real = mod.small_matmul
    monkeypatch.setattr(mod, "small_matmul", lambda x, w: calls.append(x.shape) or real(x, w))
    target = tiny_models.load(layers=2, tie=False)
    msgs = [{"role": "user", "content": "one two three one two three one two"}]
    plain = edgespec.Engine(target).generate(msgs, max_tokens=24).token_ids
    assert calls, "the kernel never ran"
    for method in ("lookup", "lookahead"):
        eng = edgespec.Engine(target, drafter=make_drafter(SpecConfig(method=method), target))
        assert eng.generate(msgs, max_tokens=24).token_ids == plain, method


# ---- the fallback: no module -----------------------------------------------------------------


def test_missing_module_warns_once_and_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_NATIVE_DIR", str(tmp_path))
    native.reset()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.load() is None
            assert native.load() is None
            assert not backend.use_small_matmul(4, 64, 64)
            x, w = mx.ones((4, 64)), mx.ones((8, 64))
            assert mx.array_equal(small_matmul(x, w), x @ w.T).item()
        ours = [c for c in caught if issubclass(c.category, native.NativeKernelWarning)]
        assert len(ours) == 1
        assert "using the pure-MLX path: not built" in str(ours[0].message)
        assert "scripts/setup.sh" in str(ours[0].message)
        assert backend.native_summary().startswith("inactive: not built")
        with pytest.raises(backend.KernelError, match="not available: not built"):
            small_matmul_native(x, w)
    finally:
        native.reset()


def test_turned_off_is_silent(monkeypatch):
    monkeypatch.setenv("EDGESPEC_NATIVE", "0")
    native.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native.load() is None
        assert backend.native_summary() == "inactive: off (EDGESPEC_NATIVE=0)"
    finally:
        native.reset()


def test_stale_means_other_sources_not_newer_files(tmp_path):
    """A module is stale when the sources' bytes differ from those its build stamped, not when
    a source file is merely newer (a checkout restoring identical sources); a module without
    a stamp (built before builds stamped) still goes by time."""
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    build.mkdir()
    (src / "k.cpp").write_text("int f() { return 1; }\n")
    (src / "notes.md").write_text("not a source")
    module = build / "mod.so"
    module.write_bytes(b"")
    old = src.stat().st_mtime - 100
    os.utime(module, (old, old))  # older than every source
    assert native.is_stale(module, src)  # no stamp: by time
    # the build's sources_stamp target, as CMakeLists.txt runs it
    subprocess.run([sys.executable, str(Path(native.__file__).with_name("stamp.py")), str(src),
                    str(build / "sources.sha256")], check=True)
    assert (build / "sources.sha256").read_text().strip() == native.digest_of(src)
    assert not native.is_stale(module, src)  # same bytes, newer files: fresh
    (src / "notes.md").write_text("edited, but not a source")
    assert not native.is_stale(module, src)
    (src / "k.cpp").write_text("int f() { return 2; }\n")
    assert native.is_stale(module, src)
    (src / "k.cpp").write_text("int f() { return 1; }\n")  # restored
    assert not native.is_stale(module, src)
    (src / "new.h").write_text("#pragma once\n")
    assert native.is_stale(module, src)
    (src / "new.h").unlink()
    assert not native.is_stale(module, src)
    # a stamp older than the module belongs to another build (one that did not stamp): by time
    stamp_time = (build / "sources.sha256").stat().st_mtime
    os.utime(module, (stamp_time + 10, stamp_time + 10))  # rebuilt after the stamp...
    assert not native.is_stale(module, src)  # ...newer than every source: fresh by time
    os.utime(module, (old, old))
    os.utime(build / "sources.sha256", (old - 10, old - 10))  # the stamp before the module
    assert native.is_stale(module, src)  # the module is older than the sources


def test_the_built_module_carries_its_sources_stamp(mod):
    """setup.sh's build leaves the stamp, and it names the sources in the tree now."""
    stamp = Path(native.status().path).with_name("sources.sha256")
    if native.build_dir() != native.SOURCE_DIR / "build":
        pytest.skip("the module comes from EDGESPEC_NATIVE_DIR")
    assert stamp.read_text().strip() == native.source_digest()


_GENERATE = """
import warnings, edgespec
from edgespec.targets import load_target
t = load_target(r"{path}", dtype="float32")
e = edgespec.Engine(t)
print(e.generate([{{"role": "user", "content": "hi"}}], max_tokens=12).token_ids)
"""


def test_process_without_module_decodes_with_one_warning(tmp_path, tiny_models):
    """A whole process with no module: one warning on stderr, the same tokens as with the
    kernels turned off on purpose (which warns nothing)."""
    code = _GENERATE.format(path=tiny_models.path())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGESPEC_NATIVE_DIR": str(tmp_path)}
    missing = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 0, missing.stderr
    assert missing.stderr.count("NativeKernelWarning") == 1, missing.stderr
    env_off = {**env, "EDGESPEC_NATIVE": "0"}
    off = subprocess.run([sys.executable, "-c", code], env=env_off, capture_output=True, text=True, cwd=ROOT)
    assert off.returncode == 0 and "NativeKernelWarning" not in off.stderr, off.stderr
    assert missing.stdout == off.stdout and missing.stdout.strip().startswith("[")


def test_concurrent_callers(mod):
    """Two Python threads (each evaluating on its own) get correct products at once: the
    helpers serve one caller, the other runs its chunks alone."""
    import threading

    rng = np.random.default_rng(5)
    w = mx.array(rng.standard_normal((3001, 257), dtype=np.float32))
    xs = [mx.array(rng.standard_normal((m, 257), dtype=np.float32)) for m in (3, 9)]
    want = [np.array(x) @ np.array(w).T for x in xs]
    errors = []

    def worker(i):
        with mx.stream(mx.new_stream(mx.cpu)):
            for _ in range(30):
                got = np.array(small_matmul_native(xs[i], w))
                if not np.allclose(got, want[i], rtol=1e-4, atol=1e-3):
                    errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.usefixtures("float_activations")
def test_linear_heads_of_every_kind():
    """``matmul.linear`` gives each head what its module gives (float, quantized with float
    activations, biased)."""
    import mlx.nn as nn

    from edgespec.kernels.matmul import linear

    mx.random.seed(6)
    x = mx.random.normal((3, 64))
    emb, lin, biased = nn.Embedding(100, 64), nn.Linear(64, 40, bias=False), nn.Linear(64, 40)
    qemb, qlin = nn.QuantizedEmbedding.from_embedding(emb), nn.QuantizedLinear.from_linear(lin)
    for module, want in ((emb, emb.as_linear(x)), (qemb, qemb.as_linear(x)), (lin, lin(x)),
                         (qlin, qlin(x)), (biased, biased(x))):
        got = linear(module, x)
        assert got.shape == want.shape and mx.allclose(got, want, rtol=1e-5, atol=1e-4).item(), module


def test_a_products_bits_do_not_depend_on_where_the_weight_starts(mod):
    """The same weight values placed at every 4-byte offset within a cache line give the
    kernel's outputs bit for bit, at one row and at several: the kernel sums in one order
    wherever a row starts (no alignment-dependent peeling)."""
    n, k = 48, 576
    flat = mx.random.normal((n * k,), key=mx.random.key(3))
    xs = {m: mx.random.normal((m, k), key=mx.random.key(m)) for m in (1, 5, 8, 16)}
    # 16 copies in one buffer, copy j shifted by j floats; each copy spans a whole number of
    # cache lines, so wherever the buffer lands the copies start at all 16 offsets within one
    seg = n * k + 16
    buf = mx.concatenate([part for lead in range(16)
                          for part in (mx.zeros((lead,)), flat, mx.zeros((16 - lead,)))])
    mx.eval(buf)
    outs, missing = {}, set(range(0, 64, 4))
    for lead in range(16):
        w = buf[lead * seg + lead : lead * seg + lead + n * k].reshape(n, k)
        mx.eval(w)
        start = np.asarray(w).__array_interface__["data"][0] % 64
        missing.discard(start)
        for m, x in xs.items():
            y = np.array(mod.small_matmul(x, w))
            assert m not in outs or np.array_equal(y, outs[m]), (start, m)
            outs[m] = y
    assert not missing, missing  # every 4-byte offset within a cache line was tried
