"""An fp32 LSE over a long row carries its row sum's rounding, which grows with the number of keys: a kernel that adds
the row's terms one by one in fp32 (the worst order) passes, and one that drops a key still fails."""

from __future__ import annotations

import torch

from attnfuzz.oracles.grade import Oracle, lse_check
from attnfuzz.oracles.tolerance import EPS
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize


def _sequential_lse(case: Case, t, drop_last: bool = False) -> torch.Tensor:
    """[b, h, sq]: fp32 logits, the row maximum subtracted, exp in fp32, and the row sum taken one key at a time in
    fp32 (each add rounds against the running sum); `drop_last` leaves the last key out (a tile-edge bug)."""
    s = torch.einsum("bqhd,bkhd->bhqk", t.q.float(), t.k.float()) * case.softmax_scale
    top = s.amax(-1)
    p = torch.exp(s - top[..., None])
    total = torch.zeros_like(top)
    for j in range(case.skv - (1 if drop_last else 0)):
        total = total + p[..., j]
    return top + torch.log(total)


def _long_row(seed: int) -> Case:
    # Gaussian logits: the terms' low bits differ, so each add's rounding is as likely up as down (terms that are all
    # equal round the same way every time, a bias no kernel that adds tile sums shows)
    return Case(sq=16, skv=24576, d_qk=8, d_v=8, dtype="float32", seed=seed)


def test_a_sequential_fp32_row_sum_passes_and_needed_the_allowance():
    worst = old_floor = 0.0
    for seed in range(2):
        case = _long_row(seed)
        t = materialize(case)
        o = Oracle.of(case, t)
        lse = _sequential_lse(case, t)
        c = lse_check(o, lse, "default")
        assert c.ok, c.describe()
        worst = max(worst, c.diff_max)
        old_floor = max(old_floor, 2 * EPS["float32"] * float(o.ref.lse.abs().max()) + 1e-7)
    # a row is off by more than the bound allowed before the row sum's term: 2 eps(fp32) * |lse| + 1e-7
    assert worst > old_floor, (worst, old_floor)


def test_a_row_sum_that_drops_a_key_still_fails():
    case = Case(sq=16, skv=4096, d_qk=8, d_v=8, dtype="float32", seed=3)
    t = materialize(case)
    o = Oracle.of(case, t)
    assert lse_check(o, _sequential_lse(case, t), "default").ok
    c = lse_check(o, _sequential_lse(case, t, drop_last=True), "default")
    assert not c.ok and c.ratio > 5, c.describe()
