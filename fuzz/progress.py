"""What `attnfuzz run` shows and keeps as it goes: the status line per backend, and the case log of --log."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from attnfuzz.engine.harness import Tally
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.store import caselog
from attnfuzz.strategies.case import Case


class Progress:
    """One status line on stderr, redrawn at most every 0.2 s (a plain line every 10 s when not a terminal)."""

    def __init__(self, name: str, total: int):
        self.name, self.total, self.last, self.start = name, total, 0.0, time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, tally: Tally, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self.last < (0.2 if self.tty else 10.0):
            return
        self.last = now
        rate = tally.examples / max(now - self.start, 1e-9)
        counts = "  ".join(f"{k} {v}" for k, v in sorted(tally.labels.items()))
        line = f"[{self.name}] {examples(tally, self.total)}, {rate:.1f}/s  {counts}"
        sys.stderr.write(("\r" + line[:150].ljust(150)) if self.tty else line + "\n")
        if final and self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def examples(tally: Tally, budget: int) -> str:
    """'57/100 examples' while that is all there is to say; the cases the backend refused, which the budget
    (max_examples) does not count; where Hypothesis ran more than its budget of new draws, what the others did:
    replay failures from the example database, shrink failures and report them."""
    ran = tally.examples - tally.refused
    also = f", {tally.refused} refused" if tally.refused else ""
    if tally.new is None:  # during the search: only the budget is known
        if ran <= budget:
            return f"{ran}/{budget} examples{also}"
        return f"{ran} examples (at most {budget} new; the rest replay or shrink failures){also}"
    shrinking = ran - tally.new - tally.replayed
    if not tally.replayed and shrinking <= 0:
        return f"{ran}/{budget} examples{also}"
    parts = [f"{tally.new} new of {budget}"] + [f"{tally.replayed} from the example database"] * bool(
        tally.replayed) + [f"{shrinking} shrinking"] * bool(shrinking)
    return f"{ran} examples ({', '.join(parts)}){also}"


class CaseLog:
    """One JSON line per case run, flushed as it goes, so a run that is killed still leaves its record."""

    def __init__(self, path: Path | None, backend: str, device: str = "cpu"):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a") if path else None
        self.backend, self.device, self.last = backend, device, time.perf_counter()

    def write(self, case: Case, verdict: Verdict) -> None:
        if self.file is None:
            return
        now = time.perf_counter()
        self.file.write(caselog.record(self.backend, case, verdict, now - self.last, verdict=verdict.to_dict(),
                                       device=self.device))
        self.file.flush()
        self.last = now

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
