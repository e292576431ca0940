"""The optimized BLAS is loaded before mlx, detected from libmlx itself, and actually fast."""

import os
import subprocess
import sys

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


def test_bad_env_value_warns_instead_of_breaking_import():
    if not LINUX:
        pytest.skip("EDGESPEC_BLAS is only read on Linux")
    env = {**os.environ, "EDGESPEC_BLAS": "bogus"}
    proc = subprocess.run([sys.executable, "-c", "import edgespec; print(edgespec.BLAS.name)"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "reference"
    assert "bogus" in proc.stderr and "Traceback" not in proc.stderr


def test_default_order_prefers_openblas_on_amd(tmp_path):
    """OpenBLAS first on AMD CPUs (measured faster there), MKL first elsewhere or when unknown."""
    amd, intel = tmp_path / "amd", tmp_path / "intel"
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n")
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n")
    assert _blas.default_order(str(amd)) == ["openblas", "mkl"]
    assert _blas.default_order(str(intel)) == ["mkl", "openblas"]
    assert _blas.default_order(str(tmp_path / "missing")) == ["mkl", "openblas"]


def test_mkl_threads_sleep_after_a_product_unless_the_user_says_otherwise(monkeypatch):
    """Loading MKL sets KMP_BLOCKTIME=0 first (its OpenMP threads would otherwise spin 200 ms
    after each call, taking a core from the native kernels); a value the user set is kept."""
    if not LINUX:
        pytest.skip("Linux only")
    monkeypatch.setattr(_blas, "_candidates", lambda name: [])
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    with pytest.raises(ConfigError):
        _blas._load("mkl")  # nothing to load here, but the variable is set before trying
    assert os.environ["KMP_BLOCKTIME"] == "0"
    monkeypatch.setenv("KMP_BLOCKTIME", "50")
    _blas.quiet_openmp_threads()
    assert os.environ["KMP_BLOCKTIME"] == "50"
    monkeypatch.delenv("KMP_BLOCKTIME")
    _blas._load("off")
    assert "KMP_BLOCKTIME" not in os.environ  # no MKL, nothing set


def test_training_gives_mkl_threads_back_their_spin_only_where_edgespec_took_it(monkeypatch):
    """``busy_openmp_threads`` (called by ``edgespec train``, all MKL products) undoes
    edgespec's own KMP_BLOCKTIME=0 and nothing a user set."""
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    monkeypatch.setattr(_blas, "_quieted", False)
    _blas.quiet_openmp_threads()
    assert os.environ["KMP_BLOCKTIME"] == "0"
    _blas.busy_openmp_threads()
    assert os.environ["KMP_BLOCKTIME"] == "200"
    monkeypatch.setenv("KMP_BLOCKTIME", "0")  # the user's choice this time
    monkeypatch.setattr(_blas, "_quieted", False)
    _blas.quiet_openmp_threads()
    _blas.busy_openmp_threads()
    assert os.environ["KMP_BLOCKTIME"] == "0"


def test_the_train_command_lets_mkl_threads_spin(monkeypatch):
    from click.testing import CliRunner

    from edgespec.cli import main

    calls = []
    monkeypatch.setattr(_blas, "busy_openmp_threads", lambda: calls.append(1))
    result = CliRunner().invoke(main, ["train", "eagle3", "--out", "/nonexistent/x",
                                       "--questions", "-3"])
    assert result.exit_code == 2 and "questions must be" in result.output  # refused after
    assert calls == [1]
