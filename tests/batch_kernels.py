"""Kernels of the custom contract for the batch-invariance check (fuzz/engine/batch.py), in plain torch on the CPU.

Each computes every sequence on its own valid rows and keys (so the matmul shapes of a sequence are the same alone
as in a batch) as split-KV attention: the keys in chunks, each chunk's partial output and running max merged at
the end. They differ only in how the chunk size is chosen:

    fixed_splits            chunks of CHUNK keys: batch invariant, and declared so (the clean control)
    splits_by_batch         the chunk size from the batch's total key count (as a kernel sizing its splits to fill
                            the device does), declared invariant: a sequence's last bits move with its neighbours
    splits_by_batch_undeclared  the same kernel, not declared: the check is an observation, never a failure

Forward only (see _kernel). All four paged fields are named, so paged cases come too: the keys are then read through the block table.
"""

from __future__ import annotations

import torch

CHUNK = 4


def _gathered(block_table, k_cache, v_cache):
    """Logical k / v [b, max_pages * page_size, hk, d] read through the block table (entries past a sequence's last
    page name the garbage page: read, never used)."""
    pages = block_table.long()
    return k_cache[pages].flatten(1, 2), v_cache[pages].flatten(1, 2)


def _one(q, k, v, mask, *, causal, window, bottom_right, scale, chunk):
    """One sequence: q [sq, h, d], k / v [skv, hk, d] (valid rows only), mask [sq, skv] or None."""
    sq, h, _ = q.shape
    skv, hk = k.shape[0], k.shape[1]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads = torch.arange(h) // (h // hk)
    kk, vv = k[:, heads].to(work), v[:, heads].to(work)
    off = skv - sq if bottom_right else 0
    left, right = window[0], 0 if causal else window[1]
    i = torch.arange(sq)[:, None]
    partials = []
    for start in range(0, skv, chunk):
        j = torch.arange(start, min(skv, start + chunk))[None, :]
        keep = torch.ones(sq, j.shape[1], dtype=torch.bool)
        if left is not None:
            keep &= j >= i + off - left
        if right is not None:
            keep &= j <= i + off + right
        if mask is not None:
            keep &= mask[:, start:start + chunk]
        s = torch.einsum("qhd,khd->hqk", q.to(work), kk[start:start + chunk]) * scale
        s = s.masked_fill(~keep, float("-inf"))
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        partials.append((m, e.sum(-1, keepdim=True), torch.einsum("hqk,khd->hqd", e, vv[start:start + chunk])))
    top = torch.stack([m for m, _, _ in partials]).amax(0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = [torch.where(torch.isfinite(m), torch.exp(m - top), torch.zeros_like(m)) for m, _, _ in partials]
    denom = sum(w * l for w, (_, l, _) in zip(weights, partials))
    total = sum(w * o for w, (_, _, o) in zip(weights, partials))
    out = total / torch.where(denom > 0, denom, torch.ones_like(denom))
    lse = torch.where(denom > 0, top + torch.log(denom), float("-inf"))
    return out.transpose(0, 1).to(q.dtype), lse.squeeze(-1).float()


def _attend(q, k, v, *, causal, window, bottom_right, scale, mask, seqlens_q, seqlens_kv, block_table, k_cache,
            v_cache, cache_seqlens, chunk_of):
    if block_table is not None:
        (k, v), seqlens_kv = _gathered(block_table, k_cache, v_cache), cache_seqlens
    b, sq, h, _ = q.shape
    lq = [int(n) for n in seqlens_q] if seqlens_q is not None else [sq] * b
    lk = [int(n) for n in seqlens_kv] if seqlens_kv is not None else [k.shape[1]] * b
    chunk = chunk_of(lk)
    outs, lses = [], []
    for n in range(b):
        out = q.new_zeros(sq, h, v.shape[-1])
        lse = torch.full((h, sq), float("-inf"))
        if lq[n] and lk[n]:
            o, l = _one(q[n, :lq[n]], k[n, :lk[n]], v[n, :lk[n]],
                        None if mask is None else mask[n, 0, :lq[n], :lk[n]], causal=causal, window=window,
                        bottom_right=bottom_right, scale=scale, chunk=chunk)
            out = torch.cat([o, out[lq[n]:]]) if lq[n] < sq else o
            lse = torch.cat([l, lse[:, lq[n]:]], dim=1) if lq[n] < sq else l
        outs.append(out)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _kernel(name, chunk_of, declared):
    def kernel(q, k, v, *, causal, window, bottom_right, scale, mask=None, seqlens_q=None, seqlens_kv=None,
               block_table=None, k_cache=None, v_cache=None, cache_seqlens=None):
        return _attend(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale, mask=mask,
                       seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, block_table=block_table, k_cache=k_cache,
                       v_cache=v_cache, cache_seqlens=cache_seqlens, chunk_of=chunk_of)
    kernel.__name__ = name
    kernel.batch_invariant = declared
    # forward only: autograd itself is not batch invariant here (the gradient of q sums one slice's gradient per
    # sequence, and -0 + 0 is +0: a sequence alone keeps a -0 that its batch turns into +0)
    kernel.supports = lambda case: not case.grads or "forward only"
    return kernel


def _by_batch(lens_kv):
    return 2 + sum(lens_kv) % 3  # 2, 3 or 4 keys a split, from the keys of the whole batch


fixed_splits = _kernel("fixed_splits", lambda lens_kv: CHUNK, True)
splits_by_batch = _kernel("splits_by_batch", _by_batch, True)
splits_by_batch_undeclared = _kernel("splits_by_batch_undeclared", _by_batch, False)
