#!/usr/bin/env bash
# The "edits" workload (predicted outputs): the demo model rewrites 26 small standard-library
# files, each with the file as its prediction; greedy, against plain decoding in the same run.
# Every method but the baseline drafts the prediction first (its own drafter where the answer
# leaves the file); the report's "prediction kept/rejected" column holds OpenAI's
# accepted/rejected prediction tokens, "exact" the greedy exact match.
#   scripts/bench_edits.sh [OUT.json]   (rebuild the rows: scripts/make_edits_workload.py)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-edits.json}"
.venv/bin/edgespec bench --model demo --prompts data/workloads/edits.jsonl \
    --methods lookup,eagle3 --max-tokens 512 --json "$out"
