"""cp_cases(engine): Hypothesis strategy of the cases a context-parallel engine can take, drawn by construction
(lengths in the engine's chunk units, heads in its a2a units, only the masks and formats it supports), so nothing
is filtered out. Shrinks toward one short sequence, one head, no mask, float32 (or the engine's first dtype)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fuzz.cp.capabilities import TE_HEAD_DIMS, a2a_ranks, te_refuses_all
from fuzz.cp.engine import CPEngine
from fuzz.cp.ring import RingEngine
from fuzz.cp.te import TEEngine
from strategies.case import DTYPES, Case

RING_DTYPES = ("float32", "bfloat16", "float16", "float64")
TE_DTYPES = ("bfloat16", "float16")


def _seed() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def _scale() -> st.SearchStrategy[float | None]:
    return st.none() | st.floats(0.05, 1.0, allow_nan=False)


@st.composite
def _ring_cases(draw, engine: RingEngine, dtypes, max_units, max_batch, max_heads, grads) -> Case:
    w = engine.world
    causal = draw(st.booleans())
    spelling = draw(st.sampled_from(["", "head_tail", "contiguous"] if causal else ["", "contiguous"]))
    unit = 2 * w if (spelling == "head_tail" or (spelling == "" and causal)) else w
    sq = unit * draw(st.integers(1, max_units))
    skv = sq if causal else unit * draw(st.integers(1, max_units))
    hk = draw(st.integers(1, max_heads))
    h = hk * draw(st.integers(1, max_heads // hk))
    d = draw(st.sampled_from([16, 8, 32]))
    return Case(b=draw(st.integers(1, max_batch)), sq=sq, skv=skv, h=h, hk=hk, d_qk=d, d_v=d,
                dtype=draw(st.sampled_from(dtypes)), causal=causal, spelling=spelling,
                alignment=draw(st.sampled_from(["top_left", "bottom_right"])) if causal else "top_left",
                scale=draw(_scale()), layout=draw(st.sampled_from(["bshd", "sbhd"])),
                memory=draw(st.sampled_from(["contiguous", "transposed"] + (["expanded_kv"] if hk > 1 else []))),
                grads=draw(st.booleans()) if grads is None else grads, seed=draw(_seed()))


@st.composite
def _te_cases(draw, engine: TEEngine, dtypes, max_units, max_batch, max_heads, grads) -> Case:
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
    softmax = draw(st.sampled_from(["vanilla", "off_by_one", "learnable"])) if (comm, kernel) == ("a2a", "fused") \
        else "vanilla"
    d_qk = draw(st.sampled_from(TE_HEAD_DIMS))
    d_v = d_qk if kernel == "flash" else draw(st.sampled_from(TE_HEAD_DIMS))
    b = draw(st.integers(1, max_batch))
    sq = unit * draw(st.integers(1, max_units))
    skv = sq if (causal or band or layout == "thd") else unit * draw(st.integers(1, max_units))
    seqlens = None
    if layout == "thd":
        if kernel == "flash":  # no padding between sequences: every length a multiple of 2*cp
            seqlens = tuple(unit * draw(st.integers(1, sq // unit)) for _ in range(b))
        else:
            seqlens = tuple(draw(st.integers(1, sq)) for _ in range(b))
    return Case(b=b, sq=sq, skv=skv, h=h, hk=hk, d_qk=d_qk, d_v=d_v, dtype=draw(st.sampled_from(dtypes)),
                seqlens_q=seqlens, seqlens_kv=seqlens, causal=causal, window=window,
                alignment=draw(st.sampled_from(["top_left", "bottom_right"])), scale=draw(_scale()),
                softmax=softmax, layout=layout, grads=draw(st.booleans()) if grads is None else grads,
                seed=draw(_seed()))


def cp_cases(engine: CPEngine, *, dtypes: tuple[str, ...] | None = None, max_units: int = 4, max_batch: int = 2,
             max_heads: int = 4, grads: bool | None = None) -> st.SearchStrategy[Case]:
    """Cases `engine` takes: sequence lengths are 1..max_units of its chunk unit (world or 2*world tokens),
    up to max_batch sequences and max_heads query heads; `dtypes` restricts the dtypes (default: every dtype the
    engine runs); `grads` fixes whether gradients are checked (None: drawn)."""
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
    return draw_for(engine, tuple(dtypes), max_units, max_batch, max_heads, grads)
