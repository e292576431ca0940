"""The optimized BLAS is loaded before mlx, detected from libmlx itself, and actually fast."""

import os
import subprocess
import sys
import time

import pytest

from edgespec.loading import _blas
from edgespec.errors import ConfigError

LINUX = sys.platform.startswith("linux")
STATUSES = {"active", "inactive", "loaded before mlx", "loaded after mlx", "reference", "n/a (macOS)"}


def test_info_fields():
    import mlx.core  # noqa: F401  (blas_info reads libmlx's binding, so mlx must be mapped)

    info = _blas.blas_info()
    assert info.name in {"mkl", "openblas", "custom", "reference", "accelerate"}
    assert info.status in STATUSES
    if not LINUX:
        assert info.provider is None
        return
    assert info.provider, "libmlx is mapped, so its cblas_sgemm provider must be known"
    if info.path is not None:
        # edgespec/__init__ loads the BLAS before anything imports mlx; "inactive" means it didn't.
        assert info.status == "active", info
        assert info.provider != "bundled reference BLAS"


def test_load_is_idempotent():
    assert _blas.load_optimized_blas() is _blas.load_optimized_blas()


@pytest.mark.parametrize("value", ["bogus", "opneblas"])
def test_unknown_choice_is_a_config_error(value):
    if not LINUX:
        pytest.skip("EDGESPEC_BLAS is only read on Linux")
    with pytest.raises(ConfigError, match=value):
        _blas._load(value)


def test_missing_explicit_library_is_a_config_error(tmp_path):
    if not LINUX:
        pytest.skip("EDGESPEC_BLAS is only read on Linux")
    with pytest.raises(ConfigError, match="nothing could be loaded"):
        _blas._load(str(tmp_path / "libnope.so"))


def test_nothing_found_falls_back_to_reference(monkeypatch):
    if not LINUX:
        pytest.skip("Linux only")
    monkeypatch.setattr(_blas, "_candidates", lambda name: [])
    info = _blas._load("")
    assert (info.name, info.path, info.status) == ("reference", None, "reference")
    assert "setup.sh" in info.detail
    with pytest.raises(ConfigError, match="mkl"):
        _blas._load("mkl")


def test_off_leaves_the_reference_blas_in_place():
    if not LINUX:
        pytest.skip("Linux only")
    code = "import edgespec, mlx.core; i = edgespec.loading._blas.blas_info(); print(i.name, '|', i.provider)"
    env = {**os.environ, "EDGESPEC_BLAS": "off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    name, provider = out.stdout.strip().splitlines()[-1].split(" | ")
    assert name == "reference"
    assert "mkl" not in provider and "openblas" not in provider


def _median_ms(f, runs=21):
    f()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[runs // 2] * 1e3


def test_eight_rows_cost_little_more_than_one():
    """Optimized sgemm: 8 rows ~2-2.5x one row (2 cores); the reference BLAS is ~8x."""
    info = _blas.blas_info()
    if not LINUX or info.path is None:
        pytest.skip(f"no optimized BLAS in use ({info.name}: {info.detail or info.status})")
    import mlx.core as mx

    w = mx.random.normal((1536, 576))  # SmolLM2-135M gate/up projection, float32
    x8 = mx.random.normal((8, 576))
    x1 = x8[:1]
    mx.eval(w, x8, x1)
    ratios = []
    for _ in range(3):  # best of three, so a busy machine doesn't fail the test
        ratios.append(_median_ms(lambda: mx.eval(x8 @ w.T)) / _median_ms(lambda: mx.eval(x1 @ w.T)))
        if ratios[-1] < 4:
            break
    assert min(ratios) < 4, f"8-row/1-row matmul time ratios {ratios}; {info}"



def test_bad_env_value_warns_instead_of_breaking_import():
    if not LINUX:
        pytest.skip("EDGESPEC_BLAS is only read on Linux")
    env = {**os.environ, "EDGESPEC_BLAS": "bogus"}
    proc = subprocess.run([sys.executable, "-c", "import edgespec; print(edgespec.BLAS.name)"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "reference"
    assert "bogus" in proc.stderr and "Traceback" not in proc.stderr
