"""The range check: a row's output lies within the values of the keys it sees, whatever its logits' rounding.

Softmax attention's output row is a weighted mean of the visible keys' values: O_ic = sum_j P_ij V_jc with P_ij >= 0
summing to 1 (or to less than 1 with a sink or the off-by-one softmax, whose extra weight sits on a value of 0). So
each channel of O_i lies between the smallest and the largest V_jc over the keys row i sees (0 included with a sink),
however the logits were computed: rounding the logits moves the weights among the visible keys and nothing else.

That makes it a check the tolerance model cannot give on rows whose logits are large. There a correct kernel's
logits may be off by eps(dtype) times their size (16 in fp16 at a logit of -16384, when the kernel's logits are a
matmul rounded to the input dtype), which admits any weighting of the row's keys, so the per-row bound admits any
output near the row's values: a kernel that gives the weight to keys it must not see (TE's unfused backend, which
fills masked logits with -10000 instead of -inf) passes it. The range check still fails it where those keys' values
lie outside the visible ones'.

What a correct kernel may be off by: P rounded to the dtype before P V while the row sum is taken in fp32 (the
FlashAttention order) makes the weights sum to 1 within u = eps / 2, and the output is rounded to the dtype once
more: 2u = eps(dtype) of the largest |V_jc| in all. RANGE_ULPS allows 8 times that, of the case's largest |V|. FP8
rounding of P or of the output (fp8_p, fp8_out) is coarser than the dtype and is left out; FP8 inputs are exact
values the reference reads. Rows whose logits are small (RANGE_LOGITS) keep no range: there the bound is as tight.
"""

from __future__ import annotations

import torch

from attnfuzz.oracles.tolerance import EPS, Check

RANGE_ULPS = 8.0        # eps(dtype) of the case's largest |V|, 8 times what a correct kernel's roundings give
BLOCK_ELEMENTS = 2**20  # rows x keys x channels masked at once (8 MiB of float64)
RANGE_LOGITS = RANGE_ULPS / 2   # the logit size above which a row keeps a range: below it the bound's logit term,
#                               2 eps(logits) L_i sum_j P_ij |V_j| <= 2 eps(dtype) L_i max|V|, is within the range's own
#                               allowance, so the range check could tell nothing that term hides
RANGE_WORK = 2**26      # b * h * sq * skv * d_v up to which a case keeps a range: the masked min / max is elementwise
#                         work, where the reference's matmuls are not; failures shrink to cases far below it
ABSOLUTE = 1e-7         # as the tolerance's floor: an all-tiny row is not graded on subnormals


def keeps_range(case) -> bool:
    """Whether the reference may keep ranges for the case (RANGE_WORK; the same for a batch folded into the heads): it
    keeps one for each row and head whose logit size passes RANGE_LOGITS."""
    return case.b * case.h * case.sq * case.skv * case.d_v <= RANGE_WORK


def value_range(visible: torch.Tensor, v: torch.Tensor, h: int, sink: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) [r, h, d_v]: per row, head and channel, the least and largest value of the keys the row sees
    (`visible` [r, j], v [j, h, d_v]: one KV head per query head), widened to 0 with a sink; (inf, -inf) where the
    row sees no key (such rows are graded as empty rows, not here). Taken a block of rows at a time, each block's
    masked copy of the values within BLOCK_ELEMENTS."""
    r, j = visible.shape
    if not j or not r:   # no key: no row sees one
        return (v.new_full((r, h, v.shape[-1]), float("inf")), v.new_full((r, h, v.shape[-1]), float("-inf")))
    values, seen = v.detach().reshape(1, j, -1), visible[:, :, None]
    step = max(1, BLOCK_ELEMENTS // max(values.numel(), 1))

    def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.where(seen[rows], values, float("inf")).amin(1),
                torch.where(seen[rows], values, float("-inf")).amax(1))

    if step >= r:   # the usual case: one block
        lo, hi = block(slice(None))
    else:
        lo, hi = values.new_empty(r, values.shape[-1]), values.new_empty(r, values.shape[-1])
        for r0 in range(0, r, step):
            lo[r0:r0 + step], hi[r0:r0 + step] = block(slice(r0, r0 + step))
    if sink:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    return lo.reshape(r, h, -1), hi.reshape(r, h, -1)


def row_ranges(case, visible: torch.Tensor, v: torch.Tensor, row_size: torch.Tensor | None,
               sink: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """value_range on the rows and heads whose logit size (`row_size` [h, r]) passes RANGE_LOGITS, the others
    unbounded (-inf, inf); None where no row does, the case is over RANGE_WORK, or v keeps fewer heads than the
    queries (a "mod" head map's alternative)."""
    if row_size is None or not keeps_range(case) or v.shape[1] != case.h:
        return None
    wide = (row_size > RANGE_LOGITS).T[:, :, None]   # [r, h, 1]
    if not bool(wide.any()):
        return None
    lo, hi = value_range(visible, v, case.h, sink)
    return lo.masked_fill(~wide, float("-inf")), hi.masked_fill(~wide, float("inf"))


def range_failure(case, lo: torch.Tensor | None, hi: torch.Tensor | None, v: torch.Tensor, out: torch.Tensor,
                  rows: torch.Tensor) -> Check | None:
    """The output [b, sq, h, d_v] against the range of the values each row sees (lo, hi from the reference), on
    `rows` [b, sq] (rows that see a key): its Check where some channel lies outside by more than RANGE_ULPS eps(dtype)
    of the case's largest |V|, else None; None too where the reference kept no range (RANGE_WORK, a baseline's) or
    FP8 rounds P or the output."""
    if lo is None or hi is None or case.fp8_p is not None or case.fp8_out is not None or not out.numel():
        return None
    x = out.to(lo.dtype)
    over = torch.maximum(lo - x, x - hi).masked_fill(~rows[:, :, None, None], 0.0).nan_to_num(nan=0.0)
    allowed = RANGE_ULPS * EPS[case.dtype] * float(v.abs().max()) + ABSOLUTE
    worst = over.argmax()
    if not float(over.flatten()[worst]) > allowed:
        return None
    index = tuple(int(i) for i in torch.unravel_index(worst, over.shape))
    below = bool(x[index] < lo[index])
    return Check("out range (the values of the keys the row sees)", float(over[index]), 0.0, 1.0, allowed, index,
                 float(x[index]), float(lo[index] if below else hi[index]), rows=int(rows.sum()) * out.shape[2])
