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
SMALL_LEN = 160        # the everyday cases' longest length: below it, cases are cheap enough to draw in thousands
LONG_ONE_IN = 10       # one case in 10 takes its lengths from the ladder, a decode shape or a tall shape
DECODE_MIN_KEYS = 512  # decode shapes: 1..DECODE_MAX_QUERIES queries over at least this many keys
DECODE_MAX_QUERIES = 16
# Long lengths are weighted toward tile residues, where a kernel's last tile is partial: (tile, residue) pairs
RESIDUES = ((128, 64), (64, 1), (64, 0), (64, 63), (128, 1), (128, 127), (256, 128))


def _tile_edges(max_len: int) -> list[int]:
    edges = sorted({n for t in TILES for n in (t - 1, t, t + 1) if 1 <= n <= max_len})
    return edges or [1]


class _Flag(st.SearchStrategy[bool]):
    """True with probability `p`, as one boolean choice (Hypothesis's own weighted coin): an index drawn from
    range(n) gives n - 1 choices that all mean False, and Hypothesis, which never repeats a choice sequence but does
    not know they alias, draws the same case again through them (a third of a run's cases, measured). Shrinks to
    False."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def do_draw(self, data) -> bool:
        return data.draw_boolean(self.p)


class _Uniform(st.SearchStrategy[int]):
    """lo..hi uniformly. Hypothesis draws an integer uniformly only within 256 of its minimum and from a heavy tail
    beyond (an index into 2,000 lengths landed below 256 most of the time), so a wider range is drawn in base-256
    digits, the most significant first: shrinking lowers the high digit, then the low ones, toward lo."""

    def __init__(self, lo: int, hi: int):
        super().__init__()
        self.lo, self.hi = lo, hi

    def do_draw(self, data) -> int:
        span = self.hi - self.lo
        value, place = 0, 256 ** max(0, (span.bit_length() - 1) // 8)
        while place >= 1:
            top = min(255, (span - value) // place)  # digits that keep value <= span
            value += data.draw_integer(0, top) * place
            place //= 256
        return self.lo + value


@lru_cache(maxsize=None)
def _flag(one_in: int) -> st.SearchStrategy[bool]:
    return _Flag(1 / one_in)


@lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """lo..hi uniformly (see _Uniform). A choice even where lo == hi: Hypothesis ranks a case by its number of
    choices before their values, so a draw that vanished when the room for it shrank would make a longer case, whose
    extra choices return as the lengths shrink (b and h have more room), rank as larger and stop the shrink (576 keys
    where 64 fail)."""
    return _Uniform(lo, hi)


@lru_cache(maxsize=None)
def _one_of(options: tuple) -> st.SearchStrategy:
    return st.sampled_from(options)


@lru_cache(maxsize=None)
def _edges(max_len: int) -> tuple[int, ...]:
    return tuple(_tile_edges(max_len))


def short_length(draw, max_len: int) -> int:
    """A length up to max_len: 1 a quarter of the time, a tile size +-1 a quarter, else uniform. Each weight is one
    choice of its own (no list with repeats, whose aliases Hypothesis would draw as new cases); shrinking drops the
    weights, and the uniform draw walks down to the smallest length that still fails."""
    if draw(_flag(4)):
        return 1
    if draw(_flag(3)):
        return pick(draw, _edges(max_len))
    return draw(_ints(1, max_len))


@lru_cache(maxsize=None)
def lengths(max_len: int) -> st.SearchStrategy[int]:
    """short_length as a strategy."""
    return st.composite(lambda draw: short_length(draw, max_len))()


@lru_cache(maxsize=None)
def _octaves(lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """lo..hi cut at powers of two: an octave drawn uniformly makes the length log-uniform."""
    cuts = [lo] + [1 << k for k in range(1, hi.bit_length() + 1) if lo < 1 << k <= hi]
    return tuple((a, b - 1) for a, b in zip(cuts, cuts[1:] + [hi + 1]))


def ladder_length(draw, lo: int, hi: int) -> int:
    """A length in lo..hi, log-uniform (an octave, then a length in it), a tile residue half the time (L % 128 = 64,
    L % 64 = 1, ...: RESIDUES). Shrinks to a lower octave, then to the octave's smallest length that still fails."""
    a, b = pick(draw, _octaves(lo, hi))
    if draw(_flag(2)):
        tile, residue = pick(draw, RESIDUES)
        first, last = -(-(a - residue) // tile), (b - residue) // tile
        if first <= last:
            return draw(_ints(first, last)) * tile + residue
    return draw(_ints(a, b))


def _lengths(draw, space: Space) -> tuple[int, int]:
    """(sq, skv). Most cases: short lengths (up to SMALL_LEN), sq == skv half the time. One in LONG_ONE_IN, where
    space.max_len exceeds SMALL_LEN: a ladder shape (log-uniform up to max_len), a decode shape (1..16 queries over
    DECODE_MIN_KEYS..max_decode_len keys) or a tall one (sq >= 8 skv). Shrinks toward the short cases."""
    short = min(space.max_len, SMALL_LEN)
    kinds = _long_kinds(space)
    if kinds and draw(_flag(LONG_ONE_IN)):
        kind = pick(draw, kinds)
        if kind == "decode":
            return draw(_ints(1, DECODE_MAX_QUERIES)), ladder_length(draw, DECODE_MIN_KEYS, space.decode_len)
        if kind == "tall":
            sq = ladder_length(draw, short + 1, space.max_len)
            return sq, ladder_length(draw, 1, sq // 8)
        sq = ladder_length(draw, 1, space.max_len)
        return sq, (sq if draw(_flag(2)) else ladder_length(draw, 1, space.max_len))
    sq = short_length(draw, short)
    # sq == skv half the time; shrinking goes toward independent lengths, so each can reach its own minimum
    return sq, (sq if draw(_flag(2)) else short_length(draw, short))


@lru_cache(maxsize=None)
def _long_kinds(space: Space) -> tuple[str, ...]:
    if space.max_len <= SMALL_LEN:
        return ()
    return ("ladder", "tall") + (("decode",) if space.decode_len >= DECODE_MIN_KEYS else ())


def pick(draw, options: tuple):
    """One of `options`, uniformly, without building a strategy per call (for options that depend on what was
    drawn before), as one choice however many options there are (see _ints). Shrinks toward the first."""
    return options[draw(_index(len(options)))]


@lru_cache(maxsize=None)
def _index(n: int) -> st.SearchStrategy[int]:
    """0..n-1 uniformly."""
    return _ints(0, n - 1)


def _either(draw, branches: tuple[st.SearchStrategy, ...]):
    """A value of one of `branches`, drawn as st.one_of draws it (the branch's index, then the branch), without the
    filtered strategy one_of builds on every draw (three times the cost of a plain draw)."""
    return draw(pick(draw, branches))


@lru_cache(maxsize=None)
def _head_dim_lists(space: Space) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The usual and the odd head dims the space draws: up to max_head_dim, among space.head_dims where the backend
    named them (narrow_to)."""
    takes = (lambda d: d <= space.max_head_dim and (space.head_dims is None or d in space.head_dims))
    usual = tuple(d for d in HEAD_DIMS if takes(d))
    odd = tuple(d for d in ODD_HEAD_DIMS if takes(d))
    fallback = tuple(sorted(space.head_dims or ())[:1]) or (min(space.max_head_dim, HEAD_DIMS[-1]),)
    return usual or odd or fallback, odd or usual or fallback


def _head_dim(draw, space: Space, room: int, d_qk: int | None = None) -> int:
    """A head dim of the space no larger than `room` (the smallest one where none fits): usual or odd, and for d_v
    (`d_qk` given) the same as d_qk half the time, or its special partner (HEAD_DIM_PAIRS) where it has one."""
    if d_qk is not None:
        partner = HEAD_DIM_PAIRS.get(d_qk)
        partner = partner if partner in _head_dim_lists(space)[0] + _head_dim_lists(space)[1] else None
        branch = pick(draw, (0, 1, 2) + ((3,) if partner is not None else ()))
        if branch == 0 or (branch == 3 and partner > room):
            return d_qk
        if branch == 3:
            return partner
        options = _head_dim_lists(space)[branch - 1]
    else:
        options = _head_dim_lists(space)[pick(draw, (0, 1))]
    fits = tuple(d for d in options if d <= room) or (min(options),)
    return pick(draw, fits)


@lru_cache(maxsize=None)
def _bound_branches(seq: int) -> tuple[st.SearchStrategy[int | None], ...]:
    """A window bound: unbounded, 0, small, or at / past the sequence length."""
    return st.none(), st.just(0), st.integers(1, 8), st.sampled_from([max(seq - 1, 0), seq, seq + 7])


def _sometimes(draw, one_in: int) -> bool:
    """True once in `one_in` draws, as one weighted boolean choice (_Flag); shrinks to False, so a shrunk case keeps
    only the features it needs."""
    return draw(_flag(one_in))


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
    b = draw(_ints(1, max(1, min(space.max_batch, room))))
    heads = max(1, min(space.max_heads, room // b))
    if space.gqa:
        hk = draw(_ints(1, max(1, heads // 2)))
        group = pick(draw, tuple(g for g in (1, 2, 3, 4, 8) if hk * g <= heads) or (1,))
        h = hk * group
    else:
        h = hk = draw(_ints(1, heads))
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
