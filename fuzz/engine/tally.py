"""What a fuzz run saw (Tally), and the known bugs it went past, each by the corpus entry that took it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

NOTE_WIDTH = 72  # characters of a known bug's note on its summary line


@dataclass
class Tally:
    """What a fuzz run saw: examples per verdict label, refusals per reason, the worst passing ratio (error / bound;
    error / floor where a case was graded within its floor: oracles/tolerance.py, floor_first), how many of the
    batch-checked cases were batch invariant (attnfuzz.engine.batch), the KNOWN ones per label and entry, and once
    the search has ended, how many of the examples were new draws the backend did not refuse (the budget,
    max_examples, counts these) and how many replayed failures from the example database; the rest shrank failures,
    and ran each shrunk one once more to report it (engine/hooks.py)."""

    examples: int = 0
    labels: Counter = field(default_factory=Counter)
    unsupported: Counter = field(default_factory=Counter)
    worst_ratio: float = 0.0
    seconds: float = 0.0
    batch_checked: int = 0
    batch_invariant: int = 0
    known: dict = field(default_factory=dict)  # (KNOWN label, entry id) -> {"count", "note", "link"}
    new: int | None = None       # None until the search ends
    replayed: int = 0
    not_run: str | None = None   # the cases a known crash or hang took without running (engine/skip_known.py)

    @property
    def refused(self) -> int:
        """The examples the backend refused (UNSUPPORTED): not graded, and not counted by the budget."""
        return sum(self.unsupported.values())

    def add(self, verdict: V.Verdict) -> None:
        self.examples += 1
        if verdict.batch_invariant is not None:
            self.batch_checked += 1
            self.batch_invariant += verdict.batch_invariant
        self.labels[verdict.label] += 1
        if verdict.status == V.UNSUPPORTED:
            self.unsupported[verdict.message] += 1
        elif verdict.status == V.PASS:
            self.worst_ratio = max(self.worst_ratio, verdict.ratio)

    def note_phases(self, new: int, replayed: int) -> None:
        self.new, self.replayed = new, replayed

    def add_known(self, label: str, hit: dict) -> None:
        """One failure, counted as KNOWN under `label`, that the known bug `hit` took (store/known.py's record)."""
        seen = self.known.setdefault((label, hit.get("id") or hit.get("link", "")),
                                     {"count": 0, "note": hit.get("note", ""), "link": hit.get("link", "")})
        seen["count"] += 1

    def known_lines(self) -> list[str]:
        """A line per known bug the run went past, e.g. 'KNOWN:LSE 28 = sdpa-flash-FAIL-LSE-77f5c7de4c2f (torch's
        CPU flash kernel returns LSE 0, ...)': its label, how many cases, the entry, its note cut short."""
        lines = []
        for (label, entry), seen in sorted(self.known.items()):
            about = seen["note"] or seen["link"]
            if len(about) > NOTE_WIDTH:
                about = about[:NOTE_WIDTH - 3].rsplit(" ", 1)[0] + "..."
            lines.append(f"{label} {seen['count']} = {entry} ({about})")
        return lines

    def to_dict(self) -> dict:
        return {"examples": self.examples, "new_examples": self.new, "replayed_examples": self.replayed,
                "labels": dict(self.labels), "unsupported": dict(self.unsupported),
                "worst_pass_ratio": self.worst_ratio, "seconds": round(self.seconds, 3),
                "batch_invariance": {"checked": self.batch_checked, "invariant": self.batch_invariant},
                "known": [{"label": label, "entry": entry, **seen}
                          for (label, entry), seen in sorted(self.known.items())]}

    def batch_line(self) -> str:
        """The observed property, e.g. 'batch invariant on 12 of 15 checked cases'."""
        return f"batch invariant on {self.batch_invariant} of {self.batch_checked} checked cases"


class CountedKnown:
    """The harness's `known` predicate, counting in `tally` each failure it takes under the entry that took it, and
    naming that entry on the KNOWN verdict the search hands on (`named`): fuzz_property marks KNOWN without it (its
    source seeds Hypothesis's derandomized streams, store/known.py's mark_known says more)."""

    def __init__(self, known, tally: Tally):
        self.known, self.tally = known, tally
        self.last: tuple[Case, dict] | None = None

    def __call__(self, backend: str, case: Case, verdict: V.Verdict) -> dict | None:
        hit = self.known(backend, case, verdict)
        self.last = (case, hit) if hit is not None else None
        if hit is not None:
            self.tally.add_known(V.as_known(verdict, hit.get("link", ""), None).label, hit)
        return hit

    def named(self, case: Case, verdict: V.Verdict) -> V.Verdict:
        """A KNOWN verdict of the case just asked about, with the known bug's link and its entry's id."""
        if verdict.status != V.KNOWN or self.last is None or self.last[0] is not case:
            return verdict
        hit = self.last[1]
        return V.as_known(verdict, hit.get("link", ""), hit.get("id"))
