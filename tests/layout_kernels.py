"""Kernels of the custom contract (fuzz/backends/custom.py) with one bug each that only a per-tensor storage
(Case.storage, strategies/materialize.py) reaches, and `correct`, the same kernel without a bug: the control.

Each reads K the way a hand-written kernel with that bug would address its buffer, then computes as
tests/value_kernels.py does.
"""

from __future__ import annotations

import math

from tests.value_kernels import _attend


def _dense_strides(k):
    """The strides K would have if its buffer held no gaps, in K's own stride order (stride-0 dims kept)."""
    order = sorted(range(k.dim()), key=lambda d: (k.shape[d] != 1, -k.stride(d), d))
    strides, step = [0] * k.dim(), 1
    for d in reversed(order):
        strides[d] = 0 if k.stride(d) == 0 else step
        step *= 1 if k.stride(d) == 0 else k.shape[d]
    return strides


def _has_gaps(k) -> bool:
    """True when K's buffer has elements between its rows or channels (padded rows, a head dim of stride 2)."""
    span = 1 + sum((n - 1) * s for n, s in zip(k.shape, k.stride()) if s > 0)
    return span > math.prod(n for n, s in zip(k.shape, k.stride()) if s > 0)


def _kernel(bug):
    def kernel(q, k, v, *, causal, window, bottom_right, scale, softcap=None, alibi_slopes=None, sink_logits=None,
               mask=None, seqlens_q=None, seqlens_kv=None):
        if bug == "gapless_k" and _has_gaps(k):  # addresses K as a gap-free buffer in its stride order
            k = k.as_strided(k.shape, _dense_strides(k), k.storage_offset())
        if bug == "k_from_buffer_start" and k.storage_offset():  # addresses K from its buffer's start
            k = k.as_strided(k.shape, k.stride(), 0)
        return _attend(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale,
                       softcap=softcap, alibi_slopes=alibi_slopes, sink_logits=sink_logits, mask=mask,
                       seqlens_q=seqlens_q, seqlens_kv=seqlens_kv)
    kernel.__name__ = bug or "correct"
    return kernel


correct = _kernel(None)
gapless_k = _kernel("gapless_k")
k_from_buffer_start = _kernel("k_from_buffer_start")
