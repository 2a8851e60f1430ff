"""Graded cases per second through the whole fuzz loop (Hypothesis draw, materialize, backend, oracle, grade).

    python3 bench/throughput.py [--backend sdpa-math] [--examples 500] [--device cpu]

Small shapes (b <= 2, s <= 64, h <= 4, d <= 64): the issue's target is >= 100 graded cases/s on a 2-core CPU.
It also splits the time: fuzzer (draw + bookkeeping) vs backend vs oracle + grade.
"""

from __future__ import annotations

import argparse
import time

from pathlib import Path

from fuzz.backends import get
from fuzz.corpus import known_bugs
from fuzz.harness import fuzz
from fuzz.profiles import profile
from oracles import grade as grade_module
from strategies.space import Space

SMALL = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="sdpa-math")
    p.add_argument("--examples", type=int, default=500)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads, as the CLI's --threads")
    args = p.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    backend = get(args.backend, args.device)
    import fuzz.harness as harness_module
    spent = {"backend": 0.0, "oracle": 0.0, "inputs": 0.0}
    run, of, grade, materialize = backend.run, grade_module.Oracle.of, harness_module.grade, harness_module.materialize

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        return wrapper

    backend.run = timed(run, "backend")
    grade_module.Oracle.of = harness_module.Oracle.of = timed(of, "oracle")
    harness_module.grade = timed(grade, "oracle")  # grading is the oracle's work: references, bounds, diagnosis
    harness_module.materialize = timed(materialize, "inputs")
    fuzz(backend, device=args.device, space=SMALL, settings=profile("ci", max_examples=20))  # warm-up
    spent.update(backend=0.0, oracle=0.0, inputs=0.0)
    tally, findings = fuzz(backend, device=args.device, space=SMALL, known=known_bugs(Path("corpus")),
                           settings=profile("ci", max_examples=args.examples, derandomize=False))
    graded = sum(v for k, v in tally.labels.items() if not k.startswith("UNSUPPORTED"))
    other = tally.seconds - spent["backend"] - spent["oracle"] - spent["inputs"]
    print(f"{args.backend} on {args.device}: {tally.examples} examples ({graded} graded) in {tally.seconds:.2f}s = "
          f"{graded / tally.seconds:.1f} graded cases/s; labels {dict(tally.labels)}")
    print(f"  time: backend {spent['backend']:.2f}s, oracle+grade {spent['oracle']:.2f}s, inputs (materialize) "
          f"{spent['inputs']:.2f}s, fuzzer and the rest "
          f"{other:.2f}s; ratio fuzzer total / (backend + oracle) = "
          f"{tally.seconds / max(spent['backend'] + spent['oracle'], 1e-9):.2f}; findings {len(findings)}")
    for f in findings:
        print(f"  {f.verdict.label}: {f.verdict.message}\n    {f.case!r}")


if __name__ == "__main__":
    main()
