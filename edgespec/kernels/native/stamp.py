"""The digest of the native kernels' sources, and the stamp a build leaves beside the module.

After every build, CMake runs ``python stamp.py SOURCE_DIR STAMP_FILE`` (the ``sources_stamp``
target in CMakeLists.txt, after the module), which writes the digest of the sources the module
is now up to date with. The
loader (``__init__.py``) compares it with the digest of the sources now: a checkout that
restores identical sources (new mtimes, same bytes) keeps the module, and only changed bytes
make it stale. Standalone on purpose: the build runs it without importing edgespec or MLX.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

SOURCE_SUFFIXES = (".cpp", ".h", ".inc", ".txt")
STAMP_NAME = "sources.sha256"


def digest_of(directory: Path) -> str:
    """sha256 over the names and bytes of ``directory``'s source files, in name order (16 hex
    digits)."""
    h = hashlib.sha256()
    for p in sorted(Path(directory).iterdir()):
        if p.suffix in SOURCE_SUFFIXES:
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    source, stamp = sys.argv[1:3]
    Path(stamp).write_text(digest_of(Path(source)) + "\n")
