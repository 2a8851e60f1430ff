#!/usr/bin/env bash
# A built wheel (FA2's flash_attn, FA3's flash_attn_3) as parts that fit a transfer limit, and back: pack it where it
# was built, install it elsewhere.
#
#   bash bench/wheel_parts.sh pack WHEEL PARTS_DIR [PART_SIZE]   strip the extensions' debug sections, xz, split (15M)
#   bash bench/wheel_parts.sh install PARTS_DIR TARGET           join, check SHA256SUMS, pip install --target TARGET
#
# pack writes PARTS_DIR/<wheel>.xz.part-aa.. and SHA256SUMS (of the stripped wheel, which `wheel pack` re-records).
# install leaves the wheel's modules importable with PYTHONPATH=TARGET (a target of its own: FA2's regular
# `flash_attn` package would hide flash-attn-4's `flash_attn.cute` in a shared site-packages, docs/backends.md); the
# parts may arrive over several transfers into one PARTS_DIR, and install says which are missing. Needs xz, strip
# (binutils) and the `wheel` package to pack; xz and pip to install.
set -euo pipefail
verb=${1:?usage: bash bench/wheel_parts.sh pack WHEEL PARTS_DIR [PART_SIZE] | install PARTS_DIR TARGET}
case $verb in
  pack)
    wheel=${2:?a built flash_attn wheel}; parts=${3:?a folder for the parts}; size=${4:-15M}
    work=$(mktemp -d)
    python3 -m wheel unpack "$wheel" -d "$work/unpacked"
    find "$work/unpacked" -name '*.so' -exec strip --strip-debug {} +
    mkdir -p "$work/stripped" "$parts"
    python3 -m wheel pack "$work"/unpacked/* -d "$work/stripped"
    stripped=$(ls "$work"/stripped/*.whl)
    name=$(basename "$stripped")
    xz -T0 -6 -c "$stripped" | split -b "$size" - "$parts/$name.xz.part-"
    (cd "$work/stripped" && sha256sum "$name") > "$parts/SHA256SUMS"
    echo "wheel_parts: $(ls "$parts"/*.part-* | wc -l) parts of $name in $parts"; cat "$parts/SHA256SUMS"
    rm -rf "$work";;
  install)
    parts=${2:?the folder of the parts}; target=${3:?where to install}
    work=$(mktemp -d)
    [ -f "$parts/SHA256SUMS" ] || { echo "wheel_parts: no SHA256SUMS in $parts: send it with the parts" >&2; exit 2; }
    name=$(awk '{print $2}' "$parts/SHA256SUMS")
    sums=$(readlink -f "$parts/SHA256SUMS")   # before the cd below: PARTS may be a relative path
    cat "$parts/$name".xz.part-* | xz -d > "$work/$name" 2> /dev/null || true   # a missing part shows below
    (cd "$work" && sha256sum -c "$sums") || {
      echo "wheel_parts: the joined parts do not match SHA256SUMS; present: $(cd "$parts" && ls "$name".xz.part-* | \
        sed 's/.*part-//' | tr '\n' ' ')(a part missing or cut short?)" >&2; exit 2; }
    python3 -m pip install -q --no-deps --no-index --target "$target" "$work/$name"
    rm -rf "$work"
    echo "wheel_parts: $name installed in $target (PYTHONPATH=$target)";;
  *) echo "wheel_parts: unknown verb $verb (pack or install)" >&2; exit 2;;
esac
