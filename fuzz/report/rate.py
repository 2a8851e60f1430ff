"""Where a campaign's hours went, per backend: graded cases per second, and the case seconds split by what they were
spent on, from the case logs' per-case `seconds` and `time`.

The parts: graded cases that passed; failures (FAIL, CRASH, HANG, FLAKY and known bugs: their reruns and the
shrink's steps count here); refused cases (UNSUPPORTED, the capability checks' and the kernels' own refusals); and,
carved out of the graded ones, slow cases, those that took over SLOW_FACTOR times the backend's median case: a new
kernel configuration's compile, a cuDNN graph's build, a long shape. A backend whose slow share is large gains from
a compile-aware search; one whose refused share is large draws what it cannot run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from attnfuzz.report.table import Table

SLOW_FACTOR = 10          # a case over this many times the backend's median case is a slow one
GRADED = ("PASS",)
FAILED = ("FAIL", "CRASH", "HANG", "FLAKY", "KNOWN")
UNRUN = "UNRUN"   # a case a precise known crash or hang took without running it (engine/skip_known.py): not graded
MINUTE = 60.0


@dataclass
class Timeline:
    """One backend's cases in the order they were logged: (unix time, status, seconds)."""

    cases: list[tuple[float, str, float]] = field(default_factory=list)

    def add(self, time: float, status: str, seconds: float) -> None:
        self.cases.append((time, status, seconds))

    def split(self) -> dict[str, float]:
        """Case seconds by part: passed, slow (passing cases over SLOW_FACTOR x the median), failures, refused."""
        seconds = [s for _, _, s in self.cases]
        median = statistics.median(seconds) if seconds else 0.0
        parts = {"passed": 0.0, "slow": 0.0, "failures": 0.0, "refused": 0.0}
        for _, status, s in self.cases:
            if status == "UNSUPPORTED":
                parts["refused"] += s
            elif status in FAILED or status == UNRUN:
                parts["failures"] += s
            elif median > 0 and s > SLOW_FACTOR * median:
                parts["slow"] += s
            else:
                parts["passed"] += s
        return parts

    def per_minute(self, start: float) -> list[tuple[float, int, int]]:
        """(minutes since `start`, graded cases, refused cases) for each whole minute the backend logged cases in."""
        bins: dict[int, list[int]] = {}
        for t, status, _ in self.cases:
            counts = bins.setdefault(int((t - start) // MINUTE), [0, 0])
            if status != UNRUN:
                counts[1 if status == "UNSUPPORTED" else 0] += 1
        return [(m, g, r) for m, (g, r) in sorted(bins.items())]


def rate_table(timelines: dict[str, Timeline], span: tuple[float, float] | None) -> Table:
    """Per backend: graded cases per second over the campaign's wall time and over its own case seconds, and the
    share of its case seconds in each part (Timeline.split)."""
    wall = (span[1] - span[0]) if span else 0.0
    rows = []
    for name, line in sorted(timelines.items()):
        graded = sum(status not in ("UNSUPPORTED", UNRUN) for _, status, _ in line.cases)
        unrun = sum(status == UNRUN for _, status, _ in line.cases)
        parts = line.split()
        busy = sum(parts.values())
        share = {k: f"{v / busy:.0%}" if busy > 0 else "-" for k, v in parts.items()}
        rows.append([name, str(graded), f"{graded / wall:.2f}" if wall > 0 else "-",
                     f"{graded / busy:.2f}" if busy > 0 else "-", f"{busy:.0f}", share["passed"], share["slow"],
                     share["failures"], share["refused"], str(unrun)])
    return Table("Where the time went", ["backend", "graded cases", "per wall second", "per case second",
                                         "case seconds", "passing", f"slow (> {SLOW_FACTOR}x median)",
                                         "failures and shrinking", "refused", "known crashes not run"], rows,
                 "graded: every case run and not refused (a case a precise known crash or hang took is answered "
                 "unrun, one in 8 checked: the last column); per wall second over the campaign's first to last case, all lanes "
                 "together; per case second over the seconds the backend's own cases took (lanes in parallel add "
                 "up); slow: passing cases over 10 times the backend's median case, mostly a new kernel "
                 "configuration's compile or a long shape; failures: failing cases, their reruns and shrink steps")
