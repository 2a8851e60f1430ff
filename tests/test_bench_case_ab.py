"""bench/case_ab.py: the same cases run in a build's own folder, and a folder without attnfuzz is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from case_ab import RUN, in_build, main  # noqa: E402
from tests.test_bench_tree_ab import _site_of_this_checkout  # noqa: E402


def test_the_cases_run_with_the_build_in_its_folder(tmp_path):
    site = _site_of_this_checkout(tmp_path / "site")
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"sq": 3, "skv": 5, "grads": True}, {"sq": 8, "skv": 8, "causal": True}]))
    row = json.loads(in_build(site, RUN, str(cases)))
    assert Path(row["module"]).parent == site / "attnfuzz"
    assert len(row["seconds"]) == 2 and all(s > 0 for s in row["seconds"])


def test_a_folder_without_attnfuzz_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["case_ab.py", f"old={tmp_path}"])
    with pytest.raises(SystemExit, match="DIR holding an installed attnfuzz"):
        main()
