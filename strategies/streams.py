"""Streams that depend on the seed alone, not on what else the process imported.

Hypothesis draws about one bounded integer or float in twenty from a pool of constants it collects from every local
module in sys.modules (hypothesis.internal.conjecture.providers._get_local_constants: any module outside the
standard library and site-packages). Which modules are loaded differs between a test file run alone and the same
file after others, a CLI run and a pytest session, one user's conftest and another's: a derandomized stream of the
same seed then drew other cases, and shrank to other minima (a control that found two bugs alone found one after
the rest of the suite was imported). attnfuzz's strategies weigh their own choices (strategies/cases.py), so the
search runs with that pool empty; Hypothesis's own global constants (0, 1, powers of two, ...) stay.

Nor on how fast the machine runs: once a bug is found, Hypothesis goes on looking for others for a number of calls
(at most 1000 past the first bug, or twice the calls up to the latest), but stops early once the first bug is more
than 10 seconds old (ConjectureRunner.should_generate_more, by time.monotonic). On a loaded machine that cut a stream
short: the same seed drew other cases, and a control that finds two bugs found one. The search runs with the engine's
monotonic clock stopped, so the call counts alone decide (its perf_counter, which times phases and the 300 s shrink
limit, runs as ever).

Nor on the text of the harness's test function: a derandomized run (the ci profile) seeds its stream from a digest
of the test function's source (hypothesis.internal.reflection.function_digest), so changing one line of it moved
every ci stream and every test that depends on one. A search without a seed of its own under a derandomized profile
runs with DERANDOMIZED_SEED, the digest that source had.
"""

from __future__ import annotations

import contextlib

DERANDOMIZED_SEED = int("f165823b2db9873af9b76bf5db9ce0a75c748139757bb022"
                        "d8d59cc42579e0f0aad1657d5ef5eafd16d551f9a82a7918", 16)


def stream_seed(seed: int | None, derandomize: bool) -> int | None:
    """The seed a search runs with: the one given, else DERANDOMIZED_SEED for a derandomized profile, else None
    (Hypothesis draws one)."""
    return seed if seed is not None or not derandomize else DERANDOMIZED_SEED


class _StoppedMonotonic:
    """The time module, but for a monotonic clock that stands still."""

    def __init__(self, clock):
        self._clock = clock

    def __getattr__(self, name):
        return getattr(self._clock, name)

    @staticmethod
    def monotonic() -> float:
        return 0.0


@contextlib.contextmanager
def seed_only_streams():
    """Hypothesis's pool of local-module constants empty and its engine's monotonic clock stopped while the block
    runs (both restored after); each a no-op on a Hypothesis without it."""
    with _empty_constant_pool(), _stopped_engine_clock():
        yield


@contextlib.contextmanager
def _stopped_engine_clock():
    try:
        from hypothesis.internal.conjecture import engine
        clock = engine.time
    except (ImportError, AttributeError):
        yield
        return
    engine.time = _StoppedMonotonic(clock)
    try:
        yield
    finally:
        engine.time = clock


@contextlib.contextmanager
def _empty_constant_pool():
    try:
        from hypothesis.internal.conjecture import providers
        original, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
        empty = providers.Constants()
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    cache.cache.clear()   # values permitted per choice kind, computed from the pool
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()
