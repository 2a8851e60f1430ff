"""Repro scripts grade with the grader's own bounds, row by row (fuzz/store/repro.py)."""

from __future__ import annotations

import ast
import subprocess
import sys

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


def test_a_case_too_large_to_inline_recomputes_the_same_bounds(tmp_path, monkeypatch):
    """A script whose inputs are regenerated from the seed (over INLINE elements) recomputes the grader's bounds the
    same way instead of holding them (a case of 131,071 keys held 64 MB of them): the bounds it takes equal those a
    small script writes out, every tensor, the script still tells the right call from a broken one, and it exits 2
    where attnfuzz is missing."""
    from attnfuzz.store import repro
    from attnfuzz.store.repro_bounds import graded_bounds
    case = Case(b=2, sq=4, skv=14, h=6, hk=2, d_qk=32, d_v=32, std=(4.0, 4.0, 1.0), grads=True,
                values="far_negative", dtype="float32")
    small = write(tmp_path / "small", "sdpa-math", case)
    written = {}
    for node in ast.parse(small.read_text()).body:
        name = getattr(node.targets[0], "id", "") if isinstance(node, ast.Assign) else ""
        if name in ("ROW_BOUNDS", "LSE_BOUNDS", "GRAD_ROW_BOUNDS"):
            written[name] = eval(compile(ast.Expression(node.value), str(small), "eval"), {"torch": torch})
    monkeypatch.setattr(repro, "INLINE", 0)   # every case is "large" now
    large = write(tmp_path / "large", "sdpa-math", case)
    text = large.read_text()
    assert "_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)" in text and "ROW_BOUNDS = _BOUNDS['out']" in text
    assert len(text) < len(small.read_text()) / 4
    again = graded_bounds(case.to_dict(), "sdpa-math")
    assert torch.equal(again["out"], written["ROW_BOUNDS"]) and torch.equal(again["lse"], written["LSE_BOUNDS"])
    for name in ("dq", "dk", "dv"):
        assert torch.equal(again[name], written["GRAD_ROW_BOUNDS"][name]), name
    ok = subprocess.run([sys.executable, str(large)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = large.with_name("broken.py")
    broken.write_text(text.replace("return out.transpose(1, 2)", "return 0.5 * out.transpose(1, 2)"))
    bad = subprocess.run([sys.executable, str(broken)], capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    alone = without_attnfuzz(large)   # where attnfuzz cannot be imported: 2, not the 1 that says the bug is there
    assert alone.returncode == 2 and "cannot run this repro here" in alone.stderr, alone.stdout + alone.stderr


def without_attnfuzz(path):
    """The script run where `import attnfuzz` fails (a finder that refuses it, ahead of the installed package)."""
    launcher = ("import runpy, sys\n"
                "class NoAttnfuzz:\n"
                "    def find_spec(self, name, path=None, target=None):\n"
                "        if name.split('.')[0] == 'attnfuzz':\n"
                "            raise ImportError(f'No module named {name!r}')\n"
                "sys.meta_path.insert(0, NoAttnfuzz())\n"
                f"runpy.run_path({str(path)!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True)
