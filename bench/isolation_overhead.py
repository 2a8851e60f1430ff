"""Isolation overhead: the same cases in-process and through an isolated worker process (fuzz/engine/isolate.py).

    python3 bench/isolation_overhead.py [--backend sdpa-math] [--examples 400]

Runs the same derandomized fuzz loop twice, with and without the worker, and reports seconds per case and the
overhead; on CPU, for small shapes, it should stay within 10 %.
"""

from __future__ import annotations

import argparse
import statistics

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import Worker
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.space import Space

SMALL = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64)


def timed_loop(backend, examples: int, worker) -> float:
    tally, findings = fuzz(backend, space=SMALL, settings=profile("ci", max_examples=examples), worker=worker)
    assert not findings, findings
    return tally.seconds / tally.examples


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="sdpa-math")
    p.add_argument("--examples", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    backend = get(args.backend)
    with Worker(args.backend) as worker:
        timed_loop(backend, 20, None), timed_loop(backend, 20, worker)  # warm-up: imports, the worker's start
        inproc, isolated = [], []
        for _ in range(args.repeats):  # interleaved, so machine load hits both alike
            inproc.append(timed_loop(backend, args.examples, None))
            isolated.append(timed_loop(backend, args.examples, worker))
    a, b = statistics.median(inproc), statistics.median(isolated)
    print(f"{args.backend}: {args.examples} derandomized cases x {args.repeats}, median seconds per case: "
          f"in-process {a * 1e3:.2f} ms, isolated {b * 1e3:.2f} ms; overhead {100 * (b - a) / a:+.1f} %")


if __name__ == "__main__":
    main()
