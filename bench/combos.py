"""Feature-combination coverage of the cases the harness draws for a backend, without running its kernel.

    python3 bench/combos.py [--backend sdpa-math ...] [--device cpu] [--cases 2000 10000] [--seed 0] [--json]

Draws the cases `attnfuzz run` would draw for each backend (attnfuzz.engine.harness.cases_for, the device's default
Space; not derandomized, one seed) and counts the ones the backend's `unsupported` does not refuse as graded: a
kernel that refuses a case only when called (base.Unsupported) is not consulted, so this is an upper bound of what a
real run grades (`attnfuzz run --json` reports the real figure under "combinations"). Reports 2-, 3- and 4-way
coverage (fuzz/report/combos.py) at each --cases count, and the drawing rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import hypothesis
from hypothesis import HealthCheck, Phase

from attnfuzz.backends import get
from attnfuzz.engine.harness import cases_for
from attnfuzz.report.combos import Combos, describe, feasible_of
from attnfuzz.strategies.space import Space
from attnfuzz.strategies.streams import seed_only_streams


def drawn(backend, space: Space, n: int, seed: int) -> list:
    """n cases from cases_for(backend, space), as Hypothesis generates them for a test that always passes."""
    out: list = []

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
                         suppress_health_check=list(HealthCheck))
    @hypothesis.given(case=cases_for(backend, space))
    def collect(case) -> None:
        out.append(case)

    with seed_only_streams():   # as `attnfuzz run` draws: whatever else this process imported (strategies/streams.py)
        collect()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", nargs="+", default=["sdpa-math"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", nargs="+", type=int, default=[2000, 10000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    space = Space.for_device(args.device)
    results = {}
    for name in args.backend:
        backend = get(name, args.device)
        start = time.perf_counter()
        cases = drawn(backend, space, max(args.cases), args.seed)
        seconds = time.perf_counter() - start
        graded = [c for c in cases if backend.unsupported(c) is None]
        feasible = feasible_of(backend, space)
        results[name] = {"drawn": len(cases), "graded": len(graded), "draw_rate": len(cases) / seconds}
        for n in args.cases:
            combos = Combos()
            for case in graded[:n]:
                combos.add(case)
            report = combos.report(feasible)
            results[name][str(n)] = report
            if not args.json:
                print(f"[{name}] {describe(report)}")
        if not args.json:
            print(f"[{name}] {len(cases)} drawn at {len(cases) / seconds:.0f}/s, {len(graded)} not refused")
    if args.json:
        json.dump(results, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
