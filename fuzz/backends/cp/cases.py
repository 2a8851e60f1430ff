"""cp_cases(engine): Hypothesis strategy of the cases a context-parallel engine can take, drawn by construction
(lengths in the engine's chunk units, heads in its a2a units, only the masks and formats it supports), so nothing
is filtered out. Lengths are 1..max_units units, or `long_units` units (a realistic tile: 128 tokens with the
default 32 units of 4), so multi-tile kernels and merges are reached too. Shrinks toward one short sequence, one
head, no mask, float32 (or the engine's first dtype).

Two constraints keep the budget on graded cases: fp32 ring cases on CUDA take per-rank lengths in multiples of 32
(64 load-balanced), clear of torch's LSE-padding defect (capabilities.RING_LSE_PADDING_WHY), which otherwise ends
every such run at its first example; TE cases avoid the refusals the table declares (see te_refusal)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from attnfuzz.backends.cp.capabilities import CUDNN_THD_SINKS, TE_HEAD_DIMS, a2a_ranks, ring_lse_align, te_refuses_all
from attnfuzz.backends.cp.engine import CPEngine
from attnfuzz.backends.cp.ring import RingEngine
from attnfuzz.backends.cp.te import TEEngine
from attnfuzz.strategies.case import DTYPES, Case

RING_DTYPES = ("float32", "bfloat16", "float16", "float64")
TE_DTYPES = ("bfloat16", "float16")


def _seed() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def _scale() -> st.SearchStrategy[float | None]:
    return st.none() | st.floats(0.05, 1.0, allow_nan=False)


def _units(low: int, max_units: int, long_units: tuple[int, ...]) -> st.SearchStrategy[int]:
    """A length in chunk units: low..max_units, or one of `long_units` (shrinks toward `low`)."""
    short = st.integers(low, max(low, max_units))
    longer = [n for n in long_units if n > max(low, max_units)]
    return short | st.sampled_from(longer) if longer else short


@st.composite
def _ring_cases(draw, engine: RingEngine, dtypes, max_units, max_batch, max_heads, grads, long_units) -> Case:
    w = engine.world
    dtype = draw(st.sampled_from(dtypes))
    causal = draw(st.booleans())
    spelling = draw(st.sampled_from(["", "head_tail", "contiguous"] if causal else ["", "contiguous"]))
    unit = 2 * w if (spelling == "head_tail" or (spelling == "" and causal)) else w
    align = ring_lse_align(engine.device, dtype)  # query rows per rank in multiples of the op's LSE padding
    sq = unit * align * draw(st.integers(1, max_units) if align > 1 else _units(1, max_units, long_units))
    skv = sq if causal else unit * draw(_units(1, max_units, long_units))
    hk = draw(st.integers(1, max_heads))
    h = hk * draw(st.integers(1, max_heads // hk))
    d = draw(st.sampled_from([16, 8, 32]))
    return Case(b=draw(st.integers(1, max_batch)), sq=sq, skv=skv, h=h, hk=hk, d_qk=d, d_v=d,
                dtype=dtype, causal=causal, spelling=spelling,
                alignment=draw(st.sampled_from(["top_left", "bottom_right"])) if causal else "top_left",
                scale=draw(_scale()), layout=draw(st.sampled_from(["bshd", "sbhd"])),
                memory=draw(st.sampled_from(["contiguous", "transposed"] + (["expanded_kv"] if hk > 1 else []))),
                grads=draw(st.booleans()) if grads is None else grads, seed=draw(_seed()))


@st.composite
def _te_cases(draw, engine: TEEngine, dtypes, max_units, max_batch, max_heads, grads, long_units) -> Case:
    w, comm, kernel = engine.world, engine.comm_type, engine.kernel
    unit = 2 * w
    layouts = ["bshd", "thd"] + (["sbhd"] if kernel == "fused" else [])
    layout = draw(st.sampled_from(layouts))
    causal = draw(st.booleans())
    band = comm in ("a2a", "all_gather") and draw(st.booleans())
    window = (None, None)
    if band:
        left = draw(st.integers(0, unit * max_units))
        window = (left, None) if causal else (left, draw(st.integers(0, unit * max_units)))
    head_unit = max(a2a_ranks(comm, w), 2 if a2a_ranks(comm, w) and kernel == "fused" else 1)
    hk = head_unit * draw(st.integers(1, max(1, max_heads // head_unit)))
    h = hk * draw(st.integers(1, max(1, max_heads // hk)))
    sinks = (comm, kernel) == ("a2a", "fused") and (layout != "thd" or (engine.cudnn or 0) >= CUDNN_THD_SINKS)
    softmax = draw(st.sampled_from(["vanilla", "off_by_one", "learnable"])) if sinks else "vanilla"
    d_qk = draw(st.sampled_from(TE_HEAD_DIMS))
    d_v = d_qk if kernel == "flash" else draw(st.sampled_from(TE_HEAD_DIMS))
    b = draw(st.integers(1, max_batch))
    # all_gather + FusedAttention over bshd/sbhd finds no kernel for one query and one key row per chunk
    one_row = (comm, kernel) == ("all_gather", "fused") and layout != "thd"
    same = causal or band or layout == "thd"
    sq = unit * draw(_units(2 if one_row and same else 1, max_units, long_units))
    skv = sq if same else unit * draw(_units(2 if one_row and sq == unit else 1, max_units, long_units))
    seqlens = None
    if layout == "thd":
        seqlens = tuple(draw(st.integers(1, sq)) for _ in range(b))
    return Case(b=b, sq=sq, skv=skv, h=h, hk=hk, d_qk=d_qk, d_v=d_v, dtype=draw(st.sampled_from(dtypes)),
                seqlens_q=seqlens, seqlens_kv=seqlens, causal=causal, window=window,
                alignment=draw(st.sampled_from(["top_left", "bottom_right"])), scale=draw(_scale()),
                softmax=softmax, layout=layout, grads=draw(st.booleans()) if grads is None else grads,
                seed=draw(_seed()))


def cp_cases(engine: CPEngine, *, dtypes: tuple[str, ...] | None = None, max_units: int = 4, max_batch: int = 2,
             max_heads: int = 4, grads: bool | None = None,
             long_units: tuple[int, ...] = (32,)) -> st.SearchStrategy[Case]:
    """Cases `engine` takes: sequence lengths are 1..max_units of its chunk unit (world or 2*world tokens) or one
    of `long_units` units, up to max_batch sequences and max_heads query heads; `dtypes` restricts the dtypes
    (default: every dtype the engine runs); `grads` fixes whether gradients are checked (None: drawn)."""
    if isinstance(engine, RingEngine):
        supported = RING_DTYPES if engine.device == "cpu" else tuple(d for d in RING_DTYPES if d != "float64")
        draw_for = _ring_cases
    elif isinstance(engine, TEEngine):
        supported, draw_for = TE_DTYPES, _te_cases
        nothing = te_refuses_all(engine.comm_type, engine.kernel)
        if nothing:
            raise InvalidArgument(f"engine={engine.name}: takes no case: {nothing}")
    else:
        raise InvalidArgument(f"engine={engine!r}: cp_cases knows RingEngine and TEEngine")
    if dtypes is None:
        dtypes = supported
    bad = [d for d in dtypes if d not in DTYPES or d not in supported]
    if not dtypes or bad:
        raise InvalidArgument(f"dtypes={dtypes!r}: {engine.name} runs {supported}; {bad or 'none'} given is not "
                              f"among them")
    for name, value, low in (("max_units", max_units, 1), ("max_batch", max_batch, 1), ("max_heads", max_heads, 1)):
        if not isinstance(value, int) or value < low:
            raise InvalidArgument(f"{name}={value!r}: must be an int >= {low}")
    if isinstance(engine, TEEngine) and max_heads < a2a_ranks(engine.comm_type, engine.world):
        raise InvalidArgument(f"max_heads={max_heads}: {engine.name} scatters heads over "
                              f"{a2a_ranks(engine.comm_type, engine.world)} ranks; give at least that many")
    if grads not in (None, True, False):
        raise InvalidArgument(f"grads={grads!r}: must be None (drawn), True or False")
    if not isinstance(long_units, tuple) or not all(isinstance(n, int) and n >= 1 for n in long_units):
        raise InvalidArgument(f"long_units={long_units!r}: must be a tuple of ints >= 1, or () for none")
    return draw_for(engine, tuple(dtypes), max_units, max_batch, max_heads, grads, long_units)
