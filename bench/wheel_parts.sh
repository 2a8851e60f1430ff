#!/usr/bin/env bash
# A built FA2 wheel as parts that fit a transfer limit, and back: pack it where it was built, install it elsewhere.
#
#   bash bench/fa2_parts.sh pack WHEEL PARTS_DIR [PART_SIZE]   strip the extension's debug sections, xz, split (15M)
#   bash bench/fa2_parts.sh install PARTS_DIR TARGET           join, check SHA256SUMS, pip install --target TARGET
#
# pack writes PARTS_DIR/<wheel>.xz.part-aa.. and SHA256SUMS (of the stripped wheel, which `wheel pack` re-records).
# install leaves flash_attn importable with PYTHONPATH=TARGET (a target of its own: FA2's regular `flash_attn` package
# would hide flash-attn-4's `flash_attn.cute` in a shared site-packages, docs/backends.md). Needs xz, strip (binutils)
# and the `wheel` package to pack; xz and pip to install.
set -euo pipefail
verb=${1:?usage: bash bench/fa2_parts.sh pack WHEEL PARTS_DIR [PART_SIZE] | install PARTS_DIR TARGET}
case $verb in
  pack)
    wheel=${2:?a built flash_attn wheel}; parts=${3:?a folder for the parts}; size=${4:-15M}
    work=$(mktemp -d)
    python3 -m wheel unpack "$wheel" -d "$work/unpacked"
    strip --strip-debug "$work"/unpacked/*/flash_attn_2_cuda*.so
    mkdir -p "$work/stripped" "$parts"
    python3 -m wheel pack "$work"/unpacked/* -d "$work/stripped"
    stripped=$(ls "$work"/stripped/*.whl)
    name=$(basename "$stripped")
    xz -T0 -6 -c "$stripped" | split -b "$size" - "$parts/$name.xz.part-"
    (cd "$work/stripped" && sha256sum "$name") > "$parts/SHA256SUMS"
    echo "fa2_parts: $(ls "$parts"/*.part-* | wc -l) parts of $name in $parts"; cat "$parts/SHA256SUMS"
    rm -rf "$work";;
  install)
    parts=${2:?the folder of the parts}; target=${3:?where to install}
    work=$(mktemp -d)
    name=$(awk '{print $2}' "$parts/SHA256SUMS")
    sums=$(readlink -f "$parts/SHA256SUMS")   # before the cd below: PARTS may be a relative path
    cat "$parts/$name".xz.part-* | xz -d > "$work/$name"
    (cd "$work" && sha256sum -c "$sums")
    python3 -m pip install -q --no-deps --no-index --target "$target" "$work/$name"
    rm -rf "$work"
    echo "fa2_parts: $name installed in $target (PYTHONPATH=$target)";;
  *) echo "fa2_parts: unknown verb $verb (pack or install)" >&2; exit 2;;
esac
