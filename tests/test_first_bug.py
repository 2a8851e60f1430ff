"""--first-bug: the search stops at the first failure and shrinks that one alone; no failure it met is lost.

The kernel answers NaN on causal cases and zeros on causal cases of one query, so the shrink of the NaN bug passes
into the zero bug (Hypothesis lets a first-bug shrink move to a smaller failure of another kind).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnfuzz.store import corpus as corpus_io

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "tests.misbehaving:nan_when_causal_zero_for_one_query"


def _fuzz(front: str, corpus: Path, log: Path, *options: str) -> subprocess.CompletedProcess:
    if front == "run":
        command = [sys.executable, "-m", "attnfuzz", "run", "--backend", KERNEL, "--profile", "ci", "--max-examples",
                   "100", "--corpus", str(corpus), "--log", str(log), *options]
    else:  # the pytest fuzz target saves into the corpus folder's findings/
        command = [sys.executable, "-m", "pytest", str(ROOT / "fuzz"), "-q", "-p", "no:cacheprovider",
                   "--attnfuzz-backend", KERNEL, "--attnfuzz-profile", "ci", "--attnfuzz-max-examples", "100",
                   "--attnfuzz-corpus", str(corpus), *(f"--attnfuzz-{o[2:]}" for o in options)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _entries(corpus: Path) -> dict[str, corpus_io.Entry]:
    found = [corpus_io.load(p) for p in corpus.rglob("*.json")]
    return {e.verdict.label: e for e in found}


@pytest.mark.parametrize("front", ["run", "pytest"])
def test_first_bug_shrinks_one_failure_and_saves_the_one_it_left_as_found(tmp_path, front):
    done = _fuzz(front, tmp_path / "corpus", tmp_path / "cases.jsonl", "--first-bug")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    entries = _entries(tmp_path / "corpus")
    assert set(entries) == {"FAIL:ALL_ZERO", "FAIL:NONFINITE"}, out[-3000:]
    zero = entries["FAIL:ALL_ZERO"].case   # the one shrunk: to its minimal case
    assert (zero.b, zero.h, zero.sq, zero.skv, zero.causal) == (1, 1, 1, 1, True), zero
    assert entries["FAIL:NONFINITE"].case.sq > 1   # a failure the search met, saved as it was seen
    assert "met before the shrunk finding, saved as found: FAIL:NONFINITE" in out, out[-3000:]
    assert "attnfuzz shrink" in out, out[-3000:]   # ... with the command that shrinks it


def test_first_bug_stops_the_search_sooner_than_a_run_that_shrinks_every_failure(tmp_path):
    """The same derandomized run without --first-bug shrinks both bugs: more cases before anything is saved."""
    # (seeded: the unseeded ci stream's NONFINITE shrink stalls at a long case, sq 2048 over one key; the
    # 100-case runs of seeds 0-5 all shrink it to sq 2)
    every = _fuzz("run", tmp_path / "every", tmp_path / "every.jsonl", "--seed", "1")
    first = _fuzz("run", tmp_path / "first", tmp_path / "first.jsonl", "--first-bug", "--seed", "1")
    assert every.returncode == first.returncode == 1, every.stderr[-2000:] + first.stderr[-2000:]
    assert "met before the shrunk finding" not in every.stderr, every.stderr[-3000:]
    shrunk = _entries(tmp_path / "every")
    assert set(shrunk) == {"FAIL:ALL_ZERO", "FAIL:NONFINITE"}
    assert shrunk["FAIL:NONFINITE"].case.sq == 2, shrunk["FAIL:NONFINITE"].case   # shrunk too, to its own minimum
    cases = [len(log.read_text().splitlines()) for log in (tmp_path / "every.jsonl", tmp_path / "first.jsonl")]
    assert cases[1] < cases[0], cases
