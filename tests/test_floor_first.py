"""Grading builds a baseline only where an error passes the rounding floor, and gives the verdict the full bound gives.

A row whose error is within its floor passes whatever its baseline (the bound is k * baseline + floor), so grading
(tolerance.check's floor_first) skips the naive same-dtype reference there. These tests hold that shortcut to the
verdicts of the full computation, on outputs inside the floor, between the floor and the bound, and past the bound.
"""

from __future__ import annotations

import pytest
import torch

from attnfuzz.oracles.grade import Oracle, check_out, gradient_check, lse_check
from attnfuzz.oracles.reference import reference
from attnfuzz.oracles.tolerance import check
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize, torch_dtype

CASES = [Case(b=2, sq=40, skv=64, h=4, hk=2, d_qk=32, d_v=16, dtype=dtype, causal=True, seed=seed, grads=True)
         for dtype in ("float16", "bfloat16", "float32") for seed in range(3)]


def _never():
    raise AssertionError("the baseline was built for a row within its floor")


def test_an_error_within_the_floor_passes_without_building_the_baseline():
    ref = torch.ones(1, 4, 2, 8, dtype=torch.float64)
    got = (ref + 1e-4).to(torch.float16)   # a tenth of fp16's eps: within the floor of its final rounding
    rows = torch.ones(1, 4, 1, 1, dtype=torch.bool)
    c = check("out", got, ref, _never, rows, family="default", quantity="out", dtype="float16", floor_first=True)
    assert c.ok and c.within_floor and c.baseline_max == 0.0
    assert "not needed (within the floor)" in c.describe()
    exact = check("out", got, ref, ref.to(torch.float16), rows, family="default", quantity="out", dtype="float16")
    assert exact.ok and not exact.within_floor and c.ratio >= exact.ratio   # the shortcut's ratio bounds the full one


def test_an_error_past_the_floor_builds_the_baseline_and_grades_against_it():
    ref = torch.ones(1, 4, 2, 8, dtype=torch.float64)
    got = (ref + 0.01).to(torch.float16)   # ten eps: past the floor, within 3x a baseline that is as far off
    rows = torch.ones(1, 4, 1, 1, dtype=torch.bool)
    built = []

    def baseline():
        built.append(True)
        return (got.double() - ref).abs()
    c = check("out", got, ref, None, rows, family="default", quantity="out", dtype="float16", baseline=baseline,
              floor_first=True)
    assert built and c.ok and not c.within_floor and c.baseline_max > 0
    without = check("out", got, ref, None, rows, family="default", quantity="out", dtype="float16",
                    baseline=torch.zeros_like(ref), floor_first=True)
    assert not without.ok   # the same error with no baseline to excuse it fails: the floor alone would not do


def _outputs(case: Case, o: Oracle) -> dict[str, torch.Tensor]:
    """A kernel's answers of four kinds: the exact one rounded (within the floor), the naive same-dtype one, one off
    by 2.5 times the naive one's error (in fp16 / bf16 past the floor, within the bound of 3 baselines) and a wrong
    one."""
    dtype = torch_dtype(case)
    naive = reference(case, o.tensors, dtype=dtype, terms=False).out
    wrong = o.ref.out.clone()
    wrong[0, 5, 1, 3] += 0.05
    return {"rounded": o.ref.out.to(dtype), "naive": naive, "naive x2.5": o.ref.out + 2.5 * (naive - o.ref.out),
            "wrong": wrong.to(dtype)}


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_floor_first_gives_the_full_bound_s_verdict(case):
    t = materialize(case)
    outcomes = set()
    for kind, out in _outputs(case, Oracle.of(case, t)).items():
        fast, full = Oracle.of(case, t), Oracle.of(case, t)
        quick = check_out(fast, out, fast.ref.out, "default", floor_first=True)
        exact = check_out(full, out, full.ref.out, "default")
        assert quick.ok == exact.ok, (kind, quick.describe(), exact.describe())
        assert quick.ratio >= exact.ratio or not quick.within_floor
        if not quick.within_floor:   # graded in full: the same check
            assert (quick.diff_max, quick.baseline_max, quick.ratio) == (exact.diff_max, exact.baseline_max,
                                                                          exact.ratio)
        outcomes.add((kind, quick.within_floor, quick.ok))
    assert ("rounded", True, True) in outcomes and ("wrong", False, False) in outcomes, outcomes
    if case.dtype != "float32":   # graded in full, and passed by its baseline
        assert ("naive x2.5", False, True) in outcomes, outcomes


def test_the_lse_and_gradient_checks_take_the_shortcut_and_keep_their_verdicts():
    case = CASES[0]
    t = materialize(case)
    o = Oracle.of(case, t, family="default")
    lse = lse_check(o, o.ref.lse.float(), "default", floor_first=True)
    assert lse.ok and lse.within_floor
    for name in ("dq", "dk", "dv"):
        got = getattr(o.ref, name).to(torch.float16)
        quick = gradient_check(o, name, got, "default", floor_first=True)
        exact = gradient_check(Oracle.of(case, t, family="default"), name, got, "default")
        assert quick.ok == exact.ok and quick.ok, (name, quick.describe())
    assert "naive" not in o.__dict__, "no check of a correct answer needed the naive baseline"
