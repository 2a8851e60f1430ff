"""SDPA's, FA4's and TE's fused and flash families are graded against the fused gradient baseline
(oracles/tolerance.py, FUSED_BACKWARD): a bf16 gradient row off by 5 % on a long row, which the textbook baseline in
the dtype lets pass, is caught through the backend's own family; ALiBi, a bias SDPA takes in the input dtype, and an
FP8 backward keep the textbook baseline."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from attnfuzz.backends import get
from attnfuzz.oracles.gradients import fused_backward
from attnfuzz.oracles.grade import grade
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fused_kernels import flash_algorithm_backward

SPEC = importlib.util.spec_from_file_location("grad_calibration", Path(__file__).resolve().parents[1] / "bench" /
                                              "grad_calibration.py")
grad_calibration = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(grad_calibration)

LONG = Case(sq=512, skv=512, h=2, d_qk=64, d_v=64, dtype="bfloat16", grads=True, seed=4)


def test_which_cases_take_the_fused_baseline():
    assert all(fused_backward(LONG, sdpa) for sdpa in ("sdpa", "sdpa-efficient", "sdpa-cudnn"))
    for sdpa in ("sdpa", "sdpa-efficient", "sdpa-cudnn"):
        assert not fused_backward(LONG.replace(alibi_slopes=(0.5, 0.25)), sdpa)
    assert fused_backward(LONG.replace(alibi_slopes=(0.5, 0.25)), "fused")   # it takes ALiBi exactly
    assert not fused_backward(LONG.replace(dtype="float32"), "sdpa")          # nothing rounds before the end
    assert not fused_backward(LONG, "te-unfused") and not fused_backward(LONG, "flex")
    assert fused_backward(LONG, "fa4") and fused_backward(LONG, "te") and fused_backward(LONG, "te-fused")
    assert fused_backward(LONG.replace(alibi_slopes=(0.5, 0.25)), "te")     # TE takes the slopes in fp32
    assert not fused_backward(LONG, "fa2") and not fused_backward(LONG, "fa3")   # not calibrated on long rows
    fp8 = LONG.replace(fp8=("e4m3", "e4m3", "e4m3"), fp8_dout="e5m2")
    assert not fused_backward(fp8, "te")   # an FP8 backward: the textbook baseline and its FP8 allowance


def test_backends_declare_the_family_their_gradients_are_graded_by():
    assert get("sdpa-math", "cpu").family == get("sdpa-flash", "cpu").family == "sdpa"
    assert get("sdpa-cudnn", "cuda").family == "sdpa-cudnn"   # cuDNN: dS rounded with the scale in it
    assert get("fa4", "cuda").family == "fa4"
    assert get("te-flash", "cuda").family == "te"
    assert get("te-fused", "cuda").family == "te-fused"   # cuDNN: dS rounded with the scale in it
    assert get("te-unfused", "cuda").family == "te-unfused"


@pytest.mark.parametrize("family", ["sdpa", "sdpa-efficient", "sdpa-cudnn", "fa4", "te", "te-fused"])
def test_a_bf16_row_off_by_5_percent_fails_through_the_backends_own_family(family):
    """The gradients come from FlashAttention's algorithm written out (tests/fused_kernels.py), not from torch's
    kernels, so the test does not bet on the host's torch rounding one way."""
    t = materialize(LONG)
    out, *grads = flash_algorithm_backward(LONG, t)
    output = Output(out, **{name: g.to(t.q.dtype) for name, g in zip(("dq", "dk", "dv"), grads)})
    assert grade(LONG, t, output, family=family).status == "PASS"   # control: a correct fused kernel
    for name in ("dq", "dk", "dv"):
        wrong = dataclasses.replace(output, **{name: grad_calibration.planted_row(getattr(output, name), 0.05)})
        caught = grade(LONG, t, wrong, family=family)
        assert caught.status == "FAIL" and name in caught.message, (name, caught.message)
        # the textbook baseline in the dtype, which this family had before, lets the same row pass
        assert grade(LONG, t, wrong, family="te-unfused").status == "PASS", name


# TE's fused and torch's cuDNN dQ on an H100: keys tied in the ties family, K's channel 0 constant at 2.0, so dQ's
# channel 0 is exactly 0; dS * scale ~ 1e-5 is among fp16's subnormals
TIED = Case(b=3, sq=126, skv=126, h=3, hk=3, d_qk=144, d_v=104, dtype="float16", grads=True, causal=True,
            alignment="bottom_right", layout="sbhd", spelling="padding", values="ties", mean=(0.0, 3.0, 0.0),
            std=(4.0, 4.0, 0.001), scale=1 / 24, seed=2915893028)


@pytest.mark.parametrize("family, spelling", [("te-fused", "padding"), ("sdpa-cudnn", ""), ("sdpa-efficient", "")])
def test_rounding_ds_with_the_scale_in_it_passes_the_families_that_do(family, spelling):
    case = TIED.replace(spelling=spelling)
    t = materialize(case)
    out, *grads = flash_algorithm_backward(case, t, scaled_ds=True)
    output = Output(out, **{name: g.to(t.q.dtype) for name, g in zip(("dq", "dk", "dv"), grads)})
    assert output.dq[1, 107, 0, 0].item() == pytest.approx(8.34465e-07, rel=1e-4)   # the H100's value
    assert grade(case, t, output, family=family).status == "PASS"
    for scaled_after in ("te", "sdpa", "fa4"):   # FlashAttention's rounding of dS allows 24x less here
        assert grade(case, t, output, family=scaled_after).label == "FAIL:GRADIENT", scaled_after
    for name in ("dq", "dk", "dv"):   # and the wider allowance still catches a row 5 % off
        wrong = dataclasses.replace(output, **{name: grad_calibration.planted_row(getattr(output, name), 0.05)})
        caught = grade(case, t, wrong, family=family)
        assert caught.status == "FAIL" and name in caught.message, (name, caught.message)


# probe values weigh every key of a row alike and give V d_v distinct rows, so a row's dS takes d_v values, each on
# skv / d_v keys; K near 3 (its mean) turns their equal roundings into one sum (an sdpa-cudnn kernel on an H100 read
# 1.73x over on a bf16 case so, 5,942 queries over 11,905 keys)
EQUAL_DS = Case(sq=128, skv=11905, d_qk=32, d_v=32, dtype="bfloat16", grads=True, values="probe", scale=1.0,
                mean=(0.0, 3.0, 0.0), std=(0.01, 0.01, 100.0), seed=1456659665)


def test_equal_ds_of_a_row_round_alike_and_a_wrong_gradient_still_fails(monkeypatch):
    from attnfuzz.oracles import grad_terms
    t = materialize(EQUAL_DS)
    out, *grads = flash_algorithm_backward(EQUAL_DS, t, scaled_ds=True)
    output = Output(out, **{name: g.to(t.q.dtype) for name, g in zip(("dq", "dk", "dv"), grads)})
    assert grade(EQUAL_DS, t, output, family="sdpa-cudnn").status == "PASS"
    _, *forgot = flash_algorithm_backward(EQUAL_DS, t, forget_d=True, scaled_ds=True)   # D never subtracted
    wrong = Output(out, **{name: g.to(t.q.dtype) for name, g in zip(("dq", "dk", "dv"), forgot)})
    assert grade(EQUAL_DS, t, wrong, family="sdpa-cudnn").label == "FAIL:GRADIENT"
    monkeypatch.setattr(grad_terms, "equal_counts", torch.ones_like)   # each rounding a step of its own walk
    assert grade(EQUAL_DS, t, output, family="sdpa-cudnn").label == "FAIL:GRADIENT"


def test_equal_counts_counts_each_rows_equal_values():
    from attnfuzz.oracles.grad_terms import equal_counts
    x = torch.tensor([[[1.0, 2.0, 1.0, 3.0, 1.0], [0.0, 0.0, 5.0, 5.0, 7.0]]])
    assert equal_counts(x).tolist() == [[[3, 1, 3, 1, 3], [2, 2, 2, 2, 1]]]
    assert equal_counts(torch.zeros(1, 2, 0)).shape == (1, 2, 0)
