"""A failure saved without a rerun that reproduced it says so in its entry and in the run's words; `attnfuzz replay`
confirms it (the flag leaves the file) or drops it (out of the corpus, reported as not reproduced)."""

from __future__ import annotations

import json

import pytest

from attnfuzz.backends import get
from attnfuzz.cli import main
from attnfuzz.engine import interrupt
from attnfuzz.oracles import verdict as V
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import inflight as inflight_io
from attnfuzz.store.replay import UNREPRODUCED_DIR
from attnfuzz.strategies.case import Case

ZERO = "tests.misbehaving:zero_when_causal"   # all zeros under causal, right otherwise
CAUSAL = Case(sq=4, skv=4, d_qk=8, d_v=8, causal=True)
ALL_ZERO = V.Verdict(V.FAIL, V.ALL_ZERO, "all zero")


def _entry(case: Case, unconfirmed: str | None = corpus_io.STOPPED_UNCONFIRMED) -> corpus_io.Entry:
    return corpus_io.Entry(ZERO, case, ALL_ZERO, unconfirmed=unconfirmed)


def test_an_unconfirmed_entry_says_so_and_reads_back(tmp_path):
    path = corpus_io.save(tmp_path, _entry(CAUSAL), repro=False)
    data = json.loads(path.read_text())
    assert data["confirmed"] is False and data["unconfirmed_reason"] == corpus_io.STOPPED_UNCONFIRMED, data
    assert corpus_io.load(path).unconfirmed == corpus_io.STOPPED_UNCONFIRMED
    said = corpus_io.describe_saved(corpus_io.load(path), path)
    assert f"UNCONFIRMED: {corpus_io.STOPPED_UNCONFIRMED}" in said and f"attnfuzz replay {path}" in said, said


def test_control_a_confirmed_entry_carries_no_flag(tmp_path):
    path = corpus_io.save(tmp_path, _entry(CAUSAL, unconfirmed=None), repro=False)
    data = json.loads(path.read_text())
    assert "confirmed" not in data and "unconfirmed_reason" not in data, "older entries stay as they are"
    assert corpus_io.load(path).unconfirmed is None
    assert "UNCONFIRMED" not in corpus_io.describe_saved(corpus_io.load(path), path)


def test_a_malformed_flag_is_named(tmp_path):
    path = corpus_io.save(tmp_path, _entry(CAUSAL), repro=False)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "confirmed": "no"}))
    with pytest.raises(corpus_io.CorpusError, match="'confirmed'"):
        corpus_io.load(path)


def test_a_confirmed_sighting_confirms_an_unconfirmed_entry_and_not_the_other_way(tmp_path):
    unconfirmed, confirmed = _entry(CAUSAL), _entry(CAUSAL, unconfirmed=None)
    path = corpus_io.save(tmp_path, unconfirmed, repro=False)
    corpus_io.save(tmp_path, _entry(CAUSAL), repro=False)
    assert corpus_io.load(path).unconfirmed, "another unconfirmed sighting confirms nothing"
    corpus_io.save(tmp_path, confirmed, repro=False)
    assert corpus_io.load(path).unconfirmed is None
    again = _entry(CAUSAL)
    corpus_io.save(tmp_path, again, repro=False)
    assert corpus_io.load(path).unconfirmed is None
    assert again.unconfirmed is None, "the caller tells what the file holds"


def test_failures_saved_as_found_are_unconfirmed(tmp_path):
    as_found = corpus_io.AsFound(ZERO, "cpu")
    as_found.see(CAUSAL, ALL_ZERO)
    [(path, said)] = as_found.save(tmp_path, corpus_io.STOPPED_UNCONFIRMED)
    assert corpus_io.load(path).unconfirmed == corpus_io.STOPPED_UNCONFIRMED
    assert "UNCONFIRMED" in said, said


def test_a_case_that_died_in_process_is_saved_unconfirmed(tmp_path):
    backend = get(ZERO)
    inflight = inflight_io.inflight_path(tmp_path, backend.name)
    inflight.write_text(json.dumps({"backend": backend.name, "device": "cpu", "isolated": False,
                                    "case": CAUSAL.to_dict()}))
    interrupt.record_path(inflight).write_text("Fatal Python error: Segmentation fault\n")
    [recovered] = inflight_io.recover_inflight(tmp_path, backend)
    assert recovered.finding and "UNCONFIRMED" in recovered.message, recovered.message
    assert corpus_io.load(recovered.path).unconfirmed == corpus_io.DIED_UNCONFIRMED


def test_replay_confirms_what_reproduces_and_drops_what_does_not(tmp_path, capsys):
    reproduces = corpus_io.save(tmp_path, _entry(CAUSAL))
    gone = corpus_io.save(tmp_path, _entry(CAUSAL.replace(causal=False)))
    fixed = corpus_io.save(tmp_path, _entry(CAUSAL.replace(causal=False, sq=3), unconfirmed=None))  # control
    code = main(["replay", str(tmp_path), "--json"])
    rows = {row["entry"]: row for row in json.loads(capsys.readouterr().out)}
    assert code == 1, rows   # the one that reproduced fails, as any finding that still fails
    assert (rows[str(reproduces)]["outcome"], rows[str(reproduces)]["unconfirmed"]) == ("fail", "confirmed")
    assert corpus_io.load(reproduces).unconfirmed is None and "confirmed" not in json.loads(reproduces.read_text())
    assert (rows[str(gone)]["outcome"], rows[str(gone)]["unconfirmed"]) == ("unreproduced", "dropped")
    assert not gone.exists() and not gone.with_suffix(".py").exists()
    assert (tmp_path / UNREPRODUCED_DIR / gone.name).exists(), "kept aside, not deleted"
    assert (tmp_path / UNREPRODUCED_DIR / gone.with_suffix(".py").name).exists()
    assert (rows[str(fixed)]["outcome"], rows[str(fixed)]["unconfirmed"]) == ("pass", None)
    assert fixed.exists(), "a confirmed entry that passes is a fix, and stays"
    assert {p.name for p in corpus_io.entry_paths(tmp_path)} == {reproduces.name, fixed.name}


def test_replay_says_what_it_made_of_an_unconfirmed_entry(tmp_path, capsys):
    corpus_io.save(tmp_path, _entry(CAUSAL))
    corpus_io.save(tmp_path, _entry(CAUSAL.replace(causal=False)))
    main(["replay", str(tmp_path)])
    out = capsys.readouterr().out
    assert "reproduced, now confirmed" in out and f"not reproduced, moved to {UNREPRODUCED_DIR}/" in out, out


def _save_unsaved(tmp_path, reruns=None) -> corpus_io.Entry:
    """What a lane whose time is up saves of the log {CAUSAL: ALL_ZERO}, given `reruns`."""
    from types import SimpleNamespace

    from attnfuzz.campaign.lane import Lane, case_key
    lane = SimpleNamespace(corpus=tmp_path, device="cpu", index=0)
    lane.save_finding = lambda *args, **kwargs: Lane.save_finding(lane, *args, **kwargs)
    try:
        Lane._save_unsaved(lane, [get(ZERO)], {case_key(ZERO, CAUSAL): ALL_ZERO}, reruns)
    finally:
        [path] = corpus_io.entry_paths(tmp_path)   # saved, even when the reruns were interrupted
    return corpus_io.load(path)


def test_a_campaign_out_of_time_saves_what_its_log_holds_unconfirmed(tmp_path):
    assert _save_unsaved(tmp_path).unconfirmed == corpus_io.OUT_OF_TIME_UNCONFIRMED


def test_a_campaign_out_of_time_reruns_what_it_saves_unshrunk(tmp_path, capsys):
    ran = []
    entry = _save_unsaved(tmp_path, {ZERO: lambda case: ran.append(case) or ALL_ZERO})
    assert ran == [CAUSAL] * 3 and entry.unconfirmed is None, (ran, entry.unconfirmed)
    assert entry.verdict.status == V.FAIL and "attnfuzz shrink" in capsys.readouterr().err


def test_a_rerun_that_passes_makes_it_flaky_not_confirmed(tmp_path):
    answers = iter([ALL_ZERO, V.Verdict(V.PASS, "PASS", ""), ALL_ZERO])
    entry = _save_unsaved(tmp_path, {ZERO: lambda case: next(answers)})
    assert entry.verdict.status == V.FLAKY and "3 of 4" in entry.verdict.message, entry.verdict
    assert entry.unconfirmed is None


def test_reruns_stop_at_the_time_limit_and_on_an_interrupt(tmp_path, monkeypatch):
    from attnfuzz.campaign import lane as lane_mod
    monkeypatch.setattr(lane_mod, "END_RERUN_S", 0.0)
    ran = []
    entry = _save_unsaved(tmp_path / "late", {ZERO: lambda case: ran.append(case) or ALL_ZERO})
    assert ran == [] and entry.unconfirmed == corpus_io.OUT_OF_TIME_UNCONFIRMED
    monkeypatch.setattr(lane_mod, "END_RERUN_S", 60.0)

    def stopped(case):
        raise interrupt.Interrupted(2)
    with pytest.raises(interrupt.Interrupted):
        _save_unsaved(tmp_path / "stopped", {ZERO: stopped})
    [path] = corpus_io.entry_paths(tmp_path / "stopped")
    assert corpus_io.load(path).unconfirmed == corpus_io.OUT_OF_TIME_UNCONFIRMED


def test_the_campaigns_closing_list_marks_an_unconfirmed_finding(tmp_path):
    from attnfuzz.campaign.supervisor import _unconfirmed
    unconfirmed = corpus_io.save(tmp_path, _entry(CAUSAL, corpus_io.OUT_OF_TIME_UNCONFIRMED), repro=False)
    confirmed = corpus_io.save(tmp_path, _entry(CAUSAL.replace(sq=3), unconfirmed=None), repro=False)
    said = _unconfirmed(unconfirmed)
    assert corpus_io.OUT_OF_TIME_UNCONFIRMED in said and f"attnfuzz replay {unconfirmed}" in said, said
    assert _unconfirmed(confirmed) == ""
