"""The verdict: every diagnosis fires on the output it names, and the worst element points at the damage."""

from __future__ import annotations

import math

import pytest
import torch

from attnfuzz.engine.harness import run_case
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, alternatives, grade
from attnfuzz.oracles.reference import reference
from attnfuzz.oracles.tolerance import check
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.broken import BROKEN, Correct, LeaksOneKey

BASE = Case(b=2, sq=40, skv=64, h=4, hk=2, d_qk=32, d_v=16, dtype="bfloat16", causal=True, seed=7)


def _graded(case: Case, make_out, **output):
    t = materialize(case)
    oracle = Oracle.of(case, t)
    return grade(case, t, Output(make_out(case, t, oracle).to(t.q.dtype), **output), oracle=oracle)


def _ref(**overrides):
    return lambda case, t, oracle: reference(case, t, **overrides).out


def test_correct_output_passes():
    verdict = _graded(BASE, lambda c, t, o: o.ref.out)
    assert verdict.status == V.PASS and verdict.ratio <= 1


@pytest.mark.parametrize("case, make_out, diagnosis", [
    (BASE, lambda c, t, o: torch.zeros_like(o.ref.out), V.ALL_ZERO),
    (BASE.replace(alignment="top_left"), lambda c, t, o: reference(c.replace(alignment="bottom_right"), t).out,
     V.MASK_ALIGNMENT),
    (BASE.replace(alignment="bottom_right"), lambda c, t, o: reference(c.replace(alignment="top_left"), t).out,
     V.MASK_ALIGNMENT),
    (BASE.replace(causal=False, window=(6, 2)), _ref(bounds=(7, 2)), V.WINDOW_OFF_BY_ONE),
    (BASE.replace(causal=False, window=(6, 2)), _ref(bounds=(6, 1)), V.WINDOW_OFF_BY_ONE),
    (BASE, _ref(bounds=(None, -1)), V.WINDOW_OFF_BY_ONE),        # causal with the diagonal left out
    (BASE, lambda c, t, o: reference(c.replace(causal=False), t).out, V.MASK_IGNORED),
    (BASE.replace(causal=False, window=(6, 2)), lambda c, t, o: reference(c.replace(window=(None, None)), t).out,
     V.MASK_IGNORED),
    (BASE, _ref(head_map="mod"), V.GQA_MAPPING),
    (BASE, _ref(scale=1 / math.sqrt(16)), V.SCALE),               # 1/sqrt(d_v) while d_qk = 32
    (BASE.replace(scale=0.05), _ref(scale=1 / math.sqrt(32)), V.SCALE),  # the custom scale ignored
    (BASE, lambda c, t, o: o.ref.out * 1.05, V.TOLERANCE),
    (BASE, lambda c, t, o: o.ref.out.transpose(1, 2), V.SHAPE),   # [b, h, sq, d_v] for [b, sq, h, d_v]
], ids=["zeros", "top-left-read-as-bottom-right", "bottom-right-read-as-top-left", "window-left+1",
        "window-right-1", "causal-diagonal-dropped", "causal-dropped", "window-dropped", "gqa-modulo", "scale-d_v",
        "scale-ignored", "tolerance", "head-major"])
def test_broken_output_gets_its_diagnosis(case, make_out, diagnosis):
    verdict = _graded(case, make_out)
    assert verdict.status == V.FAIL and verdict.diagnosis == diagnosis, verdict


def test_nan_in_one_row_is_nonfinite_and_located():
    def one_nan_row(case, t, o):
        out = o.ref.out.clone()
        out[1, 9, 3] = float("nan")
        return out
    verdict = _graded(BASE, one_nan_row)
    assert verdict.diagnosis == V.NONFINITE
    assert verdict.worst.index[:3] == (1, 9, 3) and math.isnan(verdict.worst.got)


def test_worst_element_points_at_the_damage():
    def one_bad_element(case, t, o):
        out = o.ref.out.clone()
        out[0, 17, 2, 5] += 3.0
        return out
    verdict = _graded(BASE, one_bad_element)
    assert verdict.diagnosis == V.TOLERANCE and verdict.worst.index == (0, 17, 2, 5)
    assert verdict.worst.got - verdict.worst.expected == pytest.approx(3.0, abs=0.05)
    assert "diff_max=" in verdict.message and "baseline_max=" in verdict.message and "k=" in verdict.message


def test_lse_is_graded_once_the_output_passes():
    case = BASE
    t = materialize(case)
    oracle = Oracle.of(case, t)
    good = grade(case, t, Output(oracle.ref.out, lse=oracle.ref.lse.float()), oracle=oracle)
    bad = grade(case, t, Output(oracle.ref.out, lse=oracle.ref.lse.float() + 0.01), oracle=oracle)
    log2 = grade(case, t, Output(oracle.ref.out, lse=oracle.ref.lse.float() / math.log(2)), oracle=oracle)
    assert good.status == V.PASS and bad.diagnosis == V.LSE and log2.diagnosis == V.LSE


def test_empty_row_lse_must_be_minus_inf():
    case = Case(sq=6, skv=2, causal=True, alignment="bottom_right", dtype="float16")
    t = materialize(case)
    oracle = Oracle.of(case, t)
    lse = oracle.ref.lse.float().clone()
    lse[torch.isinf(lse)] = float("inf")                       # a backend spelling "empty" as +inf
    verdict = grade(case, t, Output(oracle.ref.out, lse=lse), oracle=oracle)
    assert verdict.diagnosis == V.LSE and "no visible key" in verdict.message


def test_gradients_are_graded():
    case = BASE.replace(grads=True)
    t = materialize(case)
    oracle = Oracle.of(case, t)
    r = oracle.ref
    assert grade(case, t, Output(r.out, dq=r.dq, dk=r.dk, dv=r.dv), oracle=oracle).status == V.PASS
    verdict = grade(case, t, Output(r.out, dq=r.dq, dk=r.dk * 1.1, dv=r.dv), oracle=oracle)
    assert verdict.diagnosis == V.GRADIENT and verdict.worst.tensor == "dk"
    missing = grade(case, t, Output(r.out), oracle=oracle)
    assert missing.diagnosis == V.GRADIENT and "no dq" in missing.message


def test_a_kernel_returning_its_output_head_major_is_a_shape_failure():
    """tests/broken.py's HeadMajor returns the right values as [b, h, sq, d_v]: FAIL:SHAPE, saying both shapes; the
    correct kernel passes the same case (the control)."""
    verdict = run_case(BROKEN["broken-head-major"](), BASE)
    assert verdict.label == "FAIL:SHAPE", verdict
    assert verdict.message == "out has shape (2, 4, 40, 16), expected (2, 40, 4, 16) (b, sq, h, d_v)", verdict.message
    assert run_case(Correct(), BASE).status == V.PASS


def test_an_lse_or_a_gradient_in_another_shape_is_a_shape_failure():
    case = BASE.replace(grads=True)
    t = materialize(case)
    oracle = Oracle.of(case, t)
    r = oracle.ref
    lse = grade(case, t, Output(r.out, lse=r.lse.float().transpose(1, 2)), oracle=oracle)
    assert lse.label == "FAIL:SHAPE" and lse.message.startswith("lse has shape (2, 40, 4), expected (2, 4, 40)"), lse
    dq = grade(case, t, Output(r.out, dq=r.dq.transpose(1, 2), dk=r.dk, dv=r.dv), oracle=oracle)
    assert dq.label == "FAIL:SHAPE" and dq.message.startswith("dq has shape (2, 4, 40, 32)"), dq
    assert grade(case, t, Output(r.out, lse=r.lse.float(), dq=r.dq, dk=r.dk, dv=r.dv), oracle=oracle).status == V.PASS


def test_padding_rows_are_not_graded():
    case = Case(b=2, sq=8, skv=8, seqlens_q=(8, 3), seqlens_kv=(8, 5), dtype="float16")
    t = materialize(case)
    oracle = Oracle.of(case, t)
    out = oracle.ref.out.clone()
    out[1, 3:] = 123.0                                          # garbage where sequence 1 has no queries
    assert grade(case, t, Output(out), oracle=oracle).status == V.PASS


def test_alternatives_only_where_they_differ():
    plain = Case(sq=8, skv=8)
    assert alternatives(plain) == [(V.SCALE, "matches scale 1 (no scaling) instead of 0.25", {"scale": 1.0})]
    kinds = {a[0] for a in alternatives(BASE)}
    assert {V.MASK_ALIGNMENT, V.WINDOW_OFF_BY_ONE, V.MASK_IGNORED, V.GQA_MAPPING, V.SCALE} <= kinds


def test_nonzero_empty_rows_are_named():
    """A kernel that gives a row with no visible key the mean of V (uniform weights over masked keys)."""
    case = Case(sq=5, skv=2, causal=True, alignment="bottom_right", dtype="float16")   # rows 0-2 see nothing
    t = materialize(case)
    oracle = Oracle.of(case, t)
    out = oracle.ref.out.clone()
    out[0, :3] = t.v[0].double().mean(0)
    verdict = grade(case, t, Output(out.half()), oracle=oracle)
    assert verdict.diagnosis == V.EMPTY_ROWS and verdict.worst.index[1] < 3, verdict


def test_zeros_that_are_right_in_the_dtype_pass():
    """Logits of -80 make the true output ~1e-8, below fp16's smallest subnormal: a kernel's 0 is correct."""
    case = Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", softmax="off_by_one", std=(10.0, 10.0, 1.0))
    t = materialize(case)
    oracle = Oracle.of(case, t)
    assert 0 < oracle.ref.out.abs().max().item() < 6e-8
    assert grade(case, t, Output(torch.zeros_like(t.q[..., :8])), oracle=oracle).status == V.PASS


def _logits_in_dtype(case, t):
    """TE's unfused backend, written out: logits one matmul rounded to the dtype, softmax in fp32 rounded to the
    dtype, P V in fp32 rounded once."""
    g = case.h // case.hk
    q, k, v = t.q.float(), t.k.float().repeat_interleave(g, 2), t.v.float().repeat_interleave(g, 2)
    s = (torch.einsum("bqhd,bkhd->bhqk", q, k) * case.softmax_scale).to(t.q.dtype).float()
    p = torch.softmax(s, -1).to(t.q.dtype).float()
    return torch.einsum("bhqk,bkhd->bqhd", p, v).to(t.q.dtype)


def test_a_family_that_rounds_its_logits_to_the_dtype_is_allowed_that_rounding():
    """bf16 logits of ~100 rounded to bf16 move a near one-hot row far; the fp32-logit bound fails such a correct
    implementation on some seeds (the control), the te-unfused row of the table on none."""
    failed = {"te-unfused": 0, "default": 0}
    for seed in range(24):
        case = Case(sq=16, skv=16, h=6, hk=2, d_qk=80, d_v=96, dtype="bfloat16", mean=(0.0, 3.0, 0.0),
                    std=(10.0, 10.0, 100.0), seed=seed)
        t = materialize(case)
        oracle = Oracle.of(case, t)
        out = _logits_in_dtype(case, t)
        for family in failed:
            failed[family] += grade(case, t, Output(out), family=family, oracle=oracle).failed
    assert failed["te-unfused"] == 0 and failed["default"] > 0, failed


def test_a_softcap_is_allowed_a_fast_tanh_and_no_more():
    case = Case(sq=1, skv=31, h=2, d_qk=64, d_v=64, dtype="float16", softcap=30.0, std=(4.0, 4.0, 1.0), seed=1,
                alignment="bottom_right")
    t = materialize(case)
    oracle = Oracle.of(case, t)
    out, lse = oracle.ref.out.to(t.q.dtype), oracle.ref.lse.float()
    near = lse + 30.0 * 2.0**-12                       # within tanh.approx.f32's 2^-11 of the cap
    assert grade(case, t, Output(out, lse=near), oracle=oracle).status == V.PASS
    far = lse + 30.0 * 2.0**-7
    assert grade(case, t, Output(out, lse=far), oracle=oracle).diagnosis == V.LSE


@pytest.mark.parametrize("family", ["flex", "fused"])  # the textbook gradient baseline, and the fused one
def test_fp16_gradients_allow_ds_rounded_among_the_subnormals(family):
    """sdpa-efficient on an H200: dK 1.5e-5 off (1.9 %) where values of std 1e-3 make dS ~ 1e-6, which fp16 holds
    only as subnormals (absolute spacing 2^-24), and a far_negative q carries |q_c| ~ 270. That error passes; ten
    times it does not."""
    case = Case(sq=2, skv=512, d_qk=8, d_v=8, dtype="float16", std=(0.01, 0.01, 0.001), grads=True,
                values="far_negative")
    t = materialize(case)
    oracle = Oracle.of(case, t, family=family)
    r = oracle.ref

    def with_dk_off(delta):
        dk = r.dk.clone()
        dk[0, 404, 0, 0] += delta
        return Output(r.out.to(t.q.dtype), dq=r.dq.to(t.q.dtype), dk=dk.to(t.q.dtype), dv=r.dv.to(t.q.dtype))

    assert grade(case, t, with_dk_off(-1.5e-5), oracle=oracle, family=family).status == V.PASS
    assert grade(case, t, with_dk_off(-1.5e-4), oracle=oracle, family=family).diagnosis == V.GRADIENT


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_element_is_an_infinite_error_where_graded_and_nothing_elsewhere(bad):
    """tolerance.check reads inf, -inf and NaN in the output as an infinite error (also where the reference is
    infinite too: inf - inf is no match) at a graded element, and ignores them outside `where`."""
    ref = torch.randn(2, 3, 4, dtype=torch.float64)
    where = torch.ones(2, 3, 1, dtype=torch.bool)
    where[1, 2] = False
    got = ref.clone()
    got[1, 2, 0] = bad                                             # a row that is not graded
    quiet = check("out", got, ref, ref.clone(), where, family="sdpa", quantity="out", dtype="float32")
    assert quiet.ok and quiet.diff_max == 0.0 and quiet.ratio == 0.0
    got[0, 1, 2] = bad
    loud = check("out", got, ref, ref.clone(), where, family="sdpa", quantity="out", dtype="float32")
    assert not loud.ok and loud.diff_max == math.inf and loud.ratio == math.inf and loud.index == (0, 1, 2)
    ref[0, 1, 2] = got[0, 1, 2] if not math.isnan(bad) else math.inf
    assert check("out", got, ref, ref.clone(), where, family="sdpa", quantity="out", dtype="float32").ratio == math.inf


def _recomputed_dv(case: Case, t, reorder: bool) -> torch.Tensor:
    """dV of an fp32 fused backward: P = exp(S - LSE) from the forward's LSE, with the backward's logits S summed
    channel by channel in fp32, the dominant channel (0) first as in the forward or, `reorder`, last: both orders
    are correct fp32 arithmetic, and a kernel whose forward and backward tile their dot products differently does
    the second."""
    g = case.h // case.hk
    q = t.q.float().transpose(1, 2)
    k = t.k.float().repeat_interleave(g, 2).transpose(1, 2)
    dout = t.dout.float().transpose(1, 2)

    def logits(order):
        s = q[..., order[0]][..., :, None] * k[..., order[0]][..., None, :]
        for c in order[1:]:
            s = s + q[..., c][..., :, None] * k[..., c][..., None, :]
        return s * case.d_qk ** -0.5

    first = list(range(case.d_qk))
    lse = torch.logsumexp(logits(first), -1, keepdim=True)
    p = torch.exp(logits(first[1:] + first[:1] if reorder else first) - lse)
    return (p.transpose(-1, -2) @ dout).unflatten(1, (case.hk, g)).sum(2).transpose(1, 2)


def test_a_backward_that_recomputes_dominated_logits_in_another_order_passes_and_a_wrong_row_does_not():
    """far_negative rows put -1024 / scale in one q channel: every partial sum of a logit's dot product is that large,
    so each add rounds at its ulp, a random walk of ~sqrt(d) / 2 ulps of L, which the forward's checks allow
    (tolerance.dominated_dot). A backward that recomputes those logits in another order than its forward's LSE
    carries that walk into P and dV (torch's CPU flash fp32 dV was 1.13x over the bound without it); the same
    allowance must not hide one key's dV off by 2 %."""
    case = Case(b=2, sq=4, skv=14, h=6, hk=2, d_qk=96, d_v=96, layout="sbhd", std=(4.0, 4.0, 1.0), grads=True,
                values="far_negative", dtype="float32")
    t = materialize(case)
    ref = reference(case, t)
    exact = dict(out=ref.out.float(), dq=ref.dq.float(), dk=ref.dk.float())
    for reorder in (False, True):
        dv = _recomputed_dv(case, t, reorder)
        assert grade(case, t, Output(**exact, dv=dv), family="sdpa").status == V.PASS, reorder
    wrong = _recomputed_dv(case, t, True).clone()
    wrong[1, 3] *= 1.02
    verdict = grade(case, t, Output(**exact, dv=wrong), family="sdpa")
    assert (verdict.status, verdict.diagnosis) == (V.FAIL, V.GRADIENT), verdict.message


def test_an_alternative_the_right_answer_matches_too_names_nothing():
    """A row that sees one key reads the same at any scale, and scale 1 on anti-aligned logits widens the
    alternative's bound until it matches the output of a kernel that leaks one key: that read as FAIL:SCALE."""
    case = Case(sq=4, skv=4, d_qk=8, d_v=8, dtype="float16", causal=True, window=(0, None), alignment="top_left",
                scale=0.01, values="anti_aligned")
    verdict = run_case(LeaksOneKey(), case)
    assert verdict.status == V.FAIL and verdict.diagnosis == V.TOLERANCE, verdict
