"""Replaying entries in one process after a kernel broke its CUDA context: the entry that surfaced the error and those
after it replay in isolated workers, and the user is told; the planted kernels are tests/breaks_context.py."""

from __future__ import annotations

import pytest

from attnfuzz.cli import main
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.verdict import Verdict
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store.replay import Replayer
from attnfuzz.strategies.case import Case

PLAIN = Case(sq=4, skv=4, d_qk=8, d_v=8)


@pytest.fixture(autouse=True)
def sound_context():
    """This process's planted context sound again around each test (its draw is inert until a causal case)."""
    from tests import breaks_context
    breaks_context._broken.clear()
    yield
    breaks_context._broken.clear()
CAUSAL = PLAIN.replace(causal=True)


def _entry(kernel: str, case: Case, verdict: Verdict) -> corpus_io.Entry:
    return corpus_io.Entry(f"tests.breaks_context:{kernel}", case, verdict)


def test_a_crash_that_names_a_cuda_error_moves_the_replay_to_workers():
    replayer = Replayer()
    try:
        crashed = replayer(_entry("faults", CAUSAL, Verdict(V.CRASH, "RuntimeError", "")), "cpu")
        assert crashed.status == V.CRASH and "illegal memory access" in crashed.message
        assert replayer.switched and "crashed with CRASH:CUDA_ILLEGAL_ADDRESS" in replayer.switched
        assert "the entries after it replayed in isolated workers" in replayer.switched
        later = replayer(_entry("faults", PLAIN, Verdict(V.FAIL, V.TOLERANCE, "")), "cpu")
        assert later.status == V.PASS, later   # in a fresh worker; in this process its drawing would raise
    finally:
        replayer.close()


def test_an_error_attnfuzz_meets_after_an_asynchronous_fault_is_replayed_in_a_worker():
    replayer = Replayer()
    try:
        assert replayer(_entry("faults_later", CAUSAL, Verdict(V.FAIL, V.TOLERANCE, "")), "cpu").status == V.PASS
        assert replayer.switched is None
        later = replayer(_entry("faults_later", PLAIN, Verdict(V.FAIL, V.TOLERANCE, "")), "cpu")
        assert later.status == V.PASS, later
        assert "raised RuntimeError: planted: CUDA error" in replayer.switched
        assert "it and the entries after it replayed" in replayer.switched
    finally:
        replayer.close()


def test_an_error_of_attnfuzz_that_names_no_cuda_error_is_not_swallowed(monkeypatch):
    from attnfuzz.engine import harness
    monkeypatch.setattr(harness, "draw", lambda case, device: (_ for _ in ()).throw(KeyError("planted")))
    with pytest.raises(KeyError):
        Replayer()(corpus_io.Entry("sdpa-math", PLAIN, Verdict(V.FAIL, V.TOLERANCE, "")), "cpu")


def test_the_replay_command_says_it_moved_to_workers(tmp_path, capsys):
    first = corpus_io.save(tmp_path, _entry("faults_later", CAUSAL, Verdict(V.FAIL, V.TOLERANCE, "")), repro=False)
    second = corpus_io.save(tmp_path, _entry("faults_later", PLAIN.replace(seed=1), Verdict(V.FAIL, V.TOLERANCE, "")),
                            repro=False)
    assert main(["replay", str(first), str(second), "--device", "cpu"]) == 0   # both pass: their known fault is gone
    out, err = capsys.readouterr()
    assert out.count(" pass  ") == 2, out
    assert "replayed in isolated workers (--isolate)" in err
