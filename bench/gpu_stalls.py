"""Stalls of a whole GPU in a campaign: moments when most lanes sit in one slow case at once, and the faults beside them.

    python3 bench/gpu_stalls.py CAMPAIGN_DIR [--slow-s 2.5] [--share 0.6] [--json]

Reads the campaign's case logs (each case's `seconds`, its end `time` and its lane). A lane is stalled while it is in
a case that took more than --slow-s; the campaign is stalled while at least --share of its lanes are, at once (a
tenth of a second grain). Prints the stalls (count, seconds, share of the campaign's span, their lengths), then the
cases that crashed with their process (not answered from the known-crash skip) split by whether they overlap a stall,
grouped by backend and message. On a GPU, a CUDA fault's recovery in the driver stalls every process on the device:
the cases around it all take seconds, whatever their size.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnfuzz.engine.skip_known import answered_unrun  # noqa: E402
from attnfuzz.oracles import verdict as V  # noqa: E402
from attnfuzz.store import caselog  # noqa: E402

GRAIN = 0.1  # seconds


def crashed(row: dict) -> bool:
    """A case whose process crashed or hung running it, known bug or not (not one the known-crash skip answered)."""
    verdict = row.get("verdict") or {}
    status, diagnosis = verdict.get("status"), verdict.get("diagnosis")
    crash = status in (V.CRASH, V.HANG) or (status == V.KNOWN and diagnosis is not None
                                            and diagnosis not in V.DIAGNOSES)
    return crash and not answered_unrun(row.get("message", ""))


def stalls(rows: list[dict], slow_s: float, share: float) -> list[tuple[float, float]]:
    """(start, end) of each span in which at least `share` of the lanes are in a case slower than `slow_s`."""
    lanes = {r["lane"] for r in rows}
    slow = [(r["time"] - r["seconds"], r["time"], r["lane"]) for r in rows if r["seconds"] > slow_s]
    if not rows or not slow:
        return []
    need = max(2, -(-int(share * 100) * len(lanes) // 100))
    events = sorted(slow)
    first, last = min(s for s, _, _ in events), max(e for _, e, _ in events)
    found, current = [], None
    t = first
    while t <= last:
        busy = {lane for s, e, lane in events if s <= t <= e}
        if len(busy) >= need:
            current = [t, t] if current is None else [current[0], t]
        elif current is not None:
            found.append(tuple(current))
            current = None
        t += GRAIN
    if current is not None:
        found.append(tuple(current))
    return found


def summary(rows: list[dict], slow_s: float = 2.5, share: float = 0.6) -> dict:
    windows = stalls(rows, slow_s, share)
    span = (max(r["time"] for r in rows) - min(r["time"] - r["seconds"] for r in rows)) if rows else 0.0
    near, apart = Counter(), Counter()
    for r in rows:
        if not crashed(r):
            continue
        start, end = r["time"] - r["seconds"], r["time"]
        key = f"{r['backend']} {r['label']} {r['message'][:50].splitlines()[0] if r['message'] else ''}"
        (near if any(start <= b + 0.5 and end >= a - 0.5 for a, b in windows) else apart)[key] += 1
    stalled = sum(b - a + GRAIN for a, b in windows)
    return {"lanes": len({r["lane"] for r in rows}), "span_s": round(span, 1), "stalls": len(windows),
            "stalled_s": round(stalled, 1), "stalled_share": round(stalled / span, 3) if span else 0.0,
            "lengths_s": [round(b - a + GRAIN, 1) for a, b in windows],
            "stalls_without_a_crash": sum(not any(r["time"] - r["seconds"] <= b + 0.5 and r["time"] >= a - 0.5
                                                  for r in rows if crashed(r)) for a, b in windows),
            "crashes_near_a_stall": dict(near.most_common()), "crashes_apart": dict(apart.most_common())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("campaign", type=Path)
    p.add_argument("--slow-s", type=float, default=2.5)
    p.add_argument("--share", type=float, default=0.6, help="the share of the lanes that must be stalled at once")
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
          f"{s['stalls_without_a_crash']} without a crash beside them")
    if s["lengths_s"]:
        print("lengths (s):", " ".join(str(x) for x in s["lengths_s"]))
    for title, counts in (("crashes beside a stall", s["crashes_near_a_stall"]), ("crashes apart", s["crashes_apart"])):
        print(f"{title}: {sum(counts.values())}")
        for key, n in counts.items():
            print(f"  {n:5d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
