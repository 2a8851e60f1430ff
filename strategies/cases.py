"""Hypothesis strategies that draw valid Cases by construction, weighted toward where kernels break.

Only shapes, switches and a seed are drawn, never tensor elements, so shrinking is fast: it walks every integer
toward its minimum and every choice toward its first option, which is the simplest one (b = 1, one head, the
shortest lengths, float16, vanilla softmax, no mask, contiguous bshd).
"""

from __future__ import annotations

import math
from functools import lru_cache

from hypothesis import strategies as st

from attnfuzz.strategies.case import FAMILIES, PLAIN_STORAGE, Case
from attnfuzz.strategies.space import HEAD_DIMS, ODD_HEAD_DIMS, Space

_NO_SINK_FAMILIES = tuple(f for f in FAMILIES if f != "large_sink")
TILES = (16, 32, 64, 128, 256)
HEAD_DIM_PAIRS = {192: 128, 64: 512}   # d_qk -> a d_v that kernels special-case (MLA-style 192 / 128, 64 / 512)
WIDE_ONE_IN = 5        # one head dim in 5 is above 128, where the Space has such
SCORE_COST = 32        # a score's mask, exp and softmax cost the oracle about as much as 20-30 multiply-adds of
#                        its dot products (CPU, float64: 1.2 us a score at d = 3, 60 ns a multiply-add at d = 512)
SMALL_LEN = 160        # the everyday cases' longest length: below it, cases are cheap enough to draw in thousands
STORAGE_ONE_IN = 6     # one bshd case without a paged cache in 6 lays q, k, v out in drawn buffers (Case.storage)
DECODE_MIN_KEYS = 512  # decode shapes: 1..DECODE_MAX_QUERIES queries over at least this many keys
DECODE_MAX_QUERIES = 16
SOFTCAPS = (5.0, 30.0, 0.5)  # the softcaps drawn; shrinks toward the first
# Long lengths are weighted toward tile residues, where a kernel's last tile is partial: (tile, residue) pairs
RESIDUES = ((128, 64), (64, 1), (64, 0), (64, 63), (128, 1), (128, 127), (256, 128))


def _tile_edges(max_len: int) -> list[int]:
    edges = sorted({n for t in TILES for n in (t - 1, t, t + 1) if 1 <= n <= max_len})
    return edges or [1]


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


def coin(draw, one_in: int) -> bool:
    """True once in `one_in` draws, as one weighted boolean choice: an index drawn from range(n) would give n - 1
    choices that all mean False, and Hypothesis, which never repeats a choice sequence but does not know they alias,
    drew the same case again through them (a third of a run's cases, measured). Shrinks to False."""
    with _span(_source(draw)) as data:
        return data.draw_boolean(1 / one_in)


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
    with _span(_source(draw)) as data:
        return _short_from(data, max_len)


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
    """lo..hi cut at powers of two: an octave drawn uniformly makes the length log-uniform. hi joins the octave
    below it (no octave of one length, from which a shrink could not step down to a length of the next one)."""
    cuts = [lo] + [1 << k for k in range(1, hi.bit_length() + 1) if lo < 1 << k < hi]
    return tuple((a, b - 1) for a, b in zip(cuts, cuts[1:] + [hi + 1]))


def ladder_length(draw, lo: int, hi: int) -> int:
    """A length in lo..hi, log-uniform (an octave, then a length in it), moved up to a tile residue half the time
    (L % 128 = 64, L % 64 = 1, ...: RESIDUES). Every octave draws its length with as many choices as the widest one,
    and the residue is drawn either way, so shrinking can lower the octave, walk the length down, and drop the residue
    (the coin comes last: dropped before the length is walked down, it leaves a length that still fails more often;
    measured with hypothesis.find on 24 shrinks, 15 reached the smallest length against 9 to 11 for other orders)."""
    with _span(_source(draw)):
        a, b = pick(draw, _octaves(lo, hi))
        tile, residue = pick(draw, RESIDUES)
        n = uniform(draw, a, b, _digits(hi - lo))
        snap = coin(draw, 2)
    if snap:
        up = n + (residue - n) % tile
        n = up if up <= b else up - tile if up - tile >= a else n
    return n


def _lengths(draw, space: Space) -> tuple[int, int]:
    """(sq, skv). Most cases: short lengths (up to SMALL_LEN), sq == skv half the time. One in space.long_one_in,
    where space.max_len exceeds SMALL_LEN: a ladder shape (log-uniform up to max_len), a decode shape (1..16 queries
    over DECODE_MIN_KEYS..max_decode_len keys) or a tall one (sq >= 8 skv). Keys stop where even one head of the
    narrowest head dims would pass space.max_work (on a CPU, squares up to about 700). Shrinks toward the short
    cases."""
    short = min(space.max_len, SMALL_LEN)
    kinds = _long_kinds(space)
    if kinds and coin(draw, space.long_one_in):
        kind = pick(draw, kinds)
        if kind == "decode":
            sq = uniform(draw, 1, DECODE_MAX_QUERIES)
            return sq, ladder_length(draw, DECODE_MIN_KEYS, max(DECODE_MIN_KEYS, _keys(space, sq, space.decode_len)))
        if kind == "tall":
            sq = ladder_length(draw, short + 1, space.max_len)
            return sq, ladder_length(draw, 1, _keys(space, sq, sq // 8))
        sq = ladder_length(draw, 1, space.max_len)
        keys = _keys(space, sq, space.max_len)
        return sq, (sq if coin(draw, 2) and sq <= keys else ladder_length(draw, 1, keys))
    sq = short_length(draw, short)
    # sq == skv half the time; shrinking goes toward independent lengths, so each can reach its own minimum
    return sq, (sq if coin(draw, 2) else short_length(draw, short))


def _keys(space: Space, sq: int, most: int) -> int:
    """The most keys, up to `most`, that sq queries may have within space.max_work (one head, head dims of 1)."""
    return max(1, min(most, space.max_work // (sq * (SCORE_COST + 2))))


def work(case: Case) -> int:
    """What the float64 oracle's time grows with, in multiply-adds: b * h * sq * skv * (d_qk + d_v + SCORE_COST)."""
    return case.b * case.h * case.sq * case.skv * (case.d_qk + case.d_v + SCORE_COST)


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
    base = pick(draw, narrow)
    options = wide if wide and coin(draw, WIDE_ONE_IN) else base
    # where no wide one fits the room, the narrow list's (a wide head dim on a long case passed max_work)
    return pick(draw, tuple(d for d in options if d <= room) or tuple(d for d in base if d <= room) or (min(base),))


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


def alibi_slopes(h: int) -> tuple[float, ...]:
    """The ALiBi slopes of h heads: 2^(-8 (i + 1) / h), as ALiBi's paper sets them."""
    return tuple(2.0 ** (-8.0 * (i + 1) / h) for i in range(h))


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
    # Head dims, then batch and heads, within space.max_work (see work()): the float64 oracle's cost, which a long
    # case would otherwise multiply by thousands
    room = max(1, space.max_work // (sq * skv) - SCORE_COST)
    d_qk = _head_dim(draw, space, room // 2)
    d_v = _head_dim(draw, space, room - d_qk, d_qk) if space.split_head_dims else d_qk
    room = max(1, space.max_work // (sq * skv * (d_qk + d_v + SCORE_COST)))
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
    softcap = draw(_one_of(SOFTCAPS)) if space.softcap and _sometimes(draw, 6) else None
    alibi = None
    if space.alibi and _sometimes(draw, 6):
        alibi = alibi_slopes(h)
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
    # A value family (strategies/materialize.py) one non-probe case in four, so a fifth of all cases: split evenly
    # over the six families, 1/30 each; large_sink makes the softmax learnable, the only one it takes (off-by-one's
    # sink is 0 by definition). Drawn after the probe switch, so probe and gaussian cases keep
    # their fields; shrinks toward "gaussian", then toward the first family (far_negative).
    if values == "gaussian" and space.value_families and _sometimes(draw, 4):
        values = pick(draw, FAMILIES if "learnable" in space.softmaxes else _NO_SINK_FAMILIES)
        if values == "large_sink":  # sinks need a learnable softmax: one case in 30, whatever softmax was drawn
            softmax = "learnable"
    page_size, shared = None, 0
    if space.paged and (not space.unpaged or _sometimes(draw, 3)):  # drawn after `values`, the stream's end
        page_size, shared, sq, seqlens_q, seqlens_kv, alignment = _paged(draw, space, b, sq, skv, seqlens_q,
                                                                           seqlens_kv, alignment)
        grads = False
    storage = PLAIN_STORAGE
    if len(space.storages) > 1 and layout == "bshd" and page_size is None and _sometimes(draw, STORAGE_ONE_IN):
        storage = tuple(pick(draw, space.storages) for _ in range(3))   # per tensor; each shrinks toward "plain"
    return Case(b=b, sq=sq, skv=skv, h=h, hk=hk, d_qk=d_qk, d_v=d_v, dtype=dtype, seqlens_q=seqlens_q,
                seqlens_kv=seqlens_kv, causal=causal, window=window, alignment=alignment, mask_density=mask_density,
                scale=scale, softcap=softcap, alibi_slopes=alibi, softmax=softmax, layout=layout, memory=memory,
                mean=mean, std=std, seed=seed, grads=grads, values=values, page_size=page_size,
                shared_prefix_pages=shared, storage=storage)


def _paged(draw, space: Space, b: int, sq: int, skv: int, seqlens_q, seqlens_kv, alignment: str):
    """A paged KV cache for the case drawn so far: a page size (shrinks toward the smallest), cache lengths per
    sequence half the time (serving batches are ragged; lengths at tile edges +-1 are rarely page multiples),
    decode one time in three (1..4 queries, bottom-right aligned at the end of the cache), and half the time
    some leading pages shared by every sequence."""
    page_size = pick(draw, space.page_sizes)
    if seqlens_kv is None and _sometimes(draw, 2):
        seqlens_kv = _seqlens(draw, b, skv)
    if _sometimes(draw, 3):
        sq = draw(_ints(1, min(4, sq)))
        seqlens_q = None if seqlens_q is None else tuple(min(n, sq) for n in seqlens_q)
        alignment = "bottom_right" if "bottom_right" in space.alignments else alignment
    shared = 0
    if b > 1 and skv >= page_size and _sometimes(draw, 2):
        shared = draw(_ints(1, skv // page_size))
    return page_size, shared, sq, seqlens_q, seqlens_kv, alignment
