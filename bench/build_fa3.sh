#!/usr/bin/env bash
# Build flash-attn 3 (FA3, hopper/) as a wheel from a source tarball, offline, for sm90 only, trimmed.
#
#   bash bench/build_fa3.sh SRC_TARBALL OUTDIR            e.g. flash-attention-e2743ab5-hopper-src.tar.gz /tmp/fa3-wheel
#   BACKGROUND=1 bash bench/build_fa3.sh ...               detached; poll OUTDIR/build.status, read OUTDIR/build.log
#   DRY_RUN=1 bash bench/build_fa3.sh ...                  print the switches, the object count and the env; build nothing
#   bash bench/build_fa3.sh save WORK PARTS_DIR            the objects compiled so far as xz parts (15M), for a later machine
#   bash bench/build_fa3.sh restore PARTS_DIR WORK         unpack saved objects into WORK before a build resumes there
#
# The tarball holds hopper/ and csrc/cutlass/include of one commit (docs/backends.md: how it was cut, its sha256).
# The build runs in WORK (default /tmp/fa3-build): a second build in the same WORK compiles only what is missing, so
# a build that outlasts one machine continues on the next one from `save` / `restore` (ninja skips the objects
# whose .ninja_log / .ninja_deps entries and sources are unchanged). OUTDIR/build.status reads "running", then
# "exit N"; OUTDIR/progress counts the objects done. BACKGROUND=1 starts it in a session of its own (setsid).
#
# Switches (1 keeps, 0 leaves out; each maps to hopper/setup.py's FLASH_ATTENTION_DISABLE_* or ENABLE_*):
#   FP8=1          the e4m3 forward (fa3-fp8)                        BACKWARD=1   the fp16 / bf16 backward
#   PAGEDKV=1      paged KV (page_table)                             SPLIT=1      split-KV and its combine kernel
#   SOFTCAP=1      softcap                                            PACKGQA=1    the packed-GQA forward kernels
#   HDIMDIFF64=0   the (64, 256) / (64, 512) d_v != d_qk kernels      HDIMDIFF192=1  the (192, 128) kernels
#   APPENDKV=0     k_new / v_new appended inside the kernel (flash_attn_with_kvcache only)
#   LINEINFO=0     nvcc -lineinfo (source lines in the SASS; bigger wheel)
# Always: sm90a only (FLASH_ATTENTION_DISABLE_SM80), fp16 and bf16, head dims 64, 96, 128, 192, 256, local
# windows, varlen, clusters. FLASH_ATTENTION_FORCE_BUILD=TRUE, FLASH_ATTENTION_OFFLINE_BUILD=1 (no download).
# Needs torch (the one the wheel will run with), nvcc >= 12.3 (CUDA_HOME or on PATH), ninja, setuptools, wheel and
# packaging importable. MAX_JOBS (default: the fewer of cores - 2 and free GiB / 8) and NVCC_THREADS (default 2).
set -euo pipefail
usage="usage: bash bench/build_fa3.sh SRC_TARBALL OUTDIR | save WORK PARTS_DIR | restore PARTS_DIR WORK"
die() { echo "build_fa3: $1" >&2; exit 2; }
work=${WORK:-/tmp/fa3-build}

case ${1:-} in
  save)
    src=${2:?$usage}; parts=${3:?$usage}
    tree=$(ls -d "$src"/flash-attention-*/hopper/build/temp.* 2>/dev/null | head -n 1 || true)
    [ -n "$tree" ] || die "no build tree under $src/flash-attention-*/hopper/build: start a build there first"
    mkdir -p "$parts"
    (cd "$src" && find flash-attention-*/hopper/build/temp.* \( -name '*.o' -o -name '.ninja_*' -o -name build.ninja \) \
      -print0 | tar --null -cf - -T - | xz -T0 -6 | split -b 15M - "$parts/fa3-objects.tar.xz.part-")
    echo "build_fa3: $(find "$tree" -name '*.o' | wc -l) objects saved as $(ls "$parts"/fa3-objects.tar.xz.part-* | wc -l) parts in $parts"
    exit 0;;
  restore)
    parts=${2:?$usage}; dest=${3:?$usage}
    ls "$parts"/fa3-objects.tar.xz.part-* > /dev/null 2>&1 || die "no fa3-objects.tar.xz.part-* in $parts: run save first"
    mkdir -p "$dest"
    cat "$parts"/fa3-objects.tar.xz.part-* | xz -d | tar -xf - -C "$dest"
    echo "build_fa3: $(find "$dest" -path '*hopper/build/*' -name '*.o' | wc -l) objects restored into $dest"
    exit 0;;
esac

tarball=${1:-}; out=${2:-}
[ -n "$tarball" ] && [ -n "$out" ] || die "$usage"
[ -f "$tarball" ] || die "no source tarball at $tarball: send .whl/fa3/flash-attention-*-hopper-src.tar.gz (docs/backends.md)"
for switch in FP8 BACKWARD PAGEDKV SPLIT SOFTCAP PACKGQA HDIMDIFF64 HDIMDIFF192 APPENDKV LINEINFO; do
  value=${!switch:-}
  case $value in ''|0|1) ;; *) die "$switch=$value: 1 keeps, 0 leaves out";; esac
done
keep() { local v=${!1:-$2}; [ "$v" = 1 ] && echo FALSE || echo TRUE; }   # setup.py's DISABLE_* reads TRUE to drop
env_lines=(
  "FLASH_ATTENTION_FORCE_BUILD=TRUE" "FLASH_ATTENTION_OFFLINE_BUILD=1" "FLASH_ATTENTION_DISABLE_SM80=TRUE"
  "FLASH_ATTENTION_DISABLE_FP8=$(keep FP8 1)" "FLASH_ATTENTION_DISABLE_BACKWARD=$(keep BACKWARD 1)"
  "FLASH_ATTENTION_DISABLE_PAGEDKV=$(keep PAGEDKV 1)" "FLASH_ATTENTION_DISABLE_SPLIT=$(keep SPLIT 1)"
  "FLASH_ATTENTION_DISABLE_SOFTCAP=$(keep SOFTCAP 1)" "FLASH_ATTENTION_DISABLE_PACKGQA=$(keep PACKGQA 1)"
  "FLASH_ATTENTION_DISABLE_HDIMDIFF64=$(keep HDIMDIFF64 0)" "FLASH_ATTENTION_DISABLE_HDIMDIFF192=$(keep HDIMDIFF192 1)"
  "FLASH_ATTENTION_DISABLE_APPENDKV=$(keep APPENDKV 0)"
)
cores=$(nproc)
free_gib=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 64)
by_mem=$(( free_gib / 8 > 0 ? free_gib / 8 : 1 )); by_cpu=$(( cores > 3 ? cores - 2 : 1 ))
jobs=${MAX_JOBS:-$(( by_mem < by_cpu ? by_mem : by_cpu ))}
env_lines+=("MAX_JOBS=$jobs" "NVCC_THREADS=${NVCC_THREADS:-2}")

if [ "${DRY_RUN:-0}" = 1 ]; then
  tar -xzf "$tarball" -O --wildcards '*/hopper/setup.py' > /dev/null 2>&1 || die "$tarball holds no */hopper/setup.py"
  echo "build_fa3: would build $(basename "$tarball") in $work into $out with"
  printf '  %s\n' "${env_lines[@]}"
  echo "  -lineinfo: $([ "${LINEINFO:-0}" = 1 ] && echo kept || echo dropped)"
  env "${env_lines[@]}" python3 "$(dirname "$0")/fa3_sources.py" "$tarball"
  exit 0
fi
if [ "${BACKGROUND:-0}" = 1 ]; then
  mkdir -p "$out"
  echo running > "$out/build.status"
  BACKGROUND=0 setsid nohup bash -c 'bash "$0" "$@"; echo "exit $?" > "$2/build.status"' \
    "$(readlink -f "$0")" "$(readlink -f "$tarball")" "$(readlink -f "$out")" > "$out/build.log" 2>&1 < /dev/null &
  echo "build_fa3: started in the background (pid $!); poll $out/build.status and $out/progress, log in $out/build.log"
  exit 0
fi
mkdir -p "$work" "$out"
src=$(tar -tzf "$tarball" | sed -n '1s|/.*||p')   # sed reads the whole listing: head would stop tar with SIGPIPE
[ -f "$work/$src/hopper/setup.py" ] || tar -xzf "$tarball" -C "$work"
cd "$work/$src/hopper"
# offline: the submodule update and the -lineinfo flag are the only lines changed in setup.py
sed -i 's|^\(\s*\)subprocess.run(\["git", "submodule", "update", "--init", "../csrc/cutlass"\])|\1pass  # sources come from the tarball|' setup.py
[ "${LINEINFO:-0}" = 1 ] || sed -i 's|^\(\s*\)"-lineinfo",|\1# "-lineinfo",|' setup.py
grep -q 'subprocess.run(\["git", "submodule"' setup.py && die "setup.py's submodule line did not change; check the tarball's commit"
( while sleep 30; do echo "$(find build -name '*.o' 2>/dev/null | wc -l) objects at $(date +%T)" > "$out/progress"; done ) &
ticker=$!
trap 'kill $ticker 2>/dev/null' EXIT
start=$(date +%s)
env "${env_lines[@]}" python3 -m pip wheel --no-build-isolation --no-deps --no-index -w "$out" .
echo "build_fa3: built $(ls "$out"/flash_attn_3-*.whl) in $(( $(date +%s) - start )) s"
