"""Grading: a backend's Output against the float64 oracle, and a name for what went wrong.

A tensor returned in another shape than the contract's is SHAPE, before any value is compared. Rows that see no key
and are wrong (not 0, NaN included) are EMPTY_ROWS when the other rows pass; else those rows are graded alone. A
failing output is graded again against alternative references (the other alignment, each window bound moved by one,
no band at all, the modulo head mapping, other scales); the diagnosis is the alternative it matches, TOLERANCE when
none does. Gradients are graded in gradients.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import torch

from attnfuzz.oracles import probe, shift
# d_inherited and gradient_check: imported from here by their callers
from attnfuzz.oracles.gradients import (d_inherited, fused_backward, gradient_check,  # noqa: F401
                                       gradient_terms, grade_grads)
from attnfuzz.oracles.alternatives import alternatives, fail, valid_rows, wrong_shape
from attnfuzz.oracles.hull import range_failure
from attnfuzz.oracles import fp8
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.reference import Reference, reference
from attnfuzz.oracles.tolerance import ROWSUM_OF_ROUNDED_P, Check, check, dominated_dot, rounded_rowsum_lse
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, torch_dtype


@dataclass(frozen=True)
class Oracle:
    """The float64 reference of one case, computed once, graded against many outputs, and its baselines, each
    computed on first use: the naive same-dtype one (with the textbook gradients unless the oracle was made for a
    family graded against the fused baseline: `of(..., family=...)`), the fp32 LSE and the fused gradients. Grading
    asks for a baseline only where an error passes the rounding floor (tolerance.check's `floor_first`), which on
    correct kernels is rare, so most cases never build one."""

    case: Case
    tensors: Tensors
    ref: Reference
    naive_grads: bool | None = None  # the naive baseline's gradients: None as the case asks, False none (fused family)

    @classmethod
    def of(cls, case: Case, tensors: Tensors, device=None, family: str | None = None) -> Oracle:
        # The D terms are read by fused grading alone: skipped for a family graded textbook (a family not named yet
        # may be either); the rest terms likewise by a family that sums P rounded
        fused = family is None or fused_backward(case, family)
        rest = family is None or family in ROWSUM_OF_ROUNDED_P  # the terms only such a family's LSE bound reads
        ref = reference(case, tensors, device=device, d_terms=fused, rest_terms=rest)
        return cls(case, tensors, ref, False if family is not None and fused else None)

    @cached_property
    def naive(self) -> Reference:
        """The naive baseline: the reference computed in the case's dtype. Where that overflows (extreme logits would
        make the bound infinite), in fp32."""
        device = self.ref.out.device
        naive = reference(self.case, self.tensors, dtype=torch_dtype(self.case), device=device,
                          grads=self.naive_grads, terms=False)
        if not _finite_where(naive, self.ref):
            naive = reference(self.case, self.tensors, dtype=torch.float32, device=device, grads=self.naive_grads,
                              terms=False)
        return naive

    @cached_property
    def lse_baseline(self) -> torch.Tensor:
        """Kernels keep the LSE in fp32 whatever the input dtype, so its baseline is the reference computed in fp32
        from the same inputs (for fp16/bf16 the naive dtype-precision LSE would allow 100x too much); computed once
        per case, however many outputs are graded against it (the fused gradient baseline's, where the case grades
        gradients against it: its forward pass is that computation)."""
        if self.case.dtype in ("float32", "float64"):
            return self.naive.lse
        if self.case.grads and self.naive_grads is False:
            return self.fused_grads.lse
        return reference(self.case, self.tensors, dtype=torch.float32, device=self.ref.lse.device, grads=False,
                         terms=False).lse

    def lse_baseline_of(self, family: str) -> torch.Tensor:
        """The LSE baseline of `family`: lse_baseline, or for a family that sums P rounded to the input dtype
        (tolerance.ROWSUM_OF_ROUNDED_P), the fp32 reference whose row sum is taken so."""
        if family not in ROWSUM_OF_ROUNDED_P or self.case.dtype not in ("float16", "bfloat16"):
            return self.lse_baseline
        return self._rounded_rowsum_lse

    @cached_property
    def _rounded_rowsum_lse(self) -> torch.Tensor:
        return reference(self.case, self.tensors, dtype=torch.float32, device=self.ref.lse.device, grads=False,
                         terms=False, rowsum=torch_dtype(self.case)).lse

    @cached_property
    def textbook_grads(self) -> Reference:
        """The gradients of the textbook backward in the dtype: autograd through the naive baseline."""
        if self.naive.dq is not None or not self.case.grads:
            return self.naive
        naive = reference(self.case, self.tensors, dtype=torch_dtype(self.case), device=self.ref.out.device,
                          terms=False)
        if not _finite_where(naive, self.ref):
            naive = reference(self.case, self.tensors, dtype=torch.float32, device=self.ref.out.device, terms=False)
        return naive

    @cached_property
    def fused_grads(self) -> Reference:
        """The gradients of a fused backward (fp32, P and dS rounded to the dtype: reference's `rounding`), and its
        fp32 LSE. Where the rounding overflows the dtype (|dS| past fp16's largest), no rounding: the fp32 backward."""
        device = self.ref.out.device
        fused = reference(self.case, self.tensors, dtype=torch.float32, device=device, terms=False,
                          rounding=torch_dtype(self.case))
        if not _finite_where(fused, self.ref):
            fused = reference(self.case, self.tensors, dtype=torch.float32, device=device, terms=False)
        return fused

    def grad_baseline(self, family: str) -> Reference:
        """The reference whose dQ / dK / dV are this family's baseline: fused or textbook (tolerance.FUSED_BACKWARD)."""
        return self.fused_grads if fused_backward(self.case, family) else self.textbook_grads

    @cached_property
    def gradient_terms(self) -> dict:
        """gradients.gradient_terms, computed once for the three gradients."""
        return gradient_terms(self)

    @cached_property
    def out_baseline(self) -> torch.Tensor:
        """|naive - f64| of the output: what the diagnoses grade alternatives with."""
        return (self.naive.out.to(torch.float64) - self.ref.out).abs().nan_to_num(nan=0.0, posinf=0.0)


def _finite_where(naive: Reference, ref: Reference) -> bool:
    """Whether the naive baseline is finite wherever the reference is."""
    pairs = [(naive.out, ref.out), (naive.lse, ref.lse), (naive.dq, ref.dq), (naive.dk, ref.dk), (naive.dv, ref.dv)]
    # (a baseline finite everywhere, the usual case, needs no look at the reference)
    return all(bool(torch.isfinite(n).all()) or bool((torch.isfinite(n) | ~torch.isfinite(r)).all())
               for n, r in pairs if n is not None)


def check_out(o: Oracle, out: torch.Tensor, ref_out: torch.Tensor, family: str, name: str = "out",
              where: torch.Tensor | None = None, floor_first: bool = False, bounds: Reference | None = None) -> Check:
    """The output graded row by row against `ref_out` (the oracle's, or an alternative's with the oracle's own
    baseline), on the valid rows or on `where` [b, sq]; each row's bound from `bounds`' row terms (an alternative's
    rows see other keys, larger logits among them), the oracle's unless given. `floor_first`: the baseline only
    where an error passes the floor (tolerance.check)."""
    rows = (valid_rows(o.case, ref_out.device) if where is None else where)[:, :, None, None]
    r = o.ref if bounds is None else bounds
    size = r.row_logit_size.transpose(1, 2) if r.row_logit_size is not None else r.logit_size
    return check(name, out.to(ref_out.device), ref_out, None, rows, family=family, quantity="out",
                 dtype=o.case.dtype, logit_size=size, spread=r.row_spread, bias_max=r.bias_max,
                 baseline=lambda: o.out_baseline, keys=o.case.skv, rms=r.row_rms,
                 dot_terms=dominated_dot(o.case), softcap=o.case.softcap, floor_first=floor_first,
                 quantised=fp8.allowance(o.case, o.tensors, r, family))


def diagnose(o: Oracle, out: torch.Tensor, failed: Check, family: str,
             rows: torch.Tensor | None = None) -> V.Verdict:
    """The first alternative reference the failing output matches, within the same bound; TOLERANCE otherwise. The
    verdict's `also` lists the other alternatives' diagnoses the output matches too (a dropped causal mask on
    sq = skv = 2 matches both the right bound moved by one and no mask at all). `rows` [b, sq]: the rows the
    alternatives are graded on (the valid rows unless given: _empty_rows leaves out the rows that see no key)."""
    matched = _matching(o, out, family, rows)
    if matched:
        (diagnosis, description), others = matched[0], matched[1:]
        verdict = fail(diagnosis, f"{description}; {failed.describe()}", failed, failed.ratio)
        return dataclasses.replace(verdict, also=tuple(d for d, _ in others))
    if probe.applies(o.case):  # no alternative explains it: on a probe, the sign says a key too many or too few
        return probe.name_failure(o, out, failed)
    return fail(V.TOLERANCE, failed.describe(), failed, failed.ratio)


def _matching(o: Oracle, out: torch.Tensor, family: str, rows: torch.Tensor | None = None) -> list[tuple[str, str]]:
    """(diagnosis, description) of each alternative the output matches, every row (of `rows`, the valid rows unless
    given) within its own bound, in the order alternatives() gives them, one per diagnosis. An alternative the
    oracle's own output matches as well names nothing: within its bound it cannot be told from the right answer (a
    row that sees one key reads the same at any scale, and scale 1 on far logits widens the bound to match anything)."""
    matched: list[tuple[str, str]] = []
    for diagnosis, description, overrides in alternatives(o.case):
        if any(diagnosis == d for d, _ in matched):
            continue  # one match per diagnosis is enough
        alt_case = overrides.pop("case", o.case)
        alt = reference(alt_case, o.tensors, device=o.ref.out.device, grads=False, **overrides)
        if (check_out(o, out, alt.out, family, where=rows, bounds=alt).ok  # each row within its bound of the alternative
                and not check_out(o, o.ref.out, alt.out, family, where=rows, bounds=alt).ok):
            matched.append((diagnosis, description))
    for diagnosis, description, tensors in fp8.alternatives(o.case, o.tensors):  # FP8 descales twice or missing
        if any(diagnosis == d for d, _ in matched):
            continue
        alt = reference(o.case, tensors, device=o.ref.out.device, grads=False)
        if check_out(o, out, alt.out, family, where=rows, bounds=alt).ok:
            matched.append((diagnosis, description))
    return matched


def grade(case: Case, tensors: Tensors, output: V.Output, *, family: str = "default",
          oracle: Oracle | None = None) -> V.Verdict:
    """PASS, or FAIL with a diagnosis and the worst element, for one backend output (on a row with a logit shift,
    the failure says what the shift means: oracles/shift.py)."""
    o = oracle or Oracle.of(case, tensors)
    verdict = _graded(case, output, family, o)
    return shift.explain(o, output, verdict, family) if verdict.failed else verdict


def _graded(case: Case, output: V.Output, family: str, o: Oracle) -> V.Verdict:
    device = o.ref.out.device
    out = output.out.to(device)
    wrong = wrong_shape("out", out, o.ref.out)
    if wrong is not None:
        return wrong
    empty = _empty_rows(o, out, family)
    if empty is not None:
        return empty
    checks: list[Check] = []
    verdict = _graded_out(o, out, family, checks)
    if verdict is not None:
        return verdict
    exact = probe.applies(case)
    if output.lse is not None:
        verdict = _grade_lse(o, output.lse.to(device), family, checks)
        if verdict is None and exact:
            verdict = probe.grade_lse(o, output.lse.to(device), checks)
        if verdict is not None:
            return verdict
    if case.grads:
        verdict = grade_grads(o, output, family, checks)
        if verdict is not None:
            return verdict
    ratio = max(c.ratio for c in checks)
    return V.Verdict(V.PASS, None, "", None, ratio, tuple(c.describe() for c in checks))


def _graded_out(o: Oracle, out: torch.Tensor, family: str, checks: list[Check],
                rows: torch.Tensor | None = None) -> V.Verdict | None:
    """The output's FAIL (NONFINITE, ALL_ZERO, or diagnose's name), or None where it passes; its checks appended to
    `checks`. `rows` [b, sq]: the rows alternatives are graded on (diagnose)."""
    graded = out[valid_rows(o.case, out.device)]
    if graded.numel() and not bool(torch.isfinite(graded).all()):
        c = check_out(o, out, o.ref.out, family, floor_first=True)
        return fail(V.NONFINITE, f"non-finite output, first at {list(c.index)}: {c.got}", c)
    c = check_out(o, out, o.ref.out, family, floor_first=True)
    checks.append(c)
    if not c.ok:
        if graded.numel() and bool((graded == 0).all()):  # zeros that the bound does not excuse (underflow does)
            return fail(V.ALL_ZERO, f"every graded output element is 0; the oracle's largest is "
                                     f"{o.ref.out[valid_rows(o.case, out.device)].abs().max().item():.6g}", c)
        return diagnose(o, out, c, family, rows)
    device = o.ref.out.device
    outside = range_failure(o.case, o.ref.row_v_lo, o.ref.row_v_hi, o.tensors.v, out.to(device),
                            valid_rows(o.case, device) & ~o.ref.empty)
    if outside is not None:   # within its bound, yet no weighting of the keys the row sees gives it
        checks.append(outside)
        return diagnose(o, out, outside, family, rows)
    return probe.grade_out(o, out, checks, rows) if probe.applies(o.case) else None


def _empty_rows(o: Oracle, out: torch.Tensor, family: str) -> V.Verdict | None:
    """None unless a valid row that sees no key is wrong (beyond its bound of 0, NaN or inf). Then EMPTY_ROWS where
    the output's rows that see a key pass, whatever the wrong value is; its `also` lists every alternative the whole
    output matches (on a bottom-right sq = 2, skv = 1 a dropped causal mask is EMPTY_ROWS and matches no mask at
    all). Where those rows fail too, the verdict is theirs, graded alone (the empty rows set to the oracle's 0 and
    left out of the alternatives), and says the empty rows are wrong too: a second bug stays in sight."""
    rows = valid_rows(o.case, out.device)
    empty = rows & o.ref.empty
    if not bool(empty.any()) or bool((out[empty].to(torch.float64) == o.ref.out[empty]).all()):
        return None   # none, or each the oracle's own 0: within any bound, so no check is built
    wrong = check_out(o, out, o.ref.out, family, where=empty, floor_first=True)  # no baseline where they pass
    if wrong.ok:
        return None
    seen = rows & ~o.ref.empty
    alone = torch.where(o.ref.empty[:, :, None, None], o.ref.out.to(out.dtype), out)
    verdict = _graded_out(o, alone, family, [], seen)
    if verdict is None:
        verdict = fail(V.EMPTY_ROWS, f"rows that see no key must be 0 (every other row passes); {wrong.describe()}",
                       wrong, wrong.ratio)
        return dataclasses.replace(verdict, also=tuple(d for d, _ in _matching(o, out, family)))
    return dataclasses.replace(verdict, message=f"{verdict.message}; the rows that see no key are wrong too (they "
                                                f"must be 0, got {wrong.got:.6g} at {list(wrong.index)})")


def lse_check(o: Oracle, lse: torch.Tensor, family: str, floor_first: bool = False) -> Check:
    """The LSE's check over the rows that see a key (each row against its own bound: `row_bounds`, inf elsewhere).
    `floor_first`: the baseline only where an error passes the floor (tolerance.check)."""
    ref = o.ref.lse
    rows = valid_rows(o.case, ref.device)[:, None, :].expand_as(ref)
    size = o.ref.row_logit_size if o.ref.row_logit_size is not None else o.ref.logit_size
    rounded_p = rounded_rowsum_lse(family, o.case.dtype, o.ref.row_rest_rms, o.ref.row_rest_mass)
    return check("lse", lse, ref, lambda: o.lse_baseline_of(family), rows & torch.isfinite(ref), family=family,
                 quantity="lse", dtype=o.case.dtype, logit_size=size, bias_max=o.ref.bias_max,
                 dot_terms=dominated_dot(o.case), softcap=o.case.softcap, floor_first=floor_first,
                 quantised=rounded_p, keys=o.case.skv)


def _grade_lse(o: Oracle, lse: torch.Tensor, family: str, checks: list[Check]) -> V.Verdict | None:
    ref = o.ref.lse
    wrong = wrong_shape("lse", lse, ref)
    if wrong is not None:
        return wrong
    rows = valid_rows(o.case, ref.device)[:, None, :].expand_as(ref)
    empty = rows & torch.isinf(ref)
    if bool(empty.any()) and not bool((lse[empty] == ref[empty]).all()):
        idx = tuple(int(i) for i in torch.nonzero(empty & (lse != ref))[0])
        c = Check("lse", math.inf, 0.0, 1.0, 0.0, idx, lse[idx].item(), ref[idx].item())
        return fail(V.LSE, f"a row with no visible key must have lse {ref[idx].item()}, got {lse[idx].item()} "
                            f"at {list(idx)}", c)
    c = lse_check(o, lse, family, floor_first=True)
    checks.append(c)
    return None if c.ok else fail(V.LSE, c.describe(), c, c.ratio, [x.describe() for x in checks])
