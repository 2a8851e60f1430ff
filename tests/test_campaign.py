"""Campaigns lose nothing: misbehaving kernels cost one case each, and a campaign killed with -9 resumes without
losing a finding or running a finished case again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from pathlib import Path

from attnfuzz.campaign.lane import Resumable, lane_backends, load_log
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from tests import misbehaving

ROOT = Path(__file__).resolve().parents[1]
MISBEHAVING = ["tests.misbehaving:segfault_when_causal", "tests.misbehaving:aborts", "tests.misbehaving:hangs",
               "tests.misbehaving:raises"]


def campaign_command(directory: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "attnfuzz", "campaign", "--dir", str(directory), "--max-len", "16", *options]


def run_campaign(directory: Path, *options: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(campaign_command(directory, *options), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def logged(directory: Path) -> list[dict]:
    rows = []
    for path in sorted((directory / "cases").glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return rows


def saved_labels(directory: Path) -> set[tuple[str, str]]:
    entries = [json.loads(p.read_text()) for p in (directory / "corpus").glob("*.json")]
    return {(e["backend"], f"{e['verdict']['status']}:{e['verdict']['diagnosis']}") for e in entries}


@pytest.mark.slow
def test_the_campaign_survives_four_misbehaving_kernels_and_saves_each(tmp_path):
    result = run_campaign(tmp_path / "c", "--backends", ",".join(MISBEHAVING + ["sdpa-math"]), "--hours", "0.008",
                          "--case-timeout", "2", "--round-examples", "30", "--round-seconds", "6")
    assert result.returncode == 1, result.stderr  # findings were made
    assert saved_labels(tmp_path / "c") >= {
        ("tests.misbehaving:segfault_when_causal", "CRASH:SIGSEGV"), ("tests.misbehaving:aborts", "CRASH:SIGABRT"),
        ("tests.misbehaving:hangs", "HANG:TIMEOUT"), ("tests.misbehaving:raises", "CRASH:CUDA_ILLEGAL_ADDRESS")}
    labels = Counter((row["backend"], row["label"]) for row in logged(tmp_path / "c"))
    assert labels["sdpa-math", "PASS"] > 0, labels                       # the campaign went on after every crash
    assert labels["tests.misbehaving:segfault_when_causal", "PASS"] > 0, labels   # and so did the crashing backend
    assert "finding (new)" in result.stderr


@pytest.mark.slow
def test_a_campaign_out_of_time_mid_shrink_confirms_what_it_saves(tmp_path):
    # 14.4 s: the first case comes about 5 s after the lane starts (the worker's imports); the shrink that follows
    # needs far more than the ~17 steps of half a second that fit
    result = run_campaign(tmp_path / "c", "--backends", "tests.misbehaving:zero_slowly", "--hours", "0.004")
    assert result.returncode == 1, result.stderr
    [path] = (tmp_path / "c" / "corpus").glob("*.json")
    entry = json.loads(path.read_text())
    assert "confirmed" not in entry and entry["verdict"]["diagnosis"] == "ALL_ZERO", entry
    lane_log = (tmp_path / "c" / "state" / "lane0.stderr").read_text()
    assert "saved unshrunk (time ran out)" in lane_log and "attnfuzz shrink" in lane_log, lane_log
    assert "UNCONFIRMED" not in result.stderr, result.stderr


@pytest.mark.slow
def test_kill_9_then_resume_loses_no_finding_and_repeats_no_case(tmp_path):
    directory = tmp_path / "c"
    options = ["--backends", "sdpa-math,tests.misbehaving:zero_when_causal", "--round-examples", "400"]
    stalls = {**os.environ, misbehaving.STALL_AFTER_FAILURE: str(directory)}  # the shrink cannot finish before the kill
    first = subprocess.Popen(campaign_command(directory, *options, "--hours", "1"), cwd=ROOT, env=stalls,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any(r["label"] == "FAIL:ALL_ZERO" for r in logged(directory)):
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)  # mid-shrink: the failure is logged, not yet saved
    first.wait()
    before = logged(directory)
    assert any(r["label"] == "FAIL:ALL_ZERO" for r in before), "the first run found the bug before the kill"
    assert not list((directory / "corpus").glob("*.json")), "killed before the round could save it"
    time.sleep(1)
    lanes = subprocess.run(["pgrep", "-f", f"attnfuzz.campaign.lane {directory}"], capture_output=True, text=True).stdout
    assert not lanes.strip(), f"lanes outlived the killed campaign: {lanes}"

    resumed = run_campaign(directory, "--hours", "0.006")
    assert resumed.returncode == 1, resumed.stderr
    assert "resuming" in resumed.stderr
    assert ("tests.misbehaving:zero_when_causal", "FAIL:ALL_ZERO") in saved_labels(directory)
    after = logged(directory)
    keys = Counter((r["backend"], json.dumps(r["case"], sort_keys=True)) for r in after)
    repeated = [k for k, n in keys.items() if n > 1]
    assert not repeated, f"{len(repeated)} case(s) ran twice, e.g. {repeated[:1]}"
    assert len(after) > len(before), "the resumed campaign went on drawing new cases"


@pytest.mark.slow
def test_resuming_with_other_options_is_refused_with_the_fix(tmp_path):
    directory = tmp_path / "c"
    assert run_campaign(directory, "--backends", "sdpa-math", "--hours", "0.0003").returncode == 0
    other = run_campaign(directory, "--backends", "sdpa-flash")
    assert other.returncode == 2
    assert "--backends=['sdpa-flash']" in other.stderr and "give a new --dir" in other.stderr
    fresh = run_campaign(tmp_path / "empty")
    assert fresh.returncode == 2 and "--backends: name the backends" in fresh.stderr


def test_a_logged_case_is_answered_from_the_log_not_run_again(tmp_path):
    calls = []

    def run(case):
        calls.append(case)
        return V.Verdict(V.PASS, ratio=0.5)

    case = Case(sq=4, skv=4)
    with (tmp_path / "lane0.jsonl").open("a") as log:
        first = Resumable("b", run, log, tmp_path / ".inflight", {}, deadline=time.perf_counter() + 60, lane=0)
        first.run(case)
    with (tmp_path / "lane0.jsonl").open("a") as log:
        log.write('{"backend": "b", "label": "PA')  # a line cut short by a kill
    done = load_log(tmp_path / "lane0.jsonl")
    with (tmp_path / "lane0.jsonl").open("a") as log:
        again = Resumable("b", run, log, tmp_path / ".inflight", done, deadline=time.perf_counter() + 60, lane=0)
        assert again.run(case).status == V.PASS
        again.run(case.replace(seed=1))
    assert calls == [case, case.replace(seed=1)], "the logged case was not run again; a new one was"
    assert not (tmp_path / ".inflight").exists()


def test_lanes_share_out_backends_without_idling():
    assert lane_backends(["a", "b", "c"], 2, 0) == ["a", "c"] and lane_backends(["a", "b", "c"], 2, 1) == ["b"]
    assert [lane_backends(["a"], 3, i) for i in range(3)] == [["a"], ["a"], ["a"]]


@pytest.mark.slow
def test_a_context_parallel_backend_runs_in_a_campaign_without_a_worker_around_its_ranks(tmp_path):
    """CP ranks are processes of their own (a worker process could not start them: daemons have no children)."""
    result = run_campaign(tmp_path / "c", "--backends", "ring-allgather", "--hours", "0.002", "--round-examples", "20")
    assert result.returncode in (0, 1), result.stderr
    assert Counter(r["label"] for r in logged(tmp_path / "c"))["PASS"] > 0, result.stderr


def test_the_reports_progress_counts_the_cases_its_totals_count(tmp_path):
    """The totals count the cases run (logged lines); Progress counted Hypothesis's examples, which include every
    case drawn again and answered from the log, and read as the same number. Progress now counts both, and its cases
    are the totals' but for the round the deadline cut short."""
    from tests.test_report import table_rows
    for runs, hours in enumerate(("0.003", "0.006", "0.012", "0.024"), 1):  # a loaded host may need a resume or two
        result = run_campaign(tmp_path / "c", "--backends", "sdpa-math", "--hours", hours, "--round-examples", "20")
        assert result.returncode == 0, result.stderr
        markdown = (tmp_path / "c" / "report" / "report.md").read_text()
        totals = table_rows(markdown, "Totals per backend")["sdpa-math"]
        progress = table_rows(markdown, "Progress (state/)")["sdpa-math"]
        rounds, cases, examples = int(progress[2]), int(progress[3]), int(progress[4])
        if rounds >= 2:
            break
    assert rounds >= 2 and examples >= cases, progress
    assert 0 <= int(totals[2]) - cases <= 20 * runs, (totals, progress)  # each run's cut round: at most 20 new cases


@pytest.mark.slow
def test_a_campaign_answers_a_precise_known_crash_s_cases_mostly_unrun(tmp_path):
    known = tmp_path / "known"
    known.mkdir()
    from attnfuzz.store import corpus as corpus_io
    crash = V.Verdict(V.CRASH, "SIGSEGV", "the worker process died (SIGSEGV) while running this case")
    corpus_io.save(known, corpus_io.Entry("tests.misbehaving:segfault_when_causal", Case(causal=True), crash,
                                          known_bug={"link": "tests/misbehaving.py", "when": {"causal": True}}),
                   repro=False)
    result = run_campaign(tmp_path / "c", "--backends", "tests.misbehaving:segfault_when_causal", "--known",
                          str(known), "--hours", "0.003", "--case-timeout", "10", "--workers", "1")
    assert result.returncode == 0, result.stderr   # the one bug is known: no finding
    rows = [row for row in logged(tmp_path / "c") if row["label"] == "KNOWN:SIGSEGV"]
    unrun = sum(row["message"].startswith("not run") for row in rows)
    assert len(rows) > 8 and 0 < len(rows) - unrun < len(rows) / 2, (len(rows), unrun)   # one in 8 still runs
