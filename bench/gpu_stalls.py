"""Stalls of a whole GPU in a campaign: moments when most lanes sit in one slow case at once, and the faults beside them.

    python3 bench/gpu_stalls.py CAMPAIGN_DIR [--slow-s 2.5] [--share 0.6] [--json]

Reads the campaign's case logs (each case's `seconds`, its end `time` and its lane) and prints the stalls (count,
seconds, share of the campaign's span, their lengths), then the cases that crashed with their process (not answered
by the known-crash skip) split by whether they overlap a stall, grouped by backend, label and message
(attnfuzz.report.stalls; `attnfuzz report` shows the same as its "Whole-GPU stalls" table). On a GPU, a CUDA fault's
recovery in the driver stalls every process on the device: the cases around it all take seconds, whatever their size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnfuzz.report.stalls import SHARE, SLOW_S, Stalls
from attnfuzz.store import caselog


def summary(rows: list[dict], slow_s: float = SLOW_S, share: float = SHARE) -> dict:
    stalls = Stalls()
    for row in rows:
        stalls.add(row)
    return stalls.summary(slow_s, share)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("campaign", type=Path)
    p.add_argument("--slow-s", type=float, default=SLOW_S)
    p.add_argument("--share", type=float, default=SHARE, help="the share of the lanes that must be stalled at once")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    files = caselog.log_files(args.campaign) if args.campaign.exists() else []
    rows = [r for f in files for r in caselog.rows(f) if "time" in r and "lane" in r]
    if not rows:
        print(f"gpu_stalls.py: no campaign case logs (with lane and time) under {args.campaign}", file=sys.stderr)
        return 2
    s = summary(rows, args.slow_s, args.share)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"{s['lanes']} lanes over {s['span_s']} s: {s['stalls']} stalls of {args.share:.0%} of the lanes or more, "
          f"{s['stalled_s']} s in all ({s['stalled_share']:.1%} of the span); "
          f"{s['stalls_without_a_crash']} without a crash beside them; {s['overlaps']} spans ({s['overlaps_s']} s) "
          f"whose slow cases did not end together: lanes slow each on its own (compiles), not stalls")
    if s["lengths_s"]:
        print("lengths (s):", " ".join(str(x) for x in s["lengths_s"]))
    for title, counts in (("crashes beside a stall", s["crashes_near_a_stall"]), ("crashes apart", s["crashes_apart"])):
        print(f"{title}: {sum(counts.values())}")
        for key, n in counts.items():
            print(f"  {n:5d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
