"""The range check (oracles/hull.py): an output row must lie within the values of the keys it sees.

The control kernel is TE's unfused attention as its source reads: logits a matmul rounded to the input dtype, masked
logits filled with -10000, softmax in fp32. On anti-aligned values the row's visible logits sit near -16384, below the
fill, so the weight goes to the masked keys; the per-row bound of logits rounded to fp16 / bf16 (16 / 128 at that
size) admits it, the range check does not. With -inf as the fill the same kernel passes.
"""

from types import SimpleNamespace

import pytest
import torch

from attnfuzz.backends.layout import visibility_mask
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.alternatives import valid_rows
from attnfuzz.oracles.grade import Oracle, check_out, grade
from attnfuzz.oracles.hull import range_failure, value_range
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize, torch_dtype

# b 2 padded to 65 (lengths 4 and 65), window (4, 4), anti-aligned values: a case TE's unfused backend fails in fp32
CASE = dict(b=2, sq=65, skv=65, h=1, hk=1, d_qk=8, d_v=8, seqlens_q=(4, 65), seqlens_kv=(4, 65), window=(4, 4),
            layout="sbhd", seed=1393962283, values="anti_aligned")


def filled(case: Case, t, fill: float) -> torch.Tensor:
    """Attention with logits rounded to the case's dtype and the hidden ones set to `fill` before the softmax."""
    dtype = torch_dtype(case)
    logits = (torch.einsum("bqhd,bkhd->bhqk", t.q.float(), t.k.float()) * case.softmax_scale).to(dtype)
    keep = visibility_mask(case, t, "cpu")
    p = torch.softmax(logits.float().masked_fill(~keep, fill), -1).to(dtype)
    return torch.einsum("bhqk,bkhd->bqhd", p.float(), t.v.float()).to(dtype).nan_to_num(0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_fill_above_the_rows_logits_passes_the_bound_and_fails_the_range(dtype):
    case = Case(dtype=dtype, **CASE)
    t = materialize(case, "cpu")
    out = filled(case, t, -10000.0)
    o = Oracle.of(case, t)
    assert check_out(o, out, o.ref.out, "te-unfused").ok   # what the bound alone said: PASS
    verdict = grade(case, t, V.Output(out=out), family="te-unfused")
    assert verdict.status == V.FAIL and "out range" in verdict.message, verdict.message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_same_kernel_with_minus_inf_passes(dtype):
    case = Case(dtype=dtype, **CASE)
    t = materialize(case, "cpu")
    assert grade(case, t, V.Output(out=filled(case, t, float("-inf"))), family="te-unfused").status == V.PASS


def test_a_row_scaled_past_its_keys_is_caught_and_a_correct_row_is_not():
    case = Case(b=1, sq=3, skv=5, h=2, hk=2, d_qk=4, d_v=4, dtype="float32", causal=True, std=(4.0, 4.0, 1.0))
    t = materialize(case, "cpu")
    o = Oracle.of(case, t)
    rows = valid_rows(case, "cpu") & ~o.ref.empty
    assert range_failure(case, o.ref.row_v_lo, o.ref.row_v_hi, t.v, o.ref.out, rows) is None
    bad = o.ref.out.clone()
    bad[0, 0] *= 1.5   # row 0 sees one key: its output is that key's value, and 1.5 times it lies outside
    check = range_failure(case, o.ref.row_v_lo, o.ref.row_v_hi, t.v, bad, rows)
    assert check is not None and not check.ok and check.index[:2] == (0, 0)


def test_a_sink_widens_the_range_to_zero():
    visible = torch.tensor([[True, True], [True, False]])
    v = torch.tensor([[[2.0]], [[3.0]]], dtype=torch.float64)   # [j, h, d]
    lo, hi = value_range(visible, v, 1, sink=False)
    assert (lo[0, 0, 0], hi[0, 0, 0], lo[1, 0, 0], hi[1, 0, 0]) == (2.0, 3.0, 2.0, 2.0)
    lo, hi = value_range(visible, v, 1, sink=True)
    assert (lo[0, 0, 0], hi[0, 0, 0]) == (0.0, 3.0)


def test_a_sequence_without_keys_gives_an_empty_range():
    lo, hi = value_range(torch.zeros(3, 0, dtype=torch.bool), torch.zeros(0, 2, 4, dtype=torch.float64), 2, sink=True)
    assert lo.shape == (3, 2, 4) and bool((lo > hi).all())


def test_blocks_of_rows_give_the_range_of_one_block(monkeypatch):
    visible = torch.rand(7, 9) < 0.6
    v = torch.randn(9, 2, 3, dtype=torch.float64)
    whole = value_range(visible, v, 2, sink=False)
    monkeypatch.setattr("attnfuzz.oracles.hull.BLOCK_ELEMENTS", 1)   # one row a block
    blocks = value_range(visible, v, 2, sink=False)
    assert all(torch.equal(a, b) for a, b in zip(whole, blocks))


def test_fp8_rounding_of_p_or_the_output_keeps_no_range():
    case = Case(b=1, sq=2, skv=2, h=1, hk=1, d_qk=4, d_v=4, dtype="float32", std=(4.0, 4.0, 1.0))
    t = materialize(case, "cpu")
    o = Oracle.of(case, t)
    rows = valid_rows(case, "cpu")
    bad = o.ref.out + 10.0
    assert range_failure(case, o.ref.row_v_lo, o.ref.row_v_hi, t.v, bad, rows) is not None
    for fp8 in (dict(fp8_p="e4m3", fp8_out=None), dict(fp8_p=None, fp8_out="e4m3")):
        stand_in = SimpleNamespace(dtype=case.dtype, **fp8)   # range_failure reads only these of the case
        assert range_failure(stand_in, o.ref.row_v_lo, o.ref.row_v_hi, t.v, bad, rows) is None


def test_rows_with_small_logits_keep_no_range():
    """Below RANGE_LOGITS the bound's logit term is within the range's allowance: the reference spends nothing there."""
    small = Case(b=1, sq=3, skv=3, h=1, hk=1, d_qk=4, d_v=4, dtype="float16", std=(0.1, 0.1, 1.0))
    assert Oracle.of(small, materialize(small, "cpu")).ref.row_v_lo is None
    large = small.replace(std=(8.0, 8.0, 1.0))
    assert Oracle.of(large, materialize(large, "cpu")).ref.row_v_lo is not None
