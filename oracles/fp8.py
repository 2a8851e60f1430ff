"""FP8 cases in the oracle: what a correct FP8 kernel may round beyond a fused kernel's rounding, per output row, and
the alternative references of an FP8 descale applied twice or not at all (FP8_SCALE).

The reference reads the dequantised inputs, which are exact (strategies/fp8.py), so it has no quantisation error of
its own; a correct kernel's logits are fp32 sums of exact products (an encoding has 4 significant bits), which the
ordinary floor covers (tolerance.check). Beyond it, per output row i (maxima over its channels):

- P quantised to FP8 before P V (case.fp8_p, u_P = 2^-4 for e4m3): a flash kernel rounds e_j = exp(s_j - m) * p_scale,
  m the running maximum (so e_j <= p_scale), and divides P V by the unrounded sum. A normal e_j rounds within u_P e_j,
  a subnormal within SMALLEST / 2 absolute, i.e. (SMALLEST / 2 / p_scale) * M_i in units of P, M_i the row's largest
  weight (the sink's included: a kernel may take the sink into its maximum). The row moves by at most
  u_P sum_j P_ij |V_j| + (SMALLEST / 2 / p_scale) M_i sum_j |V_j| (the reference's row_spread, row_p_max and
  row_v_sum). This is the worst case, not a random walk: the rounding errors of equal weights (tied logits, a row
  shifted so that several keys share e_j = 1) are equal and add up.
- The output quantised to FP8 (case.fp8_out, u_O): round(O / out_descale) is within u_O |O| + (SMALLEST / 2)
  out_descale of O, twice that allowed (the kernel's O carries its own error, which can move it across a rounding
  boundary). Saturation clamps, which moves no error up: the reference is clamped the same way.
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import spacing
from attnfuzz.strategies.materialize import Tensors

FINAL_ROUNDINGS = 2.0   # how many roundings of the FP8 output a row is allowed (see the module's docstring)
# Families whose kernel rounds P at a scale of its own, whatever the case's p_scale: FA3's FP8 forward subtracts its
# row maximum less Max_offset = 8 before the exponential (hopper/softmax.h), so e_j <= 2^8 when P is rounded.
KERNEL_P_SCALE = {"fa3": 256.0}


def allowance(case: Case, t: Tensors, ref, family: str = "default") -> torch.Tensor | float:
    """[b, sq, h] float64: what a correct FP8 kernel's rounding of P and of its output may move each output row by
    (0 for a case without FP8 rounding); P's scale is the case's, or the family's own (KERNEL_P_SCALE)."""
    if case.fp8 is None or t.fp8 is None:
        return 0.0
    total = torch.zeros(case.b, case.sq, case.h, dtype=torch.float64, device=ref.out.device)
    if case.fp8_p is not None and ref.row_spread is not None and ref.row_p_max is not None:
        u, sub = spacing(case.fp8_p)
        p_scale = KERNEL_P_SCALE.get(family, t.fp8.p_scale)
        total = total + u * ref.row_spread + sub / p_scale * ref.row_p_max * ref.row_v_sum
    if case.fp8_out is not None:
        u, sub = spacing(case.fp8_out)
        size = ref.out.abs().amax(-1)
        total = total + FINAL_ROUNDINGS * (u * size + sub * float(t.fp8.out_descale))
    return total


def _full(d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A descale broadcast against x [b, s, heads, d]: per head [heads], or per key [b, s, heads]."""
    return d[None, None, :, None].to(x) if d.dim() == 1 else d[..., None].to(x)


def alternatives(case: Case, t: Tensors) -> list[tuple[str, str, Tensors]]:
    """(FP8_SCALE, description, tensors) for each FP8 descale (q, k, v, the output) applied twice or not at all, where
    it is not 1: the inputs the reference would need to give that kernel's result."""
    if case.fp8 is None or t.fp8 is None:
        return []
    f = t.fp8
    descales = {"q": f.q_descale, "k": f.k_descale, "v": f.v_descale}
    alts = []
    for name, d in descales.items():
        if bool((d == 1).all()):
            continue
        x = getattr(t, name)
        for how, factor in (("applied twice", _full(d, x)), ("missing", 1 / _full(d, x))):
            alts.append((V.FP8_SCALE, f"matches the {name} descale {how}",
                         dataclasses.replace(t, **{name: x * factor})))
    if f.out_descale is not None and float(f.out_descale) != 1.0:
        # the kernel's O / out_descale with the descale applied once more or not at all: V scaled by it (O is linear
        # in V; the reference saturates the output where the kernel's encoding saturates)
        for how, factor in (("not divided out", f.out_descale), ("divided out twice", 1 / f.out_descale)):
            alts.append((V.FP8_SCALE, f"matches the output descale {how}",
                         dataclasses.replace(t, v=t.v * factor.to(t.v))))
    return alts
