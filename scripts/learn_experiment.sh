#!/usr/bin/env bash
# The simulated user's learning run, end to end (docs/measurements.md, "Learning from use"):
#   1. edgespec serve with learning on; the use set's conversations sent to it
#   2. edgespec learn run with a time budget
#   3. one edgespec bench run, old head against new, on the test set and MT-bench prompts
# Usage: scripts/learn_experiment.sh SIMUSER_DIR OUT_DIR [BUDGET] [MT_BENCH_LIMIT]
# SIMUSER_DIR holds use.jsonl and test.jsonl (scripts/simulated_user.py make). Everything learned
# goes to OUT_DIR/learn (EDGESPEC_LEARN_DIR), not the user's own learn folder.
set -euo pipefail
SIM=$1
OUT=$2
BUDGET=${3:-30m}
MT_LIMIT=${4:-40}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=$HERE/.venv/bin/python
ES=$HERE/.venv/bin/edgespec
mkdir -p "$OUT"
export EDGESPEC_LEARN_DIR=$OUT/learn
unset EDGESPEC_LEARN
PORT=${PORT:-8097}

if [ ! -f "$OUT/use.json" ]; then
  # a user mixes their kinds of question: the use set in a seeded shuffled order, so the
  # newest conversations (the guard's held-out slice) are not all of one kind
  "$PY" -c "import random,sys; l=open(sys.argv[1]).readlines(); random.Random(5).shuffle(l); open(sys.argv[2],'w').writelines(l)" "$SIM/use.jsonl" "$OUT/use_order.jsonl"
  "$ES" serve --port "$PORT" --method eagle3 --learn >"$OUT/serve.log" 2>&1 &
  SERVE=$!
  trap 'kill -INT $SERVE 2>/dev/null || true' EXIT
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 1
  done
  "$PY" "$HERE/scripts/simulated_user.py" use --url "http://127.0.0.1:$PORT" \
    --file "$OUT/use_order.jsonl" --clients 2 --max-tokens 256 --report "$OUT/use.json"
  kill -INT $SERVE
  wait $SERVE || true
  trap - EXIT
fi

"$ES" learn status --json >"$OUT/status_before.json"
if [ ! -f "$OUT/learn_run.json" ]; then
  /usr/bin/time -v "$ES" learn run --budget "$BUDGET" --json "$OUT/learn_run.json" \
    2>"$OUT/learn_run.log"
fi
"$ES" learn status --json >"$OUT/status_after.json"

# the head to compare: the learned one in use, else the newest rejected one (kept aside)
NEW=$("$PY" - "$OUT/learn_run.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(r.get("head") or "")
EOF
)
[ -n "$NEW" ] || { echo "no new head was trained: see $OUT/learn_run.json"; exit 1; }
"$PY" - "$SIM/test.jsonl" "$HERE/../shared/eval/mt_bench.jsonl" "$MT_LIMIT" "$OUT/prompts.jsonl" <<'EOF'
import json, sys
from edgespec.bench import _round_robin, load_prompts
test, mt, limit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(test) if l.strip()]
picked = {p.id for p in _round_robin(load_prompts(mt), limit)}
for l in open(mt):
    r = json.loads(l)
    if r["question_id"] in picked:
        rows.append({"question_id": f"mt-{r['question_id']}", "category": "mt_" + r["category"],
                     "turns": r["turns"][:1]})
open(out, "w").write("".join(json.dumps(r) + "\n" for r in rows))
EOF
"$ES" bench --prompts "$OUT/prompts.jsonl" --methods "eagle3@shipped,eagle3@$NEW" \
  --json "$OUT/bench.json" | tee "$OUT/bench.txt"
