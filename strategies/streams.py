"""Streams that depend on the seed alone, not on what else the process imported.

Hypothesis draws about one bounded integer or float in twenty from a pool of constants it collects from every local
module in sys.modules (hypothesis.internal.conjecture.providers._get_local_constants: any module outside the
standard library and site-packages). Which modules are loaded differs between a test file run alone and the same
file after others, a CLI run and a pytest session, one user's conftest and another's: a derandomized stream of the
same seed then drew other cases, and shrank to other minima (a control that found two bugs alone found one after
the rest of the suite was imported). attnfuzz's strategies weigh their own choices (strategies/cases.py), so the
search runs with that pool empty; Hypothesis's own global constants (0, 1, powers of two, ...) stay.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def seed_only_streams():
    """Hypothesis's pool of local-module constants empty while the block runs (restored after); a no-op on a
    Hypothesis without that pool."""
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
