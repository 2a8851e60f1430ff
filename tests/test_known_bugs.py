"""Known-bug records that say where a passing replay is no evidence of a fix: `since` (the release that brought
the bug) and `unwritten` (output the kernel never writes)."""

from __future__ import annotations

import dataclasses

import pytest

from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case

ENTRY = corpus_io.Entry("sdpa-math", Case(sq=4, skv=6, d_qk=8, d_v=8, causal=True, seed=2),
                        V.Verdict(V.FAIL, V.ALL_ZERO, "every graded output element is 0"),
                        known_bug={"link": "https://example.org/bug"})

def test_a_known_bug_that_passes_on_a_release_before_it_came_is_not_called_fixed():
    """`since` {"torch": "2.13"}: on an older torch a passing replay is 'predates' (skipped, saying which release is
    installed), on torch from that release on it is 'xpass' (mark it fixed), and a failure stays an expected one."""
    from attnfuzz.cli import replay_outcome
    from attnfuzz.store.known import predates
    import torch
    here = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    major, minor = (int(x) for x in here.split("."))
    passed = V.Verdict(V.PASS, None, "")
    failed = V.Verdict(V.FAIL, "ALL_ZERO", "every graded output element is 0")
    newer = dataclasses.replace(ENTRY, known_bug={**ENTRY.known_bug, "since": {"torch": f"{major}.{minor + 1}"}})
    assert replay_outcome(newer, passed) == "predates"
    assert f"torch {torch.__version__} predates this known bug (since torch {major}.{minor + 1})" == predates(
        newer.known_bug)
    assert replay_outcome(newer, failed) == "xfail"
    same = dataclasses.replace(ENTRY, known_bug={**ENTRY.known_bug, "since": {"torch": here}})
    assert replay_outcome(same, passed) == "xpass" and predates(same.known_bug) is None
    absent = dataclasses.replace(ENTRY, known_bug={**ENTRY.known_bug, "since": {"no-such-package": "99"}})
    assert replay_outcome(absent, passed) == "xpass"


@pytest.mark.parametrize("since", [["torch", "2.13"], {"torch": 2.13}, {"torch": "latest"}])
def test_a_known_bug_since_must_name_packages_and_versions(since):
    from attnfuzz.store.known import record_problem
    problem = record_problem({"link": "https://example.org/bug", "since": since}, Case(sq=1, skv=1, d_qk=8, d_v=8))
    assert problem and "known_bug.since" in problem


def test_a_known_bug_of_unwritten_output_that_passes_unpoisoned_is_no_evidence_of_a_fix(monkeypatch):
    """`unwritten: true`: a pass without --poison-memory is 'unreproduced' (the memory held zeros), a pass with it
    is 'xpass' (the kernel now writes its output)."""
    from attnfuzz.cli import replay_outcome
    from attnfuzz.engine import poison
    unwritten = dataclasses.replace(ENTRY, known_bug={**ENTRY.known_bug, "unwritten": True})
    passed = V.Verdict(V.PASS, None, "")
    monkeypatch.setattr(poison, "enabled", lambda: False)
    assert replay_outcome(unwritten, passed) == "unreproduced" and replay_outcome(ENTRY, passed) == "xpass"
    monkeypatch.setattr(poison, "enabled", lambda: True)
    assert replay_outcome(unwritten, passed) == "xpass"


# -- KNOWN names the entry that took it -------------------------------------------------------------------------------
def _two_known_bugs(folder):
    """Two known bugs of one backend and label, told apart by the alignment of the case: their entries' ids."""
    ids = {}
    for alignment in ("top_left", "bottom_right"):
        entry = dataclasses.replace(ENTRY, backend="broken-zero-causal", case=ENTRY.case.replace(alignment=alignment),
                                    known_bug={"link": f"https://example.org/{alignment}", "note": f"zeros {alignment}",
                                               "when": {"alignment": alignment}})
        ids[alignment] = corpus_io.save(folder, entry, repro=False).stem
    return ids


def test_each_known_verdict_and_the_tally_name_the_entry_that_took_it(tmp_path):
    from attnfuzz.engine.harness import fuzz
    from attnfuzz.engine.profiles import profile
    from attnfuzz.strategies.space import Space
    from tests.broken import ZeroWhenCausal
    ids = _two_known_bugs(tmp_path)
    seen = []
    tally, findings = fuzz(ZeroWhenCausal(), space=Space(max_len=40), settings=profile("ci", max_examples=150),
                           known=corpus_io.known_bugs(tmp_path), on_case=lambda c, v, _: seen.append((c, v)))
    assert not findings
    known = [(c, v) for c, v in seen if v.status == V.KNOWN]
    assert {c.alignment for c, _ in known} == {"top_left", "bottom_right"}, tally.to_dict()
    for case, verdict in known:
        assert verdict.known_entry == ids[case.alignment], (case, verdict)
        assert f"known bug: https://example.org/{case.alignment}" in verdict.checks
    assert all(v.known_entry is None for _, v in seen if v.status != V.KNOWN)   # the control: nothing else is named
    counts = {r["entry"]: r["count"] for r in tally.to_dict()["known"]}
    assert counts == {ids[a]: sum(c.alignment == a for c, _ in known) for a in ids}, tally.to_dict()
    assert sum(counts.values()) == tally.labels["KNOWN:ALL_ZERO"]
    assert f"KNOWN:ALL_ZERO {counts[ids['top_left']]} = {ids['top_left']} (zeros top_left)" in tally.known_lines()


def test_run_prints_and_logs_which_known_bug_each_known_count_is(tmp_path):
    """`attnfuzz run`: a line per known entry under the tally, its record in --json, its id in each --log verdict."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    spec = "tests.misbehaving:zero_when_causal"
    path = corpus_io.save(tmp_path / "corpus", dataclasses.replace(
        ENTRY, backend=spec, known_bug={"link": "https://example.org/z", "note": "zeros under causal"}), repro=False)
    log = tmp_path / "run.jsonl"
    ran = subprocess.run([sys.executable, "-m", "attnfuzz", "run", "--backend", spec, "--max-examples", "60",
                          "--seed", "1", "--corpus", str(path.parent), "--log", str(log), "--json"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    [record] = json.loads(ran.stdout)[spec]["tally"]["known"]
    assert record["entry"] == path.stem and record["label"] == "KNOWN:ALL_ZERO" and record["count"] > 0, record
    assert f"[{spec}] KNOWN:ALL_ZERO {record['count']} = {path.stem} (zeros under causal)" in ran.stderr, ran.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["verdict"].get("known_entry") for r in rows if r["label"] == "KNOWN:ALL_ZERO"] == [path.stem] * \
        record["count"]
