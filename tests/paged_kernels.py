"""Paged-KV kernels of the bring-your-own-kernel contract, in plain torch on the CPU: a correct split-KV kernel
and two with a planted serving bug each. They read the keys through the block table only (k and v are None).

    python3 -m attnfuzz run --backend tests.paged_kernels:paged_attention

Each page is one split: its partial output and its own running max are merged at the end, as split-KV decode
kernels merge the partial results of their thread blocks.
"""

from __future__ import annotations

import math

import torch


def _split_kv(q, block_table, k_cache, v_cache, cache_seqlens, *, causal, window, bottom_right, scale, seqlens_q,
              read_past=0, rescale=True):
    b, sq, h, _ = q.shape
    ps, hk, d_v = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    out = torch.zeros(b, sq, h, d_v)
    lse = torch.full((b, h, sq), float("-inf"))
    left, right = window[0], 0 if causal else window[1]
    i = torch.arange(sq)[:, None]
    for n in range(b):
        length = int(cache_seqlens[n])
        read = min(length + read_past, block_table.shape[1] * ps)   # read_past: keys read past the cache length
        off = length - (int(seqlens_q[n]) if seqlens_q is not None else sq) if bottom_right else 0
        partials = []
        for p in range(math.ceil(read / ps)):
            count = min(ps, read - p * ps)
            page = int(block_table[n, p])
            k = k_cache[page, :count].float().repeat_interleave(h // hk, dim=1)
            v = v_cache[page, :count].float().repeat_interleave(h // hk, dim=1)
            j = torch.arange(p * ps, p * ps + count)[None, :]
            keep = torch.ones(sq, count, dtype=torch.bool)
            if left is not None:
                keep &= j >= i + off - left
            if right is not None:
                keep &= j <= i + off + right
            s = torch.einsum("qhd,khd->hqk", q[n].float(), k) * scale
            s = s.masked_fill(~keep, float("-inf"))
            m = s.amax(-1, keepdim=True)  # -inf where the page holds no visible key: it weighs 0 in the merge
            e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
            partials.append((m, e.sum(-1, keepdim=True), torch.einsum("hqk,khd->hqd", e, v)))
        if not partials:
            continue
        # the merge's maximum over the pages that see a key (a stand-in of 0 for an empty page once made rows whose
        # logits all sit near -16384 read 0: the anti_aligned values found it)
        top = torch.stack([m for m, _, _ in partials]).amax(0)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = [torch.where(torch.isfinite(m), torch.exp(m - top), torch.zeros_like(m)) if rescale
                   else torch.ones_like(m) for m, _, _ in partials]
        denom = sum(w * l for w, (_, l, _) in zip(weights, partials))
        total = sum(w * o for w, (_, _, o) in zip(weights, partials))
        safe = torch.where(denom > 0, denom, torch.ones_like(denom))
        out[n] = (total / safe).transpose(0, 1)
        lse[n] = (top + torch.log(denom)).squeeze(-1)
    return out.to(q.dtype), lse


def paged_attention(q, k, v, *, causal, window, bottom_right, scale, seqlens_q=None, block_table=None,
                    k_cache=None, v_cache=None, cache_seqlens=None):
    """Correct: each page a split, the splits merged by rescaling to the common max."""
    return _split_kv(q, block_table, k_cache, v_cache, cache_seqlens, causal=causal, window=window,
                     bottom_right=bottom_right, scale=scale, seqlens_q=seqlens_q)


def reads_one_past(q, k, v, *, causal, window, bottom_right, scale, seqlens_q=None, block_table=None,
                   k_cache=None, v_cache=None, cache_seqlens=None):
    """Planted: reads one slot past each sequence's last key (where its block table still names a page)."""
    return _split_kv(q, block_table, k_cache, v_cache, cache_seqlens, causal=causal, window=window,
                     bottom_right=bottom_right, scale=scale, seqlens_q=seqlens_q, read_past=1)


def merges_without_rescaling(q, k, v, *, causal, window, bottom_right, scale, seqlens_q=None, block_table=None,
                             k_cache=None, v_cache=None, cache_seqlens=None):
    """Planted: adds the splits' partial sums as they are, each relative to its own max."""
    return _split_kv(q, block_table, k_cache, v_cache, cache_seqlens, causal=causal, window=window,
                     bottom_right=bottom_right, scale=scale, seqlens_q=seqlens_q, rescale=False)


def _paged_only(case):
    return case.paged or "this kernel reads paged KV caches only"


for _kernel in (paged_attention, reads_one_past, merges_without_rescaling):
    _kernel.supports = _paged_only
