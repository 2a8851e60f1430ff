"""A correct fused backward pass written out: FlashAttention-2's algorithm in fp32 from fp16 / bf16 inputs (the
control the fused gradient baseline must pass, and the kernel whose dQ matched cuDNN's on an H200), and cuDNN's
variant of it that folds the softmax scale into dS before rounding it."""

from __future__ import annotations

import torch

from attnfuzz.backends.layout import visibility_mask


def flash_algorithm_backward(case, t, forget_d=False, scaled_ds=False):
    """FlashAttention-2's backward in fp32 from fp16 / bf16 inputs: O stored in the dtype, D = rowsum(dO * O) from
    it, dS and P rounded to the dtype before the gradient products. `forget_d` plants a bug: dS = P * dP, D never
    subtracted. `scaled_ds`: dS is rounded with the softmax scale folded in, as cuDNN's backward does (it gave
    TE's fused dQ to the bit on an H100 where dS * scale sits among fp16's subnormals)."""
    q, k, v, do = (x.float() for x in (t.q, t.k, t.v, t.dout))
    group = case.h // case.hk
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * case.softmax_scale
    p = torch.softmax(s.masked_fill(~visibility_mask(case, t, "cpu"), float("-inf")), -1).nan_to_num(0)
    low = t.q.dtype
    out = torch.einsum("bhqk,bkhd->bqhd", p, v).to(low)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, v)
    d = 0.0 if forget_d else torch.einsum("bqhd,bqhd->bhq", do, out.float())[..., None]
    fold, after = (case.softmax_scale, 1.0) if scaled_ds else (1.0, case.softmax_scale)
    ds = (p * (dp - d) * fold).to(low).float()
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k) * after
    dk = (torch.einsum("bhqk,bqhd->bkhd", ds, q) * after).unflatten(2, (case.hk, group)).sum(3)
    dv = torch.einsum("bhqk,bqhd->bkhd", p.to(low).float(), do).unflatten(2, (case.hk, group)).sum(3)
    return out, dq, dk, dv
