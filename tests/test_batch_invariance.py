"""Batch invariance (fuzz/engine/batch.py): a kernel that declares it and gives a sequence other bits alone than in
its batch is a FAIL:BATCH_VARIANT, found, shrunk and saved with a repro that reruns both; the same kernel without
the claim is reported as an observed property and never fails; a kernel that is invariant is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.backends.custom import load_custom
from attnfuzz.engine import batch
from attnfuzz.engine.harness import fuzz, run_case
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from bench.jit_fake import FakeJit

REPO = Path(__file__).resolve().parents[1]
SPACE = Space(max_len=24, max_heads=2, max_head_dim=16)
PAGED = SPACE.replace(paged=True, unpaged=False)
RUNS = profile("ci", max_examples=80)
RAGGED = Case(b=3, sq=6, skv=9, seqlens_q=(6, 2, 0), seqlens_kv=(9, 4, 3), d_qk=8, d_v=8)


def kernel(name: str):
    return load_custom(f"tests.batch_kernels:{name}", "cpu")


def test_the_check_runs_on_a_seeded_share_of_batched_cases_and_cuts_a_sequence_to_its_own_lengths():
    assert batch.checked(RAGGED) and not batch.checked(RAGGED.replace(seed=1))
    assert not batch.checked(Case(b=1)) and batch.checked(Case(b=2))
    assert batch.chosen(RAGGED) == 0 and batch.chosen(RAGGED.replace(seed=batch.CHECK_EVERY)) == 1
    assert not batch.checked(RAGGED.replace(seqlens_q=(0, 0, 0)))  # no sequence with a query: nothing to check
    alone = batch.alone(RAGGED, 1)
    assert (alone.b, alone.sq, alone.skv, alone.seqlens_q, alone.seqlens_kv) == (1, 2, 4, (2,), (4,))
    assert batch.reversed_batch(RAGGED).seqlens_kv == (3, 4, 9)
    paged = batch.alone(Case(b=2, skv=8, page_size=2, shared_prefix_pages=2, seqlens_kv=(8, 5)), 1)
    assert (paged.skv, paged.page_size, paged.shared_prefix_pages) == (5, 2, 0)  # its own pages


def test_the_observation_is_left_out_of_a_verdicts_json_when_unchecked_and_round_trips():
    plain = V.Verdict(V.PASS)
    assert "batch_invariant" not in plain.to_dict()
    seen = V.Verdict(V.PASS, batch_invariant=False)
    assert V.Verdict.from_dict(seen.to_dict()) == seen


def test_a_declared_kernel_whose_splits_follow_the_batch_fails_alone_vs_batched():
    verdict = run_case(kernel("splits_by_batch"), RAGGED)
    assert verdict.label == "FAIL:BATCH_VARIANT" and verdict.batch_invariant is False, verdict
    assert "sequence 0 alone (b=1, sq=6, skv=9)" in verdict.message, verdict.message
    assert run_case(kernel("fixed_splits"), RAGGED).label == "PASS"  # control: the same values, a fixed split


def test_a_declared_batch_variant_kernel_is_found_shrunk_and_saved_with_a_repro_of_both_runs(tmp_path):
    tally, findings = fuzz(kernel("splits_by_batch"), space=SPACE, settings=RUNS)
    assert [f.verdict.label for f in findings] == ["FAIL:BATCH_VARIANT"], tally.to_dict()
    case = findings[0].case
    assert case.b == 2 and case.seed % batch.CHECK_EVERY == 0 and case.h == 1 and case.skv <= 16, case  # shrunk
    entry = corpus_io.Entry(backend="tests.batch_kernels:splits_by_batch", case=case, verdict=findings[0].verdict)
    path = corpus_io.save(tmp_path, entry)
    assert corpus_io.Entry.from_dict(json.loads(path.read_text()), str(path)).verdict.diagnosis == V.BATCH_VARIANT
    assert run_case(kernel("splits_by_batch"), case).label == "FAIL:BATCH_VARIANT"  # the entry replays
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(path.with_suffix(".py"))], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "alone and the batch reversed, against the batch:" in result.stdout, result.stdout
    assert "differs from the batch's" in result.stdout, result.stdout


def test_the_same_kernel_without_the_claim_is_reported_as_a_property_never_a_failure():
    tally, findings = fuzz(kernel("splits_by_batch_undeclared"), space=SPACE, settings=RUNS)
    assert not findings, [(f.verdict.label, f.case) for f in findings]
    assert 0 < tally.batch_invariant < tally.batch_checked, tally.to_dict()
    assert tally.batch_line() == f"batch invariant on {tally.batch_invariant} of {tally.batch_checked} checked cases"
    assert tally.to_dict()["batch_invariance"] == {"checked": tally.batch_checked, "invariant": tally.batch_invariant}


def test_an_invariant_kernel_that_declares_it_is_clean():
    # (120 cases: the 80 of RUNS batch-checked 8 with the per-case richness, fewer than this test wants)
    tally, findings = fuzz(kernel("fixed_splits"), space=SPACE, settings=profile("ci", max_examples=120))
    assert not findings, [(f.verdict.label, f.verdict.message[:300], f.case) for f in findings]
    assert tally.batch_checked >= 10 and tally.batch_invariant == tally.batch_checked, tally.to_dict()


@pytest.mark.parametrize("name, fails", [("splits_by_batch", True), ("fixed_splits", False)])
def test_paged_cases_are_checked_with_the_sequence_on_its_own_pages(name, fails):
    # (120 cases, as above: one stream of 80 paged cases batch-checked 4, none of a shape where the split shows)
    tally, findings = fuzz(kernel(name), space=PAGED, settings=profile("ci", max_examples=120))
    assert tally.batch_checked >= 10, tally.to_dict()
    if fails:
        assert [f.verdict.label for f in findings] == ["FAIL:BATCH_VARIANT"] and findings[0].case.paged, findings
    else:
        assert not findings and tally.batch_invariant == tally.batch_checked, tally.to_dict()


def test_a_run_prints_the_observed_property_and_the_report_has_a_column_for_it(tmp_path, capsys):
    from attnfuzz.cli import main
    from attnfuzz.report.build import build_report
    from attnfuzz.store import caselog
    spec = "tests.batch_kernels:splits_by_batch_undeclared"
    log = tmp_path / "run.jsonl"
    assert main(["run", "--backend", spec, "--max-examples", "40", "--max-len", "24", "--corpus",
                 str(tmp_path / "found"), "--log", str(log), "--json"]) == 0
    out, err = capsys.readouterr()
    tally = json.loads(out)[spec]["tally"]["batch_invariance"]
    assert tally["checked"] > 0, tally
    assert f"[{spec}] batch invariant on {tally['invariant']} of {tally['checked']} checked cases (observed, not " \
           f"claimed)" in err, err
    rows = [row for row in caselog.rows(log) if "batch_invariant" in row["verdict"]]
    assert len(rows) == tally["checked"], rows
    markdown = build_report(log).with_name("report.md").read_text()
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {spec} "))
    assert line.rstrip(" |").endswith(f"{tally['invariant']}/{tally['checked']}"), line


class _PerBatchJit(FakeJit):
    """A stand-in JIT whose kernels are built per batch size (as compiled flex's graphs are)."""

    def compile_key(self, case: Case) -> tuple:
        return (*super().compile_key(case), case.b)


def test_a_compiling_backend_that_claims_nothing_pays_no_compile_for_the_observation():
    case = Case(b=2, sq=6, skv=9, d_qk=8, d_v=8, dtype="bfloat16")
    assert batch.checked(case)
    per_batch = _PerBatchJit(compile_seconds=0)
    verdict = run_case(per_batch, case)
    assert verdict.label == "PASS" and verdict.batch_invariant is None, verdict
    assert any("would build another kernel configuration" in line for line in verdict.checks), verdict.checks
    assert per_batch.runs == 1   # the case alone ran: no composition built a kernel of its own
    # controls: a backend that claims invariance is checked whatever it compiles; a key the compositions share too
    claimed = _PerBatchJit(compile_seconds=0)
    claimed.batch_invariant = True
    assert run_case(claimed, case).batch_invariant is True and claimed.runs == 3
    same_key = FakeJit(compile_seconds=0)
    assert run_case(same_key, case).batch_invariant is True and same_key.runs == 3
