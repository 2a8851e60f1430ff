"""A batch of equal sequences as one sequence with more heads, so the reference makes one pass where it made b.

The reference works one sequence at a time, and at small sizes its time is the count of its tensor operations, not
their arithmetic: a batch of 3 costs three times one sequence. When every sequence has all of its queries and keys
and no explicit mask tells them apart, sequence n's query head i is head n * h + i of one sequence and its KV head j
is head n * hk + j: the same query head to KV head mapping (head // g), the same band, the same softmax. `fold` makes
that case and its tensors, `unfold` puts the reference's results back in the batch's shapes.
"""

from __future__ import annotations

import dataclasses

import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


def fold(case: Case, t: Tensors) -> tuple[Case, Tensors] | None:
    """The batch as one sequence of b * h query heads and b * hk KV heads; None where sequences differ (padding,
    an explicit mask) or there is one sequence."""
    if case.b == 1 or t.mask is not None or case.lens_q != (case.sq,) * case.b or case.lens_kv != (case.skv,) * case.b:
        return None
    b = case.b
    one = case.replace(b=1, h=b * case.h, hk=b * case.hk, seqlens_q=None, seqlens_kv=None, layout="bshd",
                       alibi_slopes=None if case.alibi_slopes is None else case.alibi_slopes * b)

    def heads(x: torch.Tensor | None) -> torch.Tensor | None:  # [b, s, heads, d] -> [1, s, b * heads, d]
        return None if x is None else x.transpose(0, 1).reshape(1, x.shape[1], -1, x.shape[3])

    def per_head(x: torch.Tensor | None) -> torch.Tensor | None:  # a value per query head, the same in every sequence
        return None if x is None else x.repeat(b)

    return one, Tensors(q=heads(t.q), k=heads(t.k), v=heads(t.v), mask=None, sink=per_head(t.sink),
                        alibi=per_head(t.alibi), dout=heads(t.dout))


def unfold(ref, case: Case):
    """A Reference of the folded case in the shapes of `case`'s batch (its scalars are maxima over every head and
    row, the same either way)."""
    b = case.b

    def rows_heads(x):   # [1, s, b * heads, ...] -> [b, s, heads, ...]
        return None if x is None else x[0].unflatten(1, (b, -1)).transpose(0, 1).contiguous()

    def heads_rows(x):   # [1, b * heads, s] -> [b, heads, s]
        return None if x is None else x[0].unflatten(0, (b, -1))

    grad_rms = ref.row_grad_rms and {name: rows_heads(x) for name, x in ref.row_grad_rms.items()}
    fp8_terms = ref.fp8_grad_terms and {name: rows_heads(x) for name, x in ref.fp8_grad_terms.items()}
    return dataclasses.replace(
        ref, out=rows_heads(ref.out), lse=heads_rows(ref.lse), dq=rows_heads(ref.dq), dk=rows_heads(ref.dk),
        dv=rows_heads(ref.dv), empty=None if ref.empty is None else ref.empty.expand(b, -1).contiguous(),
        row_logit_size=heads_rows(ref.row_logit_size), row_rest_rms=heads_rows(ref.row_rest_rms),
        row_rest_mass=heads_rows(ref.row_rest_mass), row_dv_terms=rows_heads(ref.row_dv_terms),
        row_spread=rows_heads(ref.row_spread), row_rms=rows_heads(ref.row_rms), row_grad_rms=grad_rms,
        row_d_moves=rows_heads(ref.row_d_moves), row_d_size=rows_heads(ref.row_d_size),
        key_mass=rows_heads(ref.key_mass), key_d_terms=rows_heads(ref.key_d_terms),
        row_p_max=rows_heads(ref.row_p_max), row_v_sum=rows_heads(ref.row_v_sum),
        row_v_lo=rows_heads(ref.row_v_lo), row_v_hi=rows_heads(ref.row_v_hi), fp8_grad_terms=fp8_terms)
