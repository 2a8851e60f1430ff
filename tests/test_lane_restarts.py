"""A campaign restarts a lane that dies as long as it logs cases between deaths (a long campaign meets many unrelated
causes), and gives up on one that dies RESTARTS + 1 times in a row without logging a case (it would only loop)."""

from __future__ import annotations

from attnfuzz.campaign.supervisor import RESTARTS, Restarts


def _log(tmp_path, lane: int, cases: int) -> None:
    (tmp_path / "cases").mkdir(exist_ok=True)
    (tmp_path / "cases" / f"lane{lane}.jsonl").write_text('{"case": 1}\n' * cases)


def test_a_lane_that_logs_cases_between_deaths_is_always_restarted(tmp_path):
    restarts = Restarts(tmp_path)
    restarts.started(0)
    for death in range(1, 3 * RESTARTS):
        _log(tmp_path, 0, death)          # one more case before each death
        assert restarts.again(0)


def test_a_lane_that_dies_without_a_case_is_given_up_after_restarts_in_a_row(tmp_path):
    restarts = Restarts(tmp_path)
    restarts.started(1)
    _log(tmp_path, 1, 5)
    assert restarts.again(1)              # it had logged cases: the count starts over
    assert all(restarts.again(1) for _ in range(RESTARTS - 1))
    _log(tmp_path, 1, 6)
    assert restarts.again(1)              # progress again: a fresh count
    assert all(restarts.again(1) for _ in range(RESTARTS))
    assert not restarts.again(1)


def test_lanes_are_counted_apart(tmp_path):
    restarts = Restarts(tmp_path)
    for lane in (0, 1):
        restarts.started(lane)
    assert all(restarts.again(0) for _ in range(RESTARTS))
    assert not restarts.again(0)
    assert restarts.again(1)
