"""What answering a precise known crash's cases without running them saves an isolated run: the same run with the
skip and without it, in turns, in one process (engine/skip_known.py).

    python3 bench/skip_known.py [--backend tests.misbehaving:segfault_when_causal] [--examples 300] [--rounds 3]
    python3 bench/skip_known.py --backend tests.misbehaving:segfault_when_causal_and_odd
    python3 bench/skip_known.py --backend fa3 --device cuda --examples 500 --rounds 2

A planted backend (module:function) gets a known-bug record built here, taking its crashes on causal cases; a named
backend gets the shipped corpus's records. The run without the skip keeps the same records (the same cases are
KNOWN) and only runs every case. Each round prints the seconds, the workers started after a crash, the cases the
records took, what the skip answered unrun, and the rate of the skipping run over the plain one (a ratio: compare
it, not the seconds). Where the bug fills only part of its record's condition (segfault_when_causal_and_odd), the
skipping run answers some cases KNOWN that would pass, so its labels differ from the plain run's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import Worker
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.known import known_bugs_of
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space


def known_for(backend: str):
    """A planted backend's crash on causal cases as a known bug, else the shipped corpus's known bugs."""
    if ":" not in backend:
        return corpus_io.known_bugs(corpus_io.shipped_dir())
    crash = V.Verdict(V.CRASH, "SIGSEGV", "the worker process died (SIGSEGV) while running this case")
    record = {"link": "bench/skip_known.py", "note": "planted", "when": {"causal": True}}
    entry = corpus_io.Entry(backend, Case(sq=4, skv=4, d_qk=8, d_v=8, causal=True), crash, known_bug=record)
    return known_bugs_of([(Path("planted.json"), entry)])


def one_run(backend: str, device: str, examples: int, skip: bool, space: Space) -> dict:
    known = known_for(backend)
    if not skip:
        known.crash_faces = []   # the same records, nothing to skip by
    start = time.perf_counter()
    with Worker(backend, device, timeout_s=120) as worker:
        tally, findings = fuzz(get(backend, device), device=device, space=space, known=known, worker=worker,
                               settings=profile("ci", max_examples=examples), reruns=0)
        restarts = worker.restarts
    taken = sum(n for label, n in tally.labels.items() if label.startswith(V.KNOWN))
    return {"seconds": time.perf_counter() - start, "restarts": restarts, "known": taken,
            "examples": tally.examples, "labels": dict(tally.labels), "findings": len(findings),
            "found": sorted(f"{f.verdict.label} {f.case!r}"[:160] for f in findings),
            "not_run": tally.not_run}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="tests.misbehaving:segfault_when_causal")
    p.add_argument("--device", default="cpu")
    p.add_argument("--examples", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    space = Space(max_len=16, max_batch=2, max_heads=2) if ":" in args.backend else Space()
    ratios = []
    for r in range(args.rounds):
        runs = {skip: one_run(args.backend, args.device, args.examples, skip, space) for skip in (r % 2 == 0, r % 2 == 1)}
        same = runs[True]["labels"] == runs[False]["labels"]
        ratio = (runs[True]["examples"] / runs[True]["seconds"]) / (runs[False]["examples"] / runs[False]["seconds"])
        ratios.append(ratio)
        for skip in (True, False):
            run = runs[skip]
            print(f"round {r} {'skip' if skip else 'run all'}: {run['examples']} cases in {run['seconds']:.1f}s, "
                  f"{run['restarts']} workers replaced, {run['known']} known, {run['findings']} findings"
                  + (f"; {run['not_run']}" if run["not_run"] else ""))
        for skip in (True, False):
            for found in runs[skip]["found"]:
                print(f"round {r} {'skip' if skip else 'run all'} found {found}")
        print(f"round {r}: rate ratio skip / run all {ratio:.2f}; the same verdict labels: {same}")
    print(f"median rate ratio {statistics.median(ratios):.2f} over {args.rounds} rounds")


if __name__ == "__main__":
    main()
