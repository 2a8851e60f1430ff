"""Does a failure depend on what ran before it in the same process? Replay cases of a run log (`attnfuzz run --log`)
in one process, in the order given, and print each verdict beside the one logged. A case that fails after some
history and passes alone points at state a backend keeps between calls (a cache keyed too loosely, memory reused).

    python3 bench/probe_history.py LOG.jsonl --cases 0-345 [--device cuda]   # a stretch of the run, in order
    python3 bench/probe_history.py LOG.jsonl --cases 258,259,259             # chosen cases (repeats allowed)

Indices count the log's lines from 0; cases the backend refused (UNSUPPORTED in the log) are left out of ranges.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnfuzz.store import caselog
from attnfuzz.backends import get
from attnfuzz.engine.harness import run_case
from attnfuzz.strategies.case import Case


def indices(spec: str, logged: list[dict]) -> list[int]:
    """'0-345' (ranges skip the cases logged UNSUPPORTED) or '258,259,259', mixed freely."""
    out = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            out += [i for i in range(lo, hi + 1) if logged[i]["verdict"]["status"] != "UNSUPPORTED"]
        else:
            out.append(int(part))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--cases", required=True, help="e.g. 0-345 or 258,259")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quiet", action="store_true", help="print only verdicts that differ from the log's")
    args = parser.parse_args()
    logged = list(caselog.rows(args.log))  # a line cut by a kill is skipped, as everywhere logs are read
    backend = get(logged[0]["backend"], args.device)
    differ = 0
    for i in indices(args.cases, logged):
        was = logged[i]["label"]  # KNOWN:<diagnosis> for a known bug's failure
        now = run_case(backend, Case.from_dict(logged[i]["case"]), device=args.device)
        same = now.label == was or (was.startswith("KNOWN:") and now.label == f"FAIL:{was[6:]}")
        differ += not same
        if not (args.quiet and same):
            print(f"  [{i}] now {now.label:<22} logged {was:<22}{'' if same else '  <-- differs'}")
    print(f"{differ} verdict(s) differ from the log")


if __name__ == "__main__":
    main()
