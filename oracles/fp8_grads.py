"""An FP8 backward in the oracle (strategies/fp8_backward.py): what a correct one may round beyond a fused kernel's
rounding, per gradient row, and the alternative gradients of dO's descale applied twice or not at all (FP8_SCALE).

The reference reads the dequantised q, k, v and dO, which are exact, so it has no quantisation error of its own; the
products dO V^T and Q K^T of FP8 encodings are exact in fp32 and their sums the ordinary floor covers. Beyond it, per
row of dQ (query i) or of dK, dV (key j), maxima over the row's channels (docs/grading.md derives each):

- dS rounded to FP8 (fp8_ds, u_S, s_S = SMALLEST / 2): round(dS_ij ds_scale) / ds_scale is within
  u_S |dS_ij| + s_S / ds_scale of dS_ij (ds_scale never lets it saturate), so dQ_i moves by at most
  u_S sum_j |dS_ij| |K_j| + (s_S / ds_scale) sum_j |K_j| over the keys row i weighs, dK_j likewise over Q_i.
- P rounded to FP8 before dV (fp8_p, the forward's p_scale): normalised P (cuDNN rounds exp(S - stats) Scale_S), so
  within u_P P_ij + s_P / p_scale; dV_j moves by u_P sum_i P_ij |dO_i| + (s_P / p_scale) sum_i |dO_i| over the
  queries that weigh key j.
- D = rowsum(dO o O) from the output: cuDNN reduces the O it is handed, the output the forward returned (TE hands it
  the FP8 output); with TE's current scaling and NVTE_DPA_FP8CS_O_in_F16 it is the output before its FP8 rounding
  (D_FROM_WIDER_OUTPUT: both are allowed). So D_i is off by dD_i <= |dO_i . (out_i - O_i)| (`out` the output the
  kernel returned, which carries P's FP8 rounding and the output's, and its saturation: the reference's O is clamped
  as an FP8 output is, and reference.fp8_d_saturation is what that moves D by) + sum_c |dO_ic| (u_O |out_ic| +
  s_O out_descale) where the output is FP8; dS_ij moves by scale P_ij dD_i, so dQ_i by scale dD_i sum_j P_ij |K_j|
  and dK_j by scale max_i dD_i sum_i P_ij |Q_i|, times 1 + u_S where dS is rounded to FP8 (the rounding is relative
  to the kernel's dS, D's shift included).
- FP8 gradients (fp8_dqkv): each rounded once, within u_G |dX| + s_G descale of its head; FINAL_ROUNDINGS of it are
  allowed, as for the forward's FP8 output (the kernel's value carries its own error across a rounding boundary).
These are worst cases, not random walks: a row's equal terms round alike and add up (oracles/fp8.py says why).
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.fp8 import FINAL_ROUNDINGS
from attnfuzz.strategies.fp8 import spacing

D_FROM_WIDER_OUTPUT = True   # a correct kernel may take D from its output before the output's FP8 rounding


def allowance(o, name: str, out: torch.Tensor | None) -> torch.Tensor | float:
    """[b, s, heads] float64: what a correct FP8 backward's roundings may move each row of gradient `name` (dq, dk,
    dv) by; 0 for a case without an FP8 backward. `out`: the output the kernel returned (None: D's term from the
    output's rounding alone)."""
    case, t, ref = o.case, o.tensors, o.ref
    terms = ref.fp8_grad_terms
    if case.fp8_dout is None or t.fp8 is None or terms is None:
        return 0.0
    f, scale = t.fp8, case.softmax_scale
    total = torch.zeros_like(terms[f"{name}_seen"])
    if name in ("dq", "dk") and case.fp8_ds is not None:
        u, sub = spacing(case.fp8_ds)
        total = total + u * terms[f"{name}_ds"] + sub / f.ds_scale * terms[f"{name}_seen"]
    if name == "dv" and case.fp8_p is not None and ref.row_dv_terms is not None:
        u, sub = spacing(case.fp8_p)
        total = total + u * ref.row_dv_terms + sub / f.p_scale * terms["dv_seen"]
    if name in ("dq", "dk"):
        # D's shift moves the kernel's dS, which its FP8 rounding then rounds too: (1 + u_S) of it
        grown = 1 + (spacing(case.fp8_ds)[0] if case.fp8_ds is not None else 0.0)
        shift = d_shift(o, out)                                                      # [b, sq, h]
        total = total + grown * scale * (shift if name == "dq" else shift.max()) * terms[f"{name}_p"]
    if case.fp8_dqkv is not None:
        u, sub = spacing(case.fp8_dqkv)
        size = getattr(ref, name).abs().amax(-1)
        descale = getattr(f, f"{name}_descale").to(size)[None, None, :]
        total = total + FINAL_ROUNDINGS * (u * size + sub * descale)
    return total


def d_shift(o, out: torch.Tensor | None) -> torch.Tensor:
    """[b, sq, h]: a bound on how far a correct FP8 backward's D_i is off (the module's docstring), 0 on rows past a
    sequence's length."""
    ref, dout = o.ref, o.tensors.dout.to(o.ref.out.device, torch.float64)
    shift = torch.zeros_like(ref.out[..., 0])
    if o.case.fp8_out is not None and D_FROM_WIDER_OUTPUT:
        u, sub = spacing(o.case.fp8_out)
        wide = ref.out.abs() if out is None else out.to(ref.out.device, torch.float64).abs()
        shift = shift + (dout.abs() * (u * wide + sub * float(o.tensors.fp8.out_descale))).sum(-1)
    if ref.fp8_d_saturation is not None:
        shift = shift + ref.fp8_d_saturation
    if out is not None:
        shift = shift + ((out.to(dout) - ref.out) * dout).sum(-1).abs()
    return shift.nan_to_num(nan=0.0, posinf=0.0)


def dout_alternatives(case, t) -> list[tuple[str, str, object]]:
    """(FP8_SCALE, description, tensors) for dO's descale applied twice or not at all, where it is not 1: the inputs
    whose reference gradients such a kernel gives (the gradients are linear in dO)."""
    if case.fp8_dout is None or t.fp8 is None or bool((t.fp8.dout_descale == 1).all()):
        return []
    d = t.fp8.dout_descale.to(t.dout)[None, None, :, None]
    return [(V.FP8_SCALE, f"matches the dO descale {how}", dataclasses.replace(t, dout=t.dout * factor))
            for how, factor in (("applied twice", d), ("missing", 1 / d))]
