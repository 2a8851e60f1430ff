"""bench/tree_ab.py: a build's run imports attnfuzz from that build's folder, and a folder without one is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from tree_ab import main, measure  # noqa: E402


def _site_of_this_checkout(site: Path) -> Path:
    """An installed-looking attnfuzz made of links into this checkout, as pyproject maps its folders."""
    package = site / "attnfuzz"
    package.mkdir(parents=True)
    for item in (ROOT / "fuzz").iterdir():
        (package / item.name).symlink_to(item)
    for name, folder in (("oracles", "oracles"), ("strategies", "strategies"), ("shipped_corpus", "corpus")):
        (package / name).symlink_to(ROOT / folder)
    return site


def test_a_run_grades_cases_with_the_build_in_its_folder(tmp_path):
    site = _site_of_this_checkout(tmp_path / "site")
    row = measure(site, "sdpa-math", seed=1, examples=20)
    assert Path(row["module"]).parent == site / "attnfuzz"
    assert row["small"] > 0 and row["wall"] > 0 and row["cpu"] > 0


def test_a_folder_without_attnfuzz_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tree_ab.py", f"old={tmp_path}"])
    with pytest.raises(SystemExit, match="DIR holding an installed attnfuzz"):
        main()
