"""What a search hears from Hypothesis, and what Hypothesis says to the user: the split of the examples it ran
(new draws, replays from the example database, shrinking) from its statistics, and its reports, minus the
"@seed(...)" advice it prints after a stop (Ctrl-C, SIGTERM), where nothing failed."""

from __future__ import annotations

import contextlib
import sys

from hypothesis import reporting, statistics

if sys.version_info < (3, 11):  # Python 3.10: the backport Hypothesis depends on there
    from exceptiongroup import BaseExceptionGroup


def phase_counts(stats: dict) -> tuple[int, int]:
    """(new, replayed): the calls of the generate and target phases, which the budget (max_examples) counts, and of
    the reuse phase, which replays the example database's failures. Rejected calls (a draw a filter took, a case
    the backend refused: engine/harness.py) are not counted."""
    def ran(phase: str) -> int:
        calls = stats.get(f"{phase}-phase", {}).get("test-cases", ())
        return sum(call.get("status") in ("valid", "interesting") for call in calls)
    return ran("generate") + ran("target"), ran("reuse")


def _stopping() -> bool:
    """Whether an interruption is unwinding the stack (Hypothesis reports while it handles the exception)."""
    error = sys.exc_info()[1]
    return isinstance(error, KeyboardInterrupt) or (isinstance(error, BaseExceptionGroup)
                                                   and error.subgroup(KeyboardInterrupt) is not None)


@contextlib.contextmanager
def listening(on_counts):
    """While active, on_counts(new, replayed) hears the search's split once it ends (and whoever listened before,
    Hypothesis's pytest plugin, still hears the statistics); Hypothesis's reports reach the reporter in place except
    while an interruption unwinds."""
    outer_stats, outer_report = statistics.collector.value, reporting.current_reporter()

    def noted(stats) -> None:
        on_counts(*phase_counts(stats))
        if outer_stats is not None:
            outer_stats(stats)

    def report(text) -> None:
        if not _stopping():
            outer_report(text)

    with statistics.collector.with_value(noted), reporting.with_reporter(report):
        yield
