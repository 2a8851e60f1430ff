"""A campaign's compile time share (`--compile-time-share`): stored in campaign.json, read by each lane into its Space
(0: the fixed share of fresh draws), and a share out of range refused on the command line with the fix."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.campaign.lane import COMPILE_TIME_SHARE, Lane
from attnfuzz.engine.options import fraction

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
