"""Moving the canonical logical tensors [b, s, heads, d] into a backend's layout and back (packed, or a paged pool
through a block table), and the dense boolean mask for backends that take one.

This is adapter code, written apart from the oracle on purpose: if the adapters built their masks with the oracle's
helpers, a mistake there would cancel out on every mask-taking backend instead of being caught.
"""

from __future__ import annotations

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


def cu_seqlens(lens: tuple[int, ...], device) -> torch.Tensor:
    """Cumulative sequence starts, int32, length b + 1 (the varlen convention of FA and TE)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


def pack(x: torch.Tensor, lens: tuple[int, ...]) -> torch.Tensor:
    """[b, s, heads, d] -> [sum(lens), heads, d]: the valid tokens of every sequence, back to back."""
    return torch.cat([x[n, :length] for n, length in enumerate(lens)], dim=0)


def unpack(x: torch.Tensor, lens: tuple[int, ...], s: int) -> torch.Tensor:
    """[sum(lens), heads, d] -> [b, s, heads, d], zeros past each length."""
    out = x.new_zeros(len(lens), s, *x.shape[1:])
    start = 0
    for n, length in enumerate(lens):
        out[n, :length] = x[start:start + length]
        start += length
    return out


def pool_from_table(k, v, block_table, lens, page_size, num_pages, garbage_k, garbage_v):
    """(k_cache, v_cache) [num_pages, page_size, hk, d]: sequence n's first lens[n] keys of the logical k / v
    [b, s, hk, d] in the pages block_table[n] names, in order, and the garbage values in every other slot. Pages
    several sequences name (a shared prefix) get the same keys from each."""
    k_cache = k.new_full((num_pages, page_size, *k.shape[2:]), garbage_k)
    v_cache = v.new_full((num_pages, page_size, *v.shape[2:]), garbage_v)
    for n, length in enumerate(lens):
        for p in range(-(-length // page_size)):
            page, count = int(block_table[n, p]), min(page_size, length - p * page_size)
            k_cache[page, :count] = k[n, p * page_size:p * page_size + count]
            v_cache[page, :count] = v[n, p * page_size:p * page_size + count]
    return k_cache, v_cache


def to_layout(case: Case, x: torch.Tensor, lens: tuple[int, ...]) -> torch.Tensor:
    """The case's layout of one logical tensor: bshd as is, sbhd seq-major, thd packed with `lens`."""
    if case.layout == "sbhd":
        y = x.transpose(0, 1)
        return y.contiguous() if case.memory == "contiguous" else y
    if case.layout == "thd":
        return pack(x, lens)
    return x


def from_layout(case: Case, y: torch.Tensor, lens: tuple[int, ...], s: int) -> torch.Tensor:
    """Inverse of to_layout, back to [b, s, heads, d]."""
    if case.layout == "sbhd":
        return y.transpose(0, 1)
    if case.layout == "thd":
        return unpack(y, lens, s)
    return y


def lse_from_packed(lse: torch.Tensor, lens: tuple[int, ...], s: int) -> torch.Tensor:
    """[heads, total] packed LSE -> [b, heads, s], -inf past each length."""
    out = lse.new_full((len(lens), lse.shape[0], s), float("-inf"))
    start = 0
    for n, length in enumerate(lens):
        out[n, :, :length] = lse[:, start:start + length]
        start += length
    return out


def visibility_mask(case: Case, tensors: Tensors, device) -> torch.Tensor:
    """bool [b, 1, sq, skv], True where query i may see key j: padding, band (window / causal at the case's
    alignment) and the explicit mask, for backends that take a dense mask."""
    i = torch.arange(case.sq, device=device).view(1, case.sq, 1)
    j = torch.arange(case.skv, device=device).view(1, 1, case.skv)
    lq = torch.tensor(case.lens_q, device=device).view(-1, 1, 1)
    lk = torch.tensor(case.lens_kv, device=device).view(-1, 1, 1)
    shift = (lk - lq) if case.alignment == "bottom_right" else torch.zeros_like(lq)
    rel = j - i - shift  # key position relative to the query's diagonal
    keep = (i < lq) & (j < lk)
    if case.left is not None:
        keep = keep & (rel >= -case.left)
    if case.right is not None:
        keep = keep & (rel <= case.right)
    keep = keep[:, None]
    if tensors.mask is not None:
        keep = keep & tensors.mask.to(device)
    return keep


def alibi_bias(case: Case, tensors: Tensors, device, dtype) -> torch.Tensor:
    """float [b, h, sq, skv]: -slope * |i + off - j| (off from the case's alignment), for backends that add a bias."""
    i = torch.arange(case.sq, device=device).view(1, 1, case.sq, 1)
    j = torch.arange(case.skv, device=device).view(1, 1, 1, case.skv)
    lq = torch.tensor(case.lens_q, device=device).view(-1, 1, 1, 1)
    lk = torch.tensor(case.lens_kv, device=device).view(-1, 1, 1, 1)
    off = (lk - lq) if case.alignment == "bottom_right" else torch.zeros_like(lq)
    slopes = tensors.alibi.to(device).view(1, -1, 1, 1)
    return (-slopes * (i + off - j).abs()).to(dtype)
