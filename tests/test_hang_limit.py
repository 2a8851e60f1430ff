"""The adaptive hang limit: once a HANG is confirmed, a worker's later cases get max(floor, factor x the slowest
answer seen) instead of the full timeout, so a kernel that hangs on many shapes is shrunk in seconds per step."""

from __future__ import annotations

import pytest

from attnfuzz.backends import get
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import Worker
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space

SQUARE = Case(sq=4, skv=4, d_qk=8, d_v=8)
OBLONG = SQUARE.replace(skv=5)
HANGS = "tests.misbehaving:hangs_unless_square"


@pytest.mark.slow
def test_after_a_confirmed_hang_later_cases_get_the_adaptive_limit():
    with Worker(HANGS, timeout_s=5, hang_floor_s=0.5, hang_factor=2) as worker:
        assert worker.run(SQUARE).status == V.PASS
        assert worker.limit_s == 5 and worker.slowest_s > 0, "no hang yet: the full timeout"
        first = worker.run(OBLONG)
        assert (first.status, first.diagnosis) == (V.HANG, "TIMEOUT"), first
        assert "within 5s, then 10s" in first.message and "limit after" not in first.message, first.message
        assert worker.hangs == 1 and worker.restarts == 2
        limit = worker.limit_s
        assert limit == max(0.5, 2 * worker.slowest_s) and limit < 5, (limit, worker.slowest_s)
        second = worker.run(OBLONG.replace(seed=1))
        assert (second.status, second.diagnosis) == (V.HANG, "TIMEOUT"), second
        assert f"within {limit:g}s, then {2 * limit:g}s" in second.message, second.message
        assert "the limit after 1 HANG(s)" in second.message, second.message
        assert worker.hangs == 2 and worker.restarts == 4, "the adapted limit still confirms in a fresh worker"
        # the correct half of the kernel is not called a HANG under the shorter limit (a fresh worker's first call
        # may need the confirmation's longer limit on a loaded host: then it passes with a slow: line)
        after = worker.run(SQUARE.replace(seed=2))
        assert after.status == V.PASS, after


def test_without_a_hang_the_limit_stays_the_timeout():
    """Control: answers alone never shorten the limit; only a confirmed HANG does."""
    with Worker(HANGS, timeout_s=3, hang_floor_s=0.5) as worker:
        for seed in range(3):
            assert worker.run(SQUARE.replace(seed=seed)).status == V.PASS
        assert worker.hangs == 0 and worker.limit_s == 3 and worker.restarts == 0


def test_a_limit_is_never_above_the_timeout():
    with Worker(HANGS, timeout_s=1, hang_floor_s=5, confirm_factor=None) as worker:
        assert worker.run(OBLONG).status == V.HANG
        assert worker.limit_s == 1, "the floor does not lift the limit past --case-timeout"


@pytest.mark.long  # about 30 hanging steps of a few seconds each: 100 s on a loaded 2-core host
def test_a_kernel_that_hangs_unless_square_is_found_and_shrunk():
    """The hang is found, and Hypothesis shrinks it through hanging steps under the adapted limit, down to one query
    against two keys (or two against one)."""
    space = Space(max_len=16, max_batch=2, max_heads=2)
    with Worker(HANGS, timeout_s=5, hang_floor_s=0.3, hang_factor=2) as worker:
        tally, findings = fuzz(get(HANGS), space=space, worker=worker, settings=profile("ci", max_examples=15))
        hangs = worker.hangs
    assert [f.verdict.label for f in findings] == ["HANG:TIMEOUT"], findings
    case = findings[0].case
    assert sorted((case.sq, case.skv)) == [1, 2] and (case.b, case.h) == (1, 1), case
    assert hangs > 1 and tally.labels["PASS"] > 0, (hangs, tally.labels)
    assert "the limit after" in findings[0].verdict.message, "the shrunk case ran under the adapted limit"
