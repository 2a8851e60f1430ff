#!/usr/bin/env bash
# The FA2 and FA3 sources the GPU builds start from, made again byte for byte where they were lost (they are kept
# outside the repository, under .whl/), and checked against the sha256 docs/backends.md records.
#
#   bash bench/kernel_sources.sh fa2 [OUTDIR]                      the sdist from PyPI (default OUTDIR .whl/fa2)
#   bash bench/kernel_sources.sh fa3 FA_GIT CUTLASS_GIT [OUTDIR]   the hopper/ tarball (default OUTDIR .whl/fa3)
#
# fa2 takes the sdist from the package index's file list (PyPI's simple API): `pip download --no-binary :all:` runs
# its setup.py, which fails on a machine without CUDA. fa3 cuts the tarball from two git repositories that hold the
# commits (clones of Dao-AILab/flash-attention and NVIDIA/cutlass): hopper/, README.md and LICENSE of e2743ab5, with
# cutlass's include/ and LICENSE.txt of the commit it pins under csrc/cutlass, packed with a fixed order, owner and
# time so that the bytes come out the same.
set -euo pipefail
FA2_SHA256=d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b
FA3_SHA256=fe06f8f714c6a52e75853100f71e7bc70940077c1d86ed581aa9d3e46f1095a9
FA3_COMMIT=e2743ab5b3803bb672b16437ba98a3b1d4576c50
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671
usage="usage: bash bench/kernel_sources.sh fa2 [OUTDIR] | fa3 FA_GIT CUTLASS_GIT [OUTDIR]"
die() { echo "kernel_sources: $*" >&2; exit 2; }

check() {  # FILE SHA256
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then rm -f "$1"; die "$1: sha256 $got, expected $2 (another file: removed)"; fi
  echo "kernel_sources: $1 ($(stat -c %s "$1") bytes, sha256 matches)"
}

case "${1:-}" in
  fa2)
    out=${2:-.whl/fa2}
    mkdir -p "$out"
    file=flash_attn-2.8.3.post2.tar.gz
    pick="import json, sys; print(next(f['url'] for f in json.load(sys.stdin)['files'] if f['filename'] == '$file'))"
    url=$(curl -fsS -H "Accept: application/vnd.pypi.simple.v1+json" https://pypi.org/simple/flash-attn/ |
          python3 -c "$pick") ||
      die "PyPI's file list of flash-attn has no $file, or PyPI cannot be reached"
    curl -fsS -o "$out/$file" "$url"
    check "$out/$file" "$FA2_SHA256"
    ;;
  fa3)
    fa=${2:-}; cutlass=${3:-}; out=${4:-.whl/fa3}
    [ -n "$fa" ] && [ -n "$cutlass" ] || die "$usage"
    git -C "$fa" cat-file -e "$FA3_COMMIT^{commit}" 2>/dev/null ||
      die "$fa holds no commit $FA3_COMMIT (a clone of Dao-AILab/flash-attention)"
    git -C "$cutlass" cat-file -e "$CUTLASS_COMMIT^{commit}" 2>/dev/null ||
      die "$cutlass holds no commit $CUTLASS_COMMIT (a clone of NVIDIA/cutlass)"
    mkdir -p "$out"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    top=flash-attention-${FA3_COMMIT:0:8}
    mkdir -p "$work/$top/csrc/cutlass"
    git -C "$fa" archive "$FA3_COMMIT" hopper README.md LICENSE | tar -x -C "$work/$top"
    git -C "$cutlass" archive "$CUTLASS_COMMIT" include LICENSE.txt | tar -x -C "$work/$top/csrc/cutlass"
    file=$out/$top-hopper-src.tar.gz
    tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-02-04 19:45:41 -0800' -cf - "$top" |
      gzip -n -9 > "$file"
    check "$file" "$FA3_SHA256"
    ;;
  *) die "$usage" ;;
esac
