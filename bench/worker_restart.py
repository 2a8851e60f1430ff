"""What a crash costs an isolated run: the case after a worker died (a spare's first case, or a new worker's) against a
case in a worker that has answered before, on one device.

    python3 bench/worker_restart.py [--device cuda] [--backend tests.misbehaving:segfault_when_causal] [--rounds 20]

The planted backend (module:function; run from the repository's root) answers a plain case and segfaults on a causal
one, whatever the device its tensors are on. Each round runs a plain case (warm), a causal one (the crash), then a
plain one (the first case of the next worker). Printed: the median seconds of the warm case and of the case after
the crash, with spares (the default, as runs use) and without. On a GPU the difference is what a new worker pays
before its case: CUDA's context, the allocator, library handles, the backend's first kernels. Compare two builds by
running this script with each on PYTHONPATH in turn.
"""

from __future__ import annotations

import argparse
import statistics
import time

from attnfuzz.engine.isolate import Worker
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

PLAIN = Case(sq=16, skv=16, d_qk=16, d_v=16, dtype="float16")
CAUSAL = PLAIN.replace(causal=True)


def rounds(backend: str, device: str, n: int, spares: int) -> tuple[list[float], list[float]]:
    """(seconds of each warm case, seconds of each case right after a crash)."""
    warm, after = [], []
    with Worker(backend, device, timeout_s=120, spares=spares) as worker:
        worker.run(PLAIN.replace(seed=10_000))   # the first worker's start is not a crash's
        for i in range(n):
            start = time.perf_counter()
            assert worker.run(PLAIN.replace(seed=i)).status == V.PASS
            warm.append(time.perf_counter() - start)
            assert worker.run(CAUSAL.replace(seed=i)).status == V.CRASH
            start = time.perf_counter()
            assert worker.run(PLAIN.replace(seed=n + i)).status == V.PASS
            after.append(time.perf_counter() - start)
    return warm, after


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="tests.misbehaving:segfault_when_causal")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    for spares in (4, 0):
        warm, after = rounds(args.backend, args.device, args.rounds, spares)
        print(f"{args.device} spares={spares}: warm case {statistics.median(warm) * 1e3:.1f} ms, case after a crash "
              f"{statistics.median(after) * 1e3:.1f} ms (median of {args.rounds}; max {max(after) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
