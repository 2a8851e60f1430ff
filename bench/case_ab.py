"""What one small case costs two attnfuzz builds, on the same cases: is a rate change per-case overhead or a richer mix?

    python3 bench/case_ab.py A=DIR B=DIR [--draw-from A] [--seeds 4] [--examples 400] [--repeats 2]

bench/tree_ab.py compares whole runs, in which each build draws its own cases. Here one build (--draw-from, the first
by default; an older build may not read a newer build's spellings) draws the cases of `--seeds` ci streams of sdpa-math
on the CPU's default Space, as tree_ab's runs do; the small ones (sq, skv <= 160) are run through every build's
run_case (unsupported, backend, bitwise rerun, oracle, grade: no Hypothesis), each build in its own process, in turns,
`--repeats` times; a case's time is its fastest. Per build it prints the mean milliseconds of a small case, of one
with and one without gradients, and the ratio of its total to the first build's. The cost of a build's own mix: the
same build with `--draw-from` each build whose cases it reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DRAW = r'''
import json, sys
import torch
from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.space import Space
torch.set_num_threads(1)
seeds, examples, cases = int(sys.argv[1]), int(sys.argv[2]), []
backend = get("sdpa-math", "cpu")
for seed in range(1, seeds + 1):
    fuzz(backend, device="cpu", space=Space(), settings=profile("ci", max_examples=examples, derandomize=False),
         seed=seed, on_case=lambda case, verdict, tally: cases.append(case.to_dict()))
print(json.dumps([c for c in cases if c["sq"] <= 160 and c["skv"] <= 160]))
'''

RUN = r'''
import json, sys, time
import torch
import torch.nn.attention.bias  # noqa: F401
import attnfuzz
from attnfuzz.backends import get
from attnfuzz.engine.harness import run_case
from attnfuzz.strategies.case import Case
torch.set_num_threads(1)
cases = [Case.from_dict(d) for d in json.load(open(sys.argv[1]))]
backend = get("sdpa-math", "cpu")
for case in cases[:30]:  # warm-up
    run_case(backend, case, device="cpu")
seconds = []
for case in cases:
    start = time.perf_counter()
    run_case(backend, case, device="cpu")
    seconds.append(time.perf_counter() - start)
print(json.dumps({"module": attnfuzz.__file__, "seconds": seconds}))
'''


def in_build(site: Path, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=site, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run of {site} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="+", metavar="NAME=DIR", help="a name and the folder attnfuzz is installed in")
    p.add_argument("--draw-from", help="the build whose streams give the cases (default: the first)")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--examples", type=int, default=400)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    builds = {}
    for spec in args.builds:
        name, sep, folder = spec.partition("=")
        if not sep or not Path(folder, "attnfuzz").is_dir():
            raise SystemExit(f"{spec!r}: give NAME=DIR, DIR holding an installed attnfuzz (DIR/attnfuzz)")
        builds[name] = Path(folder)
    drawer = args.draw_from or next(iter(builds))
    cases = json.loads(in_build(builds[drawer], DRAW, str(args.seeds), str(args.examples)))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
    best = {name: [float("inf")] * len(cases) for name in builds}
    try:
        for turn in range(args.repeats):
            names = list(builds)
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                row = json.loads(in_build(builds[name], RUN, f.name))
                if not Path(os.path.abspath(row["module"])).is_relative_to(os.path.abspath(builds[name])):
                    raise SystemExit(f"{builds[name]}: attnfuzz was imported from {row['module']}, not from there")
                best[name] = [min(a, b) for a, b in zip(best[name], row["seconds"])]
    finally:
        os.unlink(f.name)
    grads = [bool(c.get("grads")) for c in cases]
    first = sum(next(iter(best.values())))
    print(f"{len(cases)} small cases drawn by {drawer}")
    for name, seconds in best.items():
        def mean(keep):
            kept = [s for s, g in zip(seconds, grads) if keep(g)]
            return 1000 * sum(kept) / max(1, len(kept))
        print(f"{name}: {mean(lambda g: True):.2f} ms a case (with gradients {mean(lambda g: g):.2f}, without "
              f"{mean(lambda g: not g):.2f}); {sum(seconds) / first:.3f} x the first's time")


if __name__ == "__main__":
    main()
