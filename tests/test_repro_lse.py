"""Repro scripts check the LSE where the call returns one: an LSE finding's script fails while the bug is there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.engine.harness import run_case
from attnfuzz.backends import get
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case

REPO = Path(__file__).resolve().parents[1]
CASE = Case(b=2, sq=5, skv=7, h=2, d_qk=8, d_v=8, dtype="float32", seed=3)


def saved_script(tmp_path: Path, backend: str, case: Case = CASE) -> Path:
    verdict = run_case(get(backend), case)
    entry = corpus_io.Entry(backend=backend, case=case, verdict=verdict, device="cpu")
    return corpus_io.save(tmp_path, entry).with_suffix(".py")


def run(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_an_lse_finding_script_fails_while_the_bug_is_there_and_a_right_kernel_passes(tmp_path):
    wrong = saved_script(tmp_path / "wrong", "tests.lse_kernels:lse_in_base_2")
    assert "FAIL:LSE" in wrong.read_text().splitlines()[0]
    result = run(wrong)
    assert result.returncode == 1 and "max |lse - float64|" in result.stdout and "a row's error > bound" in \
        result.stdout, result.stdout + result.stderr[-2000:]
    right = run(saved_script(tmp_path / "right", "tests.lse_kernels:right"))
    assert right.returncode == 0 and "worst row at" in right.stdout, right.stdout + right.stderr[-2000:]


def test_the_lse_check_wants_negative_infinity_exactly_on_a_row_that_sees_no_key(tmp_path):
    """Rows 0-2 of a bottom-right causal case with 6 queries and 3 keys see no key: the right kernel's script
    passes; the same kernel with one such row's LSE finite (its output still right) fails, and says why."""
    empty_rows = Case(sq=6, skv=3, h=2, d_qk=8, d_v=8, dtype="float32", causal=True, alignment="bottom_right")
    path = saved_script(tmp_path, "tests.lse_kernels:right", empty_rows)
    assert run(path).returncode == 0
    text = path.read_text()
    broken = text.replace("    result = backend.run(case, t)\n",
                          "    result = backend.run(case, t)\n    result.lse[0, 0, 0] = 0.0\n")
    assert broken != text
    path.write_text(broken)
    result = run(path)
    assert result.returncode == 1 and "lse of a row that sees no key is not -inf" in result.stdout, \
        result.stdout + result.stderr


def test_the_verdict_matches_the_script(tmp_path):
    """The grader and the script agree on the planted kernel: FAIL:LSE in both (the script's bounds are the grader's)."""
    assert run_case(get("tests.lse_kernels:lse_in_base_2"), CASE).label == "FAIL:LSE"
    assert run_case(get("tests.lse_kernels:right"), CASE).status == V.PASS


@pytest.mark.parametrize("backend", ["flex-eager", "flex-paged"])
def test_a_flex_script_returns_the_lse_checks_it_alone_and_fails_on_a_base_2_lse(tmp_path, backend):
    """flex's written call returns (out, lse): the script passes standalone (attnfuzz refused), and fails with the
    LSE divided by ln 2 (what eager flex returns with BACKEND="FLASH" on torch 2.13), its output untouched."""
    from tests.test_repro_scripts import run_alone, write
    case = Case(b=2, sq=6, skv=9, h=2, d_qk=8, d_v=8, dtype="float32", causal=True, seed=5,
                **({"seqlens_kv": (9, 4), "page_size": 4} if backend == "flex-paged" else {}))
    assert get(backend).unsupported(case) is None
    path = write(tmp_path, backend, case)
    text = path.read_text()
    assert "RETURNS_LSE = True" in text and ", aux.lse" in text
    ok, _ = run_alone(path)
    assert ok.returncode == 0 and "max |lse - float64|" in ok.stdout, ok.stdout + ok.stderr[-2000:]
    path.write_text(text.replace(", aux.lse", ", aux.lse / 0.6931471805599453"))
    bad, _ = run_alone(path)
    assert bad.returncode == 1 and "a row's error > bound" in bad.stdout and "max |out - float64| = 0" not in \
        bad.stdout.split("\n")[-1], bad.stdout + bad.stderr[-2000:]
