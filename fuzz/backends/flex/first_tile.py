"""Which rows flex's compiled kernel meets with no visible key in the first key tile it runs for them: what
ROWS_GUARANTEED_SAFE really asks, beside what its docstring says ("at least one value in each row is not masked").

The Triton kernel (torch/_inductor/kernel/flex/templates/flex_attention.py.jinja) runs a query block's partial key
blocks (those its mask_mod keeps in part, mask applied) before its full ones, each in tiles of BLOCK_N keys, and keeps
a running row maximum from -inf. ROWS_GUARANTEED_SAFE drops the guard for a row whose maximum is still -inf after a
tile: a row that sees no key in the first tile computes exp2(-inf - -inf) = NaN, and the NaN stays. So a row that
sees keys, but none at the start of its query block's first partial key block, is NaN under the option (a sliding
window does it: pytorch/pytorch#194154, a docstring change proposed and closed). Here the necessary condition,
whatever BLOCK_N: the row does not see the first key of that block. The block mask is create_block_mask's, 128 by
128, over the call flex runs (thd: the packed sequences; else each batch element); the score_mask spelling has no
block mask, so every tile runs, from key 0.
"""

from __future__ import annotations

import torch

from attnfuzz.backends.flex.knobs import band_ranges
from attnfuzz.strategies.case import Case

SPARSE_BLOCK = 128   # create_block_mask's default block, the adapter's


def first_tile_unseen(case: Case) -> bool:
    """Whether a row flex computes sees no key at the start of the first key block its kernel runs for it (above).
    An explicit random mask counts as yes: its drawn mask alone tells."""
    if case.mask_density is not None and case.mask_density < 1:
        return True
    from_key_0 = "score_mask" in case.spelling.split("+")
    return any(_unseen(lo, hi, kv_len, from_key_0) for lo, hi, kv_len in _calls(case))


def _calls(case: Case):
    """(lo, hi, kv_len) per call's block mask: the keys each row sees, in the call's own indices."""
    if case.layout == "thd":
        los, his, start = [], [], 0
        for sq_n, skv_n in zip(case.lens_q, case.lens_kv):
            lo, hi = band_ranges(case, sq_n, skv_n)
            los.append(lo + start)
            his.append(hi + start)
            start += skv_n
        yield torch.cat(los), torch.cat(his), start
        return
    for sq_n, skv_n in zip(case.lens_q, case.lens_kv):
        lo, hi = band_ranges(case, sq_n, skv_n)
        yield (*_with_empty_rows(lo, hi, case.sq - sq_n), case.skv)   # padding rows: the padding mask hides every key


def _unseen(lo: torch.Tensor, hi: torch.Tensor, kv_len: int, from_key_0: bool) -> bool:
    rows = lo.numel()
    if rows == 0:
        return False
    if from_key_0:
        return bool(((lo > 0) | (hi < 0)).any())
    blocks_q, blocks_kv = -(-rows // SPARSE_BLOCK), max(1, -(-kv_len // SPARSE_BLOCK))
    lo, hi = _with_empty_rows(lo, hi, blocks_q * SPARSE_BLOCK - rows)   # rows past the call: padded as masked
    lo, hi = lo.view(blocks_q, SPARSE_BLOCK, 1), hi.view(blocks_q, SPARSE_BLOCK, 1)
    starts = torch.arange(blocks_kv) * SPARSE_BLOCK
    seen = (torch.minimum(hi, starts + SPARSE_BLOCK - 1) - torch.maximum(lo, starts) + 1).clamp(min=0).sum(1)
    partial = (seen > 0) & (seen < SPARSE_BLOCK * SPARSE_BLOCK)       # [blocks_q, blocks_kv]
    first = partial.int().argmax(1) * SPARSE_BLOCK                    # each query block's first partial key block
    sees_start = ((lo <= first.view(-1, 1, 1)) & (hi >= first.view(-1, 1, 1))).view(-1)[:rows]   # the call's rows
    return bool((partial.any(1).repeat_interleave(SPARSE_BLOCK)[:rows] & ~sees_start).any())


def _with_empty_rows(lo: torch.Tensor, hi: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lo and hi with `count` rows after them that see no key (lo 0 > hi -1)."""
    return (torch.cat([lo, torch.zeros(count, dtype=lo.dtype)]),
            torch.cat([hi, torch.full((count,), -1, dtype=hi.dtype)]))
