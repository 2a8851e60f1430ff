"""Version diff: the same cases on two stacks, and what changed between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.tools import versiondiff
from attnfuzz.strategies.case import Case

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "tests.misbehaving:versioned"
CASES = {  # (causal, long) -> the case; old fails long ones with NaN, new fails causal ones with zeros
    (False, False): Case(sq=4, skv=4, d_qk=8, d_v=8),
    (False, True): Case(sq=8, skv=8, d_qk=8, d_v=8),
    (True, False): Case(sq=4, skv=4, d_qk=8, d_v=8, causal=True),
    (True, True): Case(sq=8, skv=8, d_qk=8, d_v=8, causal=True),
}


def _campaign_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "campaign"
    (directory / "cases").mkdir(parents=True)
    (directory / "campaign.json").write_text(json.dumps({"device": "cpu"}))
    lines = [json.dumps({"backend": KERNEL, "label": "PASS", "case": c.to_dict()}) for c in CASES.values()]
    lines.append(json.dumps({"backend": "sdpa-math", "label": "PASS", "case": CASES[True, True].to_dict()}))
    (directory / "cases" / "lane0.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def _snapshot(tmp_path: Path, stack: str, source: Path) -> Path:
    out = tmp_path / f"{stack}.json"
    env = {**os.environ, "ATTNFUZZ_TEST_STACK": stack}
    done = subprocess.run([sys.executable, "-m", "attnfuzz", "snapshot", str(source), "--label", stack, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
def test_diff_names_newly_failing_newly_passing_and_changed_diagnosis(tmp_path):
    source = _campaign_dir(tmp_path)
    old, new = _snapshot(tmp_path, "old", source), _snapshot(tmp_path, "new", source)
    changes = versiondiff.diff(json.loads(old.read_text()), json.loads(new.read_text()))

    def cases(kind):
        return {(r["case"]["causal"], r["case"]["sq"] > 4) for r in changes[kind] if r["backend"] == KERNEL}

    assert cases("newly failing") == {(True, False)}
    assert cases("newly passing") == {(False, True)}
    assert cases("changed diagnosis") == {(True, True)}
    assert [(r["old"], r["new"]) for r in changes["changed diagnosis"]] == [("FAIL:NONFINITE", "FAIL:ALL_ZERO")]
    assert not any(r["backend"] == "sdpa-math" for rows in changes.values() for r in rows), "sdpa-math did not change"

    shown = subprocess.run([sys.executable, "-m", "attnfuzz", "diff", str(old), str(new)], cwd=ROOT, capture_output=True,
                           text=True)
    assert shown.returncode == 1, shown.stderr
    assert "## newly failing: 1" in shown.stdout and "old: old: torch" in shown.stdout


@pytest.mark.slow
def test_identical_stacks_show_no_change(tmp_path):
    """Control: the same stack twice changes nothing, and diff exits 0."""
    source = _campaign_dir(tmp_path)
    a = _snapshot(tmp_path, "old", source)
    b = tmp_path / "again.json"
    b.write_text(a.read_text())
    changes = versiondiff.diff(json.loads(a.read_text()), json.loads(b.read_text()))
    assert not any(changes.values())
    assert subprocess.run([sys.executable, "-m", "attnfuzz", "diff", str(a), str(b)], cwd=ROOT,
                          capture_output=True).returncode == 0


def test_snapshot_reads_corpus_entries_too(tmp_path):
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.oracles.verdict import Verdict
    corpus_io.save(tmp_path / "corpus", corpus_io.Entry(KERNEL, CASES[True, False], Verdict("FAIL", "ALL_ZERO")),
                   repro=False)
    found = versiondiff.gather([tmp_path / "corpus", _campaign_dir(tmp_path)], max_cases=10)
    assert len(found) == 5 and all(device == "cpu" for device, _ in found.values())


def test_snapshot_asks_the_worker_whether_a_backend_is_available(tmp_path, monkeypatch):
    """As in an isolated replay: TE imports in a fresh worker but not in a process that loaded cuDNN, so the worker
    judges availability, and an unavailable backend is still UNAVAILABLE (not UNSUPPORTED) in the snapshot."""
    from attnfuzz.store import corpus as corpus_io
    from attnfuzz.backends.flash.fa4 import FlashAttn4
    from attnfuzz.oracles.verdict import Verdict

    def not_here(self):
        raise AssertionError("availability was asked in the snapshotting process")

    monkeypatch.setattr(FlashAttn4, "available", not_here)  # the worker, forked from a clean server, has the real one
    corpus_io.save(tmp_path / "corpus", corpus_io.Entry("fa4", Case(dtype="float16"), Verdict("FAIL", "TOLERANCE")),
                   repro=False)
    snap = versiondiff.snapshot([tmp_path / "corpus"], case_timeout=60)
    assert [(r["backend"], r["label"]) for r in snap["results"]] == [("fa4", "UNAVAILABLE")]
    assert "CUDA" in snap["results"][0]["message"] or "not installed" in snap["results"][0]["message"], snap
