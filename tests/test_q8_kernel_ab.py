"""scripts/q8_kernel_ab.sh: it builds the int8 kernel at a revision and the working tree's into
one program, checks that the two give the same bits on a forward's products, and times them;
bad arguments are refused by name. The timing run needs AVX-512 VNNI (skipped elsewhere) and g++."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "q8_kernel_ab.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_bad_bits_are_refused_by_name():
    done = _run("HEAD", "1", "1", "16")
    assert done.returncode == 2
    assert "BITS must be 4 or 8, not 16" in done.stderr


@pytest.mark.skipif("avx512_vnni" not in Path("/proc/cpuinfo").read_text(errors="replace")
                    if Path("/proc/cpuinfo").exists() else True,
                    reason="the VNNI form needs a CPU with AVX-512 VNNI")
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_head_against_the_working_tree_gives_the_same_bits():
    """One row (the lane layout) and five (a padded group of four): the variants' outputs are
    hashed before any timing, and a difference exits 1."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    done = _run("HEAD", "1,5", "1", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "new/base" in line]
    assert [line.split()[0] for line in lines] == ["1", "5"], done.stdout
