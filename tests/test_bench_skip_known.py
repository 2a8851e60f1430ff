"""bench/skip_known.py on the CPU: the planted crash's cases are the same known ones with the skip and without, and
the skipping run replaces fewer workers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("skip_known_bench", Path(__file__).resolve().parents[1] / "bench" /
                                              "skip_known.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_the_skipping_run_meets_the_same_cases_with_fewer_workers():
    space = bench.Space(max_len=16, max_batch=2, max_heads=2)
    skip, plain = (bench.one_run("tests.misbehaving:segfault_when_causal", "cpu", 80, s, space) for s in (True, False))
    assert skip["labels"] == plain["labels"] and skip["known"] > 8 and skip["findings"] == plain["findings"] == 0
    assert skip["restarts"] < plain["restarts"], (skip, plain)


def test_a_bug_on_part_of_its_condition_keeps_the_skip_and_its_workers():
    """The record takes every causal case, the kernel faults on odd query lengths only: the skip holds."""
    space = bench.Space(max_len=16, max_batch=2, max_heads=2)
    skip, plain = (bench.one_run("tests.misbehaving:segfault_when_causal_and_odd", "cpu", 120, s, space)
                   for s in (True, False))
    assert "checks failed as it" in skip["not_run"] and "ran every case" not in skip["not_run"], skip["not_run"]
    assert plain["not_run"] is None and 2 * skip["restarts"] < plain["restarts"], (skip, plain)
