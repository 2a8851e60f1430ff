"""What a finding tells the user: where it is saved and how to replay it; one root cause reads as one finding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.engine.harness import Finding, fuzz, run_case
from attnfuzz.engine.rootcause import Evidence, merge_root_causes
from attnfuzz.oracles import verdict as V
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.broken import BROKEN


ROOT = Path(__file__).resolve().parents[1]


def attnfuzz(*argv: str) -> subprocess.CompletedProcess:
    """The CLI in a process of its own: a run in this one would load modules whose constants Hypothesis draws from,
    and so change the derandomized streams of the tests after it."""
    return subprocess.run([sys.executable, "-m", "attnfuzz", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_run_prints_where_each_finding_is_and_how_to_replay_it(tmp_path):
    spec = "tests.misbehaving:zero_when_causal"
    ran = attnfuzz("run", "--backend", spec, "--max-examples", "30", "--seed", "0", "--corpus", str(tmp_path))
    assert ran.returncode == 1, ran.stderr[-3000:]
    err = ran.stderr
    [path] = corpus_io.entry_paths(tmp_path)
    script = path.with_suffix(".py")
    assert f"[{spec}] FAIL:ALL_ZERO: every graded output element is 0" in err, err
    for line in (f"saved:  {path}", f"repro:  {script}", f"replay: attnfuzz replay {path}   or   python3 {script}"):
        assert line in err, (line, err)
    assert "shrink:" not in err, "Hypothesis shrank it: no shrink command"
    assert attnfuzz("replay", str(path)).returncode == 1, "the printed replay command replays it: the bug is there"
    again = attnfuzz("run", "--backend", spec, "--max-examples", "30", "--seed", "0", "--corpus", str(tmp_path))
    assert again.returncode == 1 and "seen before" in again.stderr, "the same bug again merges into its entry"


# -- one root cause, one finding -------------------------------------------------------------------------------------
SPACE = Space(max_len=80, max_head_dim=128)  # the shapes these controls were written for
SEARCH = profile("ci", max_examples=300)


def test_a_dropped_causal_mask_is_one_finding_with_its_other_names_attached():
    """The grader names the bug MASK_IGNORED, WINDOW_OFF_BY_ONE or MASK_ALIGNMENT by case; Hypothesis shrinks each
    label apart, and the run used to report three findings."""
    tally, findings = fuzz(BROKEN["broken-causal-dropped"](), space=SPACE, settings=SEARCH)
    assert {"FAIL:WINDOW_OFF_BY_ONE", "FAIL:MASK_IGNORED"} <= set(tally.labels), tally.to_dict()
    [finding] = findings
    assert finding.verdict.label == "FAIL:MASK_IGNORED", finding.verdict
    attached = {verdict.label: case for case, verdict in finding.attached}
    assert "FAIL:WINDOW_OFF_BY_ONE" in attached, finding.attached
    assert all(verdict.status == V.FAIL and V.MASK_IGNORED in verdict.also for _, verdict in finding.attached)
    assert attached["FAIL:WINDOW_OFF_BY_ONE"].sq == 2, "each attached label keeps its own shrunk case"


def test_control_two_independent_bugs_stay_two_findings():
    """Causal mask dropped when sq == skv, and a wrong scale: neither explains the other's failures."""
    tally, findings = fuzz(BROKEN["broken-causal-square-and-scale"](), space=SPACE, settings=SEARCH)
    by_diagnosis = {f.verdict.diagnosis: f for f in findings}
    assert V.SCALE in by_diagnosis and V.MASK_IGNORED in by_diagnosis, [f.verdict.label for f in findings]
    assert by_diagnosis[V.SCALE] is not by_diagnosis[V.MASK_IGNORED]
    attached = [verdict.diagnosis for f in findings for _, verdict in f.attached]
    assert V.SCALE not in attached and V.MASK_IGNORED not in attached, attached


def test_control_a_bug_whose_smallest_case_is_ambiguous_keeps_its_own_finding():
    """A left bound widened by one and a band dropped when sq > skv: the window bug's smallest case, sq = skv = 2 with
    window (0, None), reads as "no band at all" too, and if that is all the run saw of it, the evidence alone would
    fold it into the dropped band. The grown case (sq = skv = 5) fails as a moved bound only: two findings."""
    backend = BROKEN["broken-window-and-mask-dropped"]()
    window_case = Case(sq=2, skv=2, d_qk=8, d_v=8, window=(0, None))
    band_case = Case(sq=4, skv=3, d_qk=8, d_v=8, causal=True)
    findings = [Finding(backend.name, c, run_case(backend, c)) for c in (window_case, band_case)]
    assert [f.verdict.label for f in findings] == ["FAIL:WINDOW_OFF_BY_ONE", "FAIL:MASK_IGNORED"]
    assert V.MASK_IGNORED in findings[0].verdict.also, "the smallest window case is ambiguous"
    evidence = Evidence()
    for f in findings:
        evidence.add(f.verdict)
    assert merge_root_causes(findings, evidence) == [findings[1]], "what the evidence alone would do"
    findings[1].attached = []
    merged = merge_root_causes(findings, evidence, probe=lambda c: run_case(backend, c))
    assert merged == findings and not findings[1].attached, [f.attached for f in merged]
    one_bug = BROKEN["broken-causal-dropped"]()  # the same probe keeps one root cause one finding
    findings = [Finding(one_bug.name, c, run_case(one_bug, c)) for c in (Case(sq=2, skv=2, d_qk=8, d_v=8, causal=True),
                                                                         Case(sq=3, skv=3, d_qk=8, d_v=8, causal=True))]
    evidence = Evidence()
    for f in findings:
        evidence.add(f.verdict)
    assert merge_root_causes(findings, evidence, probe=lambda c: run_case(one_bug, c)) == [findings[1]]


def test_the_merge_needs_every_output_of_the_label_explained():
    window = Finding("b", Case(sq=2, skv=2, causal=True), V.Verdict(V.FAIL, V.WINDOW_OFF_BY_ONE))
    ignored = Finding("b", Case(sq=3, skv=3, causal=True), V.Verdict(V.FAIL, V.MASK_IGNORED))
    ambiguous = V.Verdict(V.FAIL, V.WINDOW_OFF_BY_ONE, also=(V.MASK_IGNORED,))
    evidence = Evidence()
    for verdict in (ambiguous, ambiguous, V.Verdict(V.FAIL, V.MASK_IGNORED)):
        evidence.add(verdict)
    assert merge_root_causes([window, ignored], evidence) == [ignored] and ignored.attached[0][1] is window.verdict
    window.attached, ignored.attached = [], []
    evidence.add(V.Verdict(V.FAIL, V.WINDOW_OFF_BY_ONE))  # one output that only a moved bound explains
    assert merge_root_causes([window, ignored], evidence) == [window, ignored] and not ignored.attached


def test_run_saves_one_entry_with_the_other_labels_attached_and_old_entries_still_load(tmp_path):
    ran = attnfuzz("run", "--backend", "tests.misbehaving:drops_causal", "--max-examples", "200", "--profile", "ci",
                   "--corpus", str(tmp_path))
    err = ran.stderr
    assert ran.returncode == 1, err[-3000:]
    [path] = corpus_io.entry_paths(tmp_path)
    entry = corpus_io.load(path)
    assert entry.verdict.label == "FAIL:MASK_IGNORED" and entry.attached, (entry.verdict, err)
    for case, verdict in entry.attached:
        assert f"also {verdict.label}, the same root cause" in err and repr(case) in err
    data = json.loads(path.read_text())
    assert {a["verdict"]["diagnosis"] for a in data["attached"]} == {v.diagnosis for _, v in entry.attached}
    del data["attached"]  # an entry written before the field existed
    for attached in ([], [{"case": {"sq": 0}, "verdict": {}}]):
        if attached:
            data["attached"] = attached
        (tmp_path / "old.json").write_text(json.dumps(data))
        if attached:
            with pytest.raises(corpus_io.CorpusError, match="attached"):
                corpus_io.load(tmp_path / "old.json")
        else:
            assert corpus_io.load(tmp_path / "old.json").attached == []


def test_a_campaign_counts_a_failure_its_saved_entry_explains_as_that_entry(tmp_path):
    """Across rounds: once MASK_IGNORED is saved, a WINDOW_OFF_BY_ONE whose output matches no band at all too is
    that entry's again; one that does not is searched on."""
    from attnfuzz.campaign.lane import seen_in
    ignored = V.Verdict(V.FAIL, V.MASK_IGNORED, "no band")
    corpus_io.save(tmp_path, corpus_io.Entry("b", Case(sq=3, skv=3, causal=True), ignored), repro=False)
    seen = seen_in(tmp_path)
    case = Case(sq=2, skv=2, causal=True)
    assert seen("b", case, V.Verdict(V.FAIL, V.WINDOW_OFF_BY_ONE, also=(V.MASK_IGNORED,))) is not None
    assert seen("b", case, V.Verdict(V.FAIL, V.WINDOW_OFF_BY_ONE)) is None
    assert seen("other", case, V.Verdict(V.FAIL, V.WINDOW_OFF_BY_ONE, also=(V.MASK_IGNORED,))) is None
