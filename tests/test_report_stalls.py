"""The campaign report's whole-GPU stalls: most lanes in one slow case at once, with the crash beside them; none where
the slow cases of a few lanes only overlap, or where they overlap too briefly."""

from __future__ import annotations

import json

from attnfuzz.report.build import build_report
from attnfuzz.report.stalls import MIN_S, RELEASE_S, Stalls
from attnfuzz.strategies.case import Case

CASE = Case(sq=4, skv=4, d_qk=8, d_v=8).to_dict()
FAULT = {"status": "KNOWN", "diagnosis": "AcceleratorError"}


def _row(lane, end, seconds, label="PASS", verdict=None, message="", backend="sdpa-math"):
    return {"backend": backend, "label": label, "ratio": 0.1, "message": message, "seconds": seconds, "time": end,
            "lane": lane, "case": CASE, "verdict": verdict or {"status": label, "diagnosis": None}}


def _rows(slow_lanes: int) -> list[dict]:
    rows = [_row(lane, 1000 + t / 10, 0.05) for lane in range(5) for t in range(1, 300)]
    rows.append(_row(0, 1026.0, 6.0, "KNOWN:AcceleratorError", FAULT, "AcceleratorError: misaligned address",
                     "sdpa-flash"))
    rows += [_row(lane, 1025.9, 6.0) for lane in range(1, slow_lanes)]
    return rows


def _stalls(rows) -> Stalls:
    stalls = Stalls()
    for row in rows:
        stalls.add(row)
    return stalls


def test_most_lanes_in_one_slow_case_at_once_is_a_stall_with_its_fault_beside_it():
    table = _stalls(_rows(5)).table()
    assert table is not None and table.rows[0][:2] == ["all", "1"]
    assert table.rows[1][0].startswith("sdpa-flash KNOWN:AcceleratorError") and table.rows[1][-1] == "1"


def test_a_few_slow_lanes_or_a_brief_overlap_is_no_stall():
    assert _stalls(_rows(2)).table() is None
    brief = _rows(1) + [_row(1, 1020.0 + MIN_S / 2, 6.0), _row(2, 1023.0, 6.0)]   # three at once for MIN_S / 2
    assert _stalls(brief).spans() == []
    assert _stalls(brief + [_row(3, 1021.5, 2.0)]).spans() == [], "a case of under 2.5 s is no stalled one"


def test_the_report_shows_the_table_only_where_there_was_a_stall(tmp_path):
    for name, rows in (("stalled", _rows(5)), ("calm", _rows(2))):
        cases = tmp_path / name / "cases"
        cases.mkdir(parents=True)
        (cases / "lane0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        build_report(tmp_path / name)
    assert "## Whole-GPU stalls" in (tmp_path / "stalled" / "report" / "report.md").read_text()
    assert "Whole-GPU stalls" not in (tmp_path / "calm" / "report" / "report.md").read_text()


def test_lanes_slow_each_on_its_own_are_an_overlap_not_a_stall():
    """A fault's recovery releases every lane at once, so a stall's slow cases end together; lanes compiling kernels
    on their own overlap as long but end apart: that span is counted as an overlap, not a stall (the control: the
    same slow cases ending within RELEASE_S of each other are one)."""
    base = [_row(lane, 1000 + t / 10, 0.05) for lane in range(5) for t in range(1, 300)]
    apart = base + [_row(lane, 1024.0 + 2.0 * lane, 8.0, backend="fa4") for lane in range(5)]   # ends 2 s apart
    s = _stalls(apart).summary()
    assert (s["stalls"], s["overlaps"]) == (0, 1) and _stalls(apart).table() is None
    together = base + [_row(lane, 1030.0 + RELEASE_S * lane / 10, 6.0 + lane) for lane in range(5)]
    s = _stalls(together).summary()
    assert (s["stalls"], s["overlaps"]) == (1, 0)
