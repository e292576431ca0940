#!/usr/bin/env bash
# Set up (idempotent, fast when already done), then run the test suite: scripts/test.sh [pytest args].
# pytest's exit 5 ("no tests collected") counts as a failure: a green run must have run tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
if [[ $rc == 5 ]]; then
    echo "test: error: pytest collected no tests (args: ${*:-none})" >&2
fi
exit "$rc"
