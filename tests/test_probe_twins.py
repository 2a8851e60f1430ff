"""One root cause, one finding, across labels no alternative reference names: a finding's probe twin (its case with
probe values, graded exactly) says which keys the kernel counted, so a leaked key found as TOLERANCE on Gaussian
values and as MASK_LEAK on probe values is one finding, in a run and across a campaign's rounds; a failure whose
twin passes, or whose grade names another cause, stays a finding of its own."""

from __future__ import annotations

import json
import math
import time

from attnfuzz.campaign import lane as lane_mod
from attnfuzz.campaign.lane import Lane, Resumable
from attnfuzz.engine.harness import Finding, Tally, fuzz, run_case
from attnfuzz.engine.profiles import profile
from attnfuzz.engine.rootcause import merge_twins, probe_twin, twin_known, twin_name
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.broken import LeaksOneKey

LEAK = LeaksOneKey()
MASKED = Case(sq=2, skv=2, d_qk=4, d_v=4, mask_density=0.5, seed=3)   # Gaussian values, a hole in the mask
CAUSAL_PROBE = Case(sq=3, skv=5, d_qk=8, d_v=8, causal=True, alignment="top_left", values="probe")
UNMASKED = Case(sq=2, skv=2, d_qk=4, d_v=4)


def leak(case: Case) -> V.Verdict:
    return run_case(LEAK, case)


def test_the_planted_leak_reads_differently_by_values():
    assert leak(CAUSAL_PROBE).label == "FAIL:MASK_LEAK"
    assert leak(MASKED).label == "FAIL:TOLERANCE", leak(MASKED)
    assert leak(UNMASKED).status == V.PASS, "nothing hidden, nothing leaks"
    assert probe_twin(MASKED) == MASKED.replace(values="probe") and probe_twin(CAUSAL_PROBE) is CAUSAL_PROBE
    assert probe_twin(MASKED.replace(alibi_slopes=(0.5,))) is None, "ALiBi weights keys apart: no exact twin"


def test_a_twin_names_the_mask_error_and_only_for_failures_that_name_no_other_cause():
    assert twin_name(MASKED, leak(MASKED), leak) == V.MASK_LEAK
    assert twin_name(CAUSAL_PROBE, leak(CAUSAL_PROBE), leak) == V.MASK_LEAK
    assert twin_name(UNMASKED, V.Verdict(V.FAIL, V.TOLERANCE), leak) is None, "the twin passes: another bug"
    assert twin_name(MASKED, V.Verdict(V.FAIL, V.SCALE), leak) is None, "a scale bug beside the leak stays apart"
    assert twin_name(MASKED, V.Verdict(V.CRASH, "RuntimeError"), leak) is None


def test_a_one_channel_twin_reads_the_leak_from_its_lse():
    """d_v = 1: every key holds 1, so the output is 1 whatever keys a row counts; exp(lse) counts them."""
    from attnfuzz.engine.rootcause import _lse_counts_keys
    lse = V.Verdict(V.FAIL, V.LSE, worst=V.Worst("lse", (0, 0, 1), math.log(3), math.log(2)))
    assert _lse_counts_keys(lse) == V.MASK_LEAK
    assert _lse_counts_keys(V.Verdict(V.FAIL, V.LSE, worst=V.Worst("lse", (0,), 0.0, math.log(2)))) == V.MASK_DROP
    half = V.Verdict(V.FAIL, V.LSE, worst=V.Worst("lse", (0,), math.log(2.5), math.log(2)))
    assert _lse_counts_keys(half) is None, "half a key is a weighting error, not a mask"


def test_merge_twins_attaches_to_the_finding_named_by_the_error_and_keeps_the_rest():
    tolerance = Finding(LEAK.name, MASKED, leak(MASKED))
    named = Finding(LEAK.name, CAUSAL_PROBE, leak(CAUSAL_PROBE))
    other = Finding(LEAK.name, UNMASKED, V.Verdict(V.FAIL, V.TOLERANCE))   # a twin that passes: not the leak
    assert merge_twins([tolerance, named, other], leak) == [named, other]
    assert [v.label for _, v in named.attached] == ["FAIL:TOLERANCE"] and not other.attached


def test_merge_twins_roots_at_the_smallest_case_of_the_named_ones():
    large = CAUSAL_PROBE.replace(sq=9, skv=11)
    larger, smaller = Finding(LEAK.name, large, leak(large)), Finding(LEAK.name, CAUSAL_PROBE, leak(CAUSAL_PROBE))
    tolerance = Finding(LEAK.name, MASKED, leak(MASKED))   # the smallest case, but its label names no cause
    assert larger.verdict.label == smaller.verdict.label == "FAIL:MASK_LEAK"
    assert merge_twins([larger, smaller, tolerance], leak) == [smaller]
    assert [c for c, _ in smaller.attached] == [large, tolerance.case]


def test_a_run_reports_a_leaked_key_once():
    tally, findings = fuzz(LEAK, space=Space(max_len=80, max_head_dim=128), settings=profile("ci", max_examples=300))
    fails = {label for label in tally.labels if label.startswith("FAIL")}
    assert len(fails) >= 2, tally.to_dict()
    assert len(findings) == 1, [(f.verdict.label, f.case) for f in findings]
    assert {findings[0].verdict.label, *(v.label for _, v in findings[0].attached)} == fails


def test_a_campaign_attaches_a_later_rounds_label_of_a_saved_leak_to_its_entry(tmp_path, monkeypatch):
    (tmp_path / "campaign.json").write_text(json.dumps({"device": "cpu", "hours": 1.0, "max_len": None,
                                                       "round_examples": 20, "round_seconds": 60}))
    for sub in ("state", "corpus"):
        (tmp_path / sub).mkdir()
    rounds = [[Finding(LEAK.name, CAUSAL_PROBE, leak(CAUSAL_PROBE))], [Finding(LEAK.name, MASKED, leak(MASKED))],
              [Finding(LEAK.name, UNMASKED, V.Verdict(V.FAIL, V.TOLERANCE, "a precision bug"))]]
    monkeypatch.setattr(lane_mod, "fuzz", lambda backend, **_: (Tally(examples=0), rounds.pop(0)))
    lane = Lane(tmp_path, 0)
    runner = Resumable(LEAK.name, leak, None, tmp_path / ".inflight", {}, time.perf_counter() + 60, 0)
    lane._round(LEAK, 0, runner, None, lane.space())
    lane._round(LEAK, 1, runner, None, lane.space())
    [(path, entry)] = corpus_io.load_all(tmp_path / "corpus")[0]
    assert entry.verdict.label == "FAIL:MASK_LEAK" and [v.label for _, v in entry.attached] == ["FAIL:TOLERANCE"]
    assert lane_mod.seen_in(tmp_path / "corpus")(LEAK.name, MASKED, leak(MASKED)) is not None
    lane._round(LEAK, 2, runner, None, lane.space())   # the control: a TOLERANCE whose twin passes is news
    assert len(corpus_io.load_all(tmp_path / "corpus")[0]) == 2



def test_a_leak_marked_known_stays_known_under_the_labels_its_twin_joined(tmp_path):
    from attnfuzz.cli import main
    space, search = Space(max_len=80, max_head_dim=128), profile("ci", max_examples=300)
    [finding] = fuzz(LEAK, space=space, settings=search)[1]
    path = corpus_io.save(tmp_path, corpus_io.Entry(LEAK.name, finding.case, finding.verdict,
                                                    attached=finding.attached), repro=False)
    assert main(["known", str(path), "--link", "https://example.org/leak"]) == 0
    record = corpus_io.load(path).known_bug
    assert not {"FAIL:TOLERANCE", "FAIL:LSE"} & set(record.get("labels", ())), "no label that names no cause"
    known = corpus_io.known_bugs(tmp_path)
    tally, findings = fuzz(LEAK, space=space, settings=search, known=known)
    assert findings == [], [(f.verdict.label, f.case) for f in findings]
    assert any(label.startswith("KNOWN") for label, _ in tally.known), tally.known
    other = Finding(LEAK.name, UNMASKED, V.Verdict(V.FAIL, V.TOLERANCE, "a precision bug"))
    assert twin_known(LEAK.name, other, leak, known) is None, "a TOLERANCE whose twin passes is news"
    assert known(LEAK.name, MASKED, V.Verdict(V.FAIL, V.TOLERANCE)) is None, "the record alone takes no TOLERANCE"
