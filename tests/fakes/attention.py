"""The one piece of math every fake shares: attention over one sequence with a boolean keep-mask, in float32."""

from __future__ import annotations

import math

import torch


def attend(q, k, v, keep, *, scale=None, softcap=0.0, bias=None, sink=None):
    """q [sq, h, d], k [skv, hk, d], v [skv, hk, dv]; keep bool [sq, skv] or [h, sq, skv] (True = visible);
    bias float [h, sq, skv] added after the softcap; sink [h] logits in the denominator. Query head i reads KV head
    i // (h / hk). Returns out [sq, h, dv] in q's dtype and lse [h, sq] float32 (natural log). A row that sees no
    key gives out 0 and lse = sink (-inf without one)."""
    h, hk = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kx = k.float().repeat_interleave(h // hk, dim=1)
    vx = v.float().repeat_interleave(h // hk, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.float(), kx) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.float()
    keep = keep.expand_as(s)
    s = s.masked_fill(~keep, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float()[:, None, None].expand(-1, s.shape[1], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    if sink is not None:
        p = p[..., :-1]
    out = torch.einsum("hij,jhd->ihd", p, vx)
    return out.to(q.dtype), lse


def band_keep(sq, skv, off, left, right, device):
    """[sq, skv]: i + off - left <= j <= i + off + right, a None bound unbounded, a negative one taken literally."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    keep = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if left is not None:
        keep &= j >= i + off - left
    if right is not None:
        keep &= j <= i + off + right
    return keep


def alibi_bias(slopes, sq, skv, off, device):
    """[h, sq, skv]: -slope * |i + off - j|."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    return -slopes.float()[:, None, None] * (i + off - j).abs().float()
