#!/usr/bin/env bash
# The int8-activation kernels against the float-activation ones, for a quiet machine:
#   1. per product shape of the demo model, µs at 1, 2, 4, 8, 16 and 32 rows, float x and int8 x,
#      on every SIMD ISA the CPU has (scripts/qkernel_rows.py), 4-bit and 8-bit, one thread and
#      all threads, weights in the last-level cache (the kernels' compute) and streamed (30
#      weight copies: as a forward reads them);
#   2. the forward-cost curve of the demo model kept quantized (`edgespec doctor --dtype auto`),
#      with float activations (EDGESPEC_Q8_ACTIVATIONS=0) and with int8 ones (the default).
# Usage: scripts/int8_activations_report.sh [OUT_DIR]   (default: bench/int8_activations)
# Writes each table as JSON into OUT_DIR and prints everything.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/int8_activations}
mkdir -p "$out"
py=.venv/bin/python
lscpu | grep -E "Model name" || true
echo "SIMD: $(grep -o -w -E 'avx2|avx512f|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for bits in 4 8; do
    echo "== kernels, $bits-bit, one thread, weights in cache"
    EDGESPEC_KERNEL_THREADS=1 $py scripts/qkernel_rows.py --bits "$bits" --copies 4 \
        --json "$out/rows_${bits}bit_1thread_cached.json"
    echo "== kernels, $bits-bit, all threads, weights streamed (30 copies)"
    $py scripts/qkernel_rows.py --bits "$bits" --copies 30 --rounds 5 --calls 3 \
        --json "$out/rows_${bits}bit_streamed.json"
done
for q8 in 0 1; do
    echo "== edgespec doctor --dtype auto, EDGESPEC_Q8_ACTIVATIONS=$q8"
    EDGESPEC_Q8_ACTIVATIONS=$q8 .venv/bin/edgespec doctor --dtype auto --json > "$out/doctor_q8_$q8.json"
    $py -c 'import json, sys; from edgespec.doctor import format_findings
print(format_findings(json.load(open(sys.argv[1]))))' "$out/doctor_q8_$q8.json"
done
