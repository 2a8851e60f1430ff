"""From a CP backend's run to a Verdict: the exceptions a CP run raises besides Unsupported, and
`run_and_grade`, which maps a refusal to UNSUPPORTED, a raising rank to CRASH, a hung collective to HANG and grades
everything else against the float64 oracle of the whole sequence (attnfuzz.oracles.grade.grade)."""

from __future__ import annotations

from attnfuzz.backends.base import Backend, Hang
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case


class RankCrash(Exception):
    """One or more ranks raised; the message holds each rank's traceback."""


def crash_message(name: str, message: str, rank_errors: dict[int, str], width: int = 200) -> str:
    """`name: message: <each rank's exception line>`, then the full tracebacks. The exception lines come first so
    that a log or verdict that keeps only the head of the message still says what each rank raised."""
    lines: dict[str, list[int]] = {}
    for rank, tb in sorted(rank_errors.items()):
        last = next((ln.strip() for ln in reversed(tb.strip().splitlines()) if ln.strip()), "?")
        lines.setdefault(last[:width], []).append(rank)
    head = "; ".join(f"rank {ranks[0] if len(ranks) == 1 else ranks}: {line}" for line, ranks in lines.items())
    detail = "\n".join(f"--- rank {r} ---\n{tb.rstrip()}" for r, tb in sorted(rank_errors.items()))
    return f"{name}: {message}" + (f": {head}\n{detail}" if rank_errors else "")


class CollectiveHang(Hang):
    """Some rank gave no answer within the timeout; the pool was restarted and the case saved at `saved`."""

    def __init__(self, message: str, saved: str | None):
        super().__init__(message)
        self.saved = saved


def run_and_grade(backend: Backend, case: Case, *, oracle_device: str = "cpu") -> V.Verdict:
    """Run `case` on `backend` and grade it, as the harness does (attnfuzz.engine.harness.run_case): a refusal is
    UNSUPPORTED, a raising rank CRASH, a hung collective HANG; the CP-vs-non-CP second signal, when the backend
    gives one, is appended to the verdict's checks, never graded."""
    from attnfuzz.engine.harness import run_case
    return run_case(backend, case, device=oracle_device)
