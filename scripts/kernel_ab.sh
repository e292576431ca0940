#!/usr/bin/env bash
# The float32 small-M kernel (edgespec/kernels/native/kernel_blocks.inc, its AVX2 form) at a git
# revision against the working tree's, taking turns in one process on a forward's products
# (scripts/kernel_ab/main.cpp). Separate processes on a shared 2-core VM drifted ±5% apart with
# identical code; pairs in one process did not. Both variants take the working tree's
# kernel_avx2.cpp, store_sums.inc, avx2_sum.h and pool.cpp: only kernel_blocks.inc comes from REV.
#   scripts/kernel_ab.sh REV [ROWS,ROWS,...] [ROUNDS]      e.g. scripts/kernel_ab.sh HEAD~1 8,16 15
set -euo pipefail
rev=${1:?usage: scripts/kernel_ab.sh REV [ROWS,...] [ROUNDS]}
rows=${2:-8,16}
rounds=${3:-15}
root=$(git rev-parse --show-toplevel)
src=$root/edgespec/kernels/native
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Each variant is the module's own kernel_avx2.cpp in a folder of its own (its quoted includes
# resolve there), its namespace renamed so that both link into one program.
cxx=${CXX:-g++}
for v in base fresh; do
  mkdir "$work/$v"
  cp "$src/kernel_avx2.cpp" "$src/store_sums.inc" "$src/avx2_sum.h" "$work/$v/"
  if [[ $v == base ]]; then
    git -C "$root" show "$rev:edgespec/kernels/native/kernel_blocks.inc" >"$work/$v/kernel_blocks.inc"
  else
    cp "$src/kernel_blocks.inc" "$work/$v/"
  fi
  "$cxx" -O3 -mavx2 -mfma -std=c++20 -Wno-maybe-uninitialized -Dedgespec_native=$v \
    -c "$work/$v/kernel_avx2.cpp" -o "$work/$v.o"
done
cp "$src/pool.h" "$src/pool.cpp" "$work/"
"$cxx" -O3 -std=c++20 -I"$work" "$root/scripts/kernel_ab/main.cpp" "$work/pool.cpp" \
  "$work/base.o" "$work/fresh.o" -o "$work/ab" -lpthread
echo "kernel_blocks.inc at $rev (base) against the working tree (new); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for m in ${rows//,/ }; do "$work/ab" "$m" "$rounds"; done
