"""bench/summarize.py: a stream log's cases by label, with the known crashes answered unrun counted apart."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("summarize", Path(__file__).resolve().parents[1] / "bench" /
                                              "summarize.py")
summarize = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(summarize)


def test_known_crashes_not_run_are_counted_apart(tmp_path):
    rows = [("PASS", ""), ("KNOWN:SIGSEGV", "the worker died"), ("KNOWN:SIGSEGV", "not run: known bug x takes it"),
            ("UNSUPPORTED", "no such kernel")]
    log = tmp_path / "k.jsonl"
    log.write_text("".join(json.dumps({"backend": "k", "label": label, "message": message, "seconds": 0.5}) + "\n"
                           for label, message in rows) + '{"cut short')
    line = summarize.summarize([str(log)]).splitlines()[0]
    assert line.startswith("k: 4 cases in 2s") and "PASS 1" in line and "UNSUPPORTED 1" in line
    assert line.endswith("; 1 of them known crashes not run"), line
