"""Grading: a backend's Output against the float64 oracle, and a name for what went wrong.

A tensor returned in another shape than the contract's is SHAPE, before any value is compared. A failing output is
graded again against alternative references (the other alignment, each window bound moved by one, no band at all, the
modulo head mapping, other scales); the diagnosis is the alternative it matches, TOLERANCE when none does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import torch

from attnfuzz.oracles import probe, shift
from attnfuzz.oracles.alternatives import alternatives, fail, valid_keys, valid_rows, wrong_shape
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.reference import Reference, reference
from attnfuzz.oracles.tolerance import (FUSED_BACKWARD, LOW_PRECISION, P_ROUNDING_SIGMAS, UNIFORM_SD, Check, check,
                                        dominated_dot)
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, torch_dtype


def fused_backward(case: Case, family: str) -> bool:
    """Whether this family's gradients are graded against the fused baseline (tolerance.FUSED_BACKWARD); in fp32 /
    fp64 a fused backward rounds nothing before the end, and the naive baseline is the same computation."""
    return case.grads and case.dtype in LOW_PRECISION and family in FUSED_BACKWARD


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
        # may be either)
        fused = family is None or fused_backward(case, family)
        ref = reference(case, tensors, device=device, d_terms=fused)
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
        """_gradient_terms, computed once for the three gradients."""
        return _gradient_terms(self)

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
              where: torch.Tensor | None = None, floor_first: bool = False) -> Check:
    """The output graded row by row against `ref_out` (the oracle's, or an alternative's with the oracle's own
    baseline), on the valid rows or on `where` [b, sq]. `floor_first`: the baseline only where an error passes the
    floor (tolerance.check)."""
    rows = (valid_rows(o.case, ref_out.device) if where is None else where)[:, :, None, None]
    size = o.ref.row_logit_size.transpose(1, 2) if o.ref.row_logit_size is not None else o.ref.logit_size
    return check(name, out.to(ref_out.device), ref_out, None, rows, family=family, quantity="out",
                 dtype=o.case.dtype, logit_size=size, spread=o.ref.row_spread, bias_max=o.ref.bias_max,
                 baseline=lambda: o.out_baseline, keys=o.case.skv, rms=o.ref.row_rms,
                 dot_terms=dominated_dot(o.case), softcap=o.case.softcap, floor_first=floor_first)


def diagnose(o: Oracle, out: torch.Tensor, failed: Check, family: str) -> V.Verdict:
    """EMPTY_ROWS when only rows that see no key are wrong; else the first alternative reference the failing output
    matches, within the same bound; TOLERANCE otherwise. The verdict's `also` lists the other alternatives' diagnoses
    the output matches too (a dropped causal mask on sq = skv = 2 matches both the right bound moved by one and no
    mask at all; on a bottom-right sq = 2, skv = 1 it is EMPTY_ROWS and matches no mask at all)."""
    empty = o.ref.empty
    if bool(empty.any()) and bool(empty[failed.index[:2]]):
        rest = check_out(o, out, o.ref.out, family, where=valid_rows(o.case, out.device) & ~empty)
        if rest.ok:
            verdict = fail(V.EMPTY_ROWS, f"rows that see no key must be 0, got {failed.got:.6g} at "
                                          f"{list(failed.index)}; every other row passes", failed, failed.ratio)
            return dataclasses.replace(verdict, also=tuple(d for d, _ in _matching(o, out, family)))
    matched = _matching(o, out, family)
    if matched:
        (diagnosis, description), others = matched[0], matched[1:]
        verdict = fail(diagnosis, f"{description}; {failed.describe()}", failed, failed.ratio)
        return dataclasses.replace(verdict, also=tuple(d for d, _ in others))
    if probe.applies(o.case):  # no alternative explains it: on a probe, the sign says a key too many or too few
        return probe.name_failure(o, out, failed)
    return fail(V.TOLERANCE, failed.describe(), failed, failed.ratio)


def _matching(o: Oracle, out: torch.Tensor, family: str) -> list[tuple[str, str]]:
    """(diagnosis, description) of each alternative the output matches, every row within its own bound, in the
    order alternatives() gives them, one per diagnosis."""
    matched: list[tuple[str, str]] = []
    for diagnosis, description, overrides in alternatives(o.case):
        if any(diagnosis == d for d, _ in matched):
            continue  # one match per diagnosis is enough
        alt_case = overrides.pop("case", o.case)
        alt = reference(alt_case, o.tensors, device=o.ref.out.device, grads=False, terms=False, **overrides)
        if check_out(o, out, alt.out, family).ok:  # every row within its own bound of the alternative
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
    rows = valid_rows(case, device)
    graded = out[rows]
    if graded.numel() and not bool(torch.isfinite(graded).all()):
        c = check_out(o, out, o.ref.out, family, floor_first=True)
        return fail(V.NONFINITE, f"non-finite output, first at {list(c.index)}: {c.got}", c)
    checks = [check_out(o, out, o.ref.out, family, floor_first=True)]
    if not checks[0].ok:
        if graded.numel() and bool((graded == 0).all()):  # zeros that the bound does not excuse (underflow does)
            return fail(V.ALL_ZERO, f"every graded output element is 0; the oracle's largest is "
                                     f"{o.ref.out[rows].abs().max().item():.6g}", checks[0])
        return diagnose(o, out, checks[0], family)
    exact = probe.applies(case)
    if exact:
        verdict = probe.grade_out(o, out, checks)
        if verdict is not None:
            return verdict
    if output.lse is not None:
        verdict = _grade_lse(o, output.lse.to(device), family, checks)
        if verdict is None and exact:
            verdict = probe.grade_lse(o, output.lse.to(device), checks)
        if verdict is not None:
            return verdict
    if case.grads:
        verdict = _grade_grads(o, output, family, checks)
        if verdict is not None:
            return verdict
    ratio = max(c.ratio for c in checks)
    return V.Verdict(V.PASS, None, "", None, ratio, tuple(c.describe() for c in checks))


def lse_check(o: Oracle, lse: torch.Tensor, family: str, floor_first: bool = False) -> Check:
    """The LSE's check over the rows that see a key (each row against its own bound: `row_bounds`, inf elsewhere).
    `floor_first`: the baseline only where an error passes the floor (tolerance.check)."""
    ref = o.ref.lse
    rows = valid_rows(o.case, ref.device)[:, None, :].expand_as(ref)
    size = o.ref.row_logit_size if o.ref.row_logit_size is not None else o.ref.logit_size
    return check("lse", lse, ref, lambda: o.lse_baseline, rows & torch.isfinite(ref), family=family,
                 quantity="lse", dtype=o.case.dtype, logit_size=size, bias_max=o.ref.bias_max,
                 dot_terms=dominated_dot(o.case), softcap=o.case.softcap, floor_first=floor_first)


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


def _gradient_terms(o: Oracle) -> dict:
    """Per gradient: (a bound on the products it sums, where they can cancel; the error it inherits from D, and for
    fp16 from dS rounded among the subnormals), and apart the part from the subnormals ("dq_underflow", ...) and dK's
    bound on its products per unit of a key's P mass ("dk_per_mass").
    |dP_ij| = |dO_i . V_j| is at most the product of the largest row norms; dQ = scale * dS K averages rows of K with
    weights of total mass <= 2 |dP|; dK = scale * dS^T Q sums over queries with the mass dV = P^T dO shows,
    max|dV| / max|dO| of it; dV = P^T dO sums P_ij dO_i, at most P^T |dO| (the reference computes it). D enters
    dS_ij = P_ij (dP_ij - D_i): a kernel that takes D from its output rounded to the dtype (FlashAttention's
    algorithm; cuDNN's dQ on the H200 matched it to 4 digits) moves dQ_i by scale * dD_i * (P K)_i and dK_j by
    scale * sum_i P_ij dD_i Q_i, where dD is the reference's d_rounding."""
    t = o.tensors

    def row_norm(x: torch.Tensor) -> float:
        return x.double().norm(dim=-1).max().item() if x.numel() else 0.0

    def biggest(x: torch.Tensor) -> float:
        return x.double().abs().max().item() if x.numel() else 0.0

    dp = row_norm(t.dout) * row_norm(t.v)
    mass = biggest(o.ref.dv) / max(biggest(t.dout), 1e-30)
    scale = o.case.softmax_scale
    shifted = scale * o.ref.d_rounding
    k_max, q_max = biggest(t.k), biggest(t.q)
    # dS rounded to fp16 before dQ = dS K and dK = dS^T Q: where dS is tiny (values of std 1e-3 make dP ~ 1e-6) it
    # lands among fp16's subnormals, whose spacing 2^-24 is absolute, so each term carries up to 2^-25 * |K_j| (dQ) or
    # |Q_i| (dK), not a relative eps: independent over the n terms, six standard deviations of a uniform error, never
    # more than all n (sdpa-efficient fp16 dK on an H200: 1.3x over where far_negative puts |q_c| ~ 270 in one
    # channel and dS ~ 1e-6). bf16 keeps fp32's exponent range: its subnormals are far below anything graded.
    def underflow(n: int) -> float:
        if o.case.dtype != "float16":
            return 0.0
        spacing = torch.finfo(torch.float16).smallest_normal * torch.finfo(torch.float16).eps / 2  # 2^-25
        return scale * spacing * min(n, P_ROUNDING_SIGMAS * UNIFORM_SD * n ** 0.5)

    # P rounded to fp16 before dV = P^T dO lands among the subnormals where P < 2^-14 (a peaked row's far keys):
    # the same absolute spacing, on terms of size |dO_i| (graded so against the fused baseline only)
    return {"dq": (2 * scale * dp * k_max, (shifted + underflow(o.case.skv)) * k_max),
            "dk": (2 * scale * dp * q_max * mass, shifted * q_max * mass + underflow(o.case.sq) * q_max),
            "dv": (o.ref.dv_terms, 0.0),
            "dq_underflow": underflow(o.case.skv) * k_max, "dk_underflow": underflow(o.case.sq) * q_max,
            "dk_per_mass": 2 * scale * dp * q_max,
            "dv_underflow": underflow(o.case.sq) / scale * biggest(t.dout) if scale else 0.0}


def gradient_check(o: Oracle, name: str, got: torch.Tensor, family: str, out: torch.Tensor | None = None,
                   floor_first: bool = False) -> Check:
    """dq, dk or dv graded on the rows (dq) or keys (dk, dv) that count, with the terms the gradient sums and the
    error it inherits from D: against the fused baseline row by row, from `out`, the output the kernel returned with
    the gradients (d_inherited); without `out`, and against the textbook baseline, the worst row's shift on every
    row. `floor_first`: the baseline only where an error passes the floor (tolerance.check)."""
    rows = valid_rows(o.case, o.ref.out.device) if name == "dq" else valid_keys(o.case, o.ref.out.device)
    terms, inherited = o.gradient_terms[name]
    terms_floor = terms  # the sum of |terms| the cancellation floor takes: the tensor's largest, or per row (below)
    # (Against the textbook baseline dQ_i keeps the worst row's D shift: a bound from row i's D shift alone failed
    # the cuDNN bf16 case of tests/test_tolerance_calibration.py by 1.18x: dS rounded to bf16 where dP - D cancels
    # adds to it. The fused baseline has a floor for that rounding per row, below.)
    # fp16 / bf16 backward passes round P to the dtype before dV = P^T dO and dS before dQ = dS K, dK = dS^T Q, so
    # each term of those sums carries eps / 2 (tolerance.check adds eps(dtype) * row_terms). dV's terms are known per
    # key row. For dQ and dK only the tensor's largest sum of |terms| is: n terms of like size with independent
    # rounding move the sum by about that / sqrt(n), which is what is allowed (sdpa-flash bf16 dQ with |V| ~ 100 and
    # sdpa-cudnn fp16 dQ of a probe case, where dS K cancels to ~0, were 1.5x and 1.1x over on an H200 without it;
    # the whole sum would hide a 10 % error in dK, tests/test_grade.py).
    n = o.case.skv if name == "dq" else o.case.sq
    final_eps = None
    row_terms = o.ref.row_dv_terms if name == "dv" and o.ref.row_dv_terms is not None else terms / max(n, 1) ** 0.5
    if fused_backward(o.case, family) and o.ref.row_grad_rms is not None:
        # Against the fused baseline, which rounds P and dS as the kernel does, the rounding is allowed row by row as
        # a random walk: each term the row sums (scale dS_ij K_j, scale dS_ij Q_i, P_ij dO_i) carries an independent
        # rounding within +-u, so a channel moves by P_ROUNDING_SIGMAS standard deviations of it, u / sqrt(3) times
        # the root of the summed squared terms (the reference's row_grad_rms; tolerance.check allows
        # eps * row_terms = 2u * row_terms). The bounds above, a whole sum of |terms| or the tensor's largest over
        # sqrt(n), were 10-60x that on Gaussian bf16 rows and hid a row off by 5 %.
        row_terms = P_ROUNDING_SIGMAS * UNIFORM_SD / 2 * o.ref.row_grad_rms[name]
        # Its final rounding as an output row's: u twice (the kernel's, and once to spare). The textbook's four
        # times u were for its two more matmuls rounded to the dtype; a fused kernel accumulates those in fp32, and
        # the roundings it makes before them (P, dS) have the floor above.
        final_eps = 1.0
        # P rounded to fp16 among the subnormals (_gradient_terms) adds to dV; D's error to dQ and dK, per row.
        if name == "dv":
            inherited = o.gradient_terms["dv_underflow"]
        elif out is not None and o.ref.row_d_size is not None:
            inherited = d_inherited(o, name, out) + o.gradient_terms[f"{name}_underflow"]
        # The floor for terms that cancel (tolerance.check: fp32 rounding and each logit's, times a bound on the sum
        # of |terms|) per key row for dK: sum_i |P_ij (dP_ij - D_i) Q_i| <= 2 max|dP| max|Q| sum_i P_ij, with each
        # key's own P mass (reference.key_mass) for the tensor's largest. Key 3889 of a causal bf16 case of 4096,
        # which only the last 207 queries see (mass 0.05, the largest ~8), had 2.2 % of its row allowed so, and
        # passed x 1.05.
        if name == "dk" and o.ref.key_mass is not None:
            terms_floor = o.gradient_terms["dk_per_mass"] * o.ref.key_mass
    where = rows[:, :, None, None]
    if terms >= torch.finfo(got.dtype).max:
        # The products this gradient sums can pass the dtype's largest value: a kernel's partial sums in the dtype
        # (per query head before a GQA group sum) may overflow although the sum fits, and a sum past it rounds to
        # inf. Non-finite elements are not graded then (sdpa-flash fp16 dK of 58608 came back inf where a
        # far_negative q carries its row's shift, -1024 / scale, in one channel); finite ones are, as ever.
        where = where & torch.isfinite(got)
    return check(name, got, getattr(o.ref, name), lambda: getattr(o.grad_baseline(family), name), where,
                 family=family, quantity="grad", dtype=o.case.dtype, logit_size=o.ref.logit_size,
                 scale_of_terms=terms_floor, inherited=inherited, bias_max=o.ref.bias_max, row_terms=row_terms,
                 softcap=o.case.softcap, final_eps=final_eps, floor_first=floor_first)


def d_inherited(o: Oracle, name: str, out: torch.Tensor) -> torch.Tensor:
    """What dQ (per query row) or dK (per key row) inherits from D = rowsum(dO * O) taken from `out`, the output the
    kernel returned, as FlashAttention-style backward passes take it (a kernel that takes D exact inherits less).
    dS_ij = P_ij (dP_ij - D_i), so an error dD_i moves dQ_i = scale sum_j dS_ij K_j by scale dD_i sum_j P_ij K_j
    (reference.row_d_moves; to first order: dS is rounded after) and dK_j = scale sum_i dS_ij Q_i by
    scale sum_i P_ij dD_i Q_i. dD_i = dO_i . (out_i - O_i) is known exactly, so dQ_i is allowed its own row's
    shift. dK_j sums every query row's, which would take P again to weigh exactly; the reference weighs instead each
    row's R_i (the size of a rounded output's shift: reference.row_d_size) into key_d_terms =
    max_c sum_i P_ij R_i |Q_ic|, and dK_j is allowed that times max_i |dD_i| / R_i: never less than it moves, and a
    row whose shift outgrows its R_i loosens every key's bound, not one.
    (The reference's own shift, O rounded to nearest, is no bound per row: the kernel's fp32 O, its P rounded before
    P V and its fast exp, rounds to the other neighbour on some channels, a different draw of the same sum. torch's
    CPU flash kernel's bf16 dQ was 2.6x over a bound from it on 2 of 291 random cases, and 21x over with no D
    allowance at all; with its own output's shift taken off, 0.31 of its bound.)"""
    valid = (valid_rows(o.case, o.ref.out.device) & ~o.ref.empty)[:, :, None]
    shift = ((out.to(o.ref.out.device, torch.float64) - o.ref.out) * o.tensors.dout.to(o.ref.out.device,
                                                                                    torch.float64)).sum(-1)
    shift = torch.where(valid, shift.abs().nan_to_num(nan=0.0, posinf=0.0), 0.0)   # [b, sq, h]
    scale = o.case.softmax_scale
    if name == "dq":
        return scale * shift * o.ref.row_d_moves
    size = o.ref.row_d_size
    worst = float(torch.where(size > 0, shift / size, 0.0).max()) if shift.numel() else 0.0
    return scale * worst * o.ref.key_d_terms


def _grade_grads(o: Oracle, output: V.Output, family: str, checks: list[Check]) -> V.Verdict | None:
    for name in ("dq", "dk", "dv"):
        got, ref = getattr(output, name), getattr(o.ref, name)
        if got is None:
            return fail(V.GRADIENT, f"the case checks gradients but the backend returned no {name}")
        got = got.to(ref.device)
        wrong = wrong_shape(name, got, ref)
        if wrong is not None:
            return wrong
        c = gradient_check(o, name, got, family, output.out, floor_first=True)
        checks.append(c)
        if not c.ok:
            return fail(V.GRADIENT, c.describe(), c, c.ratio, [x.describe() for x in checks])
    return None
