"""What a worker process's end says (fuzz/engine/isolate.py): the name of its death, a death that was not its case's,
and an exception of attnfuzz's own that the worker hands back instead of dying of it."""

from __future__ import annotations

import dataclasses
import signal

from attnfuzz.strategies.case import Case


@dataclasses.dataclass(frozen=True)
class HarnessError:
    """attnfuzz's own exception in a worker (drawing the inputs, the oracle, grading), as its traceback: not the
    backend's crash, so not a finding."""

    traceback: str


class WorkerHarnessError(RuntimeError):
    """Raised in the parent for a HarnessError: the run fails as an in-process run would, naming attnfuzz."""


def death_name(exitcode: int | None) -> str:
    """SIGSEGV, SIGABRT, ... for a signal; EXIT_<n> for an exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"SIGNAL_{-exitcode}"
    return f"EXIT_{exitcode}"


@dataclasses.dataclass(frozen=True)
class UnattributedDeath:
    """A worker that died on `case` after answering `answered` cases (the last: `before`), where a fresh worker then
    ran `case` to `fresh_label`: the death was not that case's."""

    death: str
    case: Case
    answered: int
    before: Case | None
    fresh_label: str

    def describe(self) -> str:
        return (f"a worker died ({self.death}) on {self.case!r} after answering {self.answered} case(s) (the last: "
                f"{self.before!r}), and a fresh worker ran that case to {self.fresh_label}: an unattributed worker "
                f"death, not that case's crash")

    def to_dict(self) -> dict:
        return {"death": self.death, "case": self.case.to_dict(), "answered": self.answered,
                "before": self.before.to_dict() if self.before is not None else None, "fresh_label": self.fresh_label}
