"""Write ``docs/api_fields.md``: the server's request fields, generated from its request models.

Usage: python scripts/api_fields.py [--check]

Run it after adding, changing or implementing a request field (``edgespec/server/schemas.py``,
a model's ``UNSUPPORTED``); ``tests/test_server_fields.py`` fails while the committed table
differs from the models. ``--check``: exit 1 if it differs, writing nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edgespec.server.field_table import markdown

OUT = Path(__file__).resolve().parent.parent / "docs" / "api_fields.md"


def main(argv: list[str]) -> int:
    text = markdown()
    if "--check" in argv:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT}: {'up to date' if same else 'differs from the request models'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
