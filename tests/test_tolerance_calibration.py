"""The grader must not reject correct kernels: torch's own CPU kernels pass >= 2,000 random cases in bf16, fp16
and fp32 (output and, for the flash kernel, the LSE it returns).

One real deviation is expected and counted apart: torch's CPU flash kernel returns LSE 0, not -inf, for a query row
that sees no key (measured on torch 2.13). That is a finding about the kernel, not a tolerance problem: a ring
merge that trusts it weighs an empty partial result as exp(0) = 1.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnfuzz.backends.layout import alibi_bias, visibility_mask
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.space import Space
from tests.fused_kernels import flash_algorithm_backward

# plain buffers: _cpu_flash calls the CPU flash op directly, which (unlike the public SDPA entry point) takes
# unit inner strides for granted
SPACE = Space(layouts=("bshd",), softmaxes=("vanilla",), softcap=False, grads=False, max_len=96, storages=("plain",))


def _mask(case, t):
    keep = visibility_mask(case, t, "cpu")
    if case.alibi_slopes is None:
        return keep
    return alibi_bias(case, t, "cpu", t.q.dtype).masked_fill(~keep, float("-inf"))


def _math(case, t):
    q, k, v = (x.transpose(1, 2) for x in (t.q, t.k, t.v))
    with sdpa_kernel([SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_mask(case, t),
                                                               scale=case.softmax_scale, enable_gqa=True)
    return Output(out.transpose(1, 2))


def _cpu_flash(case, t):
    group = case.h // case.hk
    q = t.q.transpose(1, 2)
    k, v = (x.transpose(1, 2).repeat_interleave(group, dim=1) for x in (t.k, t.v))
    mask = _mask(case, t)
    if mask.dtype == torch.bool:  # the CPU flash op takes an additive mask of the query's dtype
        mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=mask, scale=case.softmax_scale)[:2]
    return Output(out.transpose(1, 2), lse=lse)


@pytest.mark.slow
def test_torch_cpu_kernels_pass_2000_random_cases():
    seen: Counter = Counter()
    failures = []

    @profile("ci", max_examples=2000)
    @given(case=attention_cases(SPACE))
    def graded(case):
        t = materialize(case)
        oracle = Oracle.of(case, t)
        kernels = {"math": _math} | ({"flash": _cpu_flash} if case.d_qk == case.d_v else {})
        for name, kernel in kernels.items():
            verdict = grade(case, t, kernel(case, t), oracle=oracle, family="sdpa")
            seen[(name, case.dtype, verdict.label)] += 1
            if name == "flash" and verdict.diagnosis == "LSE" and "no visible key" in verdict.message:
                seen["flash empty-row lse"] += 1
            elif verdict.failed:
                failures.append(f"{name}: {verdict.label} {verdict.message} {case!r}")

    graded()
    assert not failures, failures[:5]
    for name in ("math", "flash"):
        for dtype in ("float16", "bfloat16", "float32"):
            assert seen[(name, dtype, "PASS")] >= 200, seen
    assert sum(seen.values()) >= 3000


GRAD_SPACE = Space(layouts=("bshd",), softmaxes=("vanilla",), grads=True, max_len=96, dtypes=("float16", "bfloat16"))


def test_correct_gradients_pass_the_fused_baseline_on_300_random_cases():
    """fp16 / bf16 gradients graded against the fused baseline (family "fused": oracles/tolerance.py) pass for
    torch's CPU kernels (sdpa-math upcasts to fp32; the CPU flash kernel rounds P and dS like a fused kernel),
    bench/planted.py's fp32 kernel and FlashAttention's algorithm written out (tests/fused_kernels.py).
    (bench/grad_calibration.py, 3,000 cases on each of seeds 0 and 1: no failure; the worst dQ at 0.49 of its bound,
    dK 0.46, dV 0.94, sdpa-flash fp16.)"""
    from attnfuzz.backends import get
    from attnfuzz.backends.custom import load_custom
    kernels = {"sdpa-math": get("sdpa-math", "cpu"), "sdpa-flash": get("sdpa-flash", "cpu"),
               "planted": load_custom("bench.planted:correct")}
    seen: Counter = Counter()
    failures = []

    @profile("ci", max_examples=300)
    @given(case=attention_cases(GRAD_SPACE))
    def graded(case):
        if case.paged:
            return
        case = case.replace(grads=True)
        t = materialize(case)
        oracle = Oracle.of(case, t, family="fused")
        # SDPA takes ALiBi only as a bias in the input dtype, an error its own family is allowed and the fused family
        # is not (tolerance.BIAS_IN_INPUT_DTYPE): its kernels are graded fused without ALiBi (bench/grad_calibration.py)
        outputs = {name: b.run(case, t) for name, b in kernels.items() if b.unsupported(case) is None
                   and not (name.startswith("sdpa") and case.alibi_slopes is not None)}
        if case.softcap is None and case.alibi_slopes is None and case.d_qk == case.d_v:
            out, *grads = flash_algorithm_backward(case, t)
            outputs["flash-algorithm"] = Output(out, **dict(zip(("dq", "dk", "dv"), (g.to(t.q.dtype) for g in grads))))
        for name, output in outputs.items():
            verdict = grade(case, t, Output(output.out, dq=output.dq, dk=output.dk, dv=output.dv), oracle=oracle,
                            family="fused")
            seen[(name, verdict.label)] += 1
            if verdict.failed:
                failures.append(f"{name}: {verdict.label} {verdict.message} {case!r}")

    graded()
    assert not failures, failures[:5]
    for name in ("sdpa-math", "sdpa-flash", "planted", "flash-algorithm"):
        assert seen[(name, "PASS")] >= 50, seen


# Found by the CPU campaign (bench/campaign_cpu.sh): torch's CPU flash kernel failed dV by up to 1.7x on fp32 cases
# with logits in the hundreds, where dV = P^T dO cancels and each P_ij carries its logit's fp32 rounding.
LARGE_LOGITS = [dict(b=2, sq=sq, skv=skv, d_qk=96, d_v=96, dtype="float32", std=(qk, qk, 1.0), grads=True)
                for sq, skv, qk in ((4, 32, 10.0), (4, 32, 4.0), (4, 31, 4.0), (33, 33, 10.0), (5, 33, 10.0))]


def test_fp32_dv_with_large_logits_is_graded_on_the_terms_it_sums():
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import run_case
    from attnfuzz.strategies.case import Case
    for fields in LARGE_LOGITS:
        verdict = run_case(get("sdpa-flash"), Case(**fields))
        assert verdict.status == "PASS", (fields, verdict.message)


def test_the_dv_terms_bound_still_fails_a_wrong_dv():
    """Control: the looser dV floor is the size of a logit's rounding, far below a real error (dV scaled by 1.01)."""
    from attnfuzz.strategies.case import Case
    case = Case(**LARGE_LOGITS[0])
    t = materialize(case, "cpu")
    oracle = Oracle.of(case, t)
    ref = oracle.ref
    wrong = Output(out=ref.out.float(), lse=None, dq=ref.dq.float(), dk=ref.dk.float(), dv=(ref.dv * 1.01).float())
    verdict = grade(case, t, wrong, oracle=oracle)
    assert verdict.status == "FAIL" and verdict.diagnosis == "GRADIENT" and "dv" in verdict.message, verdict


# sdpa-cudnn on the H200 (campaign, 2026-11-30): |O| ~ 70 (V of std 100), K of mean 3. Its fp16 dQ was 0.3628 where
# the float64 one is 0.2687 (bf16: -0.8672 for -0.4894), and the FlashAttention algorithm below, which takes
# D = rowsum(dO * O) from the output rounded to the dtype, gives the same to 3 digits: a correct kernel, failed ~10x
# by a floor that did not know D comes from a rounded O.
CUDNN_D_CASE = dict(b=3, sq=15, skv=2, h=2, hk=1, causal=True, window=(1, None),
                    memory="transposed", mean=(0.0, 3.0, 0.0), std=(0.01, 0.01, 100.0), seed=17839066, grads=True)


@pytest.mark.parametrize("family", ["default", "fused"])  # the textbook gradient baseline, and the fused one
@pytest.mark.parametrize("dtype, where, cudnn", [("float16", (0, 1, 0, 7), 0.362793),
                                                  ("bfloat16", (2, 1, 0, 1), -0.867188)])
def test_gradients_from_d_of_the_rounded_output_pass_and_a_wrong_dq_does_not(dtype, where, cudnn, family):
    from attnfuzz.strategies.case import Case
    case = Case(**CUDNN_D_CASE, dtype=dtype)
    t = materialize(case, "cpu")
    oracle = Oracle.of(case, t, family=family)
    out, dq, dk, dv = flash_algorithm_backward(case, t)
    assert abs(dq[where].item() - cudnn) < 5e-3 * abs(cudnn)  # what cuDNN returned on the H200
    low = t.q.dtype
    verdict = grade(case, t, Output(out=out, lse=None, dq=dq.to(low), dk=dk.to(low), dv=dv.to(low)), oracle=oracle,
                    family=family)
    assert verdict.status == "PASS", verdict.message
    # control: the bound grew by what rounding O moves D, not by D itself
    _, dq_bug, dk_bug, _ = flash_algorithm_backward(case, t, forget_d=True)
    wrong = Output(out=out, lse=None, dq=dq_bug.to(low), dk=dk_bug.to(low), dv=dv.to(low))
    verdict = grade(case, t, wrong, oracle=oracle, family=family)
    assert verdict.status == "FAIL" and "dq" in verdict.message, verdict


# sdpa-efficient on the H200 (bench/throughput.py, 2026-11-30): fp32, sq = skv = 1, d = 64, seed 1251. Its LSE was
# -0.344574 for the float64 -0.3445752: 9.0e-7 off, i.e. 1.08 * eps(fp32) * scale * sum_d |q_d k_d| (= 6.96). The
# LSE of one key is that key's logit, so that is the dot product's own accumulation rounding: it scales with the
# terms summed, not with |logit| = 0.34, which they cancel down to. The floor used |logit|, and failed it by 1.39x.
TF32_LSE_CASE = dict(sq=1, skv=1, d_qk=64, d_v=64, seed=1251)


def test_a_logit_is_allowed_the_rounding_of_the_terms_it_sums_and_no_more():
    from attnfuzz.strategies.case import Case
    case = Case(**TF32_LSE_CASE)
    t = materialize(case, "cpu")
    oracle = Oracle.of(case, t)
    q, k = (x[0, 0, 0].double() for x in (t.q, t.k))
    terms = case.softmax_scale * (q.abs() @ k.abs()).item()
    assert abs(terms - 6.96) < 0.01 and abs(oracle.ref.lse.item() + 0.3445752) < 1e-7  # the H200 case, redrawn
    as_measured = oracle.ref.lse.float() + 1.08 * 2.0**-23 * terms
    verdict = grade(case, t, Output(oracle.ref.out.float(), lse=as_measured), oracle=oracle)
    assert verdict.status == "PASS", verdict.message
    # control: twice the rounding of the largest term-sum a correct fp32 kernel can make on this case still fails
    wrong = oracle.ref.lse.float() + 2 * (2 * 2.0**-23 * (1 + terms) + 1e-7)
    verdict = grade(case, t, Output(oracle.ref.out.float(), lse=wrong), oracle=oracle)
    assert verdict.status == "FAIL" and verdict.diagnosis == "LSE", verdict
