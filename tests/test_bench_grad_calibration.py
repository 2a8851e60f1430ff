"""bench/grad_calibration.py's planted row: one row of a gradient, the one holding its largest entry, is moved by
(1 + eps) and nothing else; a correct bf16 gradient passes the fused grading and the same gradient so planted fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

from attnfuzz.oracles.grade import Oracle, gradient_check
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from tests.fused_kernels import flash_algorithm_backward

BENCH = Path(__file__).resolve().parents[1] / "bench" / "grad_calibration.py"
SPEC = importlib.util.spec_from_file_location("grad_calibration", BENCH)
grad_calibration = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(grad_calibration)


def test_the_planted_row_is_the_largest_and_the_only_one_moved():
    grad = torch.randn(2, 5, 3, 8, dtype=torch.bfloat16)
    grad[1, 3, 2, 4] = 50.0
    wrong = grad_calibration.planted_row(grad, 0.05)
    moved = (wrong != grad).any(-1)
    assert moved.nonzero().tolist() == [[1, 3, 2]]
    assert torch.allclose(wrong[1, 3, 2].float(), grad[1, 3, 2].float() * 1.05, rtol=2 ** -7)


def test_a_bf16_gradient_row_off_by_5_percent_is_caught_against_the_fused_baseline():
    case = Case(sq=512, skv=512, h=2, d_qk=64, d_v=64, dtype="bfloat16", grads=True, seed=4)
    t = materialize(case)
    oracle = Oracle.of(case, t, family="fused")
    out, *grads = flash_algorithm_backward(case, t)   # a correct fused kernel of our own, not the host's torch
    for name, grad in zip(("dq", "dk", "dv"), grads):
        grad = grad.to(t.q.dtype)
        assert gradient_check(oracle, name, grad, "fused", out).ok, name
        wrong = grad_calibration.planted_row(grad, 0.05)
        assert not gradient_check(oracle, name, wrong, "fused", out).ok, name


def test_min_len_grades_long_rows_only_and_lists_the_plants_that_passed():
    ran = subprocess.run([sys.executable, str(BENCH), "--cases", "6", "--max-len", "300", "--min-len", "200",
                          "--dtypes", "bfloat16", "--plant", "0.05", "--kernels", "bench.planted:correct",
                          "--show", "0"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "min_len 200" in ran.stdout
    cases = [line for line in ran.stdout.splitlines() if "Case(" in line]
    assert cases and all(int(line.split("sq=")[1].split(",")[0]) >= 200 and int(line.split("skv=")[1].split(",")[0]) >= 200
               for line in cases), cases
    bad = subprocess.run([sys.executable, str(BENCH), "--max-len", "64", "--min-len", "65"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--min-len 65" in bad.stderr


def test_equal_head_dims_draws_no_split_head_dims():
    """--equal-head-dims (for FA4, whose split head dims exit the process on sm90): every case drawn has d_v = d_qk,
    where the default space draws split ones too."""
    from hypothesis import HealthCheck, given, settings

    from attnfuzz.strategies.cases import attention_cases

    def drawn(equal: bool) -> list:
        seen = []

        @settings(max_examples=150, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
        @given(case=attention_cases(grad_calibration.calibration_space(96, ("bfloat16",), equal)))
        def draw(case):
            seen.append((case.d_qk, case.d_v))
        draw()
        return seen

    assert all(d_qk == d_v for d_qk, d_v in drawn(True))
    assert any(d_qk != d_v for d_qk, d_v in drawn(False))


SPEC_X105 = "bench.planted:grads_1p05_all"


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), "--cases", "6", "--max-len", "300", "--min-len", "200",
                           "--dtypes", "bfloat16,float16", "--kernels", SPEC_X105, "--seed", "1", *args],
                          capture_output=True, text=True, timeout=600)


def test_a_known_bug_of_the_kernel_is_left_out_of_the_table_and_counted_under_its_record(tmp_path):
    """A kernel whose every gradient is 5 % off, with a known-bug record that takes its bf16 failures only: its bf16
    runs are counted under the record and out of the table, its fp16 runs stay failures; without the record
    (--known none) the bf16 runs are failures too."""
    from attnfuzz.backends.custom import load_custom
    from attnfuzz.oracles.grade import grade
    from attnfuzz.store import corpus as corpus_io

    kernel = load_custom(SPEC_X105)
    case = Case(sq=256, skv=256, h=2, d_qk=64, d_v=64, dtype="bfloat16", grads=True, seed=4)
    t = materialize(case)
    verdict = grade(case, t, kernel.run(case, t), family=kernel.family)
    assert verdict.label == "FAIL:GRADIENT", verdict
    path = corpus_io.save(tmp_path, corpus_io.Entry(SPEC_X105, case, verdict, known_bug={
        "link": "https://example.org/x105", "when": {"dtype": "bfloat16"}}), repro=False)

    ran = _calibrate("--known", str(tmp_path))
    assert ran.returncode == 1, ran.stderr[-2000:]   # the fp16 failures
    assert f"known bug, left out: {SPEC_X105} bfloat16:" in ran.stdout and path.stem in ran.stdout, ran.stdout
    rows = [line for line in ran.stdout.splitlines() if line.startswith(f"| {SPEC_X105} |")]
    assert rows and all("| float16 |" in row for row in rows), rows
    assert any(int(row.split("|")[5]) > 0 for row in rows), rows

    bare = _calibrate("--known", "none")
    assert "known bug, left out" not in bare.stdout
    assert any(line.startswith(f"| {SPEC_X105} | bfloat16 |") and int(line.split("|")[5]) > 0
               for line in bare.stdout.splitlines()), bare.stdout


def test_the_budget_stops_the_draw_and_still_prints_the_table():
    ran = _calibrate("--known", "none", "--budget-s", "0", "--cases", "50")
    assert "0 kernel runs graded" in ran.stdout and "| kernel | dtype |" in ran.stdout, ran.stdout + ran.stderr[-1000:]
