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
