"""A correct fused backward pass written out: FlashAttention-2's algorithm in fp32 from fp16 / bf16 inputs (the
control the fused gradient baseline must pass, and the kernel whose dQ matched cuDNN's on an H200)."""

from __future__ import annotations

import torch

from attnfuzz.backends.layout import visibility_mask


def flash_algorithm_backward(case, t, forget_d=False):
    """FlashAttention-2's backward in fp32 from fp16 / bf16 inputs: O stored in the dtype, D = rowsum(dO * O) from
    it, dS and P rounded to the dtype before the gradient products. `forget_d` plants a bug: dS = P * dP, D never
    subtracted."""
    q, k, v, do = (x.float() for x in (t.q, t.k, t.v, t.dout))
    group = case.h // case.hk
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * case.softmax_scale
    p = torch.softmax(s.masked_fill(~visibility_mask(case, t, "cpu"), float("-inf")), -1).nan_to_num(0)
    low = t.q.dtype
    out = torch.einsum("bhqk,bkhd->bqhd", p, v).to(low)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, v)
    d = 0.0 if forget_d else torch.einsum("bqhd,bqhd->bhq", do, out.float())[..., None]
    ds = (p * (dp - d)).to(low).float()
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k) * case.softmax_scale
    dk = (torch.einsum("bhqk,bqhd->bkhd", ds, q) * case.softmax_scale).unflatten(2, (case.hk, group)).sum(3)
    dv = torch.einsum("bhqk,bqhd->bkhd", p.to(low).float(), do).unflatten(2, (case.hk, group)).sum(3)
    return out, dq, dk, dv
