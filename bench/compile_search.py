"""Compile-aware search against plain search, in one process: configurations compiled, graded cases per second with
the compile time a JIT backend would have spent, and the minimal case of a planted bug in each.

    python3 bench/compile_search.py [--examples 150] [--seed 0] [--runs 1] [--compile-seconds 2.0]
                                    [--share 0.8] [--bug none|config|config-long] [--max-len 160] [--sleep]
                                    [--stand-in] [--first-bug]

The backend is bench/jit_fake.py's FakeJit: a correct CPU kernel behind FA4's capability table and compile key that
counts --compile-seconds for every compile key it meets first (--sleep: sleeps them too). Each run fuzzes a fresh
FakeJit twice under the same Hypothesis seed and settings (the quick profile, no example database): plain (Space
compiled_share=0, every case drawn fresh) and compile-aware (compiled_share=--share), then compile-aware with --examples / (1 - share) examples ("aware, x
fresh": as many fresh draws as plain, so about as many configurations and as much compile time). `per s` is graded cases over
wall time plus simulated compile time, the figure a GPU run's compile-bound throughput follows; `ratio` is
compile-aware over plain. With --bug, each mode's findings are listed with their minimal cases (see jit_fake.BUGS). --stand-in
answers each case from the planted bug alone (no kernel, no oracle): the search and its shrinks in seconds, `per s`
then nearly all compile time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `from bench import ...` from anywhere

from attnfuzz.engine.harness import fuzz  # noqa: E402
from attnfuzz.engine.profiles import profile  # noqa: E402
from attnfuzz.oracles import verdict as V  # noqa: E402
from attnfuzz.strategies.space import Space  # noqa: E402
from bench.jit_fake import BUGS, FakeJit, Verdicts  # noqa: E402


def one_mode(share: float, args, seed: int, examples: int | None = None) -> dict:
    backend = FakeJit(compile_seconds=args.compile_seconds, sleep=args.sleep, bug=args.bug)
    graded, found = [], []

    def on_case(case, verdict, tally):
        if verdict.status != V.UNSUPPORTED:
            graded.append(backend.compile_key(case))
        if verdict.failed and not found:
            found.append((backend.compile_spent, len(backend.compiled)))

    space = Space(max_len=args.max_len, compiled_share=share)
    start = time.perf_counter()
    worker = Verdicts(backend) if args.stand_in else None
    _, findings = fuzz(backend, space=space, seed=seed, on_case=on_case, reruns=0, worker=worker,
                       settings=profile("quick", max_examples=examples or args.examples, database=None,
                                        report_multiple_bugs=not args.first_bug))
    wall = time.perf_counter() - start
    compile_s = backend.compile_spent if not args.sleep else 0.0   # slept compiles are in the wall time already
    return {"cases": len(graded), "configs": len(backend.compiled), "wall": wall, "compile": backend.compile_spent,
            "found": found[0] if found else None,
            "per_s": len(graded) / (wall + compile_s), "per_config": len(graded) / max(len(backend.compiled), 1),
            "findings": sorted((f.verdict.label, repr(f.case)) for f in findings)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=150, help="Hypothesis's max_examples per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=1, help="runs with consecutive seeds")
    p.add_argument("--compile-seconds", type=float, default=2.0, help="simulated compile per new key (FA4: 1.6-3)")
    p.add_argument("--share", type=float, default=Space().compiled_share, help="compile-aware share of pinned draws")
    p.add_argument("--bug", choices=BUGS, default="none")
    p.add_argument("--max-len", type=int, default=160)
    p.add_argument("--first-bug", action="store_true",
                   help="shrink the first failure alone, as `attnfuzz run --first-bug` (no search past it)")
    p.add_argument("--sleep", action="store_true", help="sleep the compile time instead of counting it")
    p.add_argument("--stand-in", action="store_true",
                   help="answer from the planted bug alone (jit_fake.Verdicts): no kernel, no oracle, seconds a run")
    args = p.parse_args()
    if not 0 < args.share < 1:
        p.error(f"--share={args.share}: give a share in (0, 1)")
    print(f"FakeJit, {args.compile_seconds} s per new compile key, bug={args.bug}, {args.examples} examples, "
          f"max_len={args.max_len}, share={args.share}{', stand-in verdicts' if args.stand_in else ''}")
    print(f"{'seed':>4} {'mode':<15} {'cases':>5} {'configs':>7} {'cases/config':>12} {'wall s':>7} {'compile s':>9} "
          f"{'per s':>6} {'ratio':>5}")
    for seed in range(args.seed, args.seed + args.runs):
        plain, aware = one_mode(0.0, args, seed), one_mode(args.share, args, seed)
        # as many fresh draws as plain search makes: about the same configurations, so the same compile time
        equal = one_mode(args.share, args, seed, examples=round(args.examples / (1 - args.share)))
        modes = (("plain", plain), ("compile-aware", aware), ("aware, x fresh", equal))
        for mode, r in modes:
            ratio = f"{r['per_s'] / plain['per_s']:5.2f}"
            print(f"{seed:>4} {mode:<15} {r['cases']:>5} {r['configs']:>7} {r['per_config']:>12.2f} {r['wall']:>7.1f} "
                  f"{r['compile']:>9.1f} {r['per_s']:>6.2f} {ratio:>5}")
        for mode, r in modes:
            if r["found"] is not None:
                (at, configs), after = r["found"], r["compile"] - r["found"][0]
                print(f"     {mode}: first failure after {at:.1f} compile s ({configs} configurations); its shrink "
                      f"{after:.1f} compile s ({r['configs'] - configs} more configurations)")
            for label, case in r["findings"]:
                print(f"     {mode} found {label}: {case}")
        if args.bug != "none":
            for mode, r in modes[1:]:
                same = set(plain["findings"]) & set(r["findings"])
                print(f"     {mode}: {len(same)} of plain's {len(plain['findings'])} minimal cases found the same")


if __name__ == "__main__":
    main()
