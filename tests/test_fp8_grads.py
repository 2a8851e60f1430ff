"""FP8 backward cases (strategies/fp8_backward.py): the fields and their JSON, dO's exact encoding and the dS scale's
cap, draws only where the space and the kernel ask, the oracle's per-row FP8 gradient bound (not vacuous), FP8_SCALE
for dO's descale, and the planted FP8 backward kernels (tests/fp8_grad_kernels.py): the correct one clean, each bug
found and shrunk."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz, served_space
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.oracles.gradients import gradient_check
from attnfuzz.oracles.reference import reference
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import LARGEST
from attnfuzz.strategies.materialize import draw
from attnfuzz.strategies.space import Space

SPACE = Space(max_batch=2, max_len=64, max_heads=4, max_head_dim=64, fp8_grads=1)
BACKWARD = dict(dtype="bfloat16", fp8=("e4m3",) * 3, grads=True, fp8_dout="e5m2", fp8_ds="e5m2", fp8_p="e4m3",
                fp8_dqkv="e5m2", fp8_out="e4m3")
KERNELS = "tests.fp8_grad_kernels"


def test_backward_fields_round_trip_and_are_left_out_at_their_defaults():
    case = Case(b=2, h=4, hk=2, fp8_scaling="head", fp8_scales="any", **BACKWARD)
    assert Case.from_json(case.to_json()) == case and eval(repr(case), {"Case": Case}) == case
    forward = json.loads(Case(fp8=("e4m3",) * 3).to_json())
    assert not {"fp8_dout", "fp8_ds", "fp8_dqkv"} & set(forward)   # forward-only entries keep their bytes


@pytest.mark.parametrize("fields, named", [
    (dict(fp8=("e4m3",) * 3, grads=True), "grads="), (dict(fp8_dout="e5m2", grads=True), "fp8_dout="),
    (dict(fp8=("e4m3",) * 3, fp8_dout="e5m2"), "fp8_dout="),
    (dict(fp8=("e4m3",) * 3, grads=True, fp8_dout="e5m2", fp8_ds="e3m4"), "fp8_ds="),
])
def test_bad_backward_fields_are_named(fields, named):
    with pytest.raises(ValueError, match=named):
        Case(**fields)


@pytest.mark.parametrize("scales", ["unit", "pow2", "saturating", "any"])
@pytest.mark.parametrize("scaling", ["tensor", "head"])
def test_dout_is_encoded_exactly_and_no_ds_can_saturate(scales, scaling):
    case = Case(b=2, sq=9, skv=20, h=4, hk=2, fp8_scaling=scaling, fp8_scales=scales, seed=5, **BACKWARD)
    t = draw(case, "cpu")
    f = t.fp8
    assert f.dout8.dtype == torch.float8_e5m2 and f.dout_descale.shape == (4,)
    assert torch.equal(t.dout, f.dout8.float() * f.dout_descale[None, None, :, None])
    assert f.dq_descale.shape == (4,) and f.dk_descale.shape == f.dv_descale.shape == (2,)
    ds_bound = 2.125 * case.softmax_scale * t.dout.double().norm(dim=-1).max() * t.v.double().norm(dim=-1).max()
    assert ds_bound * f.ds_scale <= LARGEST["e5m2"]
    # the forward's scales are the same with gradients or without
    fwd = draw(dataclasses.replace(case, grads=False, fp8_dout=None, fp8_ds=None, fp8_dqkv=None), "cpu").fp8
    assert torch.equal(fwd.q_descale, f.q_descale) and torch.equal(fwd.v8.float(), f.v8.float())
    assert fwd.out_descale == f.out_descale and fwd.p_scale == f.p_scale


def test_fp8_gradients_are_drawn_only_where_the_space_and_the_kernel_ask():
    forward_kernel, backward_kernel = get("tests.fp8_kernels:fp8_attention"), get(f"{KERNELS}:fp8_attention_grads")
    assert not forward_kernel.fp8_backward and backward_kernel.fp8_backward
    assert served_space(forward_kernel, Space()).fp8_grads == 0
    assert served_space(forward_kernel, Space(fp8_grads=1)).fp8_grads == 0
    assert served_space(backward_kernel, Space()).fp8_grads == 4
    assert "runs no FP8 backward" in forward_kernel.unsupported(Case(**BACKWARD))
    assert backward_kernel.unsupported(Case(**BACKWARD)) is None


def _graded(case: Case, bug: str | None = None):
    t = draw(case, "cpu")
    backend = get(f"{KERNELS}:{bug or 'fp8_attention_grads'}")
    output = backend.run(case, t)
    return t, output, grade(case, t, output, family=backend.family)


def test_the_gradient_bound_is_not_vacuous():
    """The correct kernel passes; one dQ, dK or dV element moved by 1.5 times its row's bound fails, by 0.5 times
    passes: the FP8 allowance is a bound the grade uses, not a pass for everything."""
    case = Case(sq=24, skv=24, h=2, hk=1, fp8_scales="pow2", seed=3, **BACKWARD)
    t, output, verdict = _graded(case)
    assert verdict.status == V.PASS, verdict.message
    o = Oracle.of(case, t)
    for name in ("dq", "dk", "dv"):
        got = getattr(output, name)
        bound = gradient_check(o, name, got, "custom", output.out).row_bounds
        row = tuple(int(i) for i in torch.nonzero(torch.isfinite(bound))[5])
        for factor, ok in ((1.5, False), (0.5, True)):
            moved = got.clone()
            moved[row + (0,)] = o.ref.__getattribute__(name)[row + (0,)] + factor * bound[row]
            assert gradient_check(o, name, moved, "custom", output.out).ok == ok, (name, factor)


def test_fp8_scale_names_the_dout_descale_applied_twice_and_missing():
    case = Case(sq=8, skv=8, fp8_scales="pow2", seed=2, **{**BACKWARD, "fp8_dqkv": None})
    t, output, _ = _graded(case)
    for how, factor in (("applied twice", t.fp8.dout_descale), ("missing", 1 / t.fp8.dout_descale)):
        assert float(factor[0]) != 1.0
        alt = reference(case, dataclasses.replace(t, dout=t.dout * factor[None, None, :, None]))
        wrong = dataclasses.replace(output, dq=alt.dq, dk=alt.dk, dv=alt.dv)
        verdict = grade(case, t, wrong)
        assert verdict.diagnosis == V.FP8_SCALE and f"dO descale {how}" in verdict.message, verdict.message


RUNS = profile("ci", max_examples=150)


def test_the_correct_fp8_backward_passes_every_case():
    tally, findings = fuzz(get(f"{KERNELS}:fp8_attention_grads"), space=SPACE, settings=RUNS)
    assert not findings and tally.labels.get("PASS", 0) >= 140, dict(tally.labels)


@pytest.mark.parametrize("bug", ["dout_descale_ignored", "ds_forward_scale", "dv_p_scale_kept", "dk_head_scale"])
def test_each_planted_fp8_backward_bug_is_found_and_shrunk(bug):
    tally, findings = fuzz(get(f"{KERNELS}:{bug}"), space=SPACE, settings=profile("ci", max_examples=200))
    assert findings, (bug, dict(tally.labels))
    for f in findings:
        assert f.verdict.label in ("FAIL:GRADIENT", "FAIL:FP8_SCALE"), f.verdict.label
        c = f.case
        assert c.grads and c.fp8_dout is not None and c.b == 1 and c.sq <= 2 and c.skv <= 2 and c.d_qk <= 8, c
