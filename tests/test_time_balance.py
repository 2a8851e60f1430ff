"""Time-balanced compile-aware search (strategies/compiled.py's TimeBalance): fresh draws, which may compile, get about
the asked share of the search's time, the share of pinned draws rising as compiles cost more than cases, and a
planted bug in a rare configuration is still found and shrunk to its minimal case. The clock is the stand-in JIT's
own (its simulated compile seconds plus a fixed time a case), so every figure here is exact and the same each run."""

from __future__ import annotations

import pytest

from attnfuzz.engine.compiled_search import compiled_configs
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.compiled import COIN, LEAST_FRESH, MEASURED, MEASURED_FRESH, TimeBalance
from attnfuzz.strategies.space import Space
from bench.jit_fake import FakeJit, Verdicts
from tests.test_compiled import MINIMAL

CASE_SECONDS = 0.02   # what the stand-in clock counts for each case run, beside its compiles (2 s each)
MOST = 1 - Space().compiled_share


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _timed(balance: TimeBalance, clock: Clock, fresh: bool, seconds: float, times: int) -> None:
    for _ in range(times):
        balance.drawn(fresh)
        clock.now += seconds


def test_odds_give_fresh_draws_the_share_of_the_time():
    clock = Clock()
    balance = TimeBalance(0.5, MOST, clock=clock)
    assert balance.odds() == MOST   # nothing timed yet: the fixed share's odds
    _timed(balance, clock, True, 2.0, MEASURED)
    _timed(balance, clock, False, 0.02, MEASURED)
    balance.drawn(False)   # closes the last interval
    # s t_p / (s t_p + (1 - s) t_f) = 0.02 / 2.02: a fresh draw a hundred cases, half the time compiling
    assert balance.odds() == pytest.approx(0.02 / 2.02)
    assert balance.fresh_seconds == pytest.approx(2.0 * MEASURED)
    assert balance.pinned_seconds == pytest.approx(0.02 * MEASURED)


def test_one_timed_compile_is_enough_to_move_the_odds():
    """A fresh draw costs a compile: the balance moves once one is timed (and MEASURED pinned draws, whose cost varies
    with the case), not after three compiles at the fixed share's odds."""
    clock = Clock()
    balance = TimeBalance(0.5, MOST, clock=clock)
    _timed(balance, clock, False, 0.02, MEASURED + 1)
    assert balance.odds() == MOST   # no compile timed yet
    _timed(balance, clock, True, 2.0, MEASURED_FRESH)
    balance.drawn(False)
    assert balance.odds() == pytest.approx(0.02 / 2.02)

def test_odds_stay_between_the_least_and_the_fixed_share():
    clock = Clock()
    slow = TimeBalance(0.5, MOST, clock=clock)
    _timed(slow, clock, True, 600.0, MEASURED)        # a compile of ten minutes
    _timed(slow, clock, False, 0.001, MEASURED + 1)
    assert slow.odds() == LEAST_FRESH
    cheap = TimeBalance(0.5, MOST, clock=clock)
    _timed(cheap, clock, True, 0.001, MEASURED)       # fresh draws as cheap as pinned: never more than the fixed share
    _timed(cheap, clock, False, 0.001, MEASURED + 1)
    assert cheap.odds() == MOST


def test_a_pause_times_nothing():
    clock = Clock()
    balance = TimeBalance(0.5, MOST, clock=clock)
    balance.drawn(True)
    balance.pause()
    clock.now += 1000.0   # between two searches, or while a failure is shrunk
    balance.drawn(False)
    assert balance.fresh_seconds == 0 and balance.timed[True] == 0


def test_a_coin_keeps_its_first_decision():
    """A replayed choice sequence must mean the same case while the odds move; 0 (where shrinking goes) is fresh."""
    clock = Clock()
    balance = TimeBalance(0.5, MOST, clock=clock)
    coin = int(0.1 * COIN)   # fresh at the fixed share's odds (0.2), pinned at the balanced ones below
    assert balance.fresh(coin) and balance.fresh(0)
    _timed(balance, clock, True, 2.0, MEASURED)
    _timed(balance, clock, False, 0.02, MEASURED + 1)
    assert balance.odds() < 0.02
    assert balance.fresh(coin) and balance.fresh(0)
    assert not balance.fresh(coin + 1)


def _search(time_share: float | None, seed: int, examples: int, bug: str = "none"):
    """A stand-in JIT (2 s a compile) searched with the stand-in clock: (graded cases, configurations, simulated
    seconds, compile seconds, findings)."""
    backend = FakeJit(compile_seconds=2.0, bug=bug)
    clock = lambda: backend.compile_spent + CASE_SECONDS * backend.runs   # noqa: E731
    if time_share is not None:
        compiled_configs(backend).balance = TimeBalance(time_share, MOST, clock=clock)
    graded = []
    _, findings = fuzz(backend, space=Space(max_len=160, compile_time_share=time_share), seed=seed,
                       worker=Verdicts(backend), reruns=0,
                       on_case=lambda case, verdict, tally: graded.append(verdict.status != V.UNSUPPORTED),
                       settings=profile("quick", max_examples=examples, database=None))
    return sum(graded), len(backend.compiled), clock(), backend.compile_spent, findings


@pytest.mark.parametrize("seed", [0, 1])
def test_a_balanced_search_spends_about_half_its_time_compiling(seed):
    graded, configs, seconds, compiling, _ = _search(0.5, seed, 1000)
    assert 0.3 <= compiling / seconds <= 0.7, (compiling, seconds)
    fixed_graded, fixed_configs, fixed_seconds, fixed_compiling, _ = _search(None, seed, 1000)
    # the negative control: the fixed share spends nearly all of a 2-s compile backend's time compiling
    assert fixed_compiling / fixed_seconds > 0.85, (fixed_compiling, fixed_seconds)
    assert graded / seconds >= 4 * fixed_graded / fixed_seconds
    assert configs >= 3   # new configurations still open, at a steady rate


@pytest.mark.parametrize("seed", [0, 1])
def test_a_balanced_search_finds_and_shrinks_a_rare_configuration_bug(seed):
    """The planted bug lives in bfloat16 + softcap + causal kernels: found within a few thousand cases (about as much
    simulated time as the fixed share spends on 300), and its finding ends at the same minimal case."""
    *_, findings = _search(0.5, seed, 3000, bug="config")
    assert [f.verdict.label for f in findings] == ["FAIL:TOLERANCE"]
    assert findings[0].case == MINIMAL, findings[0].case


def test_a_space_refuses_a_time_share_out_of_range():
    for bad in (0, 1, 1.5, "half"):
        with pytest.raises(ValueError, match="compile_time_share"):
            Space(compile_time_share=bad)
