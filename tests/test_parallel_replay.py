"""Replaying the corpus in parallel isolated workers: entries side by side, a short limit for HANG entries, one
compile cache for every worker, and each entry's time in the pytest summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.parallel_replay import ParallelReplay, replay_device, shared_cache_env
from attnfuzz.strategies.case import Case
from tests.misbehaving import MEET, SHARED_CACHE

ROOT = Path(__file__).resolve().parents[1]
PLAIN = Case(sq=4, skv=4, d_qk=8, d_v=8)
HANG_BUG = {"link": "tests/misbehaving.py", "note": "never answers"}


def _entry(spec: str, verdict: Verdict, case: Case = PLAIN, **kw) -> corpus_io.Entry:
    return corpus_io.Entry(spec, case, verdict, **kw)


def test_a_hang_entry_gets_the_short_limit_and_the_others_the_case_timeout():
    hang = _entry("tests.misbehaving:hangs", Verdict(V.HANG, "TIMEOUT"), known_bug=HANG_BUG)
    fine = _entry("tests.misbehaving:drops_causal", Verdict(V.FAIL, V.TOLERANCE))
    jobs = [(Path("hang.json"), hang, "cpu"), (Path("fine.json"), fine, "cpu")]
    with ParallelReplay(jobs, workers=2, timeout_s=120, hang_timeout_s=1) as pool:
        hung, passed = pool.result(Path("hang.json")), pool.result(Path("fine.json"))
    assert (hung.verdict.status, hung.verdict.diagnosis) == (V.HANG, "TIMEOUT"), hung.verdict
    assert "within 1s, then 2s" in hung.verdict.message, "the short limit, confirmed at twice it"
    assert hung.limit_s == 1 and passed.limit_s == 120
    assert passed.verdict.status == V.PASS and passed.seconds > 0


def test_every_worker_gets_the_shared_compile_cache(tmp_path):
    entries = [_entry("tests.misbehaving:zero_unless_shared_cache", Verdict(V.FAIL, V.TOLERANCE),
                      PLAIN.replace(seed=s)) for s in range(3)]
    jobs = [(Path(f"{i}.json"), e, "cpu") for i, e in enumerate(entries)]
    shared = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / SHARED_CACHE)}
    with ParallelReplay(jobs, workers=2, timeout_s=120, env=shared) as pool:
        assert [pool.result(p).verdict.status for p, *_ in jobs] == [V.PASS] * 3
    # control: a worker not handed the cache location sees another one, and the kernel says so
    with ParallelReplay(jobs[:1], workers=1, timeout_s=120, env={}) as pool:
        assert pool.result(jobs[0][0]).verdict.label == "FAIL:ALL_ZERO"


def test_shared_cache_env_passes_on_what_is_set_and_fills_in_the_defaults():
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    assert shared_cache_env({})["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()
    given = shared_cache_env({"TORCHINDUCTOR_CACHE_DIR": "/x/inductor", "TRITON_CACHE_DIR": "/x/triton"})
    assert given["TORCHINDUCTOR_CACHE_DIR"] == "/x/inductor" and given["TRITON_CACHE_DIR"] == "/x/triton"
    assert given["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1" and "TRITON_CACHE_DIR" not in shared_cache_env({})
    assert shared_cache_env({"FLASHINFER_WORKSPACE_BASE": "/x/fi"})["FLASHINFER_WORKSPACE_BASE"] == "/x/fi"
    assert "FLASHINFER_WORKSPACE_BASE" not in shared_cache_env({})


def test_replay_device_keeps_cpu_entries_on_the_cpu():
    cpu, gpu = _entry("sdpa-math", Verdict(V.PASS)), _entry("sdpa-math", Verdict(V.PASS), device="cuda")
    assert replay_device(cpu, "cuda:1") == "cpu" and replay_device(gpu, "cuda:1") == "cuda:1"
    assert replay_device(gpu, "cpu") == "cuda"


def _corpus(directory: Path) -> None:
    for seed in range(2):  # pass only when replayed side by side
        corpus_io.save(directory, _entry("tests.misbehaving:meets_another", Verdict(V.FAIL, V.TOLERANCE),
                                         PLAIN.replace(sq=4 + seed, skv=4 + seed)), repro=False)
    corpus_io.save(directory, _entry("tests.misbehaving:hangs", Verdict(V.HANG, "TIMEOUT"), known_bug=HANG_BUG),
                   repro=False)


def _pytest_corpus(directory: Path, meet: Path, *options: str) -> subprocess.CompletedProcess:
    meet.mkdir()
    env = {**os.environ, MEET: str(meet)}
    return subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "corpus"), "-q", "-p", "no:cacheprovider",
                           "--attnfuzz-corpus", str(directory), "-rxX", "--attnfuzz-case-timeout", "120",
                           "--attnfuzz-replay-hang-timeout", "1", *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_pytest_corpus_replays_entries_side_by_side_and_lists_their_times(tmp_path):
    _corpus(tmp_path / "corpus")
    done = _pytest_corpus(tmp_path / "corpus", tmp_path / "meet", "--attnfuzz-replay-workers", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed, 1 xfailed" in done.stdout, done.stdout[-2000:]
    assert "attnfuzz replay times: 3 entries" in done.stdout, done.stdout[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.rstrip().endswith(")") and "s  " in line]
    hang = [line for line in lines if "HANG:TIMEOUT" in line and "(limit 1s)" in line]
    met = [line for line in lines if "PASS" in line and "meets_another" in line and "(limit 120s)" in line]
    assert len(hang) == 1 and len(met) == 2, done.stdout[-2000:]


@pytest.mark.slow
def test_replayed_one_at_a_time_the_meeting_entries_fail(tmp_path):
    """Control: with one worker the entries run one after the other, and the kernel that needs company fails."""
    _corpus(tmp_path / "corpus")
    done = _pytest_corpus(tmp_path / "corpus", tmp_path / "meet", "--attnfuzz-isolate")
    assert done.returncode == 1 and "2 failed, 1 xfailed" in done.stdout, done.stdout[-2000:]
    assert "FAIL:ALL_ZERO" in done.stdout


def test_the_slowest_entries_start_first():
    """Longest first, as far as it can be told before a replay: a HANG entry (three limits), then a backend that
    compiles kernels (fa4: UNSUPPORTED on this CPU, at once), then the rest in the order given."""
    from attnfuzz.store.parallel_replay import JIT_REPLAY_S, expected_seconds
    fine = _entry("tests.misbehaving:drops_causal", Verdict(V.FAIL, V.TOLERANCE))
    jit = _entry("fa4", Verdict(V.FAIL, V.ALL_ZERO), PLAIN.replace(dtype="bfloat16"), device="cuda")
    hang = _entry("tests.misbehaving:hangs", Verdict(V.HANG, "TIMEOUT"), known_bug=HANG_BUG)
    assert (expected_seconds(fine, 120), expected_seconds(jit, 120), expected_seconds(hang, 1)) == (1, JIT_REPLAY_S, 3)
    assert expected_seconds(_entry("no-such-backend", Verdict(V.FAIL, V.TOLERANCE)), 120) == 1
    assert expected_seconds(hang, 20) > JIT_REPLAY_S   # the default hang limit: a HANG entry before a JIT one
    jobs = [(Path("fine.json"), fine, "cpu"), (Path("jit.json"), jit, "cpu"), (Path("hang.json"), hang, "cpu")]
    with ParallelReplay(jobs[::2], workers=1, timeout_s=120, hang_timeout_s=1) as pool:
        assert pool.order == [Path("hang.json"), Path("fine.json")]
        assert pool.result(Path("fine.json")).verdict.status == V.PASS
    with ParallelReplay(jobs[:2], workers=1, timeout_s=120) as pool:
        assert pool.order == [Path("jit.json"), Path("fine.json")]
        assert pool.result(Path("jit.json")).verdict.status == V.UNSUPPORTED


@pytest.mark.parametrize("after_s", [0.0, 0.5, 3.0])   # before the worker exists, while it starts, inside the case
def test_closing_the_pool_during_a_hang_ends_its_thread_at_once(after_s):
    """close() stops the worker of an entry still hanging, and no worker starts for it after that (its confirmation
    in a fresh worker at twice the limit, or its first worker when close() came first): else the interpreter's exit
    waits for the whole hang (a minute at the default limit)."""
    import time
    hang = _entry("tests.misbehaving:hangs", Verdict(V.HANG, "TIMEOUT"), known_bug=HANG_BUG)
    pool = ParallelReplay([(Path("hang.json"), hang, "cpu")], workers=1, timeout_s=120, hang_timeout_s=20)
    time.sleep(after_s)
    start = time.perf_counter()
    pool.close()
    pool._executor.shutdown(wait=True)
    assert time.perf_counter() - start < 10
