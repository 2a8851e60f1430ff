"""bench/first_verdict.py --until saved: when a run's first finding is logged and saved, against a planted kernel,
with no known bugs and with the planted bug known (through a stand-in for the shipped corpus)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from first_verdict import first_finding  # noqa: E402

from attnfuzz.cli import main  # noqa: E402


@pytest.mark.slow
def test_the_first_finding_is_timed_until_its_entry_is_saved(monkeypatch, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))  # the planted kernel's checkout
    line = first_finding("tests.misbehaving:zero_when_causal", "cpu", 120, None, [], keep=tmp_path / "kept")
    assert not (here / ".hypothesis").exists(), "the run kept no example database here to replay next time"
    assert "first finding case " in line and "(FAIL:ALL_ZERO)" in line and "saved at " in line, line
    assert "not within" not in line and "; after the finding " in line, line
    kept = (tmp_path / "kept" / "tests.misbehaving-zero_when_causal.jsonl").read_text().splitlines()
    assert any('"label": "FAIL:ALL_ZERO"' in row for row in kept), "the kept log holds the run's cases"
    assert (tmp_path / "kept" / "tests.misbehaving-zero_when_causal.err").exists()
    saved = list((tmp_path / "kept" / "tests.misbehaving-zero_when_causal-findings").glob("*.json"))
    assert saved and all("FAIL-ALL_ZERO" in p.name for p in saved), saved   # the entry the run saved, kept
    # the same bug known in the stand-in shipped corpus: logged as KNOWN, nothing found, nothing saved
    corpus = tmp_path / "corpus"
    argv = ["run", "--backend", "tests.misbehaving:zero_when_causal", "--max-examples", "60", "--seed", "0",
            "--corpus", str(corpus)]
    assert main(argv) == 1
    [entry] = corpus.glob("*.json")
    assert main(["known", str(entry), "--link", "https://example.org/zero-when-causal"]) == 0
    line = first_finding("tests.misbehaving:zero_when_causal", "cpu", 30, corpus, [])
    assert "first finding none" in line and "saved at not within" in line, line
    dropped = first_finding("tests.misbehaving:zero_when_causal", "cpu", 120, corpus, [entry.stem])
    assert "(FAIL:ALL_ZERO)" in dropped and "not within" not in dropped, dropped
