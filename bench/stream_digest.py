"""What a speed change must keep: the verdicts of fixed-seed streams, case by case, and the findings they shrink to.

    python3 bench/stream_digest.py OUT.json [--examples 150] [--backend NAME ...]
    python3 bench/stream_digest.py --compare BEFORE.json AFTER.json

Runs derandomized ci streams (the same cases every time) of sdpa-math on the CPU's default Space and on small
shapes, and of planted, broken and FP8 kernels (bench/planted.py, tests/broken.py, tests/fp8_kernels.py) on small
shapes; writes per stream a
digest of every case with its label and error ratio, the tally of labels and the shrunk findings. --compare says
per stream whether the digests, the tallies and the findings are the same, and where a digest differs, the largest
relative change of a ratio. Run from the repository root, once on each tree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

STREAMS = ["sdpa-math", "sdpa-math:small", "bench.planted:leak_key", "bench.planted:row_times_1p01",
           "bench.planted:zero_row", "bench.planted:grads_1p01_row", "broken-zero-causal", "broken-window",
           "broken-gqa", "broken-alignment", "broken-scale", "tests.fp8_kernels:fp8_attention",
           "tests.fp8_kernels:head_scale_swapped"]


def run(names: list[str], examples: int) -> dict:
    import torch

    from attnfuzz.backends import get
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.profiles import profile
    from attnfuzz.strategies.space import Space
    from tests.broken import BROKEN

    torch.set_num_threads(1)
    small = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64)
    out = {}
    for name in names:
        module = name.startswith(("bench.", "tests."))   # a kernel of the repository, module:function
        backend_name, _, space_name = name.partition(":") if not module else (name, "", "small")
        backend = BROKEN[backend_name]() if backend_name in BROKEN else get(backend_name, "cpu")
        space = small if space_name == "small" or backend_name in BROKEN else Space()
        cases: list = []
        tally, findings = fuzz(backend, device="cpu", space=space,
                               settings=profile("ci", max_examples=examples if space is small else 2 * examples),
                               on_case=lambda c, v, t: cases.append((repr(c), v.label, v.ratio)))
        out[name] = {"digest": hashlib.sha256(json.dumps(cases).encode()).hexdigest()[:16], "cases": cases,
                     "labels": dict(tally.labels),
                     "findings": sorted(f"{f.verdict.label} {f.case!r}" for f in findings)}
        print(name, out[name]["digest"], out[name]["labels"], len(findings), "findings", flush=True)
    return out


def compare(before: dict, after: dict) -> None:
    for name in before:
        a, b = before[name], after.get(name)
        if b is None:
            print(f"{name}: missing after")
            continue
        same = [what for what in ("digest", "labels", "findings") if a[what] == b[what]]
        drift = max((abs(x[2] - y[2]) / abs(x[2]) for x, y in zip(a["cases"], b["cases"])
                     if x[:2] == y[:2] and x[2] != y[2] and x[2] not in (0, float("inf"))), default=0.0)
        print(f"{name}: same {', '.join(same) or 'nothing'}"
              + (f"; largest relative change of a ratio {drift:.1e}" if a["digest"] != b["digest"] else ""))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--examples", type=int, default=150)
    p.add_argument("--backend", action="append", help="a stream of STREAMS (default: all)")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = p.parse_args()
    if args.compare:
        return compare(*(json.loads(path.read_text()) for path in args.compare))
    if args.out is None:
        p.error("give OUT.json, or --compare BEFORE AFTER")
    sys.path.insert(0, str(Path.cwd()))
    args.out.write_text(json.dumps(run(args.backend or STREAMS, args.examples)))


if __name__ == "__main__":
    main()
