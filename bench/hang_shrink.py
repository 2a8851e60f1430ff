"""What a hang costs a run: find and shrink a kernel that hangs whenever sq != skv, in an isolated worker.

    python3 bench/hang_shrink.py [--case-timeout 20] [--seed 1] [--examples 100] [--cap 900]

Runs `attnfuzz run --backend tests.misbehaving:hangs_unless_square --isolate` (from the repository root, which
holds tests/) into a fresh corpus and log, and prints the wall time, the HANG cases the log holds, the cases run in
all and the case saved. A run still going after --cap seconds is stopped, and says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNEL = "tests.misbehaving:hangs_unless_square"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case-timeout", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--cap", type=float, default=900.0, help="stop the run after this many seconds")
    args = p.parse_args()
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        log, corpus = Path(tmp) / "log.jsonl", Path(tmp) / "corpus"
        cmd = [sys.executable, "-m", "attnfuzz", "run", "--backend", KERNEL, "--isolate", "--case-timeout",
               str(args.case_timeout), "--profile", "ci", "--seed", str(args.seed), "--max-examples",
               str(args.examples), "--log", str(log), "--corpus", str(corpus)]
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=args.cap)
            ended = f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            ended = f"STOPPED after the {args.cap:g}s cap, still running"
        wall = time.perf_counter() - start
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        hangs = [r for r in lines if r["label"].startswith("HANG")]
        saved = sorted(p.name for p in corpus.glob("*.json")) if corpus.exists() else []
        cases = [json.loads(p.read_text())["case"] for p in corpus.glob("*HANG*.json")] if corpus.exists() else []
    print(f"{KERNEL}, --case-timeout {args.case_timeout:g}, seed {args.seed}: {ended} in {wall:.1f}s of wall time; "
          f"{len(lines)} cases logged, {len(hangs)} of them HANG, {sum(r['seconds'] for r in hangs):.1f}s in HANGs")
    for name, case in zip(saved, cases):
        print(f"  saved {name}: sq={case['sq']} skv={case['skv']} b={case['b']} h={case['h']} d_qk={case['d_qk']}")


if __name__ == "__main__":
    main()
