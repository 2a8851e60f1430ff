"""Bring-your-own kernels that return (out, lse): one right, one with its LSE in base 2 (torch's eager flex_attention
with BACKEND="FLASH" makes that mistake), for the repro scripts' LSE check."""

import math

import torch


def _attend(q, k, v, scale, causal, bottom_right):
    k, v = (x.repeat_interleave(q.shape[2] // x.shape[2], dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    if causal:  # a row above the diagonal sees no key: its lse is -inf, its output 0
        sq, skv = q.shape[1], k.shape[1]
        shift = skv - sq if bottom_right else 0
        scores = scores.masked_fill(torch.arange(skv)[None, :] > torch.arange(sq)[:, None] + shift, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", weights, v.double()).to(q.dtype), lse.float()


def right(q, k, v, *, causal, window, bottom_right, scale):
    return _attend(q, k, v, scale, causal, bottom_right)


def lse_in_base_2(q, k, v, *, causal, window, bottom_right, scale):
    out, lse = _attend(q, k, v, scale, causal, bottom_right)
    return out, lse / math.log(2)


def _plain(case):
    """No windows, masks or sinks (causal is fine): all these kernels take."""
    return (case.window == (None, None) and case.mask_density is None and case.layout == "bshd"
            and case.softmax == "vanilla" and case.softcap is None and case.alibi_slopes is None and not case.grads
            and case.seqlens_q is None and case.seqlens_kv is None) or "plain cases only"


right.supports = lse_in_base_2.supports = _plain
