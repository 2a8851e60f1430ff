"""A derandomized fuzz stream depends on its seed alone: Hypothesis's pool of constants from local modules (which
differs with what the process imported) is empty while attnfuzz searches (strategies/streams.py). Each run is a
fresh process, since a process cannot forget what it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.own_streams   # these tests set up seed_only_streams themselves

REPO = Path(__file__).resolve().parents[1]
RUN = """
import contextlib, importlib, json, pathlib, sys
sys.path.insert(0, REPO)
from attnfuzz.engine import harness
from attnfuzz.engine.profiles import profile
from attnfuzz.strategies.space import Space
from tests.broken import BROKEN
if KEEP_POOL:
    harness.seed_only_streams = contextlib.nullcontext
if IMPORT_TESTS:  # what a pytest session has loaded when a fuzz test runs after the others
    for path in sorted(pathlib.Path(REPO, "tests").glob("test_*.py")):
        importlib.import_module("tests." + path.stem)
drawn = []
harness.fuzz(BROKEN["broken-causal-square-and-scale"](), space=Space(max_len=80, max_head_dim=128), reruns=0,
             settings=profile("ci", max_examples=300), on_case=lambda case, verdict, tally: drawn.append(repr(case)))
print(json.dumps(drawn))
"""


def _stream(import_tests: bool, keep_pool: bool) -> list[str]:
    code = (RUN.replace("REPO", repr(str(REPO))).replace("KEEP_POOL", repr(keep_pool))
            .replace("IMPORT_TESTS", repr(import_tests)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("keep_pool", [False, True], ids=["attnfuzz", "control-hypothesis-pool-kept"])
def test_a_stream_is_the_same_whatever_the_process_imported(keep_pool):
    alone, after_the_suite = _stream(False, keep_pool), _stream(True, keep_pool)
    if keep_pool:   # control: with Hypothesis's pool of local constants the imports change the cases drawn
        assert alone != after_the_suite
    else:
        assert alone == after_the_suite


def test_the_pool_is_restored_after_the_search():
    from hypothesis.internal.conjecture import providers

    from attnfuzz.strategies.streams import seed_only_streams
    original = providers._get_local_constants
    with seed_only_streams():
        assert len(providers._get_local_constants().integers) == 0
    assert providers._get_local_constants is original


def _bugs_found(monkeypatch, search) -> set[str]:
    """The kinds of bug a derandomized search finds of two: A (n % 7 == 3, n < 500) and B (n > 500, only once A
    was seen). From A on, the machine is slow: the monotonic clock jumps 60 s at every call."""
    import time

    from hypothesis import given, settings
    from hypothesis import strategies as st
    real, jumped, seen_a = time.monotonic, [0.0], []
    monkeypatch.setattr(time, "monotonic", lambda: real() + jumped[0])

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(st.integers(0, 1000))
    def prop(n):
        if seen_a:
            jumped[0] += 60.0
        if n % 7 == 3 and n < 500:
            seen_a.append(n)
            raise ValueError("A")
        if seen_a and n > 500:
            raise KeyError("B")

    try:
        with search():
            prop()
    except BaseExceptionGroup as group:  # noqa: F821 (Python 3.11+)
        return {type(e).__name__ for e in group.exceptions}
    except (ValueError, KeyError) as e:
        return {type(e).__name__}
    return set()


def test_a_slow_machine_does_not_cut_the_search_for_more_bugs(monkeypatch):
    """Hypothesis stops looking for more bugs once the first is 10 s old by its clock: under seed_only_streams the
    call counts alone decide, so both bugs are found; the control, the same search on Hypothesis's own clock, stops
    at the first."""
    import contextlib

    from attnfuzz.strategies.streams import seed_only_streams
    assert _bugs_found(monkeypatch, seed_only_streams) == {"ValueError", "KeyError"}
    assert _bugs_found(monkeypatch, contextlib.nullcontext) == {"ValueError"}


def test_the_engine_clock_is_restored_after_the_search():
    import time

    from hypothesis.internal.conjecture import engine

    from attnfuzz.strategies.streams import seed_only_streams
    with seed_only_streams():
        assert engine.time.monotonic() == 0.0 and engine.time.perf_counter() > 0
    assert engine.time is time
