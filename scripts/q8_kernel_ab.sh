#!/usr/bin/env bash
# The int8-activation kernel's AVX-512 VNNI form (kernel_q8_avx512.cpp, with q8_rows.inc) at a
# git revision against the working tree's, taking turns in one process on a forward's products
# (scripts/q8_kernel_ab/main.cpp; each variant rounds x with its own quantizer). Needs a CPU
# with AVX-512 VNNI. pool.cpp and the headers are the working tree's.
#   scripts/q8_kernel_ab.sh REV [ROWS,ROWS,...] [ROUNDS] [BITS]
#   e.g. scripts/q8_kernel_ab.sh HEAD~1 1,2,3,4 15 4
set -euo pipefail
rev=${1:?usage: scripts/q8_kernel_ab.sh REV [ROWS,...] [ROUNDS] [BITS]}
rows=${2:-1,2,3,4}
rounds=${3:-15}
bits=${4:-4}
case $bits in
  8 | 4) ;;
  *) echo "q8_kernel_ab: BITS must be 4 or 8, not $bits" >&2; exit 2 ;;
esac
grep -qw avx512_vnni /proc/cpuinfo || { echo "q8_kernel_ab: this CPU has no AVX-512 VNNI" >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
src=$root/edgespec/kernels/native
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cxx=${CXX:-g++}
flags="-O3 -std=c++20 -mavx512f -mavx512bw -mavx512vnni -mfma -Wno-maybe-uninitialized -Wno-uninitialized"
for v in base fresh; do
  mkdir "$work/$v"
  cp "$src/kernel_q.h" "$work/$v/"
  for f in kernel_q8_avx512.cpp q8_rows.inc; do
    if [[ $v == base ]]; then
      git -C "$root" show "$rev:edgespec/kernels/native/$f" >"$work/$v/$f"
    else
      cp "$src/$f" "$work/$v/"
    fi
  done
  # shellcheck disable=SC2086
  "$cxx" $flags -Dedgespec_native=$v -c "$work/$v/kernel_q8_avx512.cpp" -o "$work/$v.o"
done
cp "$src/pool.h" "$src/pool.cpp" "$work/"
"$cxx" -O3 -std=c++20 -I"$work" "$root/scripts/q8_kernel_ab/main.cpp" "$work/pool.cpp" \
  "$work/base.o" "$work/fresh.o" -o "$work/ab" -lpthread
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "kernel_q8_avx512.cpp + q8_rows.inc at $rev (base) against the working tree (new), $bits-bit blocks; $cpu"
for m in ${rows//,/ }; do "$work/ab" "$m" "$rounds" "$bits"; done
