"""One finding per root cause: Hypothesis shrinks each verdict label on its own, so one bug can come back under
several labels; the labels an alternative reference explains are attached to the finding it names.

A finding here is anything with `case`, `verdict` and an `attached` list (attnfuzz.engine.harness.Finding).
"""

from __future__ import annotations

from typing import Callable

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case


class Evidence:
    """What a run's failing outputs said about each FAIL label: the ALTERNATIVE diagnoses that every output failing
    with that label matched (its own, and the `also` of each verdict), over all the cases Hypothesis ran, shrinking
    included. A diagnosis in that set explains the label: no case of it, in this run, told them apart. Labels graded
    against no alternative (ALL_ZERO, NONFINITE, LSE, GRADIENT, TOLERANCE, crashes) are never explained; EMPTY_ROWS,
    which is decided first, is when its outputs all matched an alternative too."""

    def __init__(self) -> None:
        self.common: dict[str, frozenset[str]] = {}

    def add(self, verdict: V.Verdict) -> None:
        if verdict.status != V.FAIL or verdict.diagnosis not in V.ALTERNATIVE + (V.EMPTY_ROWS,):
            return  # a diagnosis graded against no alternative: nothing can explain it
        matched = frozenset((verdict.diagnosis, *verdict.also))
        self.common[verdict.label] = self.common.get(verdict.label, matched) & matched

    def explains(self, root, other) -> bool:
        """Whether `root`'s diagnosis explains every failing output of `other`'s label seen in this run."""
        return (root is not other and root.verdict.status == V.FAIL and root.verdict.diagnosis in V.ALTERNATIVE
                and root.verdict.diagnosis in self.common.get(other.verdict.label, ()))


def merge_root_causes(findings: list, evidence: Evidence, probe: Callable[[Case], V.Verdict] | None = None) -> list:
    """One finding per root cause. Hypothesis shrinks each verdict label on its own, so one bug can come back under
    several labels: a kernel that drops the causal mask is MASK_IGNORED on sq = skv = 3, but WINDOW_OFF_BY_ONE on
    sq = skv = 2 (the right bound moved by one hides every key too), MASK_ALIGNMENT on sq = 1, skv = 2 and
    EMPTY_ROWS on a bottom-right sq = 2, skv = 1.

    A finding B is attached to a finding A when A's diagnosis explains B's label: every output of B's label the run
    saw matched A's alternative reference as well (Evidence), and, with `probe` (runs a case through the backend),
    B's case grown by a few queries and keys (_grown) does not fail with B's label alone either. A small case can
    match both a moved bound and no band at all; a larger one tells a window bug from a dropped band. So a label with
    one output that A's reference does not explain is another bug and stays a finding of its own; so do findings
    that nothing explains, and those explained only by an attached one (no chains). B goes to the explaining root
    whose diagnosis comes last in the grader's order (the most general: no mask at all before one bound moved)."""
    told: dict[tuple[int, int], bool] = {}

    def explains(a, b) -> bool:
        if not evidence.explains(a, b):
            return False
        if probe is not None and (id(a), id(b)) not in told:
            told[id(a), id(b)] = any(v.status == V.FAIL and v.label == b.verdict.label
                                     and a.verdict.diagnosis not in (v.diagnosis, *v.also)
                                     for v in map(probe, _grown(b.case)))
        return not told.get((id(a), id(b)), False)

    roots = [a for a in findings if not any(explains(b, a) for b in findings)]
    merged = []
    for f in findings:
        by = [] if f in roots else [a for a in roots if explains(a, f)]
        if not by:
            merged.append(f)
            continue
        root = max(by, key=lambda a: V.ALTERNATIVE.index(a.verdict.diagnosis))
        root.attached.append((f.case, f.verdict))
    return merged


def _grown(case: Case) -> list[Case]:
    """The case with 3 and with 8 more queries and keys in every sequence (the alignment offset kept)."""
    grown = []
    for more in (3, 8):
        lens = {name: None if getattr(case, name) is None else tuple(n + more for n in getattr(case, name))
                for name in ("seqlens_q", "seqlens_kv")}
        try:
            grown.append(case.replace(sq=case.sq + more, skv=case.skv + more, **lens))
        except ValueError:  # a rule of the case language the larger case breaks
            continue
    return grown
