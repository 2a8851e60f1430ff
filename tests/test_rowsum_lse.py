"""The LSE of a kernel that takes its row sum over P rounded to the input dtype (FlashInfer's prefill:
tolerance.ROWSUM_OF_ROUNDED_P) is graded against a baseline rounded the same way, with an allowance for P rounded
against a running maximum tile by tile; the fp32 baseline's bound is too tight for it, and a wrong LSE still fails."""

from __future__ import annotations

import torch

from attnfuzz.oracles import grade as grade_mod
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade, lse_check
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


def _tiled_cases():
    for seed in range(12):
        for dtype in ("bfloat16", "float16"):
            yield Case(sq=40, skv=200, h=2, hk=2, d_qk=64, d_v=64, dtype=dtype, causal=True,
                       alignment="bottom_right", seed=seed)


def test_a_rounded_tiled_row_sum_passes_the_flashinfer_bound_which_its_baseline_alone_does_not_hold(monkeypatch):
    worst_without = 0.0
    for case in _tiled_cases():
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
    for case in _tiled_cases():
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


def test_only_a_rounded_row_sum_family_pays_for_its_terms():
    """The weights but each row's largest (two more reductions over P per row) are computed for a family that reads
    them, and for a family not named yet, and skipped for the rest."""
    case = Case(sq=5, skv=7, d_qk=64, d_v=64, dtype="bfloat16", seed=3)
    t = materialize(case)
    for family, expected in (("flashinfer", True), (None, True), ("default", False), ("fa4", False)):
        ref = Oracle.of(case, t, family=family).ref
        assert (ref.row_rest_rms is not None, ref.row_rest_mass is not None) == (expected, expected), family
