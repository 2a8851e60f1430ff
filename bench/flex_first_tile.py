"""Checks fuzz/backends/flex/first_tile.py against the compiled flex kernel: on a grid of band and packed cases, each
run with ROWS_GUARANTEED_SAFE (the "rows_safe" spelling), whether the output has a NaN, beside whether the trait says a
row sees no key at the start of the first key block the kernel runs for it. The trait is a necessary condition: a NaN
where it says no is a violation (exit 1); a yes without a NaN is allowed (the first tile may be wider than one key).

    python3 bench/flex_first_tile.py [--device cuda] [--dtype float16]

Needs a CUDA GPU (flex's kernel options are CUDA-only). Run from the repository root.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

QUERY_LENGTHS, KEY_LENGTHS = (128, 200), (128, 255, 300)   # a compile a case: about 70 cases, minutes
BANDS = ((False, (None, None)), (True, (None, None)), (False, (8, 0)), (True, (32, None)), (False, (None, 16)))
PACKED = (((0, 128), (115, 3)), ((60, 70), (70, 60)), ((128, 128), (128, 128)), ((1, 200), (150, 90)))


def grid(dtype: str) -> Iterator:
    """The cases checked: one sequence at every pair of lengths, band and alignment; then packed batches (thd)."""
    from attnfuzz.strategies.case import Case
    base = Case(b=1, h=2, hk=2, d_qk=64, d_v=64, dtype=dtype, spelling="rows_safe")
    for sq in QUERY_LENGTHS:
        for skv in KEY_LENGTHS:
            for causal, window in BANDS:
                for alignment in ("top_left", "bottom_right"):
                    yield base.replace(sq=sq, skv=skv, causal=causal, window=window, alignment=alignment)
    for lens_q, lens_kv in PACKED:
        for causal, window in BANDS[:3]:
            yield base.replace(b=len(lens_q), sq=max(lens_q), skv=max(lens_kv), seqlens_q=lens_q, seqlens_kv=lens_kv,
                               layout="thd", causal=causal, window=window)


def check(cases, nan_of: Callable) -> tuple[Counter, list]:
    """(tally of (trait says unseen, NaN seen), the violations: NaN where the trait says no). `nan_of(case)` is None
    for a case the backend refuses."""
    from attnfuzz.backends.flex.first_tile import first_tile_unseen
    tally, violations = Counter(), []
    for case in cases:
        nan = nan_of(case)
        if nan is None:
            tally["refused"] += 1
            continue
        unseen = first_tile_unseen(case)
        tally[(unseen, nan)] += 1
        if nan and not unseen:
            violations.append(case)
    return tally, violations


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    args = p.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import run_case
    from attnfuzz.oracles import verdict as V
    backend = get("flex-compiled", args.device)

    def nan_of(case):
        verdict = run_case(backend, case, device=args.device)
        return None if verdict.status == V.UNSUPPORTED else verdict.diagnosis == "NONFINITE"

    tally, violations = check(grid(args.dtype), nan_of)
    print(f"refused {tally['refused']}")
    for unseen in (True, False):
        print(f"trait {'yes' if unseen else 'no '}: NaN {tally[(unseen, True)]}, finite {tally[(unseen, False)]}")
    for case in violations[:10]:
        print(f"VIOLATION (NaN, trait says no): {case!r}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
