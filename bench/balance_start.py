"""How many cases a time-balanced lane grades in its first seconds, by how many compiles the balance times before it
moves the odds (TimeBalance.fresh_measured; strategies/compiled.py's MEASURED_FRESH by default): each value in turn,
on the same seeds, against bench/jit_fake.py's FakeJit on a stand-in clock (its compile seconds plus a fixed time a
case), so every figure is exact and the same each run.

    python3 bench/balance_start.py [--compile-seconds 19] [--case-seconds 0.18] [--lane-seconds 63 300]
                                   [--fresh-measured 3 1] [--seeds 8] [--examples 3000]

The defaults are compiled flex's costs on a loaded H100 host (a compile about 19 s, a case inside a compiled
configuration about 0.18 s) and a 240-s campaign's lane (about 63 s of draws) beside a 20-minute one's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `from bench import ...` from anywhere


def graded_by(seconds: list[float], compile_s: float, case_s: float, fresh_measured: int, seed: int,
              examples: int) -> list[int]:
    """Graded cases of one balanced search by each of `seconds` on the stand-in clock."""
    from attnfuzz.engine.compiled_search import compiled_configs
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.profiles import profile
    from attnfuzz.oracles import verdict as V
    from attnfuzz.strategies.compiled import TimeBalance
    from attnfuzz.strategies.space import Space
    from bench.jit_fake import FakeJit, Verdicts
    backend = FakeJit(compile_seconds=compile_s)
    clock = lambda: backend.compile_spent + case_s * backend.runs   # noqa: E731
    balance = compiled_configs(backend).balance = TimeBalance(0.5, 1 - Space().compiled_share, clock=clock)
    balance.fresh_measured = fresh_measured
    at = []
    fuzz(backend, space=Space(max_len=160, compile_time_share=0.5), seed=seed, worker=Verdicts(backend), reruns=0,
         settings=profile("quick", max_examples=examples, database=None),
         on_case=lambda case, verdict, tally: at.append((clock(), verdict.status != V.UNSUPPORTED)))
    return [sum(graded for t, graded in at if t <= limit) for limit in seconds]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compile-seconds", type=float, default=19.0)
    p.add_argument("--case-seconds", type=float, default=0.18)
    p.add_argument("--lane-seconds", type=float, nargs="+", default=[63.0, 300.0])
    p.add_argument("--fresh-measured", type=int, nargs="+", default=[3, 1])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--examples", type=int, default=3000)
    args = p.parse_args()
    for measured in args.fresh_measured:
        runs = [graded_by(args.lane_seconds, args.compile_seconds, args.case_seconds, measured, seed, args.examples)
                for seed in range(args.seeds)]
        for i, limit in enumerate(args.lane_seconds):
            per_seed = [run[i] for run in runs]
            median = statistics.median(per_seed)
            print(f"compiles timed first {measured}: graded within {limit:g} s: median {median:g}, per seed {per_seed}")


if __name__ == "__main__":
    main()
