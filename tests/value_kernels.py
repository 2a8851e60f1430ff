"""Kernels of the custom contract (fuzz/backends/custom.py) with one bug each that only a value family reaches
(strategies/materialize.py), and `correct`, the same kernel without a bug: the control that must never fail.

Each computes in fp32 (fp64 for fp64 inputs) from the contract's semantics and returns (out, lse).
"""

from __future__ import annotations

import torch


def _attend(q, k, v, *, causal, window, bottom_right, scale, softcap=None, alibi_slopes=None, sink_logits=None,
            mask=None, seqlens_q=None, seqlens_kv=None, bug=None):
    b, sq, h, _ = q.shape
    skv, hk = k.shape[1], k.shape[2]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads = torch.arange(h) // (h // hk)
    kk, vv = k[:, :, heads], v.to(work)[:, :, heads]
    if bug == "fp16_logits" and q.dtype == torch.float16:  # q.k stored in fp16 before the scale: past 65504, inf
        s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kk.float()).half().to(work) * scale
    else:
        s = torch.einsum("bqhd,bkhd->bhqk", q.to(work), kk.to(work)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    lq = seqlens_q.long() if seqlens_q is not None else torch.full((b,), sq)
    lk = seqlens_kv.long() if seqlens_kv is not None else torch.full((b,), skv)
    off = (lk - lq) if bottom_right else torch.zeros_like(lq)
    i = torch.arange(sq)[None, :, None]
    j = torch.arange(skv)[None, None, :]
    rel = j - (i + off[:, None, None])
    left, right = window[0], 0 if causal else window[1]
    keep = (i < lq[:, None, None]) & (j < lk[:, None, None])
    if left is not None:
        keep = keep & (rel >= -left)
    if right is not None:
        keep = keep & (rel <= right)
    keep = keep[:, None] if mask is None else keep[:, None] & mask
    if bug == "dedup_keys":  # drops a key whose k row repeats an earlier one (a prefix dedup that forgot the count)
        same = (kk[:, :, None] == kk[:, None, :]).all(-1).permute(0, 3, 1, 2)           # [b, h, j, j']
        keep = keep & ~(same & torch.ones(skv, skv, dtype=torch.bool).tril(-1)).any(-1)[:, :, None, :]
    if bug == "zero_keys_as_padding":  # takes an all-zero key for padding
        keep = keep & (kk != 0).any(-1).transpose(1, 2)[:, :, None, :]
    if alibi_slopes is not None:
        s = s - alibi_slopes.to(work)[None, :, None, None] * rel.abs()[:, None].to(work)
    if bug == "clamp_logits":  # clamps logits at -80 "so exp cannot underflow"
        s = s.clamp(min=-80.0)
    s = s.masked_fill(~keep, float("-inf"))
    sink = None
    if sink_logits is not None:
        sink = sink_logits.to(work)[None, :, None, None]
        if bug == "drop_huge_sinks":  # a sink past fp32's exp range is dropped instead of rescaled
            sink = torch.where(sink.abs() > 88.0, float("-inf"), sink)
    top = s.amax(-1, keepdim=True)
    if sink is not None:
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    if bug in ("max_from_zero", "max_from_finite"):  # the running maximum starts at 0 / -1e4, not -inf
        top = top.clamp(min=0.0 if bug == "max_from_zero" else -1e4)
    seen = keep.expand_as(s).any(-1, keepdim=True)  # rows that see a key; the others give 0 (and LSE -inf or the sink)
    weights = torch.where(seen, torch.exp(s - top), 0.0)
    denom = weights.sum(-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - top)
    # a row whose every weight underflowed divides 0 by 0 (only the max_from_* bugs get there)
    p = weights / torch.where(seen | (denom > 0), denom, torch.ones_like(denom))
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv).to(q.dtype)
    return out, (top + torch.log(denom)).squeeze(-1).float()


def _kernel(bug):
    def kernel(q, k, v, *, causal, window, bottom_right, scale, softcap=None, alibi_slopes=None, sink_logits=None,
               mask=None, seqlens_q=None, seqlens_kv=None):
        return _attend(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale,
                       softcap=softcap, alibi_slopes=alibi_slopes, sink_logits=sink_logits, mask=mask,
                       seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, bug=bug)
    kernel.__name__ = bug or "correct"
    if bug == "fp16_logits":  # its LSE would carry the fp16 logits' rounding on every case: it gives none
        return lambda *args, **kw: (kernel(*args, **kw)[0], None)
    return kernel


correct = _kernel(None)
max_from_zero = _kernel("max_from_zero")
clamp_logits = _kernel("clamp_logits")
max_from_finite = _kernel("max_from_finite")
fp16_logits = _kernel("fp16_logits")
drop_huge_sinks = _kernel("drop_huge_sinks")
dedup_keys = _kernel("dedup_keys")
zero_keys_as_padding = _kernel("zero_keys_as_padding")
