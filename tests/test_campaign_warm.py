"""A campaign warms its JIT backends all at once, not one after the other, and within a limit: a warm-up still
running then is stopped, and the lanes compile what it did not."""

from __future__ import annotations

import re
import sys

from attnfuzz.campaign import supervisor

# A stand-in warm-up: prints when it started, sleeps, prints when it ended (wall clock, shared by processes)
SLEEPER = "import sys, time; print('start', time.time(), flush=True); time.sleep(float(sys.argv[1])); " \
          "print('end', time.time(), flush=True)"


def sleeping(seconds: float):
    return lambda name, device: [sys.executable, "-c", SLEEPER, str(seconds)]


def test_the_warm_ups_run_at_the_same_time(monkeypatch, capsys):
    monkeypatch.setattr(supervisor, "warm_command", sleeping(2.0))
    supervisor.warm_jit_backends({"backends": ["fa4", "flex-compiled", "sdpa-math"], "device": "cpu"})
    err = capsys.readouterr().err
    starts = [float(t) for t in re.findall(r"start ([0-9.]+)", err)]
    ends = [float(t) for t in re.findall(r"end ([0-9.]+)", err)]
    assert len(starts) == len(ends) == 2, err   # sdpa-math compiles nothing: no warm-up
    assert max(starts) < min(ends), f"one warm-up ended before the other started: {err}"


def test_a_warm_up_past_the_limit_is_stopped_and_said(monkeypatch, capsys):
    monkeypatch.setattr(supervisor, "warm_command", sleeping(30.0))
    monkeypatch.setattr(supervisor, "warm_limit_s", lambda hours: 1.0)
    supervisor.warm_jit_backends({"backends": ["fa4"], "device": "cpu"})
    err = capsys.readouterr().err
    assert "[fa4] warm-up passed 1 s; the lanes compile what it did not" in err
    assert "end" not in err


def test_a_short_campaign_warms_for_a_tenth_of_its_time():
    assert supervisor.warm_limit_s(2.0) == supervisor.WARM_S
    assert supervisor.warm_limit_s(1.0) == 360
    assert supervisor.warm_limit_s(0.5) == 180
    assert supervisor.warm_limit_s(0.01) == supervisor.WARM_MIN_S
