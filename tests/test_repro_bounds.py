"""Repro scripts grade with the grader's own bounds, row by row (fuzz/store/repro.py)."""

from __future__ import annotations

import ast

import pytest
import torch

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.test_repro_scripts import write


def test_a_repro_grades_each_gradient_row_with_the_bound_the_fuzzer_graded_it_with(tmp_path):
    """The script's dV bound of the row the grader named equals that Check's own (k * baseline + floor of that row),
    and a row of another size has its own bound, not one number for the whole tensor."""
    from attnfuzz.oracles.grade import Oracle, gradient_check
    from attnfuzz.oracles.reference import reference
    case = Case(b=2, sq=4, skv=14, h=6, hk=2, d_qk=32, d_v=32, std=(4.0, 4.0, 1.0), grads=True,
                values="far_negative", dtype="float32")
    t = materialize(case)
    wrong = reference(case, t).dv.float().clone()
    wrong[1, 3, 0] += 0.1
    graded = gradient_check(Oracle.of(case, t, family="sdpa"), "dv", wrong, "sdpa")
    assert graded.ratio > 1
    path = write(tmp_path, "sdpa-math", case)
    tree = ast.parse(path.read_text())
    assign = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") ==
                  "GRAD_ROW_BOUNDS")
    bounds = eval(compile(ast.Expression(assign.value), str(path), "eval"), {"torch": torch})
    row = tuple(graded.index[:-1])
    assert bounds["dv"][row].item() == pytest.approx(graded.bound, rel=1e-9)
    assert bounds["dv"].unique().numel() > 1
