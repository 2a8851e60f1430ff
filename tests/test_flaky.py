"""Flakiness and determinism: a failure that does not come back every time is FLAKY with how often, and a backend
that claims determinism must give the same bits on every run."""

from __future__ import annotations

from attnfuzz.engine.harness import Finding, confirm, fuzz, run_case
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.broken import BROKEN, Correct

SPACE = Space(max_len=32)
CASE = Case(sq=8, skv=8, d_qk=16, d_v=16)


def test_a_backend_that_claims_determinism_and_jitters_is_a_finding():
    jitter = BROKEN["broken-jitter"]()
    first, second = run_case(jitter, CASE), run_case(jitter, CASE)
    assert V.NONDETERMINISTIC in (first.diagnosis, second.diagnosis), (first, second)
    failed = first if first.failed else second
    assert "out is not bitwise reproducible" in failed.message


def test_the_jitter_is_inside_tolerance_so_only_the_bitwise_check_sees_it():
    """Control: the same backend without the claim passes; the detector is the rerun, not the grade."""
    jitter = BROKEN["broken-jitter"]()
    jitter.deterministic = False
    assert all(run_case(jitter, CASE.replace(seed=s)).status == V.PASS for s in range(6))


def test_deterministic_correct_backend_passes_the_bitwise_check():
    correct = Correct()
    correct.deterministic = True
    tally, findings = fuzz(correct, space=SPACE, settings=profile("ci", max_examples=200))
    assert not findings and tally.labels["PASS"] > 100, tally


def test_fuzzing_a_jittery_backend_finds_nondeterminism():
    _, findings = fuzz(BROKEN["broken-jitter"](), space=SPACE, settings=profile("ci", max_examples=100))
    assert [f.verdict.diagnosis for f in findings if f.verdict.status == V.FAIL] == [V.NONDETERMINISTIC], findings


def test_confirm_counts_how_often_a_failure_comes_back():
    labels = iter(["PASS", "FAIL:ALL_ZERO", "PASS"])
    first = V.Verdict(V.FAIL, V.ALL_ZERO, "zeros")
    finding = confirm(Finding("b", CASE, first), lambda case: V.Verdict(*next(labels).split(":")), reruns=3)
    assert finding.verdict.status == V.FLAKY and finding.verdict.diagnosis == "FAIL:ALL_ZERO"
    assert "in 2 of 4 identical runs" in finding.verdict.message, finding.verdict.message


def test_confirm_keeps_a_failure_that_always_comes_back():
    first = V.Verdict(V.FAIL, V.ALL_ZERO, "zeros")
    finding = confirm(Finding("b", CASE, first), lambda case: first, reruns=3)
    assert finding.verdict is first


def test_an_intermittent_bug_is_reported_flaky_not_as_a_plain_failure():
    _, findings = fuzz(BROKEN["broken-intermittent"](), space=SPACE, settings=profile("ci", max_examples=300))
    assert findings and all(f.verdict.status == V.FLAKY for f in findings), findings
    assert any("ALL_ZERO" in f.verdict.label for f in findings)


def test_a_steady_bug_stays_a_failure_after_the_reruns():
    _, findings = fuzz(BROKEN["broken-zero-causal"](), space=SPACE, settings=profile("ci", max_examples=200))
    assert [f.verdict.label for f in findings] == ["FAIL:ALL_ZERO"]
