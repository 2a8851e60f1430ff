"""An interrupted run leaves no fake finding; a crashed one still leaves its case; a killed one keeps it, unjudged.

Real `attnfuzz run`, `pytest fuzz` and campaign processes are stopped mid-case with SIGINT (as a terminal's Ctrl-C,
sent to the whole process group) and SIGTERM (a job's time limit), and the next run must report nothing. The
kernels in tests/misbehaving.py nap while a file exists, so a test holds them mid-case for as long as it needs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import inflight as inflight_io
from attnfuzz.engine import interrupt
from attnfuzz.backends import get
from attnfuzz.engine.harness import run_case
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from tests.misbehaving import CASES_UNDER, NAP

ROOT = Path(__file__).resolve().parents[1]
NAPS, WRAPS = "tests.misbehaving:naps", "tests.misbehaving:naps_and_wraps"


def _env(nap: Path, **more: str) -> dict:
    return {**os.environ, NAP: str(nap), "PYTHONPATH": str(ROOT), **more}


def _run_command(spec: str, corpus: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "attnfuzz", "run", "--backend", spec, "--max-examples", "5", "--corpus",
            str(corpus), *options]


def _pytest_command(spec: str, corpus: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "pytest", str(ROOT / "fuzz"), "-q", "-p", "no:cacheprovider", "--attnfuzz-backend",
            spec, "--attnfuzz-max-examples", "5", "--attnfuzz-corpus", str(corpus), *options]


def _wait_for(ready, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready(), f"not ready (exit code {proc.poll()}): {proc.stdout.read() if proc.poll() is not None else ''}"


def stopped_mid_case(command: list[str], tmp_path: Path, sig: int, *, group: bool,
                     inflight: str = ".inflight-*.json", settle: float = 1.0,
                     env: dict | None = None) -> subprocess.CompletedProcess:
    """Start `command` with the napping kernels napping, wait until a case waits on disk, send `sig` (to the whole
    process group when `group`, as a terminal's Ctrl-C does), let later calls run at once, and wait for the end."""
    nap = tmp_path / "nap"
    nap.touch()
    proc = subprocess.Popen(command, cwd=ROOT, env=_env(nap, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(lambda: list(tmp_path.glob(f"**/{inflight}")), proc)
        time.sleep(settle)  # well inside the case (an isolated worker has started and is napping)
        (os.killpg if group else os.kill)(proc.pid, sig)
        nap.unlink()  # whatever runs after the signal runs at once
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, "")


def leftovers(corpus: Path) -> list[str]:
    """Anything a run leaves in a corpus folder: entries, write-ahead files, crash records, stopped cases."""
    return sorted(str(p.relative_to(corpus)) for p in corpus.rglob("*") if p.is_file())


SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]


@pytest.mark.slow
@pytest.mark.parametrize("spec", [NAPS, WRAPS])
@pytest.mark.parametrize("sig", SIGNALS)
def test_attnfuzz_run_interrupted_mid_case_leaves_no_finding(tmp_path, sig, spec):
    corpus = tmp_path / "corpus"
    stopped = stopped_mid_case(_run_command(spec, corpus), tmp_path, sig, group=True)
    assert leftovers(corpus) == [], f"no finding, no write-ahead file, no crash record\n{stopped.stdout[-3000:]}"
    again = subprocess.run(_run_command(spec, corpus), cwd=ROOT, env=_env(tmp_path / "nap"), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "0 finding(s) saved" in again.stderr, again.stderr[-3000:]
    assert "the last run" not in again.stderr, again.stderr[-3000:]
    assert leftovers(corpus) == []
    assert stopped.returncode == 128 + sig, stopped.stdout[-3000:]  # 130 / 143
    assert f"interrupted by {signal.Signals(sig).name}" in stopped.stdout, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout, stopped.stdout[-3000:]
    assert "@seed" not in stopped.stdout, stopped.stdout[-3000:]  # Hypothesis's advice to reproduce a failure: none


FOUND_THEN_NAPS = "tests.misbehaving:zero_when_causal_then_naps"


@pytest.mark.slow
@pytest.mark.parametrize("front", ["run", "pytest"])
def test_a_failure_graded_before_the_stop_is_saved_as_found(tmp_path, front):
    """A time limit that ends a run while it shrinks loses the rest of the shrink, not the failure: the smallest
    failing case of each label is saved as found, with the command to shrink it; the case it was running is still
    not a finding."""
    corpus = tmp_path / "corpus"
    # the ci profile keeps no example database: a failure saved there by another run would be replayed first
    command = (_run_command(FOUND_THEN_NAPS, corpus, "--max-examples", "50", "--profile", "ci") if front == "run" else
               _pytest_command(FOUND_THEN_NAPS, corpus, "--attnfuzz-max-examples", "50", "--attnfuzz-profile", "ci"))
    stopped = stopped_mid_case(command, tmp_path, signal.SIGTERM, group=True, inflight="nap.napping",
                               env={CASES_UNDER: str(corpus)})
    expected_exit = 143 if front == "run" else pytest.ExitCode.INTERRUPTED
    assert stopped.returncode == expected_exit, stopped.stdout[-3000:]
    assert "attnfuzz shrink" in stopped.stdout, stopped.stdout[-3000:]
    saved = [p.name for p in corpus.glob("*.json")]
    assert len(saved) == 1 and "-FAIL-ALL_ZERO-" in saved[0], leftovers(corpus)
    entry = corpus_io.load(corpus / saved[0])
    assert entry.case.causal and entry.verdict.label == "FAIL:ALL_ZERO"
    assert entry.unconfirmed == corpus_io.STOPPED_UNCONFIRMED, "it was graded once: the entry says so"
    assert f"UNCONFIRMED: {corpus_io.STOPPED_UNCONFIRMED}" in stopped.stdout, stopped.stdout[-3000:]
    assert not list(corpus.glob(".inflight-*")), leftovers(corpus)


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_pytest_fuzz_interrupted_mid_case_leaves_no_finding(tmp_path, sig):
    corpus = tmp_path / "corpus"
    stopped = stopped_mid_case(_pytest_command(WRAPS, corpus), tmp_path, sig, group=True)
    assert leftovers(corpus) == [], stopped.stdout[-3000:]
    again = subprocess.run(_pytest_command(WRAPS, corpus), cwd=ROOT, env=_env(tmp_path / "nap"),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "1 passed" in again.stdout, again.stdout[-3000:]
    assert "StoppedCase" not in again.stdout and leftovers(corpus) == []
    assert stopped.returncode == pytest.ExitCode.INTERRUPTED, stopped.stdout[-3000:]
    assert f"interrupted by {signal.Signals(sig).name}" in stopped.stdout, stopped.stdout[-3000:]


@pytest.mark.slow
def test_an_isolated_run_interrupted_by_ctrl_c_leaves_no_crash(tmp_path):
    """Ctrl-C reaches the worker too: it must not die of it (a CRASH of the case), the run stops it."""
    corpus = tmp_path / "corpus"
    command = _run_command(NAPS, corpus, "--isolate", "--case-timeout", "60")
    stopped = stopped_mid_case(command, tmp_path, signal.SIGINT, group=True, settle=6.0)
    assert "CRASH" not in stopped.stdout and leftovers(corpus) == [], stopped.stdout[-3000:]
    again = subprocess.run(command, cwd=ROOT, env=_env(tmp_path / "nap"), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "0 finding(s) saved" in again.stderr, again.stderr[-3000:]
    assert stopped.returncode == 130, stopped.stdout[-3000:]
    assert "interrupted by SIGINT" in stopped.stdout and "Traceback" not in stopped.stdout, stopped.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("sig, group", [(signal.SIGINT, True), (signal.SIGINT, False), (signal.SIGTERM, False)],
                         ids=["ctrl-c", "SIGINT", "SIGTERM"])
def test_a_campaign_lane_stopped_mid_case_resumes_without_a_finding(tmp_path, sig, group):
    """Without isolation a lane's case left on disk used to become a CRASH:PROCESS_DIED on resume. A signal to the
    campaign alone (a job's time limit) stops its lanes through it, and they name that signal: the campaign passes on
    the one it got. Ctrl-C reaches them directly too, and then both copies are the same signal."""
    camp = tmp_path / "camp"
    command = [sys.executable, "-m", "attnfuzz", "campaign", "--dir", str(camp), "--backends", NAPS, "--no-isolate",
               "--max-len", "16", "--round-examples", "20"]
    stopped = stopped_mid_case(command + ["--hours", "1"], tmp_path, sig, group=group,
                               inflight=".inflight-lane*.json")
    lane_log = (camp / "state" / "lane0.stderr").read_text()
    assert not list(camp.glob(".inflight-*")), f"the lane removed its write-ahead file and crash record\n{lane_log}"
    resumed = subprocess.run(command + ["--hours", "0.004"], cwd=ROOT, env=_env(tmp_path / "nap"),
                             capture_output=True, text=True, timeout=300)
    assert "resuming" in resumed.stderr and not corpus_io.entry_paths(camp / "corpus"), resumed.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (camp / "corpus" / inflight_io.STOPPED_DIR).exists()
    assert stopped.returncode == 128 + sig, stopped.stdout[-3000:]
    assert "interrupted" in stopped.stdout
    assert f"interrupted by {signal.Signals(sig).name}" in lane_log, lane_log[-3000:]


@pytest.mark.slow
def test_an_in_process_segfault_is_still_a_process_died_finding_with_its_signal(tmp_path):
    corpus = tmp_path / "corpus"
    spec = "tests.misbehaving:segfault_when_causal"
    died = subprocess.run(_run_command(spec, corpus, "--max-examples", "40"), cwd=ROOT, env=_env(tmp_path / "nap"),
                          capture_output=True, text=True, timeout=300)
    assert died.returncode == -signal.SIGSEGV, (died.returncode, died.stderr[-2000:])
    [left] = corpus.glob(".inflight-*.json")
    assert "Segmentation fault" in interrupt.record_path(left).read_text(), "faulthandler wrote the crash record"
    again = subprocess.run(_run_command(spec, corpus, "--isolate"), cwd=ROOT, env=_env(tmp_path / "nap"),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "the last run died of SIGSEGV" in again.stderr, again.stderr[-3000:]
    [entry_path] = corpus.glob("*CRASH-PROCESS_DIED*.json")
    entry = corpus_io.load(entry_path)
    assert entry.case.causal and "died of SIGSEGV" in entry.verdict.message, entry.verdict
    assert "segfault_when_causal" in entry.verdict.checks[0], "the stack where it died"
    assert f"attnfuzz shrink {entry_path} --isolate" in again.stderr, "it is unshrunk: the command to shrink it"
    assert not list(corpus.glob(".inflight-*"))


@pytest.mark.slow
def test_a_run_killed_from_outside_keeps_its_case_as_stopped_not_as_a_finding(tmp_path):
    corpus = tmp_path / "corpus"
    stopped_mid_case(_run_command(NAPS, corpus), tmp_path, signal.SIGKILL, group=True)
    assert sorted(p.name for p in corpus.glob(".inflight-*")) == [".inflight-tests.misbehaving_naps.crash",
                                                           ".inflight-tests.misbehaving_naps.json"]
    again = subprocess.run(_run_command(NAPS, corpus), cwd=ROOT, env=_env(tmp_path / "nap"), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "the last run stopped while running a case" in again.stderr and "not counted as a finding" in \
        again.stderr and "left no crash record" in again.stderr, again.stderr[-3000:]
    [kept] = (corpus / inflight_io.STOPPED_DIR).glob("*.json")
    assert f"attnfuzz replay {kept} --isolate" in again.stderr and f"python3 {kept.with_suffix('.py')}" in \
        again.stderr
    assert corpus_io.load(kept).verdict.status == V.STOPPED and not corpus_io.entry_paths(corpus)
    replayed = subprocess.run([sys.executable, "-m", "attnfuzz", "replay", str(kept)], cwd=ROOT,
                              env=_env(tmp_path / "nap"), capture_output=True, text=True, timeout=300)
    assert replayed.returncode == 0 and "pass" in replayed.stdout, replayed.stdout + replayed.stderr


# -- the pieces, in process ----------------------------------------------------------------------------------------
def test_a_swallowed_interrupt_still_stops_the_case_and_keeps_no_verdict(tmp_path):
    """A signal whose KeyboardInterrupt the backend swallows (a library's `except BaseException`) is raised again
    when the case ends: the verdict the backend came back with is not kept, and the write-ahead file is gone."""
    backend = get(WRAPS)
    inflight = tmp_path / ".inflight-x.json"
    nap = tmp_path / "nap"
    nap.touch()
    os.environ[NAP] = str(nap)
    try:
        with interrupt.interruptible():
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            previous = signal.signal(signal.SIGALRM, lambda *_: (os.kill(os.getpid(), signal.SIGTERM),
                                                                  nap.unlink()))
            try:
                with pytest.raises(interrupt.Interrupted) as stopped:
                    run_case(backend, Case(sq=2, skv=2, d_qk=8, d_v=8), inflight=inflight)
            finally:
                signal.signal(signal.SIGALRM, previous)
    finally:
        del os.environ[NAP]
    assert stopped.value.signum == signal.SIGTERM and stopped.value.exit_code == 143
    assert not inflight.exists()


def test_a_crash_record_names_the_fatal_signal_and_where(tmp_path):
    record = tmp_path / "x.crash"
    record.write_text("Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
                      "  File \"k.py\", line 3 in kernel\n  File \"h.py\", line 9 in run\n\nThread 0x2:\n"
                      "  File \"t.py\", line 1 in other\n")
    read = interrupt.read_record(record)
    assert read.fatal == "SIGABRT" and not read.signalled
    assert read.excerpt() == 'File "k.py", line 3 in kernel <- File "h.py", line 9 in run'
    record.write_text("Current thread 0x1 (most recent call first):\n  File \"k.py\", line 3 in spin\n")
    assert interrupt.read_record(record).signalled and interrupt.read_record(record).fatal is None
    assert interrupt.read_record(tmp_path / "none.crash") == interrupt.Record(None, "")


@pytest.mark.parametrize("stack, isolated, why", [
    ("", False, "left no crash record"),
    ("Current thread 0x1 (most recent call first):\n  File \"k.py\", line 3 in spin\n", False, "may hang"),
    ("Fatal Python error: Segmentation fault\n", True, "isolated worker"),
])
def test_a_case_left_without_a_fatal_record_is_kept_aside(tmp_path, stack, isolated, why):
    backend = get(NAPS)
    inflight = inflight_io.inflight_path(tmp_path, backend.name)
    inflight.write_text(json.dumps({"backend": backend.name, "device": "cpu", "isolated": isolated,
                                    "case": Case(sq=2, skv=2).to_dict()}))
    interrupt.record_path(inflight).write_text(stack)
    [recovered] = inflight_io.recover_inflight(tmp_path, backend)
    assert not recovered.finding and why in recovered.message, recovered.message
    assert recovered.path.parent == tmp_path / inflight_io.STOPPED_DIR
    assert not corpus_io.entry_paths(tmp_path) and not list(tmp_path.glob(".inflight-*"))


def test_shrinking_a_stopped_case_that_fails_saves_it_to_the_corpus_as_a_finding(tmp_path, capsys):
    from attnfuzz.cli import main
    backend = get("tests.misbehaving:zero_when_causal")
    stopped = corpus_io.Entry(backend.name, Case(sq=5, skv=5, d_qk=8, d_v=8, causal=True),
                              V.Verdict(V.STOPPED, None, "left no crash record"))
    path = corpus_io.save(tmp_path / inflight_io.STOPPED_DIR, stopped)
    assert main(["shrink", str(path)]) == 0
    [saved] = corpus_io.entry_paths(tmp_path)
    entry = corpus_io.load(saved)
    assert saved.parent == tmp_path and entry.verdict.label == "FAIL:ALL_ZERO", capsys.readouterr()
    assert (entry.case.sq, entry.case.skv) == (1, 1) and entry.case.causal
