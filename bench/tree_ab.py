"""The small-case rate of two attnfuzz builds, measured in turns on the same machine: is a change faster or slower?

    python3 bench/tree_ab.py A=DIR B=DIR [--seeds 12] [--repeats 2] [--examples 400] [--backend sdpa-math]

Each DIR holds an installed attnfuzz (`pip wheel --no-deps --no-build-isolation -w W .` in a checkout, then
`pip install --no-deps --target DIR W/*.whl`), so an older commit can be measured beside this one. Every run is a
fresh process that imports attnfuzz from its DIR alone (an editable install of another checkout is not consulted),
warms up on 30 cases, then fuzzes the backend on the CPU with the build's own default Space for `--examples` cases
(ci profile, not derandomized) with one seed. The builds take turns: for each seed and repeat, each build runs once,
starting from a rotating position, so load that drifts over the measurement falls on each build alike.

Per build it prints the small-case rate (graded cases with sq, skv <= 160 per second of the whole run, wall and CPU
time: what a build's long cases cost the everyday ones), the share of its time spent on long cases, and the ratio of
each build's summed rate to the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RUN = r'''
import json, sys, time
import torch
import torch.nn.attention.bias  # noqa: F401  (imports torch._dynamo before the clock starts)
import attnfuzz
from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.space import Space

torch.set_num_threads(1)
backend_name, seed, examples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
backend = get(backend_name, "cpu")
fuzz(backend, device="cpu", space=Space(), settings=profile("ci", max_examples=30, derandomize=False), seed=10**6 + seed)
rows, last = [], [0.0]

def on_case(case, verdict, tally):
    now = time.perf_counter()
    rows.append((case.sq, case.skv, verdict.status, now - last[0]))
    last[0] = now

cpu0, last[0] = time.process_time(), time.perf_counter()
start = last[0]
fuzz(backend, device="cpu", space=Space(), settings=profile("ci", max_examples=examples, derandomize=False),
     seed=seed, on_case=on_case)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
small = sum(1 for sq, skv, status, _ in rows if sq <= 160 and skv <= 160 and status not in ("UNSUPPORTED", "CRASH", "HANG"))
long_s = sum(t for sq, skv, _, t in rows if sq > 160 or skv > 160)
print(json.dumps({"module": attnfuzz.__file__, "wall": wall, "cpu": cpu, "small": small, "long_s": long_s}))
'''


def measure(site: Path, backend: str, seed: int, examples: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run([sys.executable, "-c", RUN, backend, str(seed), str(examples)], env=env, cwd=site,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run of {site} failed:\n{done.stderr[-2000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(os.path.abspath(row["module"])).is_relative_to(os.path.abspath(site)):  # (links not followed)
        raise SystemExit(f"{site}: attnfuzz was imported from {row['module']}, not from this folder")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="+", metavar="NAME=DIR", help="a name and the folder attnfuzz is installed in")
    p.add_argument("--backend", default="sdpa-math")
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--repeats", type=int, default=2, help="runs per build and seed")
    p.add_argument("--examples", type=int, default=400)
    args = p.parse_args()
    builds = []
    for spec in args.builds:
        name, sep, folder = spec.partition("=")
        if not sep or not Path(folder, "attnfuzz").is_dir():
            raise SystemExit(f"{spec!r}: give NAME=DIR, DIR holding an installed attnfuzz (DIR/attnfuzz)")
        builds.append((name, Path(folder)))
    totals = {name: {"wall": 0.0, "cpu": 0.0, "small": 0, "long_s": 0.0} for name, _ in builds}
    turn = 0
    for seed in range(1, args.seeds + 1):
        for _ in range(args.repeats):
            for i in range(len(builds)):
                name, site = builds[(i + turn) % len(builds)]
                row = measure(site, args.backend, seed, args.examples)
                for key in totals[name]:
                    totals[name][key] += row[key]
            turn += 1
    first = builds[0][0]
    for name, t in totals.items():
        rate, cpu_rate = t["small"] / t["wall"], t["small"] / t["cpu"]
        ratio = rate / (totals[first]["small"] / totals[first]["wall"])
        print(f"{name}: {rate:.1f} small graded cases/s ({cpu_rate:.1f} by CPU time), long cases "
              f"{100 * t['long_s'] / t['wall']:.1f} % of the time; {ratio:.3f} x {first}")


if __name__ == "__main__":
    main()
