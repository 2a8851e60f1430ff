"""The sources an FA3 build compiles (one object each), as hopper/setup.py lists them for the FLASH_ATTENTION_* switches
in the environment, checked against the tarball's hopper/instantiations/.

    python3 bench/fa3_sources.py SRC_TARBALL            the object count of this environment's switches
    python3 bench/fa3_sources.py SRC_TARBALL --table    and of each switch flipped alone, from sm90's defaults

setup.py's lists (3.0.0): the forward per (head dim, dtype, split, paged, softcap, packgqa), packgqa only without
paged or split; the (64, 256) / (64, 512) forwards for fp16 / bf16, the (192, 128) ones for every forward dtype; the
backward per (head dim, dtype) with softcap folded into one "softcapall" file on sm90; flash_api_stable.cpp,
flash_prepare_scheduler.cu and, with split, flash_fwd_combine.cu.
"""

from __future__ import annotations

import itertools
import os
import sys
import tarfile

SWITCHES = ("SM80", "FP8", "FP16", "BACKWARD", "PAGEDKV", "SPLIT", "SOFTCAP", "PACKGQA", "HDIMDIFF64", "HDIMDIFF192",
            "HDIM64", "HDIM96", "HDIM128", "HDIM192", "HDIM256")
SM90_DEFAULTS = {"SM80": True}   # the switches bench/build_fa3.sh always turns on (the others default to off)


def disabled(env: dict, switch: str) -> bool:
    return env.get(f"FLASH_ATTENTION_DISABLE_{switch}", "FALSE") == "TRUE"


def sources(env: dict) -> list[str]:
    """The compiled sources for `env`'s FLASH_ATTENTION_DISABLE_* values ("TRUE" leaves a part out)."""
    off = {s: disabled(env, s) for s in SWITCHES}
    half = ["bf16"] + ([] if off["FP16"] else ["fp16"])
    fwd90_dtypes = half + ([] if off["FP8"] else ["e4m3"])
    hdims = [d for d in (64, 96, 128, 192, 256) if not off[f"HDIM{d}"]]
    split = [""] + ([] if off["SPLIT"] else ["_split"])
    paged = [""] + ([] if off["PAGEDKV"] else ["_paged"])
    softcap = [""] + ([] if off["SOFTCAP"] else ["_softcap"])
    softcap_all = [""] if off["SOFTCAP"] else ["_softcapall"]
    packgqa = [""] + ([] if off["PACKGQA"] else ["_packgqa"])

    def fwd90(dims, dtypes):
        return [f"instantiations/flash_fwd_hdim{h}_{t}{p}{s}{c}{g}_sm90.cu"
                for h, t, s, p, c, g in itertools.product(dims, dtypes, split, paged, softcap, packgqa)
                if not (g and (p or s))]

    out = ["flash_api_stable.cpp"]
    if not off["SM80"]:
        out += [f"instantiations/flash_fwd_hdim{h}_{t}{p}{s}{c}_sm80.cu"
                for h, t, s, p, c in itertools.product(hdims, half, split, paged, softcap_all)]
    out += fwd90(hdims, fwd90_dtypes)
    out += [] if off["HDIMDIFF64"] else fwd90(["64_256", "64_512"], half)
    out += [] if off["HDIMDIFF192"] else fwd90(["192_128"], fwd90_dtypes)
    if not off["BACKWARD"]:
        if not off["SM80"]:
            out += [f"instantiations/flash_bwd_hdim{h}_{t}{c}_sm80.cu"
                    for h, t, c in itertools.product(hdims, half, softcap)]
        out += [f"instantiations/flash_bwd_hdim{h}_{t}{c}_sm90.cu" for h, t, c in itertools.product(hdims, half,
                                                                                                   softcap_all)]
    out += ([] if off["SPLIT"] else ["flash_fwd_combine.cu"]) + ["flash_prepare_scheduler.cu"]
    return out


def summary(files: list[str]) -> str:
    fp8 = sum("_e4m3" in f for f in files)
    fwd = sum("flash_fwd_hdim" in f for f in files)
    return f"{len(files)} objects ({fwd} forward, of them {fp8} FP8; {sum('flash_bwd' in f for f in files)} backward)"


def main() -> int:
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--table"]):
        print("usage: python3 bench/fa3_sources.py SRC_TARBALL [--table]", file=sys.stderr)
        return 2
    try:
        with tarfile.open(sys.argv[1]) as tar:
            names = {n.split("/hopper/", 1)[1] for n in tar.getnames() if "/hopper/" in n}
    except (OSError, tarfile.TarError) as e:
        print(f"fa3_sources: cannot read {sys.argv[1]} ({e}); pass the FA3 source tarball", file=sys.stderr)
        return 2
    env = dict(os.environ)
    files = sources(env)
    missing = [f for f in files if f not in names]
    print(f"fa3_sources: {summary(files)}")
    if missing:
        print(f"fa3_sources: {len(missing)} not in the tarball, e.g. {missing[0]}: its setup.py lists others",
              file=sys.stderr)
        return 1
    if sys.argv[2:] == ["--table"]:
        base = {f"FLASH_ATTENTION_DISABLE_{s}": "TRUE" if SM90_DEFAULTS.get(s) else "FALSE" for s in SWITCHES}
        print(f"  sm90, nothing else left out: {summary(sources(base))}")
        for switch in SWITCHES[1:]:
            flipped = {**base, f"FLASH_ATTENTION_DISABLE_{switch}": "TRUE"}
            print(f"  without {switch:<12} {summary(sources(flipped))}")
        print(f"  with sm80 too: {summary(sources({**base, 'FLASH_ATTENTION_DISABLE_SM80': 'FALSE'}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
