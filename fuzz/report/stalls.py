"""Stalls of a whole GPU in a campaign: spans in which most lanes sit in one slow case at once, and the crashes beside
them.

On a GPU, a CUDA fault's recovery in the driver stalls every process on the device for seconds (an H100 campaign of
12 SDPA lanes: 33 stalls of about 5.5 s, 30 % of its run, each beside a misaligned-address fault of a known bug). A
lane is stalled while it is in a case slower than SLOW_S; the campaign is stalled while at least SHARE of its lanes
are, at once, and the driver's recovery releases them together: at least SHARE of the lanes end their slow case
within RELEASE_S of each other. Lanes slow each on its own (kernels compiling, several JIT backends on a cold
machine) overlap without that: their slow cases end apart, and such a span is an overlap, not a stall. (On H100 logs
the four fault stalls of a 12-lane SDPA campaign ended 9 to 12 lanes' slow cases within a second; the ten spans of a
ten-backend campaign on a cold machine, 49 % of its run, 2 to 5.) The crashes beside a stall are the cases whose
process crashed or hung running them (known bugs too, not those the known-crash skip answered) and that overlap it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from attnfuzz.engine.skip_known import answered_unrun
from attnfuzz.oracles import verdict as V
from attnfuzz.report.table import Table

SLOW_S = 2.5     # a case slower than this may be a stalled one
SHARE = 0.6      # the share of the lanes that must be stalled at once
NEAR_S = 0.5     # a crash this close to a stall is beside it; stalls this close together are one
MIN_S = 1.0      # a shorter overlap of slow cases is no stall
RELEASE_S = 1.0  # a stall's slow cases end within this of each other: the recovery releases every lane at once


def crash_key(row: dict) -> str | None:
    """'backend label message' for a logged case whose process crashed or hung running it, else None."""
    verdict = row.get("verdict") or {}
    status, diagnosis = verdict.get("status"), verdict.get("diagnosis")
    crash = status in (V.CRASH, V.HANG) or (status == V.KNOWN and diagnosis is not None
                                            and diagnosis not in V.DIAGNOSES)
    if not crash or answered_unrun(str(row.get("message", ""))):
        return None
    message = str(row.get("message") or "").splitlines()
    return f"{row.get('backend')} {row.get('label')} {message[0][:60] if message else ''}".rstrip()


@dataclass
class Stalls:
    """The timed cases of a campaign's lanes: (start, end, lane, crash key) each."""

    cases: list[tuple[float, float, object, str | None]] = field(default_factory=list)

    def add(self, row: dict) -> None:
        """A case log line, where it carries its end time and lane."""
        if isinstance(row.get("time"), (int, float)) and "lane" in row:
            end, seconds = float(row["time"]), float(row.get("seconds") or 0.0)
            self.cases.append((end - seconds, end, row["lane"], crash_key(row)))

    def lanes_needed(self, share: float = SHARE) -> int:
        """How many lanes `share` of the campaign's lanes is, rounded up, two at least."""
        lanes = {lane for _, _, lane, _ in self.cases}
        return max(2, -(-int(round(share * 100)) * len(lanes) // 100))

    def spans(self, slow_s: float = SLOW_S, share: float = SHARE) -> list[tuple[float, float]]:
        """(start, end) of each span of MIN_S or more in which at least `share` of the lanes (two at least) are in a
        slow case; spans less than NEAR_S apart are one."""
        need = self.lanes_needed(share)
        events = sorted((t, step, lane) for start, end, lane, _ in self.cases if end - start > slow_s
                        for t, step in ((start, 1), (end, -1)))
        active: Counter = Counter()   # open slow cases per lane
        busy, found, opened = 0, [], None   # lanes with one open, spans found, the start of the one open
        for t, step, lane in events:
            busy += (active[lane] == 0) if step > 0 else -(active[lane] == 1)
            active[lane] += step
            if busy >= need and opened is None:
                opened = t
            elif busy < need and opened is not None:
                if found and opened - found[-1][1] < NEAR_S:   # a lane between two slow cases: one stall
                    opened = found.pop()[0]
                found.append((opened, t))
                opened = None
        return [(a, b) for a, b in found if b - a >= MIN_S]

    def released_together(self, span: tuple[float, float], slow_s: float = SLOW_S, share: float = SHARE) -> bool:
        """Whether at least `share` of the lanes (two at least) end a slow case that overlaps `span` within RELEASE_S
        of each other, as a GPU's recovery from a fault releases them."""
        a, b = span
        need = self.lanes_needed(share)
        ends = sorted((end, lane) for start, end, lane, _ in self.cases if end - start > slow_s and start <= b
                      and end >= a)
        return any(len({lane for t, lane in ends if 0 <= t - t0 <= RELEASE_S}) >= need for t0, _ in ends)

    def summary(self, slow_s: float = SLOW_S, share: float = SHARE) -> dict:
        """The stalls and the crashes beside them; spans of slow cases that did not end together (`overlaps`: lanes
        slow each on its own, kernels compiling) are counted apart."""
        found = self.spans(slow_s, share)
        spans = [span for span in found if self.released_together(span, slow_s, share)]
        overlaps = [span for span in found if span not in spans]
        span = (max(e for _, e, _, _ in self.cases) - min(s for s, _, _, _ in self.cases)) if self.cases else 0.0
        near, apart, touched = Counter(), Counter(), set()   # touched: the spans a crash stands beside
        for start, end, _, key in self.cases:
            if key is not None:
                beside = {i for i, (a, b) in enumerate(spans) if start <= b + NEAR_S and end >= a - NEAR_S}
                touched |= beside
                (near if beside else apart)[key] += 1
        stalled = sum(b - a for a, b in spans)
        lonely = len(spans) - len(touched)
        return {"lanes": len({lane for _, _, lane, _ in self.cases}), "span_s": round(span, 1), "stalls": len(spans),
                "stalled_s": round(stalled, 1), "stalled_share": round(stalled / span, 3) if span else 0.0,
                "lengths_s": [round(b - a, 1) for a, b in spans], "stalls_without_a_crash": lonely,
                "crashes_near_a_stall": dict(near.most_common()), "crashes_apart": dict(apart.most_common()),
                "overlaps": len(overlaps), "overlaps_s": round(sum(b - a for a, b in overlaps), 1)}

    def table(self) -> Table | None:
        """The report's table of the stalls and the crashes beside them; None where there was no stall."""
        s = self.summary()
        if not s["stalls"]:
            return None
        rows = [["all", str(s["stalls"]), f"{s['stalled_s']:.0f}", f"{s['stalled_share']:.0%}", ""]]
        rows += [[key, "", "", "", str(n)] for key, n in s["crashes_near_a_stall"].items()]
        return Table("Whole-GPU stalls", ["crash beside them", "stalls", "seconds", "share of the run", "crashes"],
                     rows, f"spans in which {SHARE:.0%} of the lanes or more sat in one case slower than {SLOW_S} s "
                     f"at once; on a GPU, a CUDA fault stalls every process on the device while the driver recovers. "
                     f"{s['stalls_without_a_crash']} stall(s) had no crash beside them; crashes apart from any "
                     f"stall: {sum(s['crashes_apart'].values())}. Spans whose slow cases did not end together "
                     f"(lanes slow each on its own, such as kernels compiling) are no stalls: {s['overlaps']} "
                     f"({s['overlaps_s']:.0f} s). The known-crash skip (fuzz/engine/skip_known.py) "
                     f"runs few of a known fault's cases; a new fault is a finding")
