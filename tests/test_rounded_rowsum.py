"""The LSE of a kernel that sums P rounded to the dtype against its running maximum (FlashInfer's prefill kernels:
tolerance.ROWSUM_OF_ROUNDED_P) passes under that family's bound, and a leaked key still fails it."""

from __future__ import annotations

import math

import torch

from attnfuzz.oracles import grade as grade_mod
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade, lse_check
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

TILE = 16


def tiled_rounded_lse(case: Case, t, leak: bool = False) -> torch.Tensor:
    """[b, h, sq] natural-log LSE as a FlashInfer-style kernel takes it: fp32 logits, keys in tiles of TILE, each
    tile's P = exp(s - running max) rounded to the dtype before its row sum, earlier sums rescaled in fp32. `leak`:
    one key past the causal diagonal counted too (the bug the bound must still see)."""
    dtype = getattr(torch, case.dtype)
    q, k = t.q.float(), t.k.float()
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * case.softmax_scale
    sq, skv = case.sq, case.skv
    visible = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq + (1 if leak else 0))
    s = s.masked_fill(~visible, float("-inf"))
    m = torch.full(s.shape[:-1], float("-inf"))
    d = torch.zeros(s.shape[:-1])
    for j0 in range(0, skv, TILE):
        tile = s[..., j0:j0 + TILE]
        m_new = torch.maximum(m, tile.amax(-1))
        d = d * torch.exp(m - m_new).nan_to_num(nan=0.0) + torch.exp(tile - m_new[..., None]).to(dtype).float().sum(-1)
        m = m_new
    return m + torch.log(d)


def cases():
    for seed in range(12):
        for dtype in ("bfloat16", "float16"):
            yield Case(sq=40, skv=200, h=2, hk=2, d_qk=64, d_v=64, dtype=dtype, causal=True,
                       alignment="bottom_right", seed=seed)


def test_a_rounded_tiled_row_sum_passes_the_flashinfer_bound_which_its_baseline_alone_does_not_hold(monkeypatch):
    worst_without = 0.0
    for case in cases():
        t = materialize(case)
        o = Oracle.of(case, t)
        lse = tiled_rounded_lse(case, t)
        said = grade(case, t, V.Output(out=o.ref.out.to(getattr(torch, case.dtype)), lse=lse), family="flashinfer")
        assert said.status == V.PASS, (case, said)
        with monkeypatch.context() as m:   # the family's rounded-rowsum baseline alone, without the allowance
            m.setattr(grade_mod, "rounded_rowsum_lse", lambda *_: 0.0)
            worst_without = max(worst_without, lse_check(o, lse, "flashinfer").ratio)
    assert worst_without > 1.5, f"{worst_without}: the emulated kernel hardly needs the allowance; the test is blind"


def test_a_leaked_key_still_fails_the_flashinfer_bound():
    caught = 0
    for case in cases():
        t = materialize(case)
        o = Oracle.of(case, t)
        said = grade(case, t, V.Output(out=o.ref.out.to(getattr(torch, case.dtype)),
                                       lse=tiled_rounded_lse(case, t, leak=True)), family="flashinfer")
        caught += said.status == V.FAIL and said.diagnosis == V.LSE
    assert caught == 2 * 12, f"{caught} of 24 leaks seen"


def test_the_allowance_is_u_times_the_weights_but_the_largest():
    case = Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16")
    o = Oracle.of(case, materialize(case))
    assert float(o.ref.row_rest_mass.max()) == 0.0 and float(o.ref.row_rest_rms.max()) == 0.0, "one key: exp(0)"
    assert lse_check(o, o.ref.lse.float(), "flashinfer").floor == lse_check(o, o.ref.lse.float(), "default").floor
    assert math.isclose(sum(1 for _ in cases()), 24)
