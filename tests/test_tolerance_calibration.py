"""The grader must not reject correct kernels: torch's own CPU kernels pass >= 2,000 random cases in bf16, fp16
and fp32 (output and, for the flash kernel, the LSE it returns).

One real deviation is expected and counted apart: torch's CPU flash kernel returns LSE 0, not -inf, for a query row
that sees no key (measured on torch 2.13). That is a finding about the kernel, not a tolerance problem: a ring
merge that trusts it weighs an empty partial result as exp(0) = 1.
"""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import given
from torch.nn.attention import SDPBackend, sdpa_kernel

from fuzz.backends.layout import alibi_bias, visibility_mask
from fuzz.profiles import profile
from oracles.grade import Oracle, grade
from oracles.verdict import Output
from strategies.cases import attention_cases
from strategies.materialize import materialize
from strategies.space import Space

SPACE = Space(layouts=("bshd",), softmaxes=("vanilla",), softcap=False, grads=False, max_len=96)


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


# Found by the CPU campaign (bench/campaign_cpu.sh): torch's CPU flash kernel failed dV by up to 1.7x on fp32 cases
# with logits in the hundreds, where dV = P^T dO cancels and each P_ij carries its logit's fp32 rounding.
LARGE_LOGITS = [dict(b=2, sq=sq, skv=skv, d_qk=96, d_v=96, dtype="float32", std=(qk, qk, 1.0), grads=True)
                for sq, skv, qk in ((4, 32, 10.0), (4, 32, 4.0), (4, 31, 4.0), (33, 33, 10.0), (5, 33, 10.0))]


def test_fp32_dv_with_large_logits_is_graded_on_the_terms_it_sums():
    from fuzz.backends import get
    from fuzz.harness import run_case
    from strategies.case import Case
    for fields in LARGE_LOGITS:
        verdict = run_case(get("sdpa-flash"), Case(**fields))
        assert verdict.status == "PASS", (fields, verdict.message)


def test_the_dv_terms_bound_still_fails_a_wrong_dv():
    """Control: the looser dV floor is the size of a logit's rounding, far below a real error (dV scaled by 1.01)."""
    from strategies.case import Case
    case = Case(**LARGE_LOGITS[0])
    t = materialize(case, "cpu")
    oracle = Oracle.of(case, t)
    ref = oracle.ref
    wrong = Output(out=ref.out.float(), lse=None, dq=ref.dq.float(), dk=ref.dk.float(), dv=(ref.dv * 1.01).float())
    verdict = grade(case, t, wrong, oracle=oracle)
    assert verdict.status == "FAIL" and verdict.diagnosis == "GRADIENT" and "dv" in verdict.message, verdict
