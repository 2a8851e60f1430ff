"""The shift check on cases whose rows carry a logit shift (values far_negative and large_sink, see
strategies/materialize.py): metamorphic and exact.

Every logit of such a row is the unshifted row's plus one constant S (an extra q channel against a k channel of
ones), so by shift invariance its output must equal the unshifted row's and its LSE must be the unshifted LSE plus
exactly S. The float64 oracle computes the shifted row itself (torch.logsumexp subtracts the row maximum, so an LSE
of -1024 comes out as -1024 + log(...), not -inf), and the ordinary per-row bounds grade it; this module names what a
failure on a shifted row means: an LSE that matches the unshifted one lost the shift (a kernel that subtracts the row
maximum and forgets to add it back), and an output that moved broke shift invariance, as an fp32 exp of raw logits
does once the row's LSE is below -87.3 (denormal) or -103.3 (0).
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.alternatives import valid_rows
from attnfuzz.oracles.tolerance import check, dominated_dot
from attnfuzz.strategies.materialize import row_shift

FP32_DENORMAL_LSE = -87.34  # log of fp32's smallest normal: exp of a logit below it is a denormal
FP32_ZERO_LSE = -103.28     # log of fp32's smallest denormal: exp of a logit below it is 0


def _where(lse: float) -> str:
    if lse < FP32_ZERO_LSE:
        return f"past {FP32_ZERO_LSE}, where fp32 exp of each raw logit is 0"
    if lse < FP32_DENORMAL_LSE:
        return f"below {FP32_DENORMAL_LSE}, where fp32 exp of each raw logit is a denormal"
    return "within fp32's exp range"


def unshifted_lse(o, lse: torch.Tensor, shift: torch.Tensor, family: str):
    """The LSE graded against the unshifted rows' (the oracle's minus the shift), on the shifted rows: a Check."""
    ref = o.ref.lse
    shift = shift.to(ref.device, ref.dtype)
    rows = valid_rows(o.case, ref.device)[:, None, :].expand_as(ref) & torch.isfinite(ref) & (shift != 0)
    baseline = (o.lse_baseline_of(family).to(torch.float64) - ref).abs().nan_to_num(nan=0.0, posinf=0.0)
    size = o.ref.row_logit_size if o.ref.row_logit_size is not None else o.ref.logit_size
    return check("lse (unshifted)", lse.to(ref.device), ref - shift, None, rows, family=family, quantity="lse",
                 dtype=o.case.dtype, logit_size=size, baseline=baseline,
                 dot_terms=dominated_dot(o.case), softcap=o.case.softcap)


def explain(o, output: V.Output, verdict: V.Verdict, family: str) -> V.Verdict:
    """`verdict` (a FAIL) with what the shift of its worst row means prepended to its message; an LSE that matches
    the unshifted rows' is said to have lost the shift. Unchanged where the case has no shift or the worst row none."""
    shift = row_shift(o.case, o.tensors)
    if shift is None or verdict.worst is None or not bool((shift != 0).any()):
        return verdict
    if verdict.diagnosis == V.LSE and output.lse is not None and shift.shape == output.lse.shape:
        c = unshifted_lse(o, output.lse, shift, family)
        if c.rows and c.ok:
            b, h, i = c.index
            s, lse = shift[b, h, i].item(), o.ref.lse[b, h, i].item()
            return dataclasses.replace(verdict, message=(
                f"the LSE lost the rows' logit shift: it matches the unshifted rows' LSE on every shifted row (row "
                f"{[b, h, i]} is shifted by {s:.6g}, so its LSE must be {lse:.6g}, got {c.got:.6g}; softmax is shift "
                f"invariant, the LSE moves by exactly the shift); {verdict.message}"))
    index = verdict.worst.index
    if verdict.worst.tensor.startswith("lse") and len(index) == 3:
        b, h, i = index
    elif verdict.worst.tensor.startswith("out") and len(index) == 4:
        b, i, h = index[:3]
    else:
        return verdict
    s, lse = shift[b, h, i].item(), o.ref.lse[b, h, i].item()
    if s == 0:
        return verdict
    what = "the LSE must be the unshifted row's plus the shift" if verdict.worst.tensor.startswith("lse") else \
        "the output must equal the unshifted row's (softmax is shift invariant)"
    return dataclasses.replace(verdict, message=(
        f"row {[b, i, h]} (batch, query, head) has every logit shifted by {s:.6g}, so its LSE is {lse:.6g}, "
        f"{_where(lse)}; {what}: {verdict.message}"))
