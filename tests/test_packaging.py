"""Packaging: the wheel carries the native kernels (with their sources' digest) and the Metal
kernels' sources, installs into a fresh venv with the kernels active, installs without them when
there is no compiler, and a command whose extra is missing says which ``pip install`` it needs.

The wheel tests (``-m wheel`` selects them, ``-m "not wheel"`` skips them) build with the running
interpreter's build tools, without build isolation, into the checkout's CMake folder (the one
the editable install of ``scripts/setup.sh`` made, so nothing is recompiled that is current),
and install with ``--no-deps`` into a venv that reaches the heavy dependencies (mlx, numpy, ...)
through a ``.pth`` line naming this environment's site-packages.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.extras import EXTRA_OF_MODULE, MissingExtraError, missing_extra

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
NATIVE = "edgespec/kernels/native"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


# ---- extras ------------------------------------------------------------------------------------

def test_every_extra_named_is_in_pyproject():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    assert {"serve", "chat", "plot", "train", "dev", "cpu", "cuda"} <= set(extras)
    core = " ".join(PYPROJECT["project"]["dependencies"]).lower()
    for dist in ("fastapi", "uvicorn", "textual", "rich", "matplotlib", "mlx-lm"):
        assert dist not in core, f"{dist} is in the core dependencies; it belongs to an extra"


def test_missing_extra_only_for_modules_an_extra_brings():
    err = missing_extra("edgespec serve", ModuleNotFoundError("no", name="uvicorn"))
    assert isinstance(err, MissingExtraError)
    assert str(err) == ("edgespec serve needs the serve extra: pip install 'edgespec[serve]' "
                        "(from a checkout: pip install '.[serve]')")
    assert missing_extra("edgespec serve", ModuleNotFoundError("no", name="numpy")) is None
    # installed but broken (a name missing inside it) is not a missing extra
    assert missing_extra("edgespec serve", ImportError("cannot import", name="fastapi")) is None


def _hide(monkeypatch, *packages: str) -> None:
    """Make ``packages`` unimportable for the test, as if not installed: None in sys.modules for
    each and for every submodule already imported (a cached submodule would import anyway)."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.setitem(sys.modules, name, None)
    for p in packages:
        monkeypatch.setitem(sys.modules, p, None)


def _one_line_error(result, extra: str, command: str) -> None:
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"edgespec: error: edgespec {command} needs the {extra} extra: "
                     f"pip install 'edgespec[{extra}]' "
                     f"(from a checkout: pip install '.[{extra}]')"], result.output


def test_serve_without_the_serve_extra(monkeypatch, tiny_models):
    _hide(monkeypatch, "uvicorn", "fastapi", "starlette")
    result = CliRunner().invoke(main, ["serve", "--model", str(tiny_models.path())])
    _one_line_error(result, "serve", "serve")


def test_chat_without_the_chat_extra(monkeypatch, tiny_models):
    for name in ("edgespec.tui.plain", "edgespec.tui.render", "edgespec.tui.app"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported afresh: rich missing
    _hide(monkeypatch, "rich", "textual")
    result = CliRunner().invoke(main, ["chat", str(tiny_models.path()), "--plain"], input="")
    _one_line_error(result, "chat", "chat")


def test_bench_plot_without_the_plot_extra(monkeypatch, tiny_models, tmp_path):
    _hide(monkeypatch, "matplotlib")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["hi"], "category": "c"}\n')
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_models.path()), "--prompts",
                                       str(prompts), "--methods", "none", "--max-tokens", "2",
                                       "--plot", str(tmp_path / "p.png")])
    _one_line_error(result, "plot", "bench --plot")


def test_the_core_needs_no_extra(tiny_models):
    """With every extra's modules unimportable, the package, the CLI module and the Python API's
    load + chat still work."""
    code = textwrap.dedent(f"""
        import sys
        for m in {sorted(EXTRA_OF_MODULE)!r}:
            sys.modules[m] = None
        import edgespec, edgespec.cli
        print(type(edgespec.load({str(tiny_models.path())!r}).chat("hi", max_tokens=3).text))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "<class 'str'>"


# ---- the wheel -----------------------------------------------------------------------------------

def _compiler() -> str | None:
    return next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++") if c and shutil.which(c)),
                None)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("EDGESPEC_NATIVE_DIR", "EDGESPEC_NATIVE", "PYTHONPATH", "CXX")}
    return {**env, **extra}


def _build_wheel(out: Path, build_dir: Path, env: dict[str, str]) -> Path:
    pytest.importorskip("scikit_build_core", reason="the build backend is not installed here; "
                                                    "run scripts/setup.sh")
    cmd = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-build-isolation", "--no-deps",
           "-q", "-w", str(out), "-C", f"build-dir={build_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = out.glob("edgespec-*.whl")
    return wheel


def _fresh_venv(root: Path, wheel: Path) -> Path:
    """A venv without pip whose site-packages reaches this environment's through a .pth line,
    with ``wheel`` installed into it; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python*/site-packages")
    (site / "zz_heavy_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
                   check=True, capture_output=True)
    return root / "bin"


_WHERE = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from edgespec.kernels import metal, native
    native.load(); native.load()
print(native.status().active, native.status().path, metal.source_dir(), sep="\\n")
print(sum(w.category is native.NativeKernelWarning for w in caught))
"""


@pytest.mark.wheel
def test_wheel_installs_with_the_kernels_active(tmp_path, tiny_models):
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the native kernels are built on x86-64 Linux only")
    if _compiler() is None:
        pytest.skip("no C++ compiler here")
    wheel = _build_wheel(tmp_path / "dist", REPO / NATIVE / "build", _clean_env())
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith(f"{NATIVE}/_edgespec_native.") for n in names)
    assert f"{NATIVE}/sources.sha256" in names and f"{NATIVE}/bindings.cpp" in names
    assert "edgespec/kernels_metal/common.h" in names
    assert "edgespec/kernels_metal/emulation/metal_emu.h" in names
    assert "edgespec/models/SmolLM2-135M-Instruct/eagle3/config.json" in names  # shipped heads
    assert not any("/build/" in n for n in names)
    bin_dir = _fresh_venv(tmp_path / "venv", wheel)
    env = _clean_env()
    doctor = subprocess.run([str(bin_dir / "edgespec"), "doctor", "--model", str(tiny_models.path())],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert doctor.returncode == 0, doctor.stderr
    kernels = next(line for line in doctor.stdout.splitlines() if line.startswith("kernels"))
    assert kernels.split()[1] == "active:", kernels
    where = subprocess.run([str(bin_dir / "python"), "-c", _WHERE], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    site = str(tmp_path / "venv")
    assert where[0] == "True" and where[1].startswith(site) and where[2].startswith(site), where
    assert where[3] == "0"


@pytest.mark.wheel
def test_wheel_without_a_compiler_installs_the_pure_mlx_path(tmp_path):
    """CXX=/bin/false: CMake fails, the build backend retries without it (pyproject.toml's
    ``if.failed`` override), and the installed package warns once that the kernels are not
    built."""
    wheel = _build_wheel(tmp_path / "dist", tmp_path / "cmake", _clean_env(CXX="/bin/false"))
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith(f"{NATIVE}/_edgespec_native.") for n in names)
    assert "edgespec/kernels_metal/common.h" in names and "edgespec/cli.py" in names
    bin_dir = _fresh_venv(tmp_path / "venv", wheel)
    where = subprocess.run([str(bin_dir / "python"), "-c", _WHERE], cwd=tmp_path, env=_clean_env(),
                           capture_output=True, text=True, check=True).stdout.split("\n")
    assert where[0] == "False" and where[1] == "None", where
    assert where[3] == "1"  # one NativeKernelWarning, however often the kernels are asked for
