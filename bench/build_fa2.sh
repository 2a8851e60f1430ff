#!/usr/bin/env bash
# Build flash-attn 2 (FA2) as a wheel from its PyPI sdist, offline, for one GPU architecture.
#
#   bash bench/build_fa2.sh SDIST OUTDIR [ARCH]      e.g. flash_attn-2.8.3.post2.tar.gz /tmp/fa2-wheel 90
#   BACKGROUND=1 bash bench/build_fa2.sh ...          detached; poll OUTDIR/build.status, read OUTDIR/build.log
#   WORK=DIR bash bench/build_fa2.sh ...               build in DIR and keep it: run again to resume from its objects
#
# A build outlasts a 10-minute command: BACKGROUND=1 starts it in a session of its own (setsid), so it survives the
# end of the command that started it (a runner that ends a command's process group ends everything else in it), and
# returns at once. OUTDIR/build.status reads "running", then "exit N" with the build's exit status.
#
# What differs from `pip install flash-attn` (see docs/backends.md):
# - FLASH_ATTN_CUDA_ARCHS=ARCH (default 90): the sdist's default builds every kernel for sm80, sm90, sm100 and sm120;
#   one architecture is a quarter of the work. The sm80 kernels are what FA2 runs on Hopper: ARCH only names the
#   SASS target.
# - FLASHATTENTION_DISABLE_DROPOUT (a flag the sdist's setup.py lists, commented out): dropout doubles every kernel's
#   instantiations, and attnfuzz never draws dropout (its case language has none; the adapters pass dropout_p=0).
#   Every head dim, causal, local (window), ALiBi, softcap, uneven head dims and the split-KV kernels stay in.
# - FLASH_ATTENTION_FORCE_BUILD=TRUE: no attempt to download a prebuilt wheel (the runner has no network).
# Needs torch (the one the wheel will run with), nvcc (CUDA_HOME or on PATH), ninja, setuptools, wheel and
# packaging importable; MAX_JOBS (default: cores - 2) and NVCC_THREADS (default 2) set the parallelism.
set -euo pipefail
sdist=${1:?usage: bash bench/build_fa2.sh SDIST OUTDIR [ARCH]}
out=${2:?usage: bash bench/build_fa2.sh SDIST OUTDIR [ARCH]}
arch=${3:-90}
if [ "${BACKGROUND:-0}" = 1 ]; then
  mkdir -p "$out"
  echo running > "$out/build.status"
  BACKGROUND=0 setsid nohup bash -c 'bash "$0" "$@"; echo "exit $?" > "$2/build.status"' \
    "$(readlink -f "$0")" "$(readlink -f "$sdist")" "$(readlink -f "$out")" "$arch" > "$out/build.log" 2>&1 < /dev/null &
  echo "build_fa2: started in the background (pid $!); poll $out/build.status, log in $out/build.log"
  exit 0
fi
work=${WORK:-$(mktemp -d)}   # WORK=DIR keeps the build tree there: a build stopped midway resumes from its objects
mkdir -p "$work"
ls -d "$work"/flash_attn-*/ > /dev/null 2>&1 || tar xzf "$sdist" -C "$work"
src=$(echo "$work"/flash_attn-*)
sed -i 's|^    # "-DFLASHATTENTION_DISABLE_DROPOUT",|    "-DFLASHATTENTION_DISABLE_DROPOUT",|' "$src/setup.py"
grep -q '^    "-DFLASHATTENTION_DISABLE_DROPOUT",' "$src/setup.py" || {
  echo "build_fa2: the sdist's setup.py has no DISABLE_DROPOUT line to turn on; check its version" >&2; exit 2; }
mkdir -p "$out"
cd "$src"
start=$(date +%s)
FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=$arch MAX_JOBS=${MAX_JOBS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))} \
  NVCC_THREADS=${NVCC_THREADS:-2} python3 -m pip wheel --no-build-isolation --no-deps --no-index -w "$out" .
echo "build_fa2: built $(ls "$out"/flash_attn-*.whl) in $(( $(date +%s) - start )) s"
