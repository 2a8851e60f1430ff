"""bench/campaign_ab.py's count: a graded case was run and not refused; a case the known-crash skip answered is not."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("campaign_ab", Path(__file__).resolve().parents[1] / "bench" /
                                              "campaign_ab.py")
campaign_ab = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(campaign_ab)


def test_refused_and_skipped_cases_are_not_graded(tmp_path):
    rows = [{"backend": "b", "label": "PASS", "message": "", "case": {"sq": 4, "skv": 4}},
            {"backend": "b", "label": "KNOWN:AcceleratorError", "message": "AcceleratorError: misaligned",
             "case": {"sq": 2, "skv": 2}},
            {"backend": "b", "label": "KNOWN:AcceleratorError", "message": "not run: known bug x takes this case",
             "case": {"sq": 3, "skv": 3}},
            {"backend": "b", "label": "UNSUPPORTED", "message": "refused", "case": {"sq": 5, "skv": 5}}]
    (tmp_path / "camp" / "cases").mkdir(parents=True)
    (tmp_path / "camp" / "cases" / "lane0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = campaign_ab.measured(tmp_path, seconds=2.0)
    assert m["b"]["rate"] == 1.0 and m["b"]["shapes"] == 2 and m["db_files"] == 0
