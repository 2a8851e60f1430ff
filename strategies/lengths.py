"""Lengths: the short everyday ones (weighted toward 1 and tile sizes +-1) and the long shapes (ladder, tall,
decode), log-uniform and moved to tile residues, within what the float64 oracle may cost (Space.max_work)."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from attnfuzz.strategies.case import Case
from attnfuzz.strategies.choices import _span, _source, _digits, coin, pick, uniform
from attnfuzz.strategies.space import Space

TILES = (16, 32, 64, 128, 256)
SCORE_COST = 32        # a score's mask, exp and softmax cost the oracle about as much as 20-30 multiply-adds of
#                        its dot products (CPU, float64: 1.2 us a score at d = 3, 60 ns a multiply-add at d = 512)
SMALL_LEN = 160        # the everyday cases' longest length: below it, cases are cheap enough to draw in thousands
DECODE_MIN_KEYS = 512  # decode shapes: 1..DECODE_MAX_QUERIES queries over at least this many keys
DECODE_MAX_QUERIES = 16
# Long lengths are weighted toward tile residues, where a kernel's last tile is partial: (tile, residue) pairs
RESIDUES = ((128, 64), (64, 1), (64, 0), (64, 63), (128, 1), (128, 127), (256, 128))


def _tile_edges(max_len: int) -> list[int]:
    edges = sorted({n for t in TILES for n in (t - 1, t, t + 1) if 1 <= n <= max_len})
    return edges or [1]


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


def ladder_length(draw, lo: int, hi: int, snap_odds: float = 1.0) -> int:
    """A length in lo..hi, log-uniform (an octave, then a length in it), moved up to a tile residue half the time
    (`snap_odds` times that: Space.long_edge_odds) (L % 128 = 64, L % 64 = 1, ...: RESIDUES). Every octave draws its length with as many choices as the widest one,
    and the residue is drawn either way, so shrinking can lower the octave, walk the length down, and drop the residue
    (the coin comes last: dropped before the length is walked down, it leaves a length that still fails more often;
    measured with hypothesis.find on 24 shrinks, 15 reached the smallest length against 9 to 11 for other orders)."""
    with _span(_source(draw)):
        a, b = pick(draw, _octaves(lo, hi))
        tile, residue = pick(draw, RESIDUES)
        n = uniform(draw, a, b, _digits(hi - lo))
        snap = coin(draw, 2, snap_odds)
    if snap:
        up = n + (residue - n) % tile
        n = up if up <= b else up - tile if up - tile >= a else n
    return n


def _lengths(draw, space: Space, odds: float = 1.0) -> tuple[int, int]:
    """_shape's (sq, skv), one key drawn as two where the space has no single key (Space.single_key)."""
    sq, skv = _shape(draw, space, odds)
    return sq, (skv if skv > 1 or space.single_key else 2)


def _shape(draw, space: Space, odds: float) -> tuple[int, int]:
    """(sq, skv). Most cases: short lengths (up to SMALL_LEN), sq == skv half the time. One in space.long_one_in
    (`odds` times that: the case's richness, attnfuzz.strategies.cases.RICHNESS), where space.max_len exceeds SMALL_LEN: a ladder shape (log-uniform up to max_len), a decode shape (1..16 queries
    over DECODE_MIN_KEYS..max_decode_len keys) or a tall one (sq >= 8 skv). Keys stop where even one head of the
    narrowest head dims would pass space.max_work (on a CPU, squares up to about 700). Shrinks toward the short
    cases."""
    short = min(space.max_len, SMALL_LEN)
    kinds = _long_kinds(space)
    if kinds and coin(draw, space.long_one_in, odds):
        kind = pick(draw, kinds)
        edge = space.long_edge_odds
        if kind == "decode":
            sq = uniform(draw, 1, DECODE_MAX_QUERIES)
            most = max(DECODE_MIN_KEYS, _keys(space, sq, space.decode_len))
            return sq, ladder_length(draw, DECODE_MIN_KEYS, most, edge)
        if kind == "tall":
            sq = ladder_length(draw, short + 1, space.max_len, edge)
            return sq, ladder_length(draw, 1, _keys(space, sq, sq // 8), edge)
        sq = ladder_length(draw, 1, space.max_len, edge)
        keys = _keys(space, sq, space.max_len)
        return sq, (sq if coin(draw, 2) and sq <= keys else ladder_length(draw, 1, keys, edge))
    sq = short_length(draw, short)
    # sq == skv half the time; shrinking goes toward independent lengths, so each can reach its own minimum
    return sq, (sq if coin(draw, 2) else short_length(draw, short))


def _keys(space: Space, sq: int, most: int) -> int:
    """The most keys, up to `most`, that sq queries may have within space.max_work (one head, head dims of 1)."""
    return max(1, min(most, space.max_work // (sq * (SCORE_COST + 2))))


# A generous bound on the device memory a case holds at once, for Space.max_bytes: per element of q, k, v and the
# output (each sequence, each head) the kernel's copy and its gradient (4 bytes at most each), buffers in a drawn
# storage (twice that), and the float64 oracle's copies with their gradients (8 bytes each, three of them); per score,
# a dense mask in the kernel's dtype and the oracle's float64 one; and the oracle's query chunks
# (attnfuzz.oracles.reference.CHUNK_BYTES, a few live at once) with the CUDA context's own allocations.
ELEMENT_BYTES = 64
SCORE_BYTES = 12
FIXED_BYTES = 512 * 2**20


def head_bytes(sq: int, skv: int, d_qk: int, d_v: int) -> int:
    """device_bytes's share of one sequence and one head."""
    return (sq + skv) * (d_qk + d_v) * ELEMENT_BYTES + sq * skv * SCORE_BYTES


def device_bytes(case: Case) -> int:
    """A generous bound on the device memory, kernel and float64 oracle together, a case holds at once (K and V
    counted at every query head, so GQA and paged pools with spare pages stay under it)."""
    return case.b * case.h * head_bytes(case.sq, case.skv, case.d_qk, case.d_v) + FIXED_BYTES


def work(case: Case) -> int:
    """What the float64 oracle's time grows with, in multiply-adds: b * h * sq * skv * (d_qk + d_v + SCORE_COST)."""
    return case.b * case.h * case.sq * case.skv * (case.d_qk + case.d_v + SCORE_COST)


@lru_cache(maxsize=None)
def _long_kinds(space: Space) -> tuple[str, ...]:
    if space.max_len <= SMALL_LEN:
        return ()
    return ("ladder", "tall") + (("decode",) if space.decode_len >= DECODE_MIN_KEYS else ())
