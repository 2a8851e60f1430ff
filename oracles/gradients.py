"""Gradient grading: dQ, dK and dV of a backend against the oracle's, each row within a bound built from the sums it
takes (textbook or fused baseline: tolerance.FUSED_BACKWARD), and what each gradient inherits from D. `o` is the
grader's Oracle (oracles/grade.py, which imports this module)."""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.oracles import fp8_grads
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.alternatives import alternatives, fail, valid_keys, valid_rows, wrong_shape
from attnfuzz.oracles.reference import reference
from attnfuzz.oracles.tolerance import (BIAS_IN_INPUT_DTYPE, FUSED_BACKWARD, LOW_PRECISION, P_ROUNDING_SIGMAS,
                                        SCALED_DS_ROUNDING, UNIFORM_SD, Check, check, dominated_dot)
from attnfuzz.strategies.case import Case


def fused_backward(case: Case, family: str) -> bool:
    """Whether this family's gradients are graded against the fused baseline (tolerance.FUSED_BACKWARD); in fp32 /
    fp64 a fused backward rounds nothing before the end, and the naive baseline is the same computation. ALiBi that
    a family takes as a bias in the input dtype (tolerance.BIAS_IN_INPUT_DTYPE) keeps the textbook baseline, as does
    an FP8 case (its backward's rounding is allowed on top of the textbook one: oracles/fp8_grads.py)."""
    return (case.grads and case.dtype in LOW_PRECISION and family in FUSED_BACKWARD and case.fp8 is None
            and not (case.alibi_slopes and family in BIAS_IN_INPUT_DTYPE))


def gradient_terms(o) -> dict:
    """Per gradient: (a bound on the products it sums, where they can cancel; the error it inherits from D), and apart
    what fp16's subnormals add in FlashAttention's order ("dq_underflow", ...; subnormal_allowance takes the
    family's) and dK's bound on its products per unit of a key's P mass ("dk_per_mass").
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
    return {"dq": (2 * scale * dp * k_max, shifted * k_max),
            "dk": (2 * scale * dp * q_max * mass, shifted * q_max * mass),
            "dv": (o.ref.dv_terms, 0.0),
            "dq_underflow": underflow(o.case.skv) * k_max, "dk_underflow": underflow(o.case.sq) * q_max,
            "dk_per_mass": 2 * scale * dp * q_max,
            "dv_underflow": underflow(o.case.sq) / scale * biggest(t.dout) if scale else 0.0}


def gradient_check(o, name: str, got: torch.Tensor, family: str, out: torch.Tensor | None = None,
                   floor_first: bool = False, expected: torch.Tensor | None = None) -> Check:
    """dq, dk or dv graded on the rows (dq) or keys (dk, dv) that count, with the terms the gradient sums and the
    error it inherits from D: against the fused baseline row by row, from `out`, the output the kernel returned with
    the gradients (d_inherited); without `out`, and against the textbook baseline, the worst row's shift on every
    row. `floor_first`: the baseline only where an error passes the floor (tolerance.check). `expected`: another
    reference's gradient (an alternative's), graded within the oracle's own bound. An FP8 backward's rounding is
    allowed on top, per row (oracles/fp8_grads.py)."""
    rows = valid_rows(o.case, o.ref.out.device) if name == "dq" else valid_keys(o.case, o.ref.out.device)
    terms, inherited = o.gradient_terms[name]
    subnormal = 0.0 if name == "dv" else subnormal_allowance(o, name, family)   # dS among fp16's subnormals
    inherited += subnormal
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
            inherited = d_inherited(o, name, out) + subnormal
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
    expected = getattr(o.ref, name) if expected is None else expected
    return check(name, got, expected, lambda: getattr(o.grad_baseline(family), name), where,
                 family=family, quantity="grad", dtype=o.case.dtype, logit_size=o.ref.logit_size,
                 scale_of_terms=terms_floor, inherited=inherited, bias_max=o.ref.bias_max, row_terms=row_terms,
                 softcap=o.case.softcap, final_eps=final_eps, floor_first=floor_first,
                 dot_terms=dominated_dot(o.case), quantised=fp8_grads.allowance(o, name, out))


def subnormal_allowance(o, name: str, family: str) -> float:
    """What dQ or dK may carry from dS rounded among fp16's subnormals (gradient_terms): 1 / scale times more for a
    family that rounds dS with the softmax scale folded in (tolerance.SCALED_DS_ROUNDING), whose rounding error is
    then not multiplied by the scale after the sum."""
    allowed = o.gradient_terms[f"{name}_underflow"]
    scale = o.case.softmax_scale
    return allowed / scale if family in SCALED_DS_ROUNDING and scale else allowed


def d_inherited(o, name: str, out: torch.Tensor) -> torch.Tensor:
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


def grade_grads(o, output: V.Output, family: str, checks: list[Check]) -> V.Verdict | None:
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
            scaled = _dout_scale(o, name, got, family, output.out)
            if scaled is not None:   # an FP8 dO descale applied twice or missing
                return fail(V.FP8_SCALE, f"{name} {scaled}; {c.describe()}", c, c.ratio, [x.describe() for x in checks])
            verdict = fail(V.GRADIENT, c.describe() + _only_empty_rows(o, name, got, family, output.out), c, c.ratio,
                           [x.describe() for x in checks])
            return dataclasses.replace(verdict, also=_alternatives_matched(o, name, got, family))
    return None


def _dout_scale(o, name: str, got: torch.Tensor, family: str, out: torch.Tensor) -> str | None:
    """The description of the FP8 dO descale alternative (applied twice, missing) whose gradient `name` the failing
    one matches, graded as the oracle of that dO would grade it (its gradients' sizes set its bounds), or None."""
    for _, description, tensors in fp8_grads.dout_alternatives(o.case, o.tensors):
        alt = type(o).of(o.case, tensors, device=o.ref.out.device, family=family)   # its own reference and bounds
        if gradient_check(alt, name, got, family, out).ok:
            return description
    return None


def _alternatives_matched(o, name: str, got: torch.Tensor, family: str) -> tuple[str, ...]:
    """The ALTERNATIVE diagnoses whose reference's gradient `name` the failing one matches within the oracle's bound:
    a kernel that drops the causal mask has its output right where every key a row sees is alike (probe values over a
    one-wide V) and its dV right only against attention without the mask, so a known dropped mask takes it too."""
    matched: list[str] = []
    for diagnosis, _, overrides in alternatives(o.case):
        if diagnosis in matched:
            continue
        alt_case = overrides.pop("case", o.case)
        alt = reference(alt_case, o.tensors, device=o.ref.out.device, grads=True, terms=False, **overrides)
        if getattr(alt, name) is not None and gradient_check(o, name, got, family, expected=getattr(alt, name)).ok:
            matched.append(diagnosis)
    return tuple(matched)


EMPTY_ROWS_ONLY = "wrong only on rows that see no key (their dq must be 0)"


def _only_empty_rows(o, name: str, got: torch.Tensor, family: str, out: torch.Tensor) -> str:
    """'; ' + EMPTY_ROWS_ONLY where a failing dQ passes once its rows that see no key are set to the oracle's 0 (a
    kernel's fully masked rows, not its other rows: what a known bug of those rows can match on); else ''."""
    empty = valid_rows(o.case, got.device) & o.ref.empty
    if name != "dq" or not bool(empty.any()):
        return ""
    alone = torch.where(empty[:, :, None, None], o.ref.dq.to(got.dtype), got)
    return f"; {EMPTY_ROWS_ONLY}" if gradient_check(o, name, alone, family, out).ok else ""
