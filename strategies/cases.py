"""Hypothesis strategies that draw valid Cases by construction, weighted toward where kernels break.

Only shapes, switches and a seed are drawn, never tensor elements, so shrinking is fast: it walks every integer
toward its minimum and every choice toward its first option, which is the simplest one (b = 1, one head, the
shortest lengths, float16, vanilla softmax, no mask, contiguous bshd).
"""

from __future__ import annotations

import math
from functools import lru_cache

from hypothesis import strategies as st

from attnfuzz.strategies.case import FAMILIES, Case
from attnfuzz.strategies.space import Space

_NO_SINK_FAMILIES = tuple(f for f in FAMILIES if f != "large_sink")
TILES = (16, 32, 64, 128, 256)
HEAD_DIMS = (8, 16, 32, 64, 96, 128, 256)
ODD_HEAD_DIMS = (1, 3, 24, 40, 72, 80, 100, 160, 192)


def _tile_edges(max_len: int) -> list[int]:
    edges = sorted({n for t in TILES for n in (t - 1, t, t + 1) if 1 <= n <= max_len})
    return edges or [1]


# Strategies are built once per argument and reused: Hypothesis computes properties of every new strategy object,
# which cost more than the draws themselves (about 3 ms a case before this cache).
@lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@lru_cache(maxsize=None)
def _one_of(options: tuple) -> st.SearchStrategy:
    return st.sampled_from(options)


@lru_cache(maxsize=None)
def lengths(max_len: int) -> st.SearchStrategy[int]:
    """Sequence lengths: uniform over 1..max_len, with extra weight on 1 and on the usual tile sizes +-1 (a quarter
    of the draws each). One choice, an index into [1..max_len, then the weighted repeats]: shrinking lowers the index,
    so a length found in the repeats shrinks through the plain range to the smallest length that still fails."""
    edges = _tile_edges(max_len)
    weighted = [1] * (max_len // 2) + edges * max(1, max_len // (2 * len(edges)))
    return st.sampled_from(list(range(1, max_len + 1)) + weighted)


def pick(draw, options: tuple):
    """One of `options`, drawn as st.sampled_from(options) draws it, without building a strategy per call (for
    options that depend on what was drawn before)."""
    return options[draw(_index(len(options)))] if len(options) > 1 else options[0]


@lru_cache(maxsize=None)
def _index(n: int) -> st.SearchStrategy[int]:
    """0..n-1 uniformly, as sampled_from draws an index (st.integers favours its minimum)."""
    return st.sampled_from(range(n))


def _either(draw, branches: tuple[st.SearchStrategy, ...]):
    """A value of one of `branches`, drawn as st.one_of draws it (the branch's index, then the branch), without the
    filtered strategy one_of builds on every draw (three times the cost of a plain draw)."""
    return draw(pick(draw, branches))


@lru_cache(maxsize=None)
def _head_dim_branches(space: Space) -> tuple[st.SearchStrategy[int], ...]:
    usual = [d for d in HEAD_DIMS if d <= space.max_head_dim] or [space.max_head_dim]
    odd = [d for d in ODD_HEAD_DIMS if d <= space.max_head_dim] or usual
    return st.sampled_from(usual), st.sampled_from(odd)


@lru_cache(maxsize=None)
def _same_or_other_head_dim(d_qk: int, space: Space) -> tuple[st.SearchStrategy[int], ...]:
    return st.just(d_qk), *_head_dim_branches(space)


@lru_cache(maxsize=None)
def _bound_branches(seq: int) -> tuple[st.SearchStrategy[int | None], ...]:
    """A window bound: unbounded, 0, small, or at / past the sequence length."""
    return st.none(), st.just(0), st.integers(1, 8), st.sampled_from([max(seq - 1, 0), seq, seq + 7])


def _sometimes(draw, one_in: int) -> bool:
    """True once in `one_in` draws (an index drawn uniformly: st.integers would make it rarer, 19 % for one in 4);
    shrinks to False, so a shrunk case keeps only the features it needs."""
    return draw(_index(one_in)) == one_in - 1


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
    b = draw(_ints(1, space.max_batch))
    sq = draw(lengths(space.max_len))
    # sq == skv half the time; shrinking goes toward independent lengths, so each can reach its own minimum
    skv = sq if _sometimes(draw, 2) else draw(lengths(space.max_len))
    if space.gqa:
        hk = draw(_ints(1, max(1, space.max_heads // 2)))
        group = draw(_one_of(tuple(g for g in (1, 2, 3, 4, 8) if hk * g <= space.max_heads) or (1,)))
        h = hk * group
    else:
        h = hk = draw(_ints(1, space.max_heads))
    d_qk = _either(draw, _head_dim_branches(space))
    d_v = _either(draw, _same_or_other_head_dim(d_qk, space)) if space.split_head_dims else d_qk
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
    return Case(b=b, sq=sq, skv=skv, h=h, hk=hk, d_qk=d_qk, d_v=d_v, dtype=dtype, seqlens_q=seqlens_q,
                seqlens_kv=seqlens_kv, causal=causal, window=window, alignment=alignment, mask_density=mask_density,
                scale=scale, softcap=softcap, alibi_slopes=alibi, softmax=softmax, layout=layout, memory=memory,
                mean=mean, std=std, seed=seed, grads=grads, values=values, page_size=page_size,
                shared_prefix_pages=shared)


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
