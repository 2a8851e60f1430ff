"""`attnfuzz shrink`: an unshrunk corpus entry walks to the plainest case that still fails the same way."""

from __future__ import annotations

import json

from attnfuzz.store import corpus as corpus_io
from attnfuzz.backends import get
from attnfuzz.cli import main
from attnfuzz.engine.harness import run_case
from attnfuzz.tools.shrink import candidates, shrink
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

BIG = Case(b=3, sq=40, skv=33, h=4, hk=2, d_qk=64, d_v=32, dtype="float32", causal=True, alignment="bottom_right",
           mean=(0.0, 3.0, 0.0), seed=77, memory="transposed")


def _fails_as(spec: str, label: str):
    backend = get(spec, "cpu")

    def fails(case):
        verdict = run_case(backend, case)
        return verdict if verdict.label == label else None
    return fails


def test_a_bug_that_needs_only_causal_shrinks_to_the_plainest_causal_case():
    small, verdict, runs = shrink(BIG, _fails_as("tests.misbehaving:zero_when_causal", "FAIL:ALL_ZERO"))
    assert small == Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", causal=True), small
    assert verdict.label == "FAIL:ALL_ZERO" and runs < 100


def test_what_the_bug_needs_is_kept():
    """NaN once sq > 4: the length stops at 5, everything else goes."""
    small, _, _ = shrink(BIG, _fails_as("tests.misbehaving:nan_when_long", "FAIL:NONFINITE"))
    assert small == Case(sq=5, skv=1, d_qk=8, d_v=8, dtype="float16"), small


def test_control_a_correct_backend_shrinks_nothing():
    small, verdict, runs = shrink(BIG, lambda case: None)
    assert (small, verdict) == (BIG, None) and runs > 20, "every candidate was tried, none kept"


def test_every_candidate_is_valid_and_simpler_somewhere():
    thd = Case(b=3, sq=20, skv=9, h=6, hk=3, d_qk=40, d_v=24, layout="thd", seqlens_q=(20, 0, 7),
               seqlens_kv=(9, 9, 1), alibi_slopes=tuple(0.5 ** i for i in range(6)), memory="expanded_kv",
               window=(3, 2), grads=True)
    seen = [c for c in candidates(thd) if c is not None]
    assert seen and thd not in seen
    assert any(c.b == 1 and c.seqlens_q == (7,) for c in seen), "the last sequence alone is a candidate"
    assert all(c.alibi_slopes is None or len(c.alibi_slopes) == c.h for c in seen)


def _save(tmp_path, spec, case, label, known_bug=None):
    status, diagnosis = label.split(":")
    entry = corpus_io.Entry(spec, case, V.Verdict(status, diagnosis), known_bug=known_bug)
    return corpus_io.save(tmp_path, entry, repro=False)


def test_cli_saves_the_shrunk_entry_and_a_known_bug_keeps_its_when(tmp_path, capsys):
    path = _save(tmp_path, "tests.misbehaving:zero_when_causal", BIG, "FAIL:ALL_ZERO",
                 known_bug={"link": "tests/misbehaving.py", "note": "zeros", "when": {"b": 3}})
    assert main(["shrink", str(path)]) == 0
    out = capsys.readouterr().out
    [new] = [p for p in tmp_path.glob("*.json") if p != path]
    assert str(new) in out
    shrunk = corpus_io.load(new)
    assert shrunk.case.b == 3 and shrunk.case.sq == 1 and shrunk.case.causal, "the known bug's `when` held b = 3"
    assert "shrunk by `attnfuzz shrink`" in shrunk.known_bug["note"]
    known = corpus_io.known_bugs(tmp_path)
    assert known(shrunk.backend, shrunk.case, V.Verdict(V.FAIL, "ALL_ZERO")) is not None


def test_a_known_bug_with_several_labels_shrinks_through_each_and_keeps_them(tmp_path):
    """NaN rows on long cases, zeros on short ones: one bug. Known with both labels, it shrinks past the length where
    its label changes, and the shrunk entry still answers to the label it was saved with; without them it stops at
    the last length that gives the first label (the control)."""
    spec = "tests.misbehaving:garbage_when_causal"
    alone = _save(tmp_path / "alone", spec, BIG, "FAIL:NONFINITE", known_bug={"link": "l"})
    assert main(["shrink", str(alone)]) == 0
    [stopped] = [p for p in (tmp_path / "alone").glob("*.json") if p != alone]
    assert corpus_io.load(stopped).case.sq == 5
    both = _save(tmp_path / "both", spec, BIG, "FAIL:NONFINITE", known_bug={"link": "l", "labels": ["FAIL:ALL_ZERO"]})
    assert main(["shrink", str(both)]) == 0
    [new] = [p for p in (tmp_path / "both").glob("*.json") if p != both]
    shrunk = corpus_io.load(new)
    assert shrunk.case == Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", causal=True), shrunk.case
    assert shrunk.verdict.label == "FAIL:ALL_ZERO" and shrunk.known_bug["labels"] == ["FAIL:NONFINITE"]


def test_a_shrunk_case_that_does_not_fail_the_same_way_every_time_is_saved_flaky(tmp_path):
    """The shrunk case is confirmed as the fuzzer confirms a finding: a kernel whose output is NaN on some calls and
    right on others is saved FLAKY (its known bug then replays as unreproduced, not fixed, when it passes); a
    deterministic one stays as it failed (the control, in the tests above)."""
    spec = "tests.misbehaving:nan_every_other_call"
    path = _save(tmp_path, spec, BIG, "FAIL:NONFINITE", known_bug={"link": "l"})
    assert main(["shrink", str(path)]) == 0
    [new] = [p for p in tmp_path.glob("*.json") if p != path]
    shrunk = corpus_io.load(new)
    assert shrunk.verdict.status == V.FLAKY and shrunk.verdict.diagnosis == "FAIL:NONFINITE", shrunk.verdict
    assert corpus_io.known_bugs(tmp_path)(spec, shrunk.case, V.Verdict(V.FAIL, V.NONFINITE)) is not None


def test_cli_says_so_when_the_case_no_longer_fails(tmp_path, capsys):
    path = _save(tmp_path, "tests.misbehaving:zero_when_causal", BIG.replace(causal=False), "FAIL:ALL_ZERO")
    assert main(["shrink", str(path)]) == 1
    assert "does not fail here (PASS)" in capsys.readouterr().err
    assert list(tmp_path.glob("*.json")) == [path]


def test_cli_isolate_shrinks_a_segfault_one_worker_per_crash(tmp_path):
    path = _save(tmp_path, "tests.misbehaving:segfault_when_causal", BIG, "CRASH:SIGSEGV")
    assert main(["shrink", str(path), "--isolate", "--case-timeout", "20"]) == 0
    [new] = [p for p in tmp_path.glob("*.json") if p != path]
    data = json.loads(new.read_text())
    assert data["verdict"]["diagnosis"] == "SIGSEGV"
    assert Case.from_dict(data["case"]) == Case(sq=1, skv=1, d_qk=8, d_v=8, dtype="float16", causal=True)


def test_cli_refuses_a_backend_that_cannot_run_here(tmp_path, capsys):
    """Not a crash to shrink: an FA4 entry on a machine without FA4 says why and saves nothing."""
    path = _save(tmp_path, "fa4", Case(sq=2, skv=2, d_qk=8, d_v=8, dtype="float16"), "FAIL:ALL_ZERO")
    assert main(["shrink", str(path), "--device", "cpu"]) == 2
    assert "fa4 is not available on cpu" in capsys.readouterr().err
    assert list(tmp_path.glob("*.json")) == [path]


def test_a_failure_far_past_its_bound_is_not_traded_for_one_barely_past_it(tmp_path):
    """On an H200 an FA4 row 788x past its bound shrank, step by step, to a case 1.2x past it that failed 3 runs of 4:
    another effect. A step is kept only while its FAIL stays at least 2x its bound (or as far as the first case);
    the control without that rule walks down to the marginal case."""
    from types import SimpleNamespace
    from attnfuzz.tools.shrink import _shrink_entry

    def run(case):   # far off while sq >= 8, barely off below
        return V.Verdict(V.FAIL, V.TOLERANCE, "rows off", ratio=788.0 if case.sq >= 8 else 1.2)

    path = _save(tmp_path, "sdpa-math", BIG, "FAIL:TOLERANCE")
    args = SimpleNamespace(entry=path, max_runs=400)
    assert _shrink_entry(args, corpus_io.load(path), run, "cpu", "") == 0
    [new] = [p for p in tmp_path.glob("*.json") if p != path]
    shrunk = corpus_io.load(new)
    assert shrunk.case.sq == 8 and shrunk.verdict.ratio == 788.0, shrunk.case
    marginal, _, _ = shrink(BIG, lambda case: run(case))    # the rule left out: it slides to sq = 1
    assert marginal.sq == 1
