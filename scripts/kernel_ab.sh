#!/usr/bin/env bash
# A small-M kernel's AVX2 form at a git revision against the working tree's, taking turns in one
# process on a forward's products (scripts/kernel_ab/main.cpp). Separate processes on a shared
# 2-core VM drifted ±5% apart with identical code; pairs in one process did not.
# BITS 32 (the default): the float32 kernel; REV gives kernel_blocks.inc, and both variants take
# the working tree's kernel_avx2.cpp. BITS 8 or 4: the quantized kernel's per-block form
# (qrows_avx2: up to 8 rows; from 9 rows the module dequantizes a chunk for the float kernel;
# without the Intel default's buffer; x as it is, not de-interleaved, which changes no timing);
# REV gives kernel_q_blocks.inc and kernel_q_avx2.cpp (which sets its block shapes). Every other
# file (store_sums.inc, avx2_sum.h, pool.cpp, the other kernel's) is the working tree's.
#   scripts/kernel_ab.sh REV [ROWS,ROWS,...] [ROUNDS] [BITS]
#   e.g. scripts/kernel_ab.sh HEAD~1 1,4 11 8
set -euo pipefail
rev=${1:?usage: scripts/kernel_ab.sh REV [ROWS,...] [ROUNDS] [BITS]}
rows=${2:-8,16}
rounds=${3:-15}
bits=${4:-32}
case $bits in
  32 | 8 | 4) ;;
  *) echo "kernel_ab: BITS must be 32, 8 or 4, not $bits" >&2; exit 2 ;;
esac
root=$(git rev-parse --show-toplevel)
src=$root/edgespec/kernels/native
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Each variant is the module's own kernel_avx2.cpp and kernel_q_avx2.cpp in a folder of its own
# (their quoted includes resolve there), the namespace renamed so that both link into one program.
cxx=${CXX:-g++}
measured="kernel_q_blocks.inc kernel_q_avx2.cpp"  # REV's files
[[ $bits == 32 ]] && measured=kernel_blocks.inc
for v in base fresh; do
  mkdir "$work/$v"
  cp "$src/kernel_avx2.cpp" "$src/store_sums.inc" "$src/avx2_sum.h" "$work/$v/"
  for f in kernel_blocks.inc kernel_q_blocks.inc kernel_q_avx2.cpp; do
    if [[ $v == base && " $measured " == *" $f "* ]]; then
      git -C "$root" show "$rev:edgespec/kernels/native/$f" >"$work/$v/$f"
    else
      cp "$src/$f" "$work/$v/"
    fi
  done
  for f in kernel_avx2 kernel_q_avx2; do
    "$cxx" -O3 -mavx2 -mfma -std=c++20 -Wno-maybe-uninitialized -Dedgespec_native=$v \
      -c "$work/$v/$f.cpp" -o "$work/$v-$f.o"
  done
done
cp "$src/pool.h" "$src/pool.cpp" "$work/"
"$cxx" -O3 -std=c++20 -I"$work" "$root/scripts/kernel_ab/main.cpp" "$work/pool.cpp" \
  "$work"/base-*.o "$work"/fresh-*.o -o "$work/ab" -lpthread
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "${measured// / + } at $rev (base) against the working tree (new), $bits-bit; $cpu"
for m in ${rows//,/ }; do "$work/ab" "$m" "$rounds" "$bits"; done
