"""Visibility as small boolean helpers: query i sees key j iff every helper says so (they are ANDed)."""

from __future__ import annotations

import torch


def band(rows: torch.Tensor, cols: torch.Tensor, off: int, left: int | None, right: int | None) -> torch.Tensor:
    """[r, j]: i + off - left <= j <= i + off + right; a None bound is unbounded."""
    diag = rows[:, None] + off
    keep = torch.ones(rows.numel(), cols.numel(), dtype=torch.bool, device=rows.device)
    if left is not None:
        keep &= cols[None, :] >= diag - left
    if right is not None:
        keep &= cols[None, :] <= diag + right
    return keep


def diagonal_offset(alignment: str, sq_n: int, skv_n: int) -> int:
    """off = 0 aligns the mask's diagonal to the top-left corner, skv_n - sq_n to the bottom-right one."""
    return 0 if alignment == "top_left" else skv_n - sq_n


def distance(rows: torch.Tensor, cols: torch.Tensor, off: int) -> torch.Tensor:
    """[r, j]: |i + off - j|, the ALiBi distance, measured from the same diagonal as the band."""
    return (rows[:, None] + off - cols[None, :]).abs()
