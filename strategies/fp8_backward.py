"""FP8 attention with gradients in the case language: how the backward is quantised, and its scales.

An FP8 case with `grads` sets `fp8_dout`, and the kernel runs an FP8 backward as cuDNN's `sdpa_fp8_backward`
(NVIDIA/cudnn-frontend include/cudnn_frontend/node/sdpa_fp8_bwd.h) builds it and TransformerEngine's FusedAttnFunc
runs it (transformer_engine/pytorch/attention/dot_product_attention/backends.py; docs/grading.md has the facts):

- `fp8_dout`: dO's format (TE's dO_quantizer: e5m2 under the HYBRID format). dO is handed as an encoding and a
  descale, drawn exactly as q, k and v are (per tensor, or per query head with "head" scaling); the oracle reads the
  exact dequantised dO.
- `fp8_ds`: the format dS = scale * P o (dP - D) is rounded to before dQ = dS K and dK = dS^T Q (what cuDNN and TE
  call dP: Scale_dP / Descale_dP / Amax_dP, TE's dP_quantizer; cuDNN casts it to dO's data type), as
  round(dS * ds_scale), divided back after the product; None keeps dS wider. ds_scale is capped so that no dS can
  saturate: |dS_ij| <= DS_BOUND scale max_i |dO_i| max_j |V_j| (|dP_ij| <= |dO_i| |V_j|, and |D_i| <=
  (1 + u_O) max_j |dP_ij| where D is taken from an output rounded to FP8, u_O <= 1/8), so the cap is the largest
  power of two with that bound times ds_scale <= the format's largest.
- P before dV = P^T dO: the forward's `fp8_p` and `p_scale` (cuDNN's backward rounds P = exp(S - stats) times
  Scale_S to q's data type with the same Scale_S as its forward).
- `fp8_dqkv`: dQ, dK and dV's format (TE's one dQKV_quantizer; None: returned in the case's dtype, as TE's current
  scaling and bf16_backward return them). The kernel returns sat(round(dX / dX_descale)), one descale per query head
  for dQ and per KV head for dK and dV (all equal with per-tensor scaling). A gradient's amax is not known before
  the backward runs (delayed scaling takes it from earlier steps), so its descales are drawn as 1 (unit), powers of
  two (pow2 and saturating) or any 8-bit value, and a row may saturate or fall among the subnormals.
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.strategies.fp8 import FORMATS, FP8_SEED, LARGEST, FP8Inputs, _descales, encode

DS_BOUND = 2.125                      # |dP - D| <= DS_BOUND max |dO| max |V| (the docstring says why)
DS_SCALES = (1.0, 2.0**6, 2.0**12)   # ds_scale drawn (before its cap) where scales are not unit
FIELDS = ("fp8_dout", "fp8_ds", "fp8_dqkv")
BACKWARD_SEED = 0xB4C8_5EED   # the backward's scales: a generator of their own, so the forward's are as without it


def check_fields(case, check) -> None:
    """The FP8 backward fields' rules (strategies/case.py calls it)."""
    for name in FIELDS:
        value = getattr(case, name)
        check(value is None or value in FORMATS, name, value, f"None or one of {FORMATS}")
        check(value is None or (case.fp8 is not None and case.grads), name, value,
              "the FP8 backward's fields need an FP8 case (fp8) with grads=true")
    check(case.fp8_dout is not None or not (case.fp8_ds or case.fp8_dqkv), "fp8_dout", case.fp8_dout,
          "an FP8 backward takes dO in FP8: set fp8_dout with fp8_ds / fp8_dqkv")


def quantised_backward(case, dout: torch.Tensor, v: torch.Tensor, fp8: FP8Inputs) -> tuple[torch.Tensor, FP8Inputs]:
    """dO (the case's Gaussian draw) as FP8, and the backward's scales: (dO dequantised in float32, `fp8` with its
    backward fields). `v`: the dequantised V."""
    gen = torch.Generator().manual_seed(case.seed ^ FP8_SEED ^ BACKWARD_SEED)
    dout_r, dout8, dout_descale = quantised_dout(case, dout, gen)
    return dout_r, dataclasses.replace(fp8, dout8=dout8, dout_descale=dout_descale,
                                       **backward_scales(case, dout_r, v, gen))


def quantised_dout(case, dout: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dO [b, sq, h, d_v] (the case's Gaussian draw) as FP8: (dequantised float32, encoding, descale [h])."""
    fmt, x = case.fp8_dout, dout.float()
    if case.fp8_scaling == "head":
        d = _descales(case.fp8_scales, x.abs().amax(dim=(0, 1, 3)), LARGEST[fmt], gen)
    else:
        d = _descales(case.fp8_scales, x.abs().amax().reshape(1), LARGEST[fmt], gen).expand(case.h).contiguous()
    x8 = encode(x, d[None, None, :, None], fmt)
    return x8.float() * d[None, None, :, None], x8, d


def backward_scales(case, dout: torch.Tensor, v: torch.Tensor, gen: torch.Generator) -> dict:
    """ds_scale (float or None) and the dQ / dK / dV descales (float32 [h] / [hk] / [hk], or None), from the
    dequantised dO and V (their largest row norms cap ds_scale)."""
    out = {"ds_scale": None, "dq_descale": None, "dk_descale": None, "dv_descale": None}
    kind = case.fp8_scales
    if case.fp8_ds is not None:
        largest = [float(x.double().norm(dim=-1).max()) for x in (dout, v)]
        bound = DS_BOUND * case.softmax_scale * largest[0] * largest[1]
        cap = 2.0 ** torch.floor(torch.log2(torch.tensor(LARGEST[case.fp8_ds] / max(bound, 2.0**-60)))).item()
        drawn = 1.0 if kind == "unit" else cap if kind == "saturating" else DS_SCALES[
            int(torch.randint(len(DS_SCALES), (), generator=gen))]
        out["ds_scale"] = min(drawn, cap)
    if case.fp8_dqkv is not None:
        grad_kind = "pow2" if kind == "saturating" else kind
        for name, n in (("dq_descale", case.h), ("dk_descale", case.hk), ("dv_descale", case.hk)):
            groups = n if case.fp8_scaling == "head" else 1
            d = _descales(grad_kind, torch.ones(groups), LARGEST[case.fp8_dqkv], gen)
            out[name] = d.expand(n).contiguous() if groups == 1 else d
    return out


def saturate_grads(case, grads: dict, fp8) -> dict:
    """dq / dk / dv as an FP8 gradient holds them before rounding: clamped to +-largest * its descale (per head)."""
    if case.fp8_dqkv is None or fp8 is None or fp8.dq_descale is None:
        return grads
    largest, out = LARGEST[case.fp8_dqkv], {}
    for name, x in grads.items():
        if x is None:
            out[name] = x
            continue
        limit = largest * getattr(fp8, f"{name}_descale").to(x)[None, None, :, None]
        out[name] = torch.maximum(torch.minimum(x, limit), -limit)
    return out
