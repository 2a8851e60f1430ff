"""A campaign's compile time share (`--compile-time-share`): stored in campaign.json, read by each lane into its Space
(0: the fixed share of fresh draws), a share out of range refused on the command line with the fix, and what the
search met (configurations, fresh draws' time) in the lanes' state and the report."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnfuzz.campaign import lane as lane_mod
from attnfuzz.campaign.lane import COMPILE_TIME_SHARE, Lane, Resumable
from attnfuzz.engine.compiled_search import compiled_configs, declares_compile_key
from attnfuzz.engine.harness import Tally
from attnfuzz.engine.options import fraction
from attnfuzz.report.build import read_campaign
from attnfuzz.report.state import state_table
from attnfuzz.strategies.case import Case

ROOT = Path(__file__).resolve().parents[1]


def _lane(tmp_path: Path, **config) -> Lane:
    (tmp_path / "campaign.json").write_text(json.dumps({"device": "cpu", "hours": 0.01, **config}))
    return Lane(tmp_path, 0)


def test_each_lane_draws_with_the_campaign_s_share(tmp_path):
    assert _lane(tmp_path, compile_time_share=0.25).space().compile_time_share == 0.25
    assert _lane(tmp_path, compile_time_share=0).space().compile_time_share is None   # 0: the fixed share
    assert _lane(tmp_path).space().compile_time_share == COMPILE_TIME_SHARE   # a campaign stored before the option


def test_a_share_is_from_0_up_to_1():
    assert fraction("0") == 0 and fraction("0.5") == 0.5
    for bad in ("1", "-0.1", "half", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="share from 0 up to 1"):
            fraction(bad)


def test_the_campaign_refuses_a_share_out_of_range_with_the_fix(tmp_path):
    done = subprocess.run([sys.executable, "-m", "attnfuzz", "campaign", "--dir", str(tmp_path / "c"), "--backends",
                           "sdpa-math", "--compile-time-share", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "--compile-time-share" in done.stderr and "share from 0 up to 1" in done.stderr
    assert not (tmp_path / "c").exists()


def test_the_campaign_report_shows_what_a_compiling_backend_s_rounds_met(tmp_path, monkeypatch):
    """Each round adds the configurations its search met and its fresh and pinned draws' seconds to the lane's state
    (the search stubbed out: it meets keys and times draws as compile_aware does); the report's progress table shows
    them, and a backend without a compile key shows none."""
    (tmp_path / "campaign.json").write_text(json.dumps({"device": "cpu", "hours": 1.0, "round_examples": 20,
                                                       "round_seconds": 60}))
    (tmp_path / "state").mkdir()
    met = iter([(2, 3.0, 1.0), (1, 1.0, 3.0), (0, 0.0, 0.0)])

    def fake_fuzz(backend, **_):
        if declares_compile_key(backend):
            keys, fresh, pinned = next(met)
            configs = compiled_configs(backend)
            for _ in range(keys):
                configs.add(("key", len(configs)), Case())
            balance = configs.balanced(0.5, 0.8)
            balance.fresh_seconds += fresh
            balance.pinned_seconds += pinned
        return Tally(examples=1), []

    monkeypatch.setattr(lane_mod, "fuzz", fake_fuzz)
    lane = Lane(tmp_path, 0)
    for name in ("flex-compiled", "sdpa-math"):
        backend = lane_mod.get(name, "cpu")
        runner = Resumable(backend.name, None, None, tmp_path / ".inflight", {}, time.perf_counter() + 60, 0)
        for r in range(3 if name == "flex-compiled" else 1):
            lane._round(backend, r, runner, None, lane.space())
    state = json.loads((tmp_path / "state" / "lane0.json").read_text())["backends"]
    assert (state["flex-compiled"]["configurations"], state["flex-compiled"]["fresh_seconds"],
            state["flex-compiled"]["pinned_seconds"]) == (3, 4.0, 4.0)
    assert "configurations" not in state["sdpa-math"]
    table = state_table(read_campaign(tmp_path).state)
    rows = {row[0]: row for row in table.rows}
    assert rows["flex-compiled"][-2:] == ["3", "50%"]
    assert rows["sdpa-math"][-2:] == ["-", "-"]
