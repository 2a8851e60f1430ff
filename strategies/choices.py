"""Hypothesis choices for the case strategies: weighted coins, uniform integers and picks that shrink well.

Every draw here sits in a span of its own label (_span), and every integer is drawn as base-256 digits (uniform),
so that Hypothesis's mutator and shrinker treat the case's choices as the independent knobs they are.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st


def _source(draw):
    """The choices behind a composite's `draw` (st.composite hands it the bound draw method of its ConjectureData)."""
    return draw.__self__


_LABEL = 0xA77F_0000_0000


class _span:
    """A span around one draw, labelled by where it starts (choice and depth), so no two spans of a case share a label. Hypothesis's
    mutator copies one span's choices onto another span of the same label: with one label per kind of draw, lengths
    and coins came out equal far more often than drawn (79 % square shapes where the weights give 69 %, causal 27 %
    where they give 33 %, bench/distribution.py). The spans themselves are kept: the shrinker deletes the span after a
    choice it lowered when the lower value needs fewer choices, which a choice in no span would not allow. (A class
    rather than a generator context manager: a case opens about 45 spans, and this costs a third as much.)"""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __enter__(self):
        data = self.data
        data.start_span(_LABEL + (len(getattr(data, "nodes", ())) << 8) + getattr(data, "depth", 0))
        return data

    def __exit__(self, *exc) -> bool:
        self.data.stop_span()
        return False


MIN_ODDS, MAX_ODDS = 1 / 256, 0.9  # a coin's chance, at least and at most: never certain either way, so a replayed
#                                   choice is one the coin can make whatever the odds it was drawn with


def coin(draw, one_in: int, odds: float = 1.0) -> bool:
    """True once in `one_in` draws (`odds` times that, within MIN_ODDS..MAX_ODDS), as one weighted boolean choice: an
    index drawn from range(n) would give n - 1 choices that all mean False, and Hypothesis, which never repeats a
    choice sequence but does not know they alias, drew the same case again through them (a third of a run's cases,
    measured). Shrinks to False. One in 1 is every draw, whatever the odds: a feature the space asks of every case
    (Space(long_one_in=1)) is not optional, and a plain richness would otherwise take it from two cases in five (long
    shapes at long_one_in=1 fell from 83 % of the cases to 31-41 %); certain at every richness, it replays alike."""
    with _span(_source(draw)) as data:
        return data.draw_boolean(1.0 if one_in <= 1 else min(MAX_ODDS, max(MIN_ODDS, odds / one_in)))


def _digits(span: int) -> int:
    return max(1, (span.bit_length() + 7) // 8)


def _uniform_from(data, lo: int, hi: int, digits: int | None = None) -> int:
    span, value = hi - lo, 0
    place = 256 ** ((digits or _digits(span)) - 1)
    with _span(data):
        while place >= 1:
            value += data.draw_integer(0, min(255, (span - value) // place)) * place  # digits keeping value <= span
            place //= 256
    return lo + value


def uniform(draw, lo: int, hi: int, digits: int | None = None) -> int:
    """lo..hi uniformly. Hypothesis draws an integer uniformly only within 256 of its minimum and from a heavy tail
    beyond (an index into 2,000 lengths landed below 256 most of the time), so a wider range is drawn in base-256
    digits, the most significant first: shrinking lowers the high digit, then the low ones, toward lo. As many
    choices as `digits` (default: as the range needs), one even where lo == hi: Hypothesis ranks a case by its number
    of choices before their values, so a shrink that adds a choice is never taken (a length in a narrower range, b
    and h with the room a shorter case leaves them): a residue bug stopped shrinking at 576 keys where 64 fail."""
    return _uniform_from(_source(draw), lo, hi, digits)


class _Uniform(st.SearchStrategy[int]):
    def __init__(self, lo: int, hi: int):
        super().__init__()
        self.lo, self.hi = lo, hi

    def do_draw(self, data) -> int:
        return _uniform_from(data, self.lo, self.hi)


@lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """lo..hi uniformly, as a strategy (see uniform)."""
    return _Uniform(lo, hi)


@lru_cache(maxsize=None)
def _one_of(options: tuple) -> st.SearchStrategy:
    return st.sampled_from(options)



def pick(draw, options: tuple):
    """One of `options`, uniformly, without building a strategy per call (for options that depend on what was
    drawn before), as one choice however many options there are (see uniform). Shrinks toward the first."""
    return options[uniform(draw, 0, len(options) - 1)]


def _either(draw, branches: tuple[st.SearchStrategy, ...]):
    """A value of one of `branches`, drawn as st.one_of draws it (the branch's index, then the branch), without the
    filtered strategy one_of builds on every draw (three times the cost of a plain draw)."""
    return draw(pick(draw, branches))

