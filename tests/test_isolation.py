"""Crash isolation: kernels that segfault, abort, hang or raise cost one case each, and the worker carries on."""

from __future__ import annotations

import json
import time

import pytest

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import CALM_CASES, MAX_SPARES, Worker, WorkerHarnessError
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.misbehaving import SLOW_FIRST_MARKER

PLAIN = Case(sq=4, skv=4, d_qk=8, d_v=8)


@pytest.mark.parametrize("kernel, status, diagnosis", [
    ("aborts", V.CRASH, "SIGABRT"),
    ("hangs", V.HANG, "TIMEOUT"),
    ("raises", V.CRASH, V.CUDA_ILLEGAL_ADDRESS),  # a RuntimeError that names CUDA error 700
])
def test_misbehaving_kernel_costs_one_case(kernel, status, diagnosis):
    # a hang is confirmed in a fresh worker with twice the limit: 1 s, then 2 s
    with Worker(f"tests.misbehaving:{kernel}", timeout_s=20 if kernel != "hangs" else 1) as worker:
        first = worker.run(PLAIN)
        second = worker.run(PLAIN.replace(seed=1))
    assert (first.status, first.diagnosis) == (status, diagnosis), first
    assert (second.status, second.diagnosis) == (status, diagnosis), "a fresh worker served the next case"


def test_a_hang_is_confirmed_in_a_fresh_worker_before_it_is_called_one():
    with Worker("tests.misbehaving:hangs", timeout_s=1) as worker:
        start = time.perf_counter()
        verdict = worker.run(PLAIN)
        took = time.perf_counter() - start
        assert worker.restarts == 2, "both workers were killed"
    assert (verdict.status, verdict.diagnosis) == (V.HANG, "TIMEOUT"), verdict
    assert "timed out twice" in verdict.message and "1s" in verdict.message and "2s" in verdict.message, verdict
    assert took >= 3, f"the case had 1 s, then 2 s: {took:.1f} s in all"


@pytest.mark.slow
@pytest.mark.parametrize("spares", [MAX_SPARES, 0])
def test_after_a_replacement_later_workers_start_while_the_cases_before_run(spares):
    """Shrinking a crash replaces the worker at every step: once one has been replaced, spares pay the backend's
    start-up (here 3 s of import) during the steps before, and later crash steps do not wait for it, even when they
    come faster than one start-up (as many spares as a start-up lasts in cases)."""
    startup = 3.0
    causal = PLAIN.replace(causal=True)
    with Worker("tests.slow_start:segfault_when_causal", timeout_s=60, spares=spares,
                env={"ATTNFUZZ_TEST_STARTUP_S": str(startup)}) as worker:
        assert worker.run(causal).status == V.CRASH
        assert worker.run(causal.replace(seed=1)).status == V.CRASH  # a replacement: the spares start behind it
        time.sleep(startup + 1)  # what a shrink step's kernel and grading take
        start = time.perf_counter()
        crashes = [worker.run(causal.replace(seed=seed)) for seed in range(2, 5)]
        took = time.perf_counter() - start
        assert worker.run(PLAIN).status == V.PASS, "the worker after the spares serves cases too"
    assert all((v.status, v.diagnosis) == (V.CRASH, "SIGSEGV") for v in crashes), crashes
    if spares:
        assert took < startup, f"three crash steps back to back, each on a ready spare: {took:.1f} s"
    else:
        assert took >= 3 * startup, f"without spares every replacement waits for the start-up: {took:.1f} s"


@pytest.mark.parametrize("prestart", [True, False])
def test_a_prestarted_worker_imports_its_backend_while_the_caller_does_the_same(prestart):
    """`attnfuzz run --isolate` asks a backend's availability in its own process (TE: a 10 s import) before the first
    case: a worker prestarted first pays its own import meanwhile, not after."""
    startup = 3.0
    with Worker("tests.slow_start:segfault_when_causal", timeout_s=60,
                env={"ATTNFUZZ_TEST_STARTUP_S": str(startup)}) as worker:
        if prestart:
            worker.prestart()
            worker.prestart()   # once a worker is starting, no second one
        time.sleep(startup + 1)  # the caller's own import
        start = time.perf_counter()
        verdict = worker.run(PLAIN)
        took = time.perf_counter() - start
        assert worker.restarts == 0 and worker.spares_alive == 0, "the prestarted worker is the one at work"
        assert worker.startup_s >= startup, f"its start-up counts from its spawn: {worker.startup_s:.1f} s"
    assert verdict.status == V.PASS, verdict
    if prestart:
        assert took < startup, f"the first case waited for no import: {took:.1f} s"
    else:
        assert took >= startup, f"without a prestart the first case waits for the import: {took:.1f} s"


def test_spares_stop_once_the_worker_at_work_answers_calm_cases_in_a_row():
    """A crash's shrink is over once the same worker answers case after case: its spares (a process each, a CUDA
    context each on a GPU) stop then, and start again at the next replacement."""
    causal = PLAIN.replace(causal=True)
    with Worker("tests.slow_start:segfault_when_causal", timeout_s=60, env={"ATTNFUZZ_TEST_STARTUP_S": "1"}) as worker:
        for seed in range(2):
            assert worker.run(causal.replace(seed=seed)).status == V.CRASH
        assert worker.spares_alive >= 1, "a replacement keeps spares starting"
        for seed in range(CALM_CASES - 1):
            assert worker.run(PLAIN.replace(seed=seed)).status == V.PASS
        assert worker.spares_alive >= 1, "one case short of calm, the spares are kept"
        assert worker.run(PLAIN.replace(seed=99)).status == V.PASS
        assert worker.spares_alive == 0, "calm: the spares are stopped"
        assert worker.run(causal.replace(seed=2)).status == V.CRASH
        assert worker.run(PLAIN).status == V.PASS
        assert worker.spares_alive >= 1, "the next replacement starts them again"


def test_a_case_slow_only_the_first_time_gets_its_real_verdict(tmp_path, monkeypatch):
    """A JIT compile that outlasts the limit once: the retry in a fresh worker answers, so it is not a HANG."""
    monkeypatch.chdir(tmp_path)  # the kernel's marker lives in the working directory, which each worker takes
    with Worker("tests.misbehaving:slow_first", timeout_s=2) as worker:
        verdict = worker.run(PLAIN)
        assert worker.restarts == 1, "only the first worker was killed"
        after = worker.run(PLAIN.replace(seed=1))
        assert worker.restarts == 1, "the second worker served the next case"
    assert (tmp_path / SLOW_FIRST_MARKER).exists(), "the first call did go the slow way"
    assert verdict.status == V.PASS, verdict
    slow = [c for c in verdict.checks if c.startswith("slow:")]
    assert len(slow) == 1 and "no answer within 2s" in slow[0] and "answered in" in slow[0], verdict.checks
    assert after.status == V.PASS and not any(c.startswith("slow:") for c in after.checks), after


@pytest.mark.parametrize("factor", [None, 1])
def test_without_confirmation_the_slow_first_case_is_a_hang(tmp_path, monkeypatch, factor):
    """Control: the same kernel is a HANG when the timed-out case is not tried again, so the retry is what saves it."""
    monkeypatch.chdir(tmp_path)
    with Worker("tests.misbehaving:slow_first", timeout_s=2, confirm_factor=factor) as worker:
        verdict = worker.run(PLAIN)
        assert worker.restarts == 1
    assert (tmp_path / SLOW_FIRST_MARKER).exists(), "the first call did go the slow way"
    assert (verdict.status, verdict.diagnosis) == (V.HANG, "TIMEOUT"), verdict
    assert "no answer within 2s" in verdict.message and "twice" not in verdict.message, verdict


def test_segfault_is_a_crash_and_the_next_case_still_passes():
    with Worker("tests.misbehaving:segfault_when_causal", timeout_s=20) as worker:
        crash = worker.run(PLAIN.replace(causal=True))
        after = worker.run(PLAIN)
        assert worker.restarts == 1
    assert (crash.status, crash.diagnosis) == (V.CRASH, "SIGSEGV") and "died" in crash.message
    assert after.status == V.PASS, after


def test_a_case_after_a_raised_device_error_runs_in_a_fresh_worker():
    # a raised CUDA error can leave the process's context unusable: the next case must not inherit it (on an H200,
    # cases after sdpa-efficient's misaligned-address errors died with exit code 1 and were saved as FLAKY crashes)
    with Worker("tests.misbehaving:breaks_the_process_when_causal", timeout_s=20) as worker:
        crash = worker.run(PLAIN.replace(causal=True))
        after = worker.run(PLAIN)
    assert crash.status == V.CRASH and "misaligned address" in crash.message, crash
    assert after.status == V.PASS, after
    assert worker.restarts == 1


def test_an_error_of_the_backends_own_keeps_the_worker():
    # a compile error or a failed check leaves the CUDA context as it was: forking a fresh worker (and re-importing
    # a kernel library, re-loading its JIT cache) for each would slow a stream with many known crashes
    with Worker("tests.misbehaving:refuses_causal_loudly", timeout_s=20) as worker:
        crash = worker.run(PLAIN.replace(causal=True))
        after = worker.run(PLAIN)
    assert crash.status == V.CRASH and crash.diagnosis == "ValueError", crash
    assert after.status == V.PASS and worker.restarts == 0, (after, worker.restarts)


def test_an_error_of_attnfuzz_in_the_worker_is_raised_as_attnfuzz_s_not_saved_as_the_backends_crash():
    # on an H100 a large FP8 case drawn on the GPU met a CPU tensor in the quantiser: the worker died (EXIT_1) and the
    # run saved it as the backend's CRASH; in process the same exception ends the run naming attnfuzz
    with Worker("tests.breaks_harness:correct", timeout_s=20) as worker:
        with pytest.raises(WorkerHarnessError, match="attnfuzz itself failed(.|\n)*planted: attnfuzz's own input"):
            worker.run(PLAIN.replace(causal=True))
        after = worker.run(PLAIN)
    assert after.status == V.PASS and worker.deaths == 0, (after, worker.deaths)


def test_a_segfault_is_shrunk_each_attempt_in_a_fresh_worker():
    spec = "tests.misbehaving:segfault_when_causal"
    with Worker(spec, timeout_s=20) as worker:
        tally, findings = fuzz(get(spec), space=Space(max_len=16, max_batch=2, max_heads=2), worker=worker,
                               settings=profile("ci", max_examples=25))
    assert tally.labels["PASS"] > 0
    assert [f.verdict.label for f in findings] == ["CRASH:SIGSEGV"]
    shrunk = findings[0].case
    assert shrunk.causal and (shrunk.b, shrunk.sq, shrunk.skv, shrunk.h) == (1, 1, 1, 1), shrunk


def _pytest_fuzz(tmp_path, *options):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "pytest", str(root / "fuzz"), "-q", "-p", "no:cacheprovider",
                           "--attnfuzz-backend", "tests.misbehaving:segfault_when_causal", "--attnfuzz-profile",
                           "ci", "--attnfuzz-max-examples", "40", "--attnfuzz-corpus", str(tmp_path), *options],
                          cwd=root, capture_output=True, text=True, timeout=600)


def test_pytest_fuzz_isolate_turns_a_segfault_into_a_failed_test(tmp_path):
    isolated = _pytest_fuzz(tmp_path, "--attnfuzz-isolate", "--attnfuzz-case-timeout", "20")
    assert isolated.returncode == 1, isolated.stdout + isolated.stderr   # a failed test, not a dead session
    assert "CRASH:SIGSEGV" in isolated.stdout and "1 failed" in isolated.stdout
    assert list(tmp_path.glob("*CRASH-SIGSEGV*.json")), "the crash was saved to the corpus"


@pytest.mark.slow
def test_without_isolate_the_same_segfault_kills_the_pytest_session(tmp_path):
    """Control: the kernel really segfaults; only the worker process stands between it and the session. The case it
    died on is not lost: it waits on disk, and the next session saves it and fails with it."""
    bare = _pytest_fuzz(tmp_path)
    assert bare.returncode < 0 or "Segmentation fault" in bare.stderr, (bare.returncode, bare.stdout[-500:])
    [left] = tmp_path.glob(".inflight-*.json")
    assert json.loads(left.read_text())["case"]["causal"], "the case the session died on"
    again = _pytest_fuzz(tmp_path, "--attnfuzz-isolate", "--attnfuzz-case-timeout", "20")
    assert "CRASH:PROCESS_DIED" in again.stdout and again.returncode == 1, again.stdout[-2000:]
    assert list(tmp_path.glob("*CRASH-PROCESS_DIED*.json")) and not list(tmp_path.glob(".inflight-*.json"))


@pytest.mark.slow
def test_an_isolated_run_killed_from_outside_leaves_the_case_it_was_running(tmp_path):
    """`attnfuzz run --isolate` killed mid-case (a CI job's time limit) while its worker hangs: the case is on disk.
    The next run keeps it under .stopped/, replayable, and does not call it a finding: an isolated worker reports its
    own crashes, so the case was not what ended the run (it used to be saved as CRASH:PROCESS_DIED)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.store import inflight as inflight_io
    spec = "tests.misbehaving:hangs"
    run = subprocess.Popen([sys.executable, "-m", "attnfuzz", "run", "--backend", spec, "--isolate", "--case-timeout",
                            "300", "--max-examples", "5", "--corpus", str(tmp_path)],
                           cwd=Path(__file__).resolve().parents[1], start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".inflight-*.json")) and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the run and its hanging worker, as a job's time limit would
        run.wait()
    [left] = tmp_path.glob(".inflight-*.json")
    assert json.loads(left.read_text())["backend"] == spec
    assert json.loads(left.read_text())["isolated"] is True
    [recovered] = inflight_io.recover_inflight(tmp_path, get(spec))
    assert not recovered.finding and "isolated worker" in recovered.message, recovered
    assert recovered.path.parent.name == ".stopped" and recovered.path.with_suffix(".py").exists()
    assert corpus_io.load(recovered.path).verdict.status == V.STOPPED
    assert not corpus_io.entry_paths(tmp_path), "nothing counts as a corpus entry"
    assert not left.exists() and not list(tmp_path.glob(".inflight-*"))



PARENT = """
import sys, threading, time
from attnfuzz.engine.isolate import Worker
from attnfuzz.strategies.case import Case
worker = Worker("tests.misbehaving:hangs", timeout_s=600, confirm_factor=None, spares=0)
threading.Thread(target=worker.run, args=(Case(sq=4, skv=4, d_qk=8, d_v=8),), daemon=True).start()
while worker._process is None or worker._process.pid is None:
    time.sleep(0.05)
print(worker._process.pid, flush=True)
time.sleep(600)
"""


def test_a_worker_whose_run_is_killed_exits_instead_of_hanging_on():
    """A run killed by SIGKILL alone (the OOM killer, a limit on one pid) cannot take its worker along: the worker is
    the fork server's child. It watches its run and exits within seconds, so a hung case holds no GPU memory, and
    keeps no fork server alive, after the run; while the run lives, the worker stays at its case."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from attnfuzz.engine.worker_process import PARENT_POLL_S, _alive
    root = Path(__file__).resolve().parents[1]
    run = subprocess.Popen([sys.executable, "-c", PARENT], cwd=root, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(root)})
    worker = None
    try:
        worker = int(run.stdout.readline())
        time.sleep(3 * PARENT_POLL_S)
        assert _alive(worker), "the worker stays while its run lives"
        run.kill()
        run.wait()
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived its run"
    finally:
        run.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _corpus_with_a_segfault_first(directory):
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.oracles.verdict import Verdict
    spec = "tests.misbehaving:segfault_when_causal"
    crash = corpus_io.Entry(spec, PLAIN.replace(causal=True), Verdict(V.CRASH, "SIGSEGV"),
                            known_bug={"link": "tests/misbehaving.py", "note": "segfaults under causal"})
    fine = corpus_io.Entry(spec, PLAIN, Verdict(V.FAIL, V.TOLERANCE))  # fixed since: replays as a pass
    for entry in (crash, fine):
        corpus_io.save(directory, entry, repro=False)


def _pytest_corpus(directory, *options):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "pytest", str(root / "corpus"), "-q", "-p", "no:cacheprovider",
                           "--attnfuzz-corpus", str(directory), "-rxX", *options], cwd=root, capture_output=True, text=True,
                          timeout=300)


def test_pytest_corpus_isolate_replays_past_an_entry_that_crashes(tmp_path):
    _corpus_with_a_segfault_first(tmp_path)
    isolated = _pytest_corpus(tmp_path, "--attnfuzz-isolate", "--attnfuzz-case-timeout", "20")
    assert isolated.returncode == 0, isolated.stdout + isolated.stderr
    assert "1 passed, 1 xfailed" in isolated.stdout and "SIGSEGV" in isolated.stdout


def test_without_isolate_the_crashing_entry_takes_the_replay_session_down(tmp_path):
    _corpus_with_a_segfault_first(tmp_path)
    bare = _pytest_corpus(tmp_path)
    assert bare.returncode < 0 or "Segmentation fault" in bare.stderr, (bare.returncode, bare.stdout[-400:])


def test_an_isolated_replay_asks_the_worker_whether_the_backend_is_available(monkeypatch):
    """TE must be imported before torch loads cuDNN: a replay process that ran cuDNN entries cannot import it, but
    its fresh workers can. So availability is the worker's to judge, and an unavailable backend is UNSUPPORTED (a
    skip), not a crash of the worker's import."""
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.store import replay as replay_io
    from attnfuzz.backends.flash.fa4 import FlashAttn4

    def not_here(self):
        raise AssertionError("availability was asked in the replaying process")

    monkeypatch.setattr(FlashAttn4, "available", not_here)  # the worker, forked from a clean server, has the real one
    entry = corpus_io.Entry(backend="fa4", case=Case(dtype="float16"), verdict=V.Verdict(V.FAIL, V.TOLERANCE, "x"),
                            device="cpu")
    with Worker("fa4", "cpu", timeout_s=60) as worker:
        verdict = replay_io.replay(entry, "cpu", worker=worker)
    assert verdict.status == V.UNSUPPORTED and "fa4 is not available here" in verdict.message, verdict


@pytest.mark.parametrize("text", [
    "CUDA error: an illegal memory access was encountered",
    "cudaErrorIllegalAddress (error code: 700)",
    "CUDA Error Code: 700 (at <unknown>:0)",   # FA4's launcher on an H200: the code alone
])
def test_an_illegal_address_is_named_however_it_is_wrapped(text):
    from attnfuzz.engine.harness import crash_diagnosis
    assert crash_diagnosis(RuntimeError(text)) == V.CUDA_ILLEGAL_ADDRESS
    assert crash_diagnosis(ValueError("head dim 7 is not supported")) == "ValueError"
