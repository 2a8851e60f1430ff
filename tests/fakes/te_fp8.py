"""The FP8 part of the fake TransformerEngine (tests/fakes/transformer_engine.py): te.autocast with a DelayedScaling
recipe, Float8Tensor inputs, DotProductAttention's fp8_meta scales, and FusedAttention's FP8 forward as cuDNN's FP8
graph computes it: q, k, v decoded and multiplied by their scale_inv; e = exp(s - row max) times scale_s rounded to
e4m3, P V divided by scale_s and by the row sum of the unrounded e; O times scale_o rounded to e4m3 (saturated), then
returned as a Float8Tensor (fp8_output) or dequantised into the nominal dtype. With Float8Tensors that require grad,
the backward is cuDNN's FP8 one as docs/grading.md describes it (tests/fp8_grad_kernels.py's, called with TE's
scales): a Float8Tensor dO taken as it is (a plain one quantised with scaling_bwd's dO scale), P rounded with scale_s,
dS with the dP scale, D from the e4m3 O, dQ / dK / dV rounded with the dQKV scale and returned as Float8Tensors, all
in the recipe's backward format (e5m2 under HYBRID). The autocast's exit with grad mode on moves the forward scales
(TE re-derives them from their amaxes there), so a backward run after it rounds P with another scale.

Planted bugs, one per FakeTE(fp8_bug=...): "descale_twice" (q's scale_inv applied twice), "q_scale_ignored",
"p_scale_kept" (P V not divided by scale_s), "o_scale_ignored" (O encoded without scale_o, decoded with it),
"fp8_off" (the autocast ignored: the inputs dequantised and attention run unquantised, with DPA.fp8 False); in the
backward (tests/fp8_grad_kernels.py's) "dout_descale_ignored", "ds_forward_scale" (dS rounded with scale_s).
"""

from __future__ import annotations

import enum
import types
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tests.fakes.attention import attend
from tests.fp8_grad_kernels import _backward
from tests.fp8_kernels import _attention

META_QKV, META_O, META_S = 2, 3, 8           # TE's FP8FwdTensorIdx slots (GEMM1_OUTPUT, GEMM2_INPUT, GEMM3_OUTPUT)
META_DQKV, META_DO, META_DP = 0, 3, 5        # FP8BwdTensorIdx (GRAD_OUTPUT1, GRAD_INPUT2, GRAD_INPUT3)
BACKWARD_BUGS = ("dout_descale_ignored", "ds_forward_scale")
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


class Float8Tensor(torch.Tensor):
    """Raw FP8 data (uint8) with its scale_inv and format: a tensor of `dtype` (the nominal one) and the data's shape
    (holding the dequantised values, as an autograd leaf or gradient can be)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, *, shape, dtype, data, fp8_scale_inv, fp8_dtype, requires_grad=False, device=None):
        assert data.dtype == torch.uint8 and tuple(shape) == tuple(data.shape), (data.dtype, shape, data.shape)
        assert fp8_scale_inv.dtype == torch.float32 and fp8_scale_inv.numel() == 1
        values = (data.view(TORCH_OF[DType(fp8_dtype)]).float() * fp8_scale_inv).to(dtype)
        self = torch.Tensor._make_subclass(cls, values, requires_grad)
        self._data, self._scale_inv, self._fp8_dtype = data, fp8_scale_inv, DType(fp8_dtype)
        return self

    def __init__(self, **_):
        pass

    def real(self) -> torch.Tensor:
        """encoding * scale_inv in float32."""
        return self._data.view(TORCH_OF[self._fp8_dtype]).float() * self._scale_inv

    def dequantize(self) -> torch.Tensor:
        return self.real().to(self.dtype)


STATE = {"enabled": False, "recipe": None, "modules": []}


@contextmanager
def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None):
    saved = dict(STATE)
    STATE.update(enabled=enabled, recipe=recipe if recipe is not None else DelayedScaling(), modules=[])
    try:
        yield
    finally:
        if enabled and torch.is_grad_enabled():   # reduce_and_update_fp8_tensors(forward=True) re-derives the
            for dpa in STATE["modules"]:           # forward scales from their amaxes: here halved, so a change shows
                dpa.fp8_meta["scaling_fwd"].scale.mul_(0.5)
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
    dpa.fp8_meta.setdefault("scaling_bwd", RecipeState(2 * num_gemms))
    if torch.is_grad_enabled() and dpa not in STATE["modules"]:
        STATE["modules"].append(dpa)


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


def output(dpa, out: torch.Tensor, nominal: torch.dtype) -> Float8Tensor:
    """O times scale_o rounded to e4m3 (saturated), with scale_inv 1 / scale_o."""
    scale_o = dpa.fp8_meta["scaling_fwd"].scale[META_O].reshape(1)
    x = out.float() / scale_o if dpa.fake.fp8_bug == "o_scale_ignored" else out.float()   # encoded without scale_o
    return quantised(x, scale_o, DType.kFloat8E4M3, nominal)


def quantised(x: torch.Tensor, scale: torch.Tensor, fmt: DType, nominal: torch.dtype) -> Float8Tensor:
    """x times scale rounded to fmt (saturated), as a Float8Tensor with scale_inv 1 / scale."""
    scale = scale.float().reshape(1)
    largest = torch.finfo(TORCH_OF[fmt]).max
    data = (x.float() * scale).clamp(-largest, largest).to(TORCH_OF[fmt]).view(torch.uint8)
    return Float8Tensor(shape=data.shape, dtype=nominal, data=data, fp8_scale_inv=1 / scale, fp8_dtype=fmt)


def attention(dpa, forward, spec, lengths, q, k, v, fp8_output: bool):
    """FusedAttention's FP8 forward (`forward(spec, q, k, v)` on the dequantised inputs), and its backward where the
    inputs require grad: O as a Float8Tensor (fp8_output) or dequantised."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return _Attention.apply(q, k, v, dpa, forward, spec, lengths, fp8_output)
    o8 = output(dpa, forward(spec, *dequantised(dpa, q, k, v)), q.dtype)
    return o8 if fp8_output else o8.dequantize()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dpa, forward, spec, lengths, fp8_output):
        o8 = output(dpa, forward(spec, *dequantised(dpa, q, k, v)), q.dtype)
        ctx.state = (dpa, spec, lengths, q, k, v, o8)
        return o8 if fp8_output else o8.dequantize()

    @staticmethod
    def backward(ctx, dout):
        return (*backward(*ctx.state, dout), None, None, None, None, None)


def backward(dpa, spec, lengths, q, k, v, o8, dout):
    """cuDNN's FP8 backward with TE's scales: (dq, dk, dv) as Float8Tensors in the recipe's backward format."""
    bwd = dpa.fp8_meta["scaling_bwd"].scale
    fmt = DType.kFloat8E4M3 if dpa.fp8_meta["recipe"].fp8_format == Format.E4M3 else DType.kFloat8E5M2
    if not isinstance(dout, Float8Tensor):   # TE quantises a plain dO with the dO quantizer
        dout = quantised(dout, bwd[META_DO], fmt, dout.dtype)
    sbhd = spec["fmt"] == "sbhd"
    layout = (lambda x: x.transpose(0, 1)) if sbhd else (lambda x: x)
    enc = [layout(x._data.view(TORCH_OF[x._fp8_dtype])) for x in (q, k, v)]
    (b, sq, h, _), hk, d_v = enc[0].shape, enc[1].shape[2], enc[2].shape[3]
    per_head = [x._scale_inv.float().reshape(1).expand(n) for x, n in ((q, h), (k, hk), (v, hk), (dout, h))]
    common = dict(causal=spec["causal"], window=tuple(None if w < 0 else w for w in spec["window"]),
                  bottom_right=spec["brd"], scale=spec["scale"], q_descale=per_head[0], k_descale=per_head[1],
                  v_descale=per_head[2], softcap=None, alibi_slopes=None, mask=None,
                  seqlens_q=torch.tensor(lengths[0]), seqlens_kv=torch.tensor(lengths[1]))
    _, lse = _attention(*enc, out_dtype=torch.float32, out_descale=None, p_dtype=None, p_scale=None, sink_logits=None,
                        block_table=None, k_cache=None, v_cache=None, cache_seqlens=None, **common)
    scale_s = float(dpa.fp8_meta["scaling_fwd"].scale[META_S])
    bug = dpa.fake.fp8_bug if dpa.fake.fp8_bug in BACKWARD_BUGS else None
    grads = _backward(*enc, layout(o8.real()).reshape(b, sq, h, d_v), lse,
                      layout(dout._data.view(TORCH_OF[dout._fp8_dtype])).reshape(b, sq, h, d_v),
                      dout_descale=per_head[3], p_dtype=E4M3, p_scale=scale_s, ds_dtype=TORCH_OF[fmt],
                      ds_scale=float(bwd[META_DP]), bug=bug, **common)
    return tuple(quantised(layout(g).contiguous(), bwd[META_DQKV], fmt, x.dtype) for g, x in zip(grads, (q, k, v)))


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
    fused.META_DQKV, fused.META_DO, fused.META_DP = META_DQKV, META_DO, META_DP
    return {m.__name__: m for m in (common, recipe, ext, fused)}


def export(pt) -> None:
    pt.autocast, pt.Float8Tensor, pt.DType = autocast, Float8Tensor, DType
