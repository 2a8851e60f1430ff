"""Compile-aware drawing: many runtime variations under each kernel configuration a JIT backend compiled already.

A JIT-compiled backend (FA4, FlashInfer, compiled flex_attention) builds a new kernel for every new compile key
(Backend.compile_key: dtype, head dims, which mask and score features are present, ...), for seconds, and nearly
every case the general strategy draws has a new key. `compile_aware` wraps a backend's case strategy: each draw
starts with one weighted coin, `pinned`, True with probability `share`. A fresh draw (False) is the wrapped
strategy's case, unchanged; a pinned draw (True, once some key is compiled) picks one compiled configuration by its
index in the order they were compiled, draws a case from the wrapped strategy and carries that case's runtime fields
(runtime_groups: seed and values, lengths and batch, heads at the configuration's GQA ratio, band and scale values,
spelling) onto the configuration's first case, one group at a time, keeping each group only where the result is a
valid case of the same key that the backend takes.

Hypothesis stays in charge: the coin and the index are its choices, and shrinking lowers them toward a fresh draw
and toward the first configuration compiled. Once the search has met a failure, the configurations are closed
(CompiledConfigs.closed; the harness closes them, engine/compiled_search.py's open_after opens them again): a fresh
draw of a configuration not compiled yet is then invalid, not run, so Hypothesis's shrink (and what is left of its
search) stays inside compiled configurations, where a step costs milliseconds, not a compile. A failure keeps the
compile fields of the configuration it settles in; the greedy shrink (engine/reshrink.py) walks those down after, one
compile a step, where Hypothesis's shrink crossed a configuration at nearly every step that changed one. Its choices
name a configuration of this process, so the case it settles on is what is saved (corpus entries are Cases, replayed
as such), and a database entry replayed in another process redraws a different case there.

With a time share (Space.compile_time_share, a campaign's), the coin follows the cost: fresh draws, which may compile,
get about that share of the search's time (TimeBalance), never more often than the fixed share would draw them.
A compile of seconds against cases of milliseconds then comes one draw in tens or hundreds, where the fixed share
spent nine tenths of a JIT backend's time compiling. The coin is then a uniform choice whose threshold moves, fixed
for each value at its first use, so a replayed choice sequence still means one case.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from typing import Callable

from hypothesis import strategies as st

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import alibi_slopes
from attnfuzz.strategies.choices import _uniform_from
from attnfuzz.strategies.lengths import work

INDEXES = 2**16  # the range of the index choice (two base-256 digits): CompiledConfigs.named maps it to one
COIN = 2**16     # the range of a time-balanced coin: a value below odds * COIN draws fresh
LEAST_FRESH = 1 / 500   # the fewest fresh draws a time-balanced search makes, whatever a compile costs
MEASURED = 3     # pinned draws timed before the balance moves the odds from the fixed share's (a case's cost varies)
MEASURED_FRESH = 1   # ... and fresh ones: a compile's seconds show in one, and each costs a compile
SMOOTHING = 0.1  # weight of the newest interval in each kind's moving average of seconds a draw
DECIDED = 4096   # coin values whose decision is remembered (replays and shrinks are of recent draws)


class TimeBalance:
    """The odds of a fresh draw that give fresh draws about `share` of the search's time: with t_f and t_p the
    moving averages of the seconds from a fresh and from a pinned draw to the next draw (the case run, graded and
    what Hypothesis does between), fresh draws take share s of the time at odds s t_p / (s t_p + (1 - s) t_f), held
    within [LEAST_FRESH, most] (most: the fixed share's 1 - compiled_share). Each coin value keeps the decision of its
    first use. `clock` is time.perf_counter, or a test's."""

    def __init__(self, share: float, most: float, clock: Callable[[], float] = time.perf_counter):
        self.share, self.most, self.clock = share, most, clock
        self.fresh_measured = MEASURED_FRESH   # fresh draws timed before the odds move
        self.mean = {True: 0.0, False: 0.0}   # fresh? -> moving average of a draw's seconds
        self.timed = {True: 0, False: 0}
        self.fresh_seconds = self.pinned_seconds = 0.0   # every timed interval, for reports and tests
        self._last: tuple[bool, float] | None = None
        self._decided: OrderedDict[int, bool] = OrderedDict()

    def odds(self) -> float:
        """The probability of a fresh draw now."""
        if self.timed[True] < self.fresh_measured or self.timed[False] < MEASURED:
            return self.most
        s, t_f, t_p = self.share, self.mean[True], self.mean[False]
        balanced = s * t_p / (s * t_p + (1 - s) * t_f) if t_f > 0 else self.most
        return min(self.most, max(LEAST_FRESH, balanced))

    def fresh(self, coin: int) -> bool:
        """Whether the coin value `coin` (0 .. COIN - 1; 0 is fresh) draws fresh: decided at its first use."""
        if coin not in self._decided:
            self._decided[coin] = coin < max(1, round(self.odds() * COIN))
            if len(self._decided) > DECIDED:
                self._decided.popitem(last=False)
        return self._decided[coin]

    def drawn(self, fresh: bool) -> None:
        """A draw of this kind now: the time since the last draw is the last draw's."""
        now = self.clock()
        if self._last is not None:
            kind, then = self._last
            seconds = now - then
            self.mean[kind] = seconds if not self.timed[kind] else self.mean[kind] + SMOOTHING * (
                seconds - self.mean[kind])
            self.timed[kind] += 1
            if kind:
                self.fresh_seconds += seconds
            else:
                self.pinned_seconds += seconds
        self._last = (fresh, now)

    def pause(self) -> None:
        """Time nothing until the next draw (a search ends, or shrinks a failure: its steps are not the search's)."""
        self._last = None


class CompiledConfigs:
    """The compile keys a backend has met in this process, in order, each with the first case that met it. `closed`:
    a fresh draw of a key not among them is invalid (a failure is being shrunk: the module docstring)."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []
        self.cases: list[Case] = []
        self._index: dict[tuple, int] = {}
        self._named: dict[int, int | None] = {}
        self.closed = False
        self.balance: TimeBalance | None = None   # kept across the searches of a process, as the keys are

    def balanced(self, share: float, most: float) -> TimeBalance:
        """This process's TimeBalance for a time share `share` (made at the first search that asks for one)."""
        if self.balance is None or self.balance.share != share:
            self.balance = TimeBalance(share, most)
        self.balance.most = most
        return self.balance

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key) -> bool:
        return key in self._index

    def named(self, choice: int) -> int | None:
        """The configuration an index choice names, fixed at the choice's first use (so one choice sequence means one
        case for the rest of the process, as Hypothesis's replays and shrinks need): choice % count then, so 0 names
        the first one compiled; None (a fresh draw) where nothing was compiled yet."""
        if choice not in self._named:
            self._named[choice] = choice % len(self.keys) if self.keys else None
        return self._named[choice]

    def add(self, key: tuple, case: Case) -> bool:
        """Record `key` with `case` as its first case; False when the key was known already."""
        if key in self._index:
            return False
        self._index[key] = len(self.keys)
        self.keys.append(key)
        self.cases.append(case)
        return True


def _lens(full: int, b: int, drawn, pinned):
    """Per-sequence lengths present exactly where the configuration's case has them (varlen is a compile choice)."""
    if pinned is None:
        return None
    return drawn if drawn is not None else (full,) * b


def runtime_groups(pinned: Case, drawn: Case, salt: int = 0) -> list[dict]:
    """The runtime fields of `drawn`, as changes to `pinned`, one group at a time (see the module docstring); the
    seed is drawn's XOR `salt`, which the draw makes from the index choice and all of `drawn`: two draws that differ
    only in choices pinning overrides (drawn's dtype, head dims, ...; index choices naming one configuration) draw
    other values instead of one case twice (with drawn's seed alone, 18 % of a stand-in's cases repeated an earlier
    one, against 1.3 % for plain search). A pinned failure's seed is therefore not shrunk to 0."""
    heads = {"hk": drawn.hk, "h": drawn.hk * (pinned.h // pinned.hk)}
    if pinned.alibi_slopes is not None:
        heads["alibi_slopes"] = alibi_slopes(heads["h"])
    band = {"window": drawn.window, "alignment": drawn.alignment, "scale": drawn.scale}
    if pinned.softcap is not None and drawn.softcap is not None:
        band["softcap"] = drawn.softcap
    if pinned.mask_density is not None and drawn.mask_density is not None:
        band["mask_density"] = drawn.mask_density
    return [
        {"seed": drawn.seed ^ salt, "values": drawn.values, "mean": drawn.mean, "std": drawn.std},
        {"b": drawn.b, "sq": drawn.sq, "skv": drawn.skv,
         "seqlens_q": _lens(drawn.sq, drawn.b, drawn.seqlens_q, pinned.seqlens_q),
         "seqlens_kv": _lens(drawn.skv, drawn.b, drawn.seqlens_kv, pinned.seqlens_kv),
         "shared_prefix_pages": drawn.shared_prefix_pages if pinned.paged and drawn.paged else 0},
        heads,
        band,
        {"spelling": drawn.spelling},
    ]


def pin(pinned: Case, drawn: Case, key: tuple, fits: Callable[[Case, tuple], bool], max_work: int,
        salt: int = 0) -> Case:
    """`pinned` with each group of `drawn`'s runtime fields that keeps it a case of `key` the backend takes, and
    within `max_work` (the space's bound on the oracle's cost: the drawn lengths with the configuration's head dims
    could pass it) or no costlier than the costlier of the two."""
    case, most = pinned, max(work(pinned), work(drawn), max_work)
    for changes in runtime_groups(pinned, drawn, salt):
        try:
            candidate = case.replace(**changes)
        except ValueError:  # the group breaks a rule of the case language here (seqlens of another batch, ...)
            continue
        if work(candidate) <= most and fits(candidate, key):
            case = candidate
    return case


class _CompileAware(st.SearchStrategy[Case]):
    def __init__(self, drawn, configs: CompiledConfigs, key_of, takes, share: float, max_work: int,
                 time_share: float | None = None):
        super().__init__()
        self.drawn, self.configs, self.key_of, self.takes, self.share = drawn, configs, key_of, takes, share
        self.max_work = max_work
        self.balance = None if time_share is None else configs.balanced(time_share, 1 - share)

    def fits(self, case: Case, key: tuple) -> bool:
        return self.takes(case) and self.key_of(case) == key

    def do_draw(self, data) -> Case:
        # the coin, the index and the case are drawn with the same bounds whatever was compiled: Hypothesis requires
        # one layout of choices for one prefix
        if self.balance is None:
            choice = _uniform_from(data, 0, INDEXES - 1) if data.draw_boolean(self.share) else None
        else:   # the coin's meaning moves with the balance, so the index is drawn either way
            coin, choice = _uniform_from(data, 0, COIN - 1), _uniform_from(data, 0, INDEXES - 1)
            choice = None if self.balance.fresh(coin) else choice
        index = None if choice is None else self.configs.named(choice)
        if self.balance is not None and self.configs.closed:   # a shrink's steps are not the search's
            self.balance.pause()
        elif self.balance is not None:
            self.balance.drawn(fresh=index is None)
        case = data.draw(self.drawn)
        if index is not None:  # the salt: every choice of the draw, the ones pinning overrides too (see runtime_groups)
            salt = choice ^ zlib.crc32(case.replace(seed=0).to_json().encode())
            case = pin(self.configs.cases[index], case, self.configs.keys[index], self.fits, self.max_work, salt)
        elif self.takes(case):  # a fresh case the backend runs: its key is compiled from now on
            key = self.key_of(case)
            if key is not None and key not in self.configs:
                if self.configs.closed:
                    data.mark_invalid("a kernel configuration not compiled, while a failure is being shrunk")
                self.configs.add(key, case)
        return case


def compile_aware(drawn: st.SearchStrategy[Case], configs: CompiledConfigs, key_of: Callable[[Case], tuple | None],
                  takes: Callable[[Case], bool], share: float, max_work: int,
                  time_share: float | None = None) -> st.SearchStrategy[Case]:
    """`drawn`, with a share `share` of its draws pinned to configurations in `configs` (filled as fresh draws meet new
    keys). `key_of` is the backend's compile key, `takes` says whether the backend takes a case (no refusal, within
    the space's work bound). With `time_share`, fresh draws get about that share of the time instead (TimeBalance),
    and at most 1 - `share` of the draws."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"compile_aware: invalid share={share!r}: a probability in [0, 1) (1 would never draw a "
                         f"fresh configuration)")

    return _CompileAware(drawn, configs, key_of, takes, share, max_work, time_share)
