"""The features of a case: one table of named classes, computed from the Case alone.

Each FEATURE names one property of a case and the classes it falls in (the plainest first). The strategies draw
their combinations through each case's richness (strategies/cases.py), the coverage report counts which combinations
of them a backend graded (fuzz/report/combos.py), and a known bug's `when` may name them (fuzz/store/known.py). A
feature's `witness` turns a case into one of the feature's class, so that a combination of classes can be shown
feasible by building a case that has them all (`witness_case`).

- value_family: Case.values (gaussian, probe, or one of the value families).
- band: the causal band or window as the rows see it, whatever flags spell it: none; causal (a right bound of 0,
  by `causal` or a window (None, 0), with no offset between queries and keys); causal_bottom_right (the same with
  an offset, bottom-right aligned: rows may see no key); window (any other bound).
- explicit_mask: an explicit boolean mask (Case.mask_density) or not.
- sequences: how sequences reach the backend, first match of: paged (a paged KV cache), packed (thd), padded
  (per-sequence lengths), dense.
- gradients, dtype, layout, memory, softmax: the Case fields (off / on for gradients).
- head_dim: the larger head dim: small (< 64), 64, 65-128 on the 32-grain (96, 128), 65-128 off it (72, 80, 104),
  over_128.
- heads: MHA (h = hk), MQA (hk = 1 < h), GQA.
- buffer: the least plain Case.storage of q, k and v.
- spelling_form: the backend's default spelling ("") or another.
- softcapped, alibi_bias: off / on.
- fp8: FP8 inputs (strategies/fp8.py): off, e4m3 or e5m2 (all three of q, k, v), mixed, kv (q unquantised).
- len_q, len_kv: the padded length of each side: 1; decode (queries only: at most 16 over 512 keys or more); edge
  (63..160 within 1 of a multiple of 64: a partial or a just-full tile); small (up to 160); long_edge (over 160,
  within 1 of a multiple of 64); long.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from attnfuzz.strategies.case import DTYPES, FAMILIES, LAYOUTS, MEMORY, SOFTMAXES, STORAGES, Case
from attnfuzz.strategies.cases import alibi_slopes
from attnfuzz.strategies.fp8 import fp8_class
from attnfuzz.strategies.lengths import DECODE_MAX_QUERIES, DECODE_MIN_KEYS, SMALL_LEN

TILE = 64               # the tile grain lengths are classed against: 64 and 128-row tiles share its edges


def band_class(case: Case) -> str:
    if case.right is None and case.left is None:
        return "none"
    if case.right == 0 and case.left is None:
        offset = any(q != k for q, k in zip(case.lens_q, case.lens_kv))
        return "causal_bottom_right" if offset and case.alignment == "bottom_right" else "causal"
    return "window"


def sequences_class(case: Case) -> str:
    return ("paged" if case.page_size is not None else "packed" if case.layout == "thd" else
            "padded" if case.padded else "dense")


def head_dim_class(case: Case) -> str:
    d = max(case.d_qk, case.d_v)
    if d < 64:
        return "small"
    if d == 64:
        return "64"
    if d <= 128:
        return "65-128" if case.d_qk % 32 == 0 and case.d_v % 32 == 0 else "65-128_off_32"
    return "over_128"


def _memory(value: str, c: Case) -> Case:
    if value == "expanded_kv" and c.hk == 1:   # one KV head expanded: needs several (MHA grows to two of each)
        if c.h > 1:
            raise ValueError("expanded_kv needs more than one KV head")
        c = c.replace(h=2, hk=2, alibi_slopes=None if c.alibi_slopes is None else alibi_slopes(2))
    return c.replace(memory=value)


def heads_class(case: Case) -> str:
    return "MHA" if case.h == case.hk else "MQA" if case.hk == 1 else "GQA"


def at_tile_edge(n: int) -> bool:
    """Within one of a multiple of TILE (63, 64, 65, 127, 128, 129, 191, ...)."""
    return n >= TILE - 1 and n % TILE in (TILE - 1, 0, 1)


def length_class(n: int) -> str:
    if n == 1:
        return "1"
    if n <= SMALL_LEN:
        return "edge" if at_tile_edge(n) else "small"
    return "long_edge" if at_tile_edge(n) else "long"


def len_q_class(case: Case) -> str:
    return "decode" if case.sq <= DECODE_MAX_QUERIES and case.skv >= DECODE_MIN_KEYS else length_class(case.sq)


# -- witnesses: a case changed into one class of a feature --------------------------------------------------------
def _band(value: str, c: Case) -> Case:
    if value == "none":
        return c.replace(causal=False, window=(None, None))
    if value == "window":
        return c.replace(causal=False, window=(4, 4))
    c = c.replace(causal=True, window=(None, None), alignment="bottom_right" if value != "causal" else "top_left")
    if value == "causal_bottom_right" and c.sq == c.skv:   # an offset: one key more than queries
        c = c.replace(skv=c.skv + 1, seqlens_kv=None if c.seqlens_kv is None else tuple(n + 1 for n in c.lens_kv))
    return c


def _sequences(value: str, c: Case) -> Case:
    flat = c.replace(page_size=None, shared_prefix_pages=0, seqlens_q=None, seqlens_kv=None,
                     layout="bshd" if c.layout == "thd" else c.layout)
    if value == "dense":
        return flat
    if value == "paged":
        return flat.replace(page_size=16, grads=False, storage=("plain",) * 3)
    lens = dict(b=2, seqlens_q=(c.sq, max(c.sq - 1, 1)), seqlens_kv=(c.skv, max(c.skv - 1, 1)))
    return flat.replace(**lens, layout="thd", storage=("plain",) * 3) if value == "packed" else flat.replace(**lens)


def _head_dim(value: str, c: Case) -> Case:
    d = {"small": 16, "64": 64, "65-128": 96, "65-128_off_32": 72, "over_128": 256}[value]
    return c.replace(d_qk=d, d_v=d)


def _heads(value: str, c: Case) -> Case:
    h, hk = {"MHA": (1, 1), "GQA": (4, 2), "MQA": (2, 1)}[value]
    return c.replace(h=h, hk=hk, alibi_slopes=None if c.alibi_slopes is None else alibi_slopes(h))


def _len_q(value: str, c: Case) -> Case:
    if value == "decode":   # keys kept where they are decode's already, else the fewest of their class
        skv = c.skv if c.skv >= DECODE_MIN_KEYS else 600 if length_class(c.skv) == "long" else DECODE_MIN_KEYS
        return c.replace(sq=4, skv=skv, seqlens_q=None, seqlens_kv=None)
    n = {"1": 1, "small": 8, "edge": 64, "long": 300, "long_edge": 257}[value]
    return c.replace(sq=n, seqlens_q=None if c.seqlens_q is None else tuple(min(x, n) for x in c.seqlens_q))


def _len_kv(value: str, c: Case) -> Case:
    n = {"1": 1, "small": 8, "edge": 65, "long": 300, "long_edge": 449}[value]
    return c.replace(skv=n, seqlens_kv=None if c.seqlens_kv is None else tuple(min(x, n) for x in c.seqlens_kv))


@dataclass(frozen=True)
class Feature:
    """One feature: its classes (plainest first), the class of a case, and a case changed into a given class."""

    name: str
    values: tuple[str, ...]
    of: Callable[[Case], str]
    witness: Callable[[str, Case], Case]


def _field(name: str, values: tuple[str, ...]) -> Feature:
    return Feature(name, values, lambda c: getattr(c, name), lambda v, c: c.replace(**{name: v}))


def _switch(name: str, on: Callable[[Case], bool], turn: Callable[[bool, Case], Case]) -> Feature:
    return Feature(name, ("off", "on"), lambda c: "on" if on(c) else "off", lambda v, c: turn(v == "on", c))


FEATURES: tuple[Feature, ...] = (
    Feature("value_family", ("gaussian", "probe", *FAMILIES), lambda c: c.values,
            lambda v, c: c.replace(values=v, softmax="learnable" if v == "large_sink" else c.softmax)),
    Feature("band", ("none", "causal", "causal_bottom_right", "window"), band_class, _band),
    _switch("explicit_mask", lambda c: c.mask_density is not None,
            lambda on, c: c.replace(mask_density=0.5 if on else None)),
    Feature("sequences", ("dense", "padded", "packed", "paged"), sequences_class, _sequences),
    _switch("gradients", lambda c: c.grads, lambda on, c: c.replace(grads=on)),
    _field("dtype", DTYPES),
    Feature("head_dim", ("small", "64", "65-128", "65-128_off_32", "over_128"), head_dim_class, _head_dim),
    Feature("heads", ("MHA", "GQA", "MQA"), heads_class, _heads),
    Feature("layout", LAYOUTS, lambda c: c.layout,
            lambda v, c: _sequences("packed", c) if v == "thd" else _sequences(sequences_class(c), c).replace(
                layout=v) if c.layout == "thd" else c.replace(layout=v)),
    Feature("memory", MEMORY, lambda c: c.memory, _memory),
    Feature("buffer", STORAGES, lambda c: max(c.storage, key=STORAGES.index),
            lambda v, c: c.replace(storage=(v, v, v))),
    _switch("spelling_form", lambda c: c.spelling != "", lambda on, c: c.replace(spelling="*" if on else "")),
    _switch("softcapped", lambda c: c.softcap is not None, lambda on, c: c.replace(softcap=5.0 if on else None)),
    _switch("alibi_bias", lambda c: c.alibi_slopes is not None,
            lambda on, c: c.replace(alibi_slopes=alibi_slopes(c.h) if on else None)),
    _field("softmax", SOFTMAXES),
    Feature("len_q", ("1", "decode", "small", "edge", "long", "long_edge"), len_q_class, _len_q),
    Feature("len_kv", ("1", "small", "edge", "long", "long_edge"), lambda c: length_class(c.skv), _len_kv),
    Feature("fp8", ("off", "e4m3", "e5m2", "mixed", "kv"), fp8_class,
            lambda v, c: c.replace(fp8=None if v == "off" else ("e4m3", "e5m2", "e4m3") if v == "mixed" else
                                   (None, "e4m3", "e4m3") if v == "kv" else (v,) * 3,
                                   fp8_out=None, fp8_p=None, fp8_scaling="tensor", fp8_scales="unit")),
)
BY_NAME = {f.name: f for f in FEATURES}
NAMES = tuple(f.name for f in FEATURES)
# The order witnesses are applied in: lengths and sequence shapes first, the band (which may add a key) after them,
# the switches last
WITNESS_ORDER = ("len_kv", "len_q", "sequences", "layout", "heads", "memory", "head_dim", "band", "buffer",
                 "value_family", "softmax", "explicit_mask", "gradients", "dtype", "softcapped", "alibi_bias",
                 "spelling_form", "fp8")
assert sorted(WITNESS_ORDER) == sorted(NAMES)
WITNESS_BASE = Case(b=1, sq=8, skv=8, h=1, hk=1, d_qk=16, d_v=16, dtype="float16")


def features(case: Case) -> dict[str, str]:
    """The class of each feature, by name."""
    return {f.name: f.of(case) for f in FEATURES}


def vector(case: Case) -> tuple[int, ...]:
    """The index of each feature's class, in FEATURES order."""
    return tuple(f.values.index(f.of(case)) for f in FEATURES)


def witness_case(classes: dict[str, str]) -> Case | None:
    """A case in every given class of the given features (name -> class), or None where the witnesses conflict: a
    rule of the case language breaks, or a later witness moved an earlier feature out of its class. `spelling_form`
    'on' leaves the placeholder spelling '*' for the caller to replace with one the backend lists."""
    case = _applied(tuple((name, classes[name]) for name in WITNESS_ORDER if name in classes))
    return case if case is not None and all(BY_NAME[n].of(case) == v for n, v in classes.items()) else None


@lru_cache(maxsize=1 << 16)
def _applied(steps: tuple[tuple[str, str], ...]) -> Case | None:
    """WITNESS_BASE with each (feature, class) witness applied in turn (combinations share their first steps: each
    prefix is built once), or None where one breaks a rule of the case language."""
    if not steps:
        return WITNESS_BASE
    case = _applied(steps[:-1])
    if case is None:
        return None
    name, value = steps[-1]
    try:
        return BY_NAME[name].witness(value, case)
    except ValueError:
        return None
