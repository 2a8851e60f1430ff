"""bench/balance_start.py: a lane that times one compile before balancing grades at least as many cases in its first
simulated minute as one that times three (the stand-in clock makes both exact), and more on some seed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("balance_start", ROOT / "bench" / "balance_start.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_timing_one_compile_first_grades_more_in_a_short_lane():
    three = [bench.graded_by([63.0], 19.0, 0.18, 3, seed, 400)[0] for seed in (1, 2)]
    one = [bench.graded_by([63.0], 19.0, 0.18, 1, seed, 400)[0] for seed in (1, 2)]
    assert all(a >= b for a, b in zip(one, three)) and sum(one) > sum(three), (one, three)
