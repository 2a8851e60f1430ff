"""Hypothesis strategies that draw valid Cases by construction, weighted toward where kernels break.

Only shapes, switches and a seed are drawn, never tensor elements, so shrinking is fast: it walks every integer
toward its minimum and every choice toward its first option, which is the simplest one (b = 1, one head, the
shortest lengths, float16, vanilla softmax, no mask, contiguous bshd).
"""

from __future__ import annotations

import math
from functools import lru_cache

from hypothesis import strategies as st

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import HEAD_DIMS, ODD_HEAD_DIMS, Space

TILES = (16, 32, 64, 128, 256)
HEAD_DIM_PAIRS = {192: 128, 64: 512}   # d_qk -> a d_v that kernels special-case (MLA-style 192 / 128, 64 / 512)
WIDE_ONE_IN = 5        # one head dim in 5 is above 128, where the Space has such
SMALL_LEN = 160        # the everyday cases' longest length: below it, cases are cheap enough to draw in thousands
LONG_ONE_IN = 10       # one case in 10 takes its lengths from the ladder, a decode shape or a tall shape
DECODE_MIN_KEYS = 512  # decode shapes: 1..DECODE_MAX_QUERIES queries over at least this many keys
DECODE_MAX_QUERIES = 16
# Long lengths are weighted toward tile residues, where a kernel's last tile is partial: (tile, residue) pairs
RESIDUES = ((128, 64), (64, 1), (64, 0), (64, 63), (128, 1), (128, 127), (256, 128))


def _tile_edges(max_len: int) -> list[int]:
    edges = sorted({n for t in TILES for n in (t - 1, t, t + 1) if 1 <= n <= max_len})
    return edges or [1]


def _source(draw):
    """The choices behind a composite's `draw` (st.composite hands it the bound draw method of its ConjectureData).
    Coins, integers and lengths are drawn from it directly, as single choices in no span of their own: Hypothesis's
    mutator copies one span's choices onto another span of the same label, so lengths and coins drawn through
    strategies of their own came out equal far more often than drawn (79 % square shapes against 69 %, causal 27 %
    against 33 %, bench/distribution.py)."""
    return draw.__self__


def coin(draw, one_in: int) -> bool:
    """True once in `one_in` draws, as one weighted boolean choice: an index drawn from range(n) would give n - 1
    choices that all mean False, and Hypothesis, which never repeats a choice sequence but does not know they alias,
    drew the same case again through them (a third of a run's cases, measured). Shrinks to False."""
    return _source(draw).draw_boolean(1 / one_in)


def _uniform_from(data, lo: int, hi: int) -> int:
    span, value = hi - lo, 0
    place = 256 ** max(0, (span.bit_length() - 1) // 8)
    while place >= 1:
        value += data.draw_integer(0, min(255, (span - value) // place)) * place  # digits that keep value <= span
        place //= 256
    return lo + value


def uniform(draw, lo: int, hi: int) -> int:
    """lo..hi uniformly. Hypothesis draws an integer uniformly only within 256 of its minimum and from a heavy tail
    beyond (an index into 2,000 lengths landed below 256 most of the time), so a wider range is drawn in base-256
    digits, the most significant first: shrinking lowers the high digit, then the low ones, toward lo. A choice even
    where lo == hi: Hypothesis ranks a case by its number of choices before their values, so a draw that vanished
    when its room shrank would make the case with more room (b and h, as the lengths shrink) rank larger and stop the
    shrink (576 keys where 64 fail)."""
    return _uniform_from(_source(draw), lo, hi)


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


@lru_cache(maxsize=None)
def _short_weights(max_len: int) -> dict[int, float] | None:
    edges = [e for e in _tile_edges(max_len) if e != 1]
    return {1: 0.25, **{e: 0.25 / len(edges) for e in edges}} if max_len > 1 and edges else None


def _short_from(data, max_len: int) -> int:
    return data.draw_integer(1, max_len, weights=_short_weights(max_len)) if max_len > 1 else 1


def short_length(draw, max_len: int) -> int:
    """1..max_len as one integer choice, weighted in Hypothesis's own draw: 1 a quarter of the time, a tile size +-1
    a quarter, else uniform. One choice (no list with repeats, whose aliases Hypothesis would draw as new cases, nor a
    branch: a length picked among the tile edges could not shrink below the smallest edge), so shrinking walks it down
    through every length to the smallest that still fails."""
    return _short_from(_source(draw), max_len)


class _ShortLength(st.SearchStrategy[int]):
    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len

    def do_draw(self, data) -> int:
        return _short_from(data, self.max_len)


@lru_cache(maxsize=None)
def lengths(max_len: int) -> st.SearchStrategy[int]:
    """short_length as a strategy."""
    return _ShortLength(max_len)


@lru_cache(maxsize=None)
def _octaves(lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """lo..hi cut at powers of two: an octave drawn uniformly makes the length log-uniform."""
    cuts = [lo] + [1 << k for k in range(1, hi.bit_length() + 1) if lo < 1 << k <= hi]
    return tuple((a, b - 1) for a, b in zip(cuts, cuts[1:] + [hi + 1]))


def ladder_length(draw, lo: int, hi: int) -> int:
    """A length in lo..hi, log-uniform (an octave, then a length in it), a tile residue half the time (L % 128 = 64,
    L % 64 = 1, ...: RESIDUES). Shrinks to a lower octave, then to the octave's smallest length that still fails."""
    a, b = pick(draw, _octaves(lo, hi))
    if coin(draw, 2):
        tile, residue = pick(draw, RESIDUES)
        first, last = -(-(a - residue) // tile), (b - residue) // tile
        if first <= last:
            return uniform(draw, first, last) * tile + residue
    return uniform(draw, a, b)


def _lengths(draw, space: Space) -> tuple[int, int]:
    """(sq, skv). Most cases: short lengths (up to SMALL_LEN), sq == skv half the time. One in LONG_ONE_IN, where
    space.max_len exceeds SMALL_LEN: a ladder shape (log-uniform up to max_len), a decode shape (1..16 queries over
    DECODE_MIN_KEYS..max_decode_len keys) or a tall one (sq >= 8 skv). Shrinks toward the short cases."""
    short = min(space.max_len, SMALL_LEN)
    kinds = _long_kinds(space)
    if kinds and coin(draw, LONG_ONE_IN):
        kind = pick(draw, kinds)
        if kind == "decode":
            return uniform(draw, 1, DECODE_MAX_QUERIES), ladder_length(draw, DECODE_MIN_KEYS, space.decode_len)
        if kind == "tall":
            sq = ladder_length(draw, short + 1, space.max_len)
            return sq, ladder_length(draw, 1, sq // 8)
        sq = ladder_length(draw, 1, space.max_len)
        return sq, (sq if coin(draw, 2) else ladder_length(draw, 1, space.max_len))
    sq = short_length(draw, short)
    # sq == skv half the time; shrinking goes toward independent lengths, so each can reach its own minimum
    return sq, (sq if coin(draw, 2) else short_length(draw, short))


@lru_cache(maxsize=None)
def _long_kinds(space: Space) -> tuple[str, ...]:
    if space.max_len <= SMALL_LEN:
        return ()
    return ("ladder", "tall") + (("decode",) if space.decode_len >= DECODE_MIN_KEYS else ())


def pick(draw, options: tuple):
    """One of `options`, uniformly, without building a strategy per call (for options that depend on what was
    drawn before), as one choice however many options there are (see uniform). Shrinks toward the first."""
    return options[uniform(draw, 0, len(options) - 1)]


def _either(draw, branches: tuple[st.SearchStrategy, ...]):
    """A value of one of `branches`, drawn as st.one_of draws it (the branch's index, then the branch), without the
    filtered strategy one_of builds on every draw (three times the cost of a plain draw)."""
    return draw(pick(draw, branches))


@lru_cache(maxsize=None)
def _head_dim_lists(space: Space) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The head dims the space draws, up to max_head_dim and among space.head_dims where the backend named them
    (narrow_to): the usual and the odd ones up to 128 (those of the two lists that are not empty), and those above."""
    takes = (lambda d: d <= space.max_head_dim and (space.head_dims is None or d in space.head_dims))
    usual = tuple(d for d in HEAD_DIMS if takes(d) and d <= 128)
    odd = tuple(d for d in ODD_HEAD_DIMS if takes(d) and d <= 128)
    wide = tuple(sorted(d for d in {*HEAD_DIMS, *ODD_HEAD_DIMS} if takes(d) and d > 128))
    narrow = tuple(dims for dims in (usual, odd) if dims)
    if not narrow and not wide:
        return ((tuple(sorted(space.head_dims or ())[:1]) or (min(space.max_head_dim, HEAD_DIMS[-1]),)),), ()
    return narrow or (wide,), wide if narrow else ()


def _one_head_dim(draw, space: Space, room: int) -> int:
    """Above 128 one time in WIDE_ONE_IN (where the space has such), else usual or odd; no larger than `room` (the
    smallest one where none fits). The list is picked before the coin, so a shrink to a narrow head dim does not
    add a choice (see uniform)."""
    narrow, wide = _head_dim_lists(space)
    options = pick(draw, narrow)
    options = wide if wide and coin(draw, WIDE_ONE_IN) else options
    return pick(draw, tuple(d for d in options if d <= room) or (min(options),))


def _head_dim(draw, space: Space, room: int, d_qk: int | None = None) -> int:
    """d_qk (`d_qk` None), or d_v: the same as d_qk, another one, or d_qk's special partner (HEAD_DIM_PAIRS) where
    the space has it."""
    if d_qk is None:
        return _one_head_dim(draw, space, room)
    partner = HEAD_DIM_PAIRS.get(d_qk)
    narrow, wide = _head_dim_lists(space)
    partner = partner if partner in wide or any(partner in dims for dims in narrow) else None
    branch = pick(draw, (0, 1, 2) if partner is not None else (0, 1))
    if branch == 1:
        return _one_head_dim(draw, space, room)
    return partner if branch == 2 and partner <= room else d_qk


@lru_cache(maxsize=None)
def _bound_branches(seq: int) -> tuple[st.SearchStrategy[int | None], ...]:
    """A window bound: unbounded, 0, small, or at / past the sequence length."""
    return st.none(), st.just(0), st.integers(1, 8), st.sampled_from([max(seq - 1, 0), seq, seq + 7])


def _sometimes(draw, one_in: int) -> bool:
    """True once in `one_in` draws (coin); shrinks to False, so a shrunk case keeps only the features it needs."""
    return coin(draw, one_in)


def _seqlens(draw, b: int, full: int) -> tuple[int, ...]:
    """Per-sequence valid lengths: full, or anything down to 0 (an empty sequence)."""
    return tuple(_either(draw, _full_or_less(full)) for _ in range(b))


@lru_cache(maxsize=None)
def _full_or_less(full: int) -> tuple[st.SearchStrategy[int], ...]:
    return st.just(full), st.integers(0, full)


@st.composite
def attention_cases(draw, space: Space = Space()) -> Case:
    """Valid Cases drawn from `space`. Generates every field of the case language the space allows: batch and
    lengths (tile edges, sq != skv both ways, sq = 1), GQA / MQA ratios, head dims (odd ones too, d_qk != d_v),
    dtypes, causal masks at both alignments, sliding windows (0, small, larger than the sequence), padding and
    packed layouts, explicit boolean masks, softcap, ALiBi, softmax sinks, memory formats, extreme logit scales and
    gradients. Shrinks toward the smallest, plainest case that still fails."""
    sq, skv = _lengths(draw, space)
    # Head dims, then batch and heads, within space.max_work multiply-adds (b * h * sq * skv * (d_qk + d_v)): the
    # float64 oracle's cost, which a long case would otherwise multiply by thousands
    room = max(1, space.max_work // (sq * skv))
    d_qk = _head_dim(draw, space, room // 2)
    d_v = _head_dim(draw, space, room - d_qk, d_qk) if space.split_head_dims else d_qk
    room = max(1, room // (d_qk + d_v))
    b = uniform(draw, 1, max(1, min(space.max_batch, room)))
    heads = max(1, min(space.max_heads, room // b))
    if space.gqa:
        hk = uniform(draw, 1, max(1, heads // 2))
        group = pick(draw, tuple(g for g in (1, 2, 3, 4, 8) if hk * g <= heads) or (1,))
        h = hk * group
    else:
        h = hk = uniform(draw, 1, heads)
    dtype = draw(_one_of(tuple(space.dtypes)))
    layout = draw(_one_of(tuple(space.layouts)))

    if layout == "thd" or (space.padding and _sometimes(draw, 4)):
        seqlens_q = _seqlens(draw, b, sq)
        seqlens_kv = _seqlens(draw, b, skv)
    else:
        seqlens_q = seqlens_kv = None

    causal = space.causal and _sometimes(draw, 3)
    window: tuple[int | None, int | None] = (None, None)
    if space.windows and _sometimes(draw, 4):
        left = _either(draw, _bound_branches(skv))
        window = (left, None if causal else _either(draw, _bound_branches(skv)))
    alignment = draw(_one_of(tuple(space.alignments)))
    mask_density = None
    if space.explicit_mask and _sometimes(draw, 8):
        mask_density = draw(_one_of((0.5, 0.9, 0.1, 0.0, 1.0)))

    scale = None
    if space.custom_scale and _sometimes(draw, 6):
        scale = draw(_one_of((1.0, 0.5 / math.sqrt(d_qk), 2.0 / math.sqrt(d_qk), 0.01)))
    softcap = draw(_one_of((5.0, 30.0, 0.5))) if space.softcap and _sometimes(draw, 6) else None
    alibi = None
    if space.alibi and _sometimes(draw, 6):
        alibi = tuple(2.0 ** (-8.0 * (i + 1) / h) for i in range(h))
    softmax = draw(_one_of(tuple(space.softmaxes)))
    memory = draw(_one_of(tuple(m for m in space.memory if m != "expanded_kv" or hk > 1) or ("contiguous",)))

    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if space.extreme_logits and _sometimes(draw, 5):
        qk_std = draw(_one_of((0.01, 4.0, 10.0)))
        std = (qk_std, qk_std, draw(_one_of((1.0, 0.001, 100.0))))
        mean = (0.0, draw(_one_of((0.0, 3.0))), 0.0)
    grads = space.grads and _sometimes(draw, 4)
    seed = draw(_ints(0, 2**32 - 1))
    # Probes one case in five: enough to meet every band, padding and GQA shape often, and few enough that the
    # random values keep testing weights and rounding. Drawn last, so every other field of a stream is as before;
    # shrinks toward "gaussian", so a probe case stays one only when the failure needs it.
    values = "probe" if space.probes and _sometimes(draw, 5) else "gaussian"
    return Case(b=b, sq=sq, skv=skv, h=h, hk=hk, d_qk=d_qk, d_v=d_v, dtype=dtype, seqlens_q=seqlens_q,
                seqlens_kv=seqlens_kv, causal=causal, window=window, alignment=alignment, mask_density=mask_density,
                scale=scale, softcap=softcap, alibi_slopes=alibi, softmax=softmax, layout=layout, memory=memory,
                mean=mean, std=std, seed=seed, grads=grads, values=values)
