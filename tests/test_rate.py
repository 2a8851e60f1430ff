"""Where a campaign's time went (fuzz/report/rate.py): case seconds split by part, graded cases per second and per
minute, and the report's table and plot built from case logs."""

from __future__ import annotations

import json

import pytest

from attnfuzz.report.build import build_report
from attnfuzz.engine.skip_known import NOT_RUN
from attnfuzz.report.rate import UNRUN, Timeline, rate_table
from attnfuzz.strategies.case import Case
from tests.test_report import assert_valid_png, table_rows

T0 = 1_800_000_000.0


def _timeline() -> Timeline:
    line = Timeline()
    for i in range(20):                       # 20 passing cases of 0.1 s, one a minute apart from the next ten
        line.add(T0 + (0 if i < 10 else 70) + i, "PASS", 0.1)
    line.add(T0 + 5, "PASS", 5.0)            # a compile: 50x the median
    line.add(T0 + 6, "FAIL", 2.0)
    line.add(T0 + 7, "UNSUPPORTED", 0.9)
    return line


def test_case_seconds_are_split_by_what_they_were_spent_on():
    parts = _timeline().split()
    assert parts == pytest.approx({"passed": 2.0, "slow": 5.0, "failures": 2.0, "refused": 0.9})


def test_cases_are_counted_per_minute_graded_and_refused_apart():
    assert _timeline().per_minute(T0) == [(0, 12, 1), (1, 10, 0)]   # a failure is graded


def test_the_rate_table_counts_graded_cases_over_wall_and_case_seconds():
    table = rate_table({"k": _timeline()}, (T0, T0 + 100))
    name, graded, per_wall, per_case, busy, passing, slow, failures, refused, unrun = table.rows[0]
    assert (name, graded, per_wall, per_case, busy) == ("k", "22", "0.22", "2.22", "10")
    assert (passing, slow, failures, refused, unrun) == ("20%", "51%", "20%", "9%", "0")


def test_a_known_crash_s_case_answered_unrun_is_not_graded():
    line = _timeline()
    for i in range(5):
        line.add(T0 + 8 + i, UNRUN, 0.001)
    name, graded, *_, unrun = rate_table({"k": line}, (T0, T0 + 100)).rows[0]
    assert (graded, unrun) == ("22", "5")
    assert line.per_minute(T0) == [(0, 12, 1), (1, 10, 0)]


def test_the_report_reads_a_not_run_line_as_unrun(tmp_path):
    case = Case()
    lines = [{"backend": "b", "label": label, "seconds": 0.1, "time": T0 + t, "case": case.to_dict(), "ratio": 0.1,
              "message": message}
             for t, label, message in ((0, "PASS", ""), (1, "KNOWN:SIGSEGV", f"{NOT_RUN}: known bug x takes this case"),
                                       (2, "KNOWN:SIGSEGV", "the worker process died (SIGSEGV)"))]
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in lines))
    rows = table_rows(build_report(log).with_name("report.md").read_text(), "Where the time went")
    assert rows["b"][1] == "2" and rows["b"][-1] == "1", rows


def test_the_report_shows_where_the_time_went(tmp_path):
    case = Case()
    lines = [{"backend": "b", "label": label, "seconds": s, "time": T0 + t, "case": case.to_dict(), "ratio": 0.1}
             for t, label, s in ((0, "PASS", 0.1), (1, "PASS", 0.1), (2, "UNSUPPORTED", 0.2), (65, "PASS", 0.1))]
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in lines))
    index = build_report(log)
    rows = table_rows(index.with_name("report.md").read_text(), "Where the time went")
    assert rows["b"][:5] == ["b", "3", "0.05", "6.00", "0"], rows
    assert_valid_png(index.with_name("rate.png"), min_bytes=4000)


def test_a_backend_not_available_where_the_report_is_built_is_not_judged(tmp_path):
    """Feasibility is the backend's own refusals: where it cannot run (sdpa-cudnn without CUDA) every combination
    would read infeasible, so the report says so instead of a share of 0; a backend that runs here is judged."""
    case = Case(sq=4, skv=4, d_qk=16, d_v=16, dtype="float16")
    lines = [{"backend": b, "label": "PASS", "seconds": 0.1, "time": T0 + i, "case": case.to_dict(), "ratio": 0.1,
              "device": "cuda"} for i, b in enumerate(("sdpa-cudnn", "custom-not-a-backend"))]
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in lines))
    rows = table_rows(build_report(log).with_name("report.md").read_text(), "Feature combinations graded")
    assert rows["sdpa-cudnn"][2].startswith("not judged here"), rows
    assert "% of" in rows["custom-not-a-backend"][2], rows
