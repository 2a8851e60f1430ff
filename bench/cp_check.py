"""Fuzz every context-parallel backend for N cases and print PASS / FAIL by diagnosis / UNSUPPORTED by reason.

No torchrun: the ranks are attnfuzz's own worker pool (fuzz/backends/cp/pool.py), one pool per world size, reused across
backends. On the 2-GPU runner (after `source /tmp/attn-stack/env.sh` for TE):

    python3 bench/cp_check.py --device cuda --n 40
    python3 bench/cp_check.py --device cpu --n 40 --backends ring-allgather,ring-alltoall   # CPU / gloo

Cases come from attnfuzz.backends.cp.cases.cp_cases (only what each backend takes), graded against the float64 oracle of the
whole sequence; the CP-vs-non-CP agreement of the same backend is counted beside it as a second signal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hypothesis  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import InvalidArgument  # noqa: E402

from attnfuzz.backends.cp.adapter import BACKENDS, CPBackend  # noqa: E402
from attnfuzz.backends.cp.cases import cp_cases  # noqa: E402
from attnfuzz.engine.harness import run_case  # noqa: E402
from attnfuzz.backends.cp.pool import CPPool  # noqa: E402
from attnfuzz.oracles import verdict as V  # noqa: E402


def check_backend(backend: CPBackend, n: int, seed: int, oracle_device: str) -> dict:
    """Run n drawn cases; return counts by verdict label, refusal reasons, agreement counts and one example case
    per failing label."""
    labels, reasons, agreement, examples = Counter(), Counter(), Counter(), {}
    try:
        strategy = cp_cases(backend.engine)
    except InvalidArgument as e:
        return {"labels": {"UNSUPPORTED": n}, "unsupported": {str(e): n}, "agreement": {}, "examples": {},
                "cases_per_s": 0.0}
    start = time.perf_counter()

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        verdict = run_case(backend, case, device=oracle_device)
        labels[verdict.label] += 1
        if verdict.status == V.UNSUPPORTED:
            reasons[verdict.message] += 1
        if verdict.failed:
            examples.setdefault(verdict.label, {"case": repr(case), "message": verdict.message[:400]})
        if backend.last_agreement is not None:
            agreement["agree" if backend.last_agreement.agree else "disagree"] += 1
        done = sum(labels.values())
        if done % 10 == 0 or done == n:
            print(f"  {backend.name}: {done}/{n} {dict(labels)}", file=sys.stderr, flush=True)

    hypothesis.seed(seed)(run)()
    seconds = time.perf_counter() - start
    return {"labels": dict(labels), "unsupported": dict(reasons), "agreement": dict(agreement),
            "examples": examples, "cases_per_s": sum(labels.values()) / seconds if seconds else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--n", type=int, default=40, help="fuzzed cases per backend")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated CP backend names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a case counts as a HANG")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    names = [b for b in args.backends.split(",") if b]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown:
        parser.error(f"--backends: unknown {unknown}; known: {', '.join(BACKENDS)}")
    oracle_device = "cuda" if args.device == "cuda" else "cpu"
    pools: dict[int, CPPool] = {}
    summary = {}
    try:
        for name in names:
            backend = BACKENDS[name](args.device)
            why = backend.available()
            if why:
                summary[name] = {"unavailable": why}
                continue
            world = backend.engine.world
            if world not in pools:
                pools[world] = CPPool(world, device=args.device, timeout_s=args.timeout).start()
                print(f"pool of {world} ranks on {args.device} started in {pools[world].start_seconds:.1f}s",
                      file=sys.stderr)
            backend = CPBackend(backend.engine, args.device, pool=pools[world])
            summary[name] = check_backend(backend, args.n, args.seed, oracle_device)
    finally:
        for pool in pools.values():
            summary.setdefault("_pools", {})[pool.world] = {"restarts": pool.restarts, "cases": pool.cases,
                                                            "start_s": round(pool.start_seconds, 2)}
            pool.close()
    print_summary(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 0


def print_summary(summary: dict) -> None:
    for name, s in summary.items():
        if name == "_pools":
            print(f"pools: {s}")
            continue
        if "unavailable" in s:
            print(f"{name}: UNAVAILABLE: {s['unavailable']}")
            continue
        total = sum(s["labels"].values())
        print(f"{name}: {total} cases, {s['cases_per_s']:.2f} cases/s, cp_vs_nocp {s['agreement']}")
        for label, count in sorted(s["labels"].items(), key=lambda kv: -kv[1]):
            if label != V.UNSUPPORTED:
                print(f"  {label:<28} {count}")
        for reason, count in sorted(s["unsupported"].items(), key=lambda kv: -kv[1]):
            print(f"  UNSUPPORTED {count:>4}  {reason}")
        for label, ex in s["examples"].items():
            print(f"  e.g. {label}: {ex['case']}\n       {ex['message'].splitlines()[0] if ex['message'] else ''}")


if __name__ == "__main__":
    raise SystemExit(main())
