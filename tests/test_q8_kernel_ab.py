"""scripts/q8_kernel_ab.sh: it builds the int8 kernel at a revision and the working tree's into
one program, checks that the two give the same bits on a forward's products, and times them;
bad arguments are refused by name. Run against the kernel before its lane layout (every row
count now), it checks that the layout changed no bit. The timing run needs AVX-512 VNNI
(skipped elsewhere), g++ and the revision in the checkout's history."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "q8_kernel_ab.sh"
BEFORE_LANES = "d64b5a3"  # the last commit whose 1-3 rows ran q8block (and 4 or more q8group)


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
@pytest.mark.parametrize("bits", ["4", "8"])
def test_the_kernel_gives_the_bits_of_its_earlier_form(bits):
    """Rows in one pass of the lane kernel (1-3, 5, 8) and in two (9, 12: 8 rows, then the rest)
    against the kernel at BEFORE_LANES, whose 1-3 rows rearranged the weights across lanes and
    whose 4 rows or more ran in groups of four (a last one padded): the variants' outputs are
    hashed before any timing, and a difference exits 1."""
    if subprocess.run(["git", "cat-file", "-e", f"{BEFORE_LANES}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode:
        pytest.skip(f"{BEFORE_LANES} is not in this checkout's history")
    done = _run(BEFORE_LANES, "1,2,3,5,8,9,12", "1", bits)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "new/base" in line]
    assert [line.split()[0] for line in lines] == ["1", "2", "3", "5", "8", "9", "12"], done.stdout
