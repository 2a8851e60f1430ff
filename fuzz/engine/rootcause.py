"""One finding per root cause: Hypothesis shrinks each verdict label on its own, so one bug can come back under
several labels; the labels an alternative reference explains are attached to the finding it names, and so are the
findings whose probe twins name the same mask error (twin_name).

A finding here is anything with `case`, `verdict` and an `attached` list (attnfuzz.engine.harness.Finding).
"""

from __future__ import annotations

import math
from typing import Callable

from attnfuzz.oracles import probe as probe_values
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

# What a probe twin's failure names exactly, whatever the rounding: which keys a row counted, or which rows saw none.
TWIN_NAMES = (V.EMPTY_ROWS, V.MASK_ALIGNMENT, V.MASK_IGNORED, V.WINDOW_OFF_BY_ONE, V.MASK_LEAK, V.MASK_DROP,
              V.GQA_MAPPING)
# The failures a twin may attach to a mask error: those named by it, and those whose grade names no cause of its own.
# A SCALE, an ALL_ZERO or a crash names another cause, and stays a finding even where its case also has the mask error.
TWIN_TAKES = TWIN_NAMES + (V.TOLERANCE, V.LSE, V.GRADIENT, V.NONFINITE)


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
    return merge_twins(merged, probe) if probe is not None else merged


def probe_twin(case: Case) -> Case | None:
    """The case with probe values (q = 0, v of 0 / 1: oracles/probe.py grades it exactly), where it can have them;
    the case itself when it has them already."""
    if case.values == "probe":
        return case
    if case.fp8 is not None or case.alibi_slopes is not None:
        return None
    try:
        twin = case.replace(values="probe")
    except ValueError:   # a rule of the case language that probe values break
        return None
    return twin if probe_values.applies(twin) else None


def twin_name(case: Case, verdict: V.Verdict, probe: Callable[[Case], V.Verdict]) -> str | None:
    """The mask error (TWIN_NAMES) a FAIL's probe twin fails with, run through `probe`; None when the twin passes,
    fails otherwise or cannot be drawn, and for a failure whose grade names another cause (not in TWIN_TAKES). A
    failure of a probe case is its own twin. A twin names which keys the rows counted, exactly: a leaked key reads
    MASK_LEAK on a probe case and TOLERANCE or LSE on Gaussian values of the same shape and mask; a wrong softmax
    scale or a rounding error leaves the twin passing (q = 0 makes every logit 0). Where the twin matches an
    alternative (one leaked key on sq = 2 reads as a bound moved by one), the twin grown by 3 and 8 queries and keys
    names it MASK_LEAK or MASK_DROP if it reads so."""
    if verdict.status != V.FAIL or verdict.diagnosis not in TWIN_TAKES:
        return None
    twin = probe_twin(case)
    if twin is None:
        return None
    name = _named_by(verdict if twin is case else probe(twin))
    if name in V.ALTERNATIVE:   # a small twin can read as a moved bound where a larger one says a key too many
        for grown in _grown(twin):
            effect = _named_by(probe(grown))
            if effect in (V.MASK_LEAK, V.MASK_DROP):
                return effect
    return name


def _named_by(said: V.Verdict) -> str | None:
    if said.status != V.FAIL:
        return None
    return said.diagnosis if said.diagnosis in TWIN_NAMES else _lse_counts_keys(said)


def _lse_counts_keys(verdict: V.Verdict) -> str | None:
    """MASK_LEAK / MASK_DROP for a probe case's LSE that counted whole keys too many / too few (with q = 0, exp(lse)
    is the row's key count, plus exp(sink): a twin whose v is one channel reads the same share whatever keys it
    counts, its LSE does not)."""
    w = verdict.worst
    if verdict.diagnosis != V.LSE or w is None or not w.tensor.startswith("lse") or max(w.got, w.expected) > 700:
        return None
    moved = math.exp(w.got) - math.exp(w.expected)
    if abs(moved - round(moved)) > probe_values.WHOLE_KEY or round(moved) == 0:
        return None
    return V.MASK_LEAK if moved > 0 else V.MASK_DROP


def twin_known(backend: str, finding, probe: Callable[[Case], V.Verdict], known) -> dict | None:
    """The known bug (`known`'s record) that a finding's probe twin fails as, where the twin names a mask error: a
    dropped mask marked known stays known when it comes back as TOLERANCE on Gaussian values. None otherwise."""
    if known is None or finding.verdict.diagnosis not in TWIN_TAKES or finding.verdict.status != V.FAIL:
        return None
    twin = probe_twin(finding.case)
    if twin is None or twin is finding.case:
        return None
    said = probe(twin)
    return known(backend, twin, said) if _named_by(said) is not None else None


def by_twin(root: V.Verdict, attached: V.Verdict) -> bool:
    """Whether an attached failure joined its root by their probe twins (a label that names no cause, which the
    root's alternative does not explain), rather than because its output matched the root's alternative too."""
    generic = attached.diagnosis in TWIN_TAKES and attached.diagnosis not in TWIN_NAMES
    return generic and root.diagnosis not in attached.also


def merge_twins(findings: list, probe: Callable[[Case], V.Verdict]) -> list:
    """Findings whose probe twins fail with the same mask error are one root cause: each is attached (with what it
    carries) to the smallest of those whose own diagnosis is that error, else to the smallest. A finding whose twin
    passes stays a finding of its own: a precision error beside a leaked key is another bug."""
    names = [twin_name(f.case, f.verdict, probe) for f in findings]
    roots: dict[str, object] = {}
    for f, name in sorted(zip(findings, names), key=lambda fn: fn[0].case.size):
        if name is not None and (name not in roots or f.verdict.diagnosis == name != roots[name].verdict.diagnosis):
            roots[name] = f
    merged = []
    for f, name in zip(findings, names):
        root = roots.get(name) if name is not None else None
        if root is None or root is f:
            merged.append(f)
        else:
            root.attached += [(f.case, f.verdict), *f.attached]
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
