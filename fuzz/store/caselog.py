"""The per-case log: one JSON line per case run (`attnfuzz run --log`, a campaign's cases/lane<i>.jsonl), appended
and flushed as it goes so a killed run keeps its record; and reading it back, past a line a kill cut short."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from attnfuzz.oracles.verdict import Verdict, known_bug_check
from attnfuzz.strategies.case import Case

# The link a campaign gives a failure it counts as KNOWN because it saved that bug already (fuzz/campaign/lane.py, seen_in);
# the report tells those apart from the corpus's known bugs by it.
SEEN_HERE = "this campaign's corpus"


def seen_here(row: dict) -> bool:
    """Whether a logged KNOWN case was a bug this campaign had found, not one of the corpus's known bugs."""
    checks = (row.get("verdict") or {}).get("checks") or ()
    return known_bug_check(SEEN_HERE) in checks


def record(backend: str, case: Case, graded: Verdict, seconds: float, **extra) -> str:
    """One log line: backend, verdict label, error ratio, message, seconds, the case, and any `extra` fields (a
    campaign adds lane, time and the whole verdict)."""
    ratio = graded.ratio if graded.ratio == graded.ratio and abs(graded.ratio) != float("inf") \
        else str(graded.ratio)  # JSON has no inf / nan
    return json.dumps({"backend": backend, "label": graded.label, "ratio": ratio, "message": graded.message[:300],
                       "seconds": round(seconds, 4), "case": case.to_dict(), **extra}) + "\n"


def log_files(source: Path) -> list[Path]:
    """The case logs of `source`: a campaign directory's cases/*.jsonl, else a folder's *.jsonl, else the file."""
    source = Path(source)
    if not source.is_dir():
        return [source]
    return sorted((source / "cases").glob("*.jsonl")) or sorted(source.glob("*.jsonl"))


def rows(path: Path) -> Iterator[dict]:
    """Every complete line of a log as a dict; a line that does not parse (cut by a kill) is skipped."""
    with Path(path).open(errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield row
