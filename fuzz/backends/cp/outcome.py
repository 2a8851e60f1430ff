"""The exceptions a CP run raises besides Unsupported: a raising rank (RankCrash, which the harness records as CRASH)
and a hung collective (CollectiveHang, a Hang: HANG). The harness (attnfuzz.engine.harness.run_case) grades
everything else against the float64 oracle of the whole sequence."""

from __future__ import annotations

from attnfuzz.backends.base import Hang


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

