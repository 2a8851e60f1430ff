"""The FP8 part of the fake TransformerEngine (tests/fakes/transformer_engine.py): te.autocast with a DelayedScaling
recipe, Float8Tensor inputs, DotProductAttention's fp8_meta scales, and FusedAttention's FP8 forward as cuDNN's FP8
graph computes it: q, k, v decoded and multiplied by their scale_inv; e = exp(s - row max) times scale_s rounded to
e4m3, P V divided by scale_s and by the row sum of the unrounded e; O times scale_o rounded to e4m3 (saturated), then
returned as a Float8Tensor (fp8_output) or dequantised into the nominal dtype.

Planted bugs, one per FakeTE(fp8_bug=...): "descale_twice" (q's scale_inv applied twice), "q_scale_ignored",
"p_scale_kept" (P V not divided by scale_s), "o_scale_ignored" (O encoded without scale_o, decoded with it),
"fp8_off" (the autocast ignored: the inputs dequantised and attention run unquantised, with DPA.fp8 False).
"""

from __future__ import annotations

import enum
import types
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tests.fakes.attention import attend

META_QKV, META_O, META_S = 2, 3, 8           # TE's FP8FwdTensorIdx slots (GEMM1_OUTPUT, GEMM2_INPUT, GEMM3_OUTPUT)
E4M3, E4M3_MAX = torch.float8_e4m3fn, 448.0


class Format(enum.Enum):
    E4M3 = "e4m3"
    HYBRID = "hybrid"
    E5M2 = "e5m2"


@dataclass
class DelayedScaling:
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    amax_history_len: int = 1024

    def __post_init__(self):
        assert self.fp8_format != Format.E5M2, "Pure E5M2 training is not supported."


class DType(enum.IntEnum):
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8


TORCH_OF = {DType.kFloat8E4M3: torch.float8_e4m3fn, DType.kFloat8E5M2: torch.float8_e5m2}


class Float8Tensor:
    """Raw FP8 data (uint8) with its scale_inv and format, presenting `dtype` (the nominal one) and the data's shape."""

    def __init__(self, *, shape, dtype, data, fp8_scale_inv, fp8_dtype, requires_grad=False, device=None):
        assert data.dtype == torch.uint8 and tuple(shape) == tuple(data.shape), (data.dtype, shape, data.shape)
        assert fp8_scale_inv.dtype == torch.float32 and fp8_scale_inv.numel() == 1
        self._data, self._scale_inv, self._fp8_dtype = data, fp8_scale_inv, DType(fp8_dtype)
        self.dtype, self.shape, self.device = dtype, torch.Size(shape), data.device

    def dequantize(self) -> torch.Tensor:
        return (self._data.view(TORCH_OF[self._fp8_dtype]).float() * self._scale_inv).to(self.dtype)


STATE = {"enabled": False, "recipe": None}


@contextmanager
def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None):
    saved = dict(STATE)
    STATE.update(enabled=enabled, recipe=recipe if recipe is not None else DelayedScaling())
    try:
        yield
    finally:
        STATE.update(saved)


class RecipeState:
    def __init__(self, n: int):
        self.scale = torch.ones(n)
        self.amax_history = torch.zeros(1, n)


def init_fp8_metadata(dpa, num_gemms: int = 1) -> None:
    """TE's DotProductAttention.init_fp8_metadata: fp8 from the autocast; scales made once (ones) and kept after."""
    dpa.fp8 = STATE["enabled"] and dpa.fake.fp8_bug != "fp8_off"
    if not dpa.fp8:
        return
    dpa.fp8_meta["recipe"] = STATE["recipe"]
    dpa.fp8_meta.setdefault("scaling_fwd", RecipeState(3 * num_gemms))


def attention_on(dpa) -> bool:
    return bool(dpa.fp8 and dpa.fp8_meta["recipe"].fp8_dpa)


def dequantised(dpa, q, k, v):
    """q, k, v as cuDNN reads them: each encoding times its scale_inv (float32), or with a planted bug."""
    bug = dpa.fake.fp8_bug
    out = []
    for name, x in zip("qkv", (q, k, v)):
        assert isinstance(x, Float8Tensor), f"fake FP8 attention: {name} is no Float8Tensor"
        d = x._scale_inv
        if name == "q" and bug == "descale_twice":
            d = d * d
        if name == "q" and bug == "q_scale_ignored":
            d = torch.ones_like(d)
        out.append(x._data.view(TORCH_OF[x._fp8_dtype]).float() * d)
    return out


def p_quantised_attend(dpa):
    """attend() with P quantised as cuDNN's FP8 forward does (scale_s from the DPA's S slot)."""
    scale_s = float(dpa.fp8_meta["scaling_fwd"].scale[META_S])
    back = 1.0 if dpa.fake.fp8_bug == "p_scale_kept" else scale_s

    def run(q, k, v, keep, *, scale, softcap=0.0, bias=None, sink=None):
        assert not softcap and bias is None and sink is None, "fake FP8 attention: vanilla softmax, no bias"
        h, hk = q.shape[1], k.shape[1]
        kx, vx = (x.repeat_interleave(h // hk, dim=1) for x in (k, v))
        s = torch.einsum("ihd,jhd->hij", q, kx) * scale
        s = s.masked_fill(~keep.expand_as(s), float("-inf"))
        m = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:-1], 1), float("-inf"))
        e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        p8 = (e * scale_s).to(E4M3).float()
        total = e.sum(-1, keepdim=True)
        out = torch.einsum("hij,jhd->ihd", p8 / back / torch.where(total > 0, total, torch.ones_like(total)), vx)
        return out, None
    return run


def output(dpa, out: torch.Tensor, nominal: torch.dtype, fp8_output: bool):
    """O times scale_o rounded to e4m3 (saturated): a Float8Tensor with scale_inv 1 / scale_o, or dequantised."""
    scale_o = dpa.fp8_meta["scaling_fwd"].scale[META_O].reshape(1)
    encode = torch.ones_like(scale_o) if dpa.fake.fp8_bug == "o_scale_ignored" else scale_o
    data = (out.float() * encode).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(torch.uint8)
    o8 = Float8Tensor(shape=data.shape, dtype=nominal, data=data, fp8_scale_inv=1 / scale_o,
                      fp8_dtype=DType.kFloat8E4M3)
    return o8 if fp8_output else o8.dequantize()


def modules() -> dict:
    """The recipe and fused-attention modules, and what transformer_engine.pytorch exports for FP8."""
    common = types.ModuleType("transformer_engine.common")
    common.__path__ = []
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Format, recipe.DelayedScaling = Format, DelayedScaling
    common.recipe = recipe
    ext = types.ModuleType("transformer_engine.pytorch.cpp_extensions")
    ext.__path__ = []
    fused = types.ModuleType("transformer_engine.pytorch.cpp_extensions.fused_attn")
    fused.META_QKV, fused.META_O, fused.META_S = META_QKV, META_O, META_S
    return {m.__name__: m for m in (common, recipe, ext, fused)}


def export(pt) -> None:
    pt.autocast, pt.Float8Tensor, pt.DType = autocast, Float8Tensor, DType
