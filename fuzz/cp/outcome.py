"""From a CP backend's run to a Verdict: the exceptions a CP run raises besides Unsupported, and
`run_and_grade`, which maps a refusal to UNSUPPORTED, a raising rank to CRASH, a hung collective to HANG and grades
everything else against the float64 oracle of the whole sequence (oracles.grade.grade)."""

from __future__ import annotations

import dataclasses

from fuzz.backends.base import Backend, Unsupported
from oracles import verdict as V
from oracles.grade import grade
from strategies.case import Case
from strategies.materialize import materialize


class RankCrash(Exception):
    """One or more ranks raised; the message holds each rank's traceback."""


class CollectiveHang(Exception):
    """Some rank gave no answer within the timeout; the pool was restarted and the case saved at `saved`."""

    def __init__(self, message: str, saved: str | None):
        super().__init__(message)
        self.saved = saved


def run_and_grade(backend: Backend, case: Case, *, oracle_device: str = "cpu") -> V.Verdict:
    """Run `case` on `backend` and grade it. The oracle sees the same tensors the ranks drew from the seed. The
    backend's second signal (CP vs non-CP), when it gives one, is appended to the verdict's checks, never graded."""
    reason = backend.unsupported(case)
    if reason:
        return V.Verdict(V.UNSUPPORTED, message=reason)
    tensors = materialize(case, oracle_device)
    try:
        output = backend.run(case, tensors)
    except Unsupported as e:
        return V.Verdict(V.UNSUPPORTED, message=str(e))
    except CollectiveHang as e:
        return V.Verdict(V.HANG, message=str(e))
    except RankCrash as e:
        return V.Verdict(V.CRASH, message=str(e))
    verdict = grade(case, tensors, output, family=backend.family)
    signal = getattr(backend, "last_agreement", None)
    if signal is not None:
        verdict = dataclasses.replace(verdict, checks=verdict.checks + (signal.describe(),))
    return verdict
