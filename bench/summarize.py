"""Summarize `attnfuzz run --log` files: per backend, cases, PASS, FAIL by diagnosis, UNSUPPORTED by reason,
CRASH / HANG, the cases a known crash took without running them, and cases per second.

    python3 bench/summarize.py LOG.jsonl [LOG.jsonl ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict

from attnfuzz.engine.skip_known import answered_unrun


def summarize(paths: list[str]) -> str:
    labels: dict[str, Counter] = defaultdict(Counter)
    reasons: dict[str, Counter] = defaultdict(Counter)
    seconds: Counter = Counter()
    unrun: Counter = Counter()   # answered by a precise known crash without running (engine/skip_known.py)
    for path in paths:
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a killed run
                name = row["backend"]
                labels[name][row["label"]] += 1
                seconds[name] += row["seconds"]
                unrun[name] += answered_unrun(str(row.get("message", "")))
                if row["label"] in ("UNSUPPORTED",) or row["label"].startswith(("CRASH", "HANG")):
                    reasons[name][f"{row['label']}: {row['message'][:110]}"] += 1
    lines = []
    for name in sorted(labels):
        c = labels[name]
        total = sum(c.values())
        fails = {k: v for k, v in c.items() if k.startswith("FAIL")}
        lines.append(f"{name}: {total} cases in {seconds[name]:.0f}s ({total / max(seconds[name], 1e-9):.1f}/s); "
                     f"PASS {c['PASS']}, FAIL {sum(fails.values())} {fails or ''}, UNSUPPORTED {c['UNSUPPORTED']}, "
                     f"other {({k: v for k, v in c.items() if k.startswith(('CRASH', 'HANG', 'FLAKY'))})}"
                     + (f"; {unrun[name]} of them known crashes not run" if unrun[name] else ""))
        for reason, n in reasons[name].most_common(6):
            lines.append(f"    {n:5d}  {reason}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(sys.argv[1:]))
