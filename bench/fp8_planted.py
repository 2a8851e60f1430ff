"""FP8 grading against the planted FP8 kernels (tests/fp8_kernels.py): false alarms of the correct kernel over N
drawn FP8 cases, and for each planted bug whether a run finds it, under which label, how small its shrunk case is and
how long the run took.

    python3 bench/fp8_planted.py [--cases 2000] [--bug-cases 200] [--space small|default] [--seed 0] [--grads]

Run from the repository root. The correct kernel's run is a plain search (no shrinking once nothing fails); its error
ratios (error / bound, PASS means <= 1) are summarised by their largest and 99th percentile. --grads grades the FP8
backward instead (tests/fp8_grad_kernels.py): every case checks gradients (Space(fp8_grads=1)).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--bug-cases", type=int, default=200)
    p.add_argument("--space", choices=("small", "default"), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grads", action="store_true", help="the FP8 backward's kernels, every case with gradients")
    args = p.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    import torch

    from attnfuzz.backends import get
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.profiles import profile
    from attnfuzz.strategies.space import Space
    if args.grads:
        from tests.fp8_grad_kernels import BUGS
        module, correct = "tests.fp8_grad_kernels", "fp8_attention_grads"
    else:
        from tests.fp8_kernels import BUGS
        module, correct = "tests.fp8_kernels", "fp8_attention"

    torch.set_num_threads(1)
    space = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64) if args.space == "small" else Space()
    space = space.replace(fp8_grads=1) if args.grads else space
    ratios: list[float] = []
    worst: list = [0.0, None, None]

    def seen(case, verdict, tally) -> None:
        ratios.append(verdict.ratio)
        if verdict.ratio > worst[0]:
            worst[:] = [verdict.ratio, case, verdict.checks[0] if verdict.checks else ""]
    t0 = time.time()
    tally, findings = fuzz(get(f"{module}:{correct}"), space=space, seed=args.seed,
                           settings=profile("ci", max_examples=args.cases, derandomize=False),
                           on_case=seen)
    ratios.sort()
    print(f"{correct}: {len(ratios)} cases, {dict(tally.labels)}, {len(findings)} findings, largest ratio "
          f"{ratios[-1]:.3f}, 99th percentile {ratios[int(0.99 * (len(ratios) - 1))]:.3f}, {time.time() - t0:.0f} s")
    print(f"    worst: {worst[1]!r}: {worst[2]}")
    for f in findings:
        print(f"    {f.verdict.label} {f.case!r}: {f.verdict.message[:300]}")
    for bug in BUGS:
        t0 = time.time()
        tally, findings = fuzz(get(f"{module}:{bug}"), space=space, seed=args.seed,
                               settings=profile("ci", max_examples=args.bug_cases, derandomize=False))
        print(f"{bug}: {time.time() - t0:.1f} s, {dict(tally.labels)}")
        for f in findings:
            c = f.case
            print(f"    {f.verdict.label}: b={c.b} sq={c.sq} skv={c.skv} h={c.h} hk={c.hk} d_qk={c.d_qk} d_v={c.d_v} "
                  f"({c.b * c.sq * c.skv * c.h} scores) {c!r}")


if __name__ == "__main__":
    main()
