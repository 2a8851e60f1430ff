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
from attnfuzz.strategies.choices import _either, _ints, _one_of, coin, pick, uniform
from attnfuzz.strategies.lengths import (ELEMENT_BYTES, FIXED_BYTES, SCORE_BYTES, SCORE_COST, _lengths,
                                         head_bytes)
from attnfuzz.strategies.fp8 import SCALE_KINDS
from attnfuzz.strategies.space import HEAD_DIMS, ODD_HEAD_DIMS, Space, fp8_narrowed, top_left_shift_refused

_NO_SINK_FAMILIES = tuple(f for f in FAMILIES if f != "large_sink")
HEAD_DIM_PAIRS = {192: 128, 64: 512}   # d_qk -> a d_v that kernels special-case (MLA-style 192 / 128, 64 / 512)
WIDE_ONE_IN = 5        # one head dim in 5 is above 128, where the Space has such
STORAGE_ONE_IN = 3     # one bshd case without a paged cache in 3 lays q, k, v out in drawn buffers (Case.storage)
SOFTCAPS = (5.0, 30.0, 0.5)  # the softcaps drawn; shrinks toward the first
# A case's richness, drawn first: the odds of every optional feature (a mask, a window, padding, a softcap, ALiBi,
# gradients, probe and family values, a paged cache, drawn buffers, a wide head dim), times its everyday odds: none
# (plain, each at MIN_ODDS), the everyday odds, or twice them, by two fair coins (a weighted or uniform integer choice
# came out on its last value 38-39 % of the time in Hypothesis's generation; its coins keep their odds better). As
# drawn (bench/combos.py, 2,000 cases): plain 41 %, everyday 25 %, twice 34 %, a mean of about 1, so each feature
# keeps its share of the cases (gradients 24.2 % against 24.7 % without richness), while cases that combine several
# rare features come 2 to 4 times as often (outlier channels with a head dim over 128 and gradients: 58 against 29 in
# 10,000; probe values over long keys in bf16: 57 against 15). Long shapes keep the everyday odds whatever the
# richness: a long case that is also rich costs several times a plain one (with them in, long cases took 36 % of a
# CPU run's time against 20 %). Richness is a swarm configuration with one knob: it correlates the features without
# moving their marginals. Each feature's coin is drawn either way, so a shrink of the richness leaves the case as it is.
RICHNESS = (0.0, 1.0, 2.0)


def _richness(draw) -> float:
    """The case's RICHNESS: plain on the first coin, else the everyday odds or twice them on the second."""
    return (RICHNESS[2] if coin(draw, 2) else RICHNESS[1]) if coin(draw, 2) else RICHNESS[0]


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


def _one_head_dim(draw, space: Space, room: int, odds: float) -> int:
    """Above 128 one time in WIDE_ONE_IN (where the space has such), else usual or odd; no larger than `room` (the
    smallest one where none fits). The list is picked before the coin, so a shrink to a narrow head dim does not
    add a choice (see uniform)."""
    narrow, wide = _head_dim_lists(space)
    base = pick(draw, narrow)
    options = wide if wide and coin(draw, WIDE_ONE_IN, odds) else base
    # where no wide one fits the room, the narrow list's (a wide head dim on a long case passed max_work)
    return pick(draw, tuple(d for d in options if d <= room) or tuple(d for d in base if d <= room) or (min(base),))


def _head_dim(draw, space: Space, room: int, odds: float, d_qk: int | None = None) -> int:
    """d_qk (`d_qk` None), or d_v: the same as d_qk, another one, or d_qk's special partner (HEAD_DIM_PAIRS) where
    the space has it."""
    if d_qk is None:
        return _one_head_dim(draw, space, room, odds)
    partner = HEAD_DIM_PAIRS.get(d_qk)
    narrow, wide = _head_dim_lists(space)
    partner = partner if partner in wide or any(partner in dims for dims in narrow) else None
    branch = pick(draw, (0, 1, 2) if partner is not None else (0, 1))
    if branch == 1:
        return _one_head_dim(draw, space, room, odds)
    return partner if branch == 2 and partner <= room else d_qk


def alibi_slopes(h: int) -> tuple[float, ...]:
    """The ALiBi slopes of h heads: 2^(-8 (i + 1) / h), as ALiBi's paper sets them."""
    return tuple(2.0 ** (-8.0 * (i + 1) / h) for i in range(h))


@lru_cache(maxsize=None)
def _bound_branches(seq: int) -> tuple[st.SearchStrategy[int | None], ...]:
    """A window bound: unbounded, 0, small, or at / past the sequence length."""
    return st.none(), st.just(0), st.integers(1, 8), st.sampled_from([max(seq - 1, 0), seq, seq + 7])


def _sometimes(draw, one_in: int, odds: float = 1.0) -> bool:
    """True once in `one_in` draws, times `odds` (coin); shrinks to False, so a shrunk case keeps only the features it
    needs."""
    return coin(draw, one_in, odds)


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
    gradients; with `space.fp8`, FP8 inputs, scales and outputs (_fp8). Shrinks toward the smallest, plainest case
    that still fails."""
    if space.fp8:
        space = fp8_narrowed(space)
    odds = _richness(draw)   # first, so that a shrink toward plain does not move the other choices
    sq, skv = _lengths(draw, space)   # at the everyday odds: a long shape in a rich case costs several times more
    # Head dims, then batch and heads, within space.max_work (see work()): the float64 oracle's cost, which a long
    # case would otherwise multiply by thousands
    room = max(1, space.max_work // (sq * skv) - SCORE_COST)
    if space.max_bytes is not None:   # and within the device memory a case may hold (a campaign lane's share)
        free = space.max_bytes - FIXED_BYTES - sq * skv * SCORE_BYTES
        room = min(room, max(1, free // ((sq + skv) * ELEMENT_BYTES)))
    d_qk = _head_dim(draw, space, room // 2, odds)
    d_v = _head_dim(draw, space, room - d_qk, odds, d_qk) if space.split_head_dims else d_qk
    room = max(1, space.max_work // (sq * skv * (d_qk + d_v + SCORE_COST)))
    if space.max_bytes is not None:
        room = min(room, max(1, (space.max_bytes - FIXED_BYTES) // head_bytes(sq, skv, d_qk, d_v)))
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

    if layout == "thd" or (space.padding and _sometimes(draw, 4, odds)):
        seqlens_q = _seqlens(draw, b, sq)
        seqlens_kv = _seqlens(draw, b, skv)
    else:
        seqlens_q = seqlens_kv = None

    causal = space.causal and _sometimes(draw, 3, odds)
    window: tuple[int | None, int | None] = (None, None)
    if space.windows and _sometimes(draw, 4, odds):
        left = _either(draw, _bound_branches(skv))
        window = (left, None if causal else _either(draw, _bound_branches(skv)))
    alignment = draw(_one_of(tuple(space.alignments)))
    mask_density = None
    if space.explicit_mask and _sometimes(draw, 8, odds):
        mask_density = draw(_one_of((0.5, 0.9, 0.1, 0.0, 1.0)))

    scale = None
    if space.custom_scale and _sometimes(draw, 6, odds):
        scale = draw(_one_of((1.0, 0.5 / math.sqrt(d_qk), 2.0 / math.sqrt(d_qk), 0.01)))
    softcap = draw(_one_of(SOFTCAPS)) if space.softcap and _sometimes(draw, 6, odds) else None
    alibi = None
    if space.alibi and _sometimes(draw, 6, odds):
        alibi = alibi_slopes(h)
    softmax = draw(_one_of(tuple(space.softmaxes)))
    memory = draw(_one_of(tuple(m for m in space.memory if m != "expanded_kv" or hk > 1) or ("contiguous",)))

    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if space.extreme_logits and _sometimes(draw, 5, odds):
        qk_std = draw(_one_of((0.01, 4.0, 10.0)))
        std = (qk_std, qk_std, draw(_one_of((1.0, 0.001, 100.0))))
        mean = (0.0, draw(_one_of((0.0, 3.0))), 0.0)
    grads = space.grads and _sometimes(draw, space.fp8_grads if space.fp8 else 4, odds)
    seed = draw(_ints(0, 2**32 - 1))
    # Probes one case in five: enough to meet every band, padding and GQA shape often, and few enough that the
    # random values keep testing weights and rounding. Drawn last, so every other field of a stream is as before;
    # shrinks toward "gaussian", so a probe case stays one only when the failure needs it.
    values = "probe" if space.probes and _sometimes(draw, 5, odds) else "gaussian"
    # A value family (strategies/materialize.py) one non-probe case in two, so two fifths of all cases: split evenly
    # over the six families, 1/15 each (they cost no more than Gaussian values and reach the extreme logits where
    # kernels break, so each meets the other rare features often); large_sink makes the softmax learnable, the only
    # one it takes (off-by-one's sink is 0 by definition). Drawn after the probe switch, so probe and gaussian cases
    # keep their fields; shrinks toward "gaussian", then toward the first family (far_negative).
    if values == "gaussian" and space.value_families and _sometimes(draw, 2, odds):
        values = pick(draw, FAMILIES if "learnable" in space.softmaxes else _NO_SINK_FAMILIES)
        if values == "large_sink":  # sinks need a learnable softmax: one case in 15, whatever softmax was drawn
            softmax = "learnable"
    page_size, shared = None, 0
    # A paged cache is inference only (no gradients). Where the backend takes both kinds of case, one that drew
    # gradients keeps them and draws no cache, and the others draw one at one in two (times the richness): both then
    # keep about their everyday shares (1,000 cases: gradients 18 %, as without paged caches, paged 24 %), where a
    # cache drawn over gradients took them from most rich cases (gradients 10 %, paged 27 %).
    if space.paged and (not space.unpaged or (not grads and _sometimes(draw, 2, odds))):  # after `values`: the end
        page_size, shared, sq, seqlens_q, seqlens_kv, alignment = _paged(draw, space, b, sq, skv, seqlens_q,
                                                                           seqlens_kv, alignment)
        grads = False
    storage = PLAIN_STORAGE
    if len(space.storages) > 1 and layout == "bshd" and page_size is None and _sometimes(draw, STORAGE_ONE_IN, odds):
        storage = tuple(pick(draw, space.storages) for _ in range(3))   # per tensor; each shrinks toward "plain"
    fp8 = _fp8(draw, space, page_size is not None, grads) if space.fp8 else {}
    case = Case(b=b, sq=sq, skv=skv, h=h, hk=hk, d_qk=d_qk, d_v=d_v, dtype=dtype, seqlens_q=seqlens_q,
                seqlens_kv=seqlens_kv, causal=causal, window=window, alignment=alignment, mask_density=mask_density,
                scale=scale, softcap=softcap, alibi_slopes=alibi, softmax=softmax, layout=layout, memory=memory,
                mean=mean, std=std, seed=seed, grads=grads, values=values, page_size=page_size,
                shared_prefix_pages=shared, storage=storage, **fp8)
    if not space.top_left_shift and top_left_shift_refused(case):   # what the kernel would refuse, at its alignment
        case = case.replace(alignment="bottom_right")
    return case


def _fp8(draw, space: Space, paged: bool, grads: bool) -> dict:
    """The FP8 fields of a case (strategies/fp8.py), drawn last: one format for q, k and v, or one each a time in four,
    and q left in the dtype a time in four; the output's format, P's, the scale granularity (per page only on a paged case) and how the scales are drawn.
    Shrinks toward e4m3 everywhere, an output in the dtype, P kept wide, one scale per tensor, unit scales. With
    gradients, after those: dO's format, dS's and the gradients' (strategies/fp8_backward.py), toward the first of
    each (dS kept wide, gradients in the dtype)."""
    formats = space.fp8_formats
    one = pick(draw, formats)
    fp8 = tuple(pick(draw, formats) for _ in range(3)) if len(formats) > 1 and coin(draw, 4) else (one,) * 3
    if space.fp8_plain_q and coin(draw, 4):   # q in the dtype, K and V in FP8 (an FP8 KV cache)
        fp8 = (None, *fp8[1:])
    scalings = tuple(s for s in space.fp8_scalings if s != "page") or ("tensor",)
    # a paged case takes per-page scales one time in two, where the space has them (a third of them were too few to
    # meet a per-page bug within 200 cases of the default Space)
    paged_scales = paged and "page" in space.fp8_scalings and coin(draw, 2)
    fields = dict(fp8=fp8, fp8_out=pick(draw, space.fp8_outputs), fp8_p=pick(draw, space.fp8_ps),
                  fp8_scaling="page" if paged_scales else pick(draw, scalings), fp8_scales=pick(draw, SCALE_KINDS))
    if grads:
        fields.update(fp8_dout=pick(draw, space.fp8_douts), fp8_ds=pick(draw, space.fp8_dss),
                      fp8_dqkv=pick(draw, space.fp8_dqkvs))
    return fields


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
