"""The LSE of a kernel that takes its row sum over P rounded to the input dtype (FlashInfer's prefill:
tolerance.ROWSUM_OF_ROUNDED_P) is graded against a baseline rounded the same way; the fp32 baseline's bound is too
tight for it, and a wrong LSE still fails."""

from __future__ import annotations

import torch

from attnfuzz.oracles.grade import Oracle, lse_check
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize


def _rowsum_rounded_lse(case: Case, t) -> torch.Tensor:
    """An emulated kernel, written apart from the oracle: fp32 logits, P = exp(s - max) cast to the input dtype and
    summed in fp32, lse = max + log(sum); [b, h, sq]."""
    s = torch.einsum("bqhd,bkhd->bhqk", t.q.float(), t.k.float()) * case.softmax_scale
    top = s.amax(-1, keepdim=True)
    d = torch.exp(s - top).to(t.q.dtype).float().sum(-1)
    return top.squeeze(-1) + torch.log(d)


def _cases():
    for seed in range(120):
        for dtype in ("float16", "bfloat16"):
            yield Case(sq=5, skv=2 + seed % 7, d_qk=64, d_v=64, dtype=dtype, seed=seed,
                       scale=1.0 if seed % 3 == 0 else None)


def test_a_row_sum_of_rounded_p_passes_its_family_and_needs_it():
    over_default = 0
    for case in _cases():
        t = materialize(case)
        o = Oracle.of(case, t, family="flashinfer")
        lse = _rowsum_rounded_lse(case, t)
        c = lse_check(o, lse, "flashinfer")
        assert c.ok, (case, c.describe())
        over_default += not lse_check(Oracle.of(case, t, family="default"), lse, "default").ok
    assert over_default >= 5, over_default   # the fp32 baseline's bound fails such a kernel


def test_a_wrong_lse_still_fails_the_rounded_row_sum_family():
    for dtype, off in (("float16", 2.0**-9), ("bfloat16", 2.0**-6)):
        case = Case(sq=5, skv=4, d_qk=64, d_v=64, dtype=dtype, seed=3)
        t = materialize(case)
        lse = _rowsum_rounded_lse(case, t)
        lse[0, 0, 2] += off   # four times the rounding a row sum of P in that dtype can carry
        assert not lse_check(Oracle.of(case, t, family="flashinfer"), lse, "flashinfer").ok, dtype
