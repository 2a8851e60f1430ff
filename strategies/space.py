"""Space: which parts of the case language a strategy draws, and how to narrow it to what a backend takes.

A backend declares refusals one case at a time (`unsupported(case)`); `narrow_to` turns that into a Space by probing
one feature at a time, so features a backend refuses outright are never drawn for it (constrain, don't filter) and
only the combinations it refuses reach the harness, which reports them as UNSUPPORTED.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from attnfuzz.strategies import fp8 as F
from attnfuzz.strategies.case import (ALIGNMENTS, DTYPES, LAYOUTS, MEMORY, SOFTMAXES, STORAGES, Case, shifted_band,
                                     top_left_shifts)

# Page sizes of a paged KV cache, smallest first (shrinking goes toward the first): the usual powers of two and odd
# ones, for the backends that take any size.
PAGE_SIZES = (1, 3, 16, 17, 64, 100, 128, 256)
HEAD_DIMS = (8, 16, 32, 64, 96, 128, 256, 512)
ODD_HEAD_DIMS = (1, 3, 24, 40, 72, 80, 100, 104, 136, 144, 160, 176, 192)


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Space: invalid {name}={value!r}: must be an int >= 1")


def _subset(name: str, value, allowed) -> None:
    if not isinstance(value, tuple) or not value or any(v not in allowed for v in value):
        raise ValueError(f"Space: invalid {name}={value!r}: a non-empty tuple drawn from {allowed}")


@dataclass(frozen=True)
class Space:
    """Bounds and feature switches for attention_cases(). Defaults are a CPU's (`for_device` gives a GPU's).

    max_len: the longest sequence; past attnfuzz.strategies.lengths.SMALL_LEN only the one case in `long_one_in` that
    draws a long shape reaches it. max_decode_len: the most keys a decode shape draws (default: max_len). max_work:
    what a case may cost the float64 oracle, in multiply-adds (attnfuzz.strategies.lengths.work: b * h * sq * skv *
    (d_qk + d_v + 32); 2**24 is about 0.1 to 0.3 s on one CPU core). head_dims: the head dims a backend takes on
    their own (narrow_to), None for every listed one up to max_head_dim."""

    max_batch: int = 3
    max_len: int = 2048
    max_heads: int = 8
    max_head_dim: int = 512
    max_decode_len: int | None = None
    max_work: int = 2**24
    max_bytes: int | None = None     # the device memory a case may hold (attnfuzz.strategies.lengths.device_bytes)
    long_one_in: int = 10            # one case in this many draws a long shape, where max_len passes SMALL_LEN
    long_edge_odds: float = 1.0      # how much likelier than half a long length sits at a tile residue (GPU_EDGE_ODDS)
    head_dims: tuple[int, ...] | None = None
    dtypes: tuple[str, ...] = ("float16", "bfloat16", "float32")
    layouts: tuple[str, ...] = LAYOUTS
    memory: tuple[str, ...] = MEMORY
    softmaxes: tuple[str, ...] = SOFTMAXES
    alignments: tuple[str, ...] = ALIGNMENTS
    causal: bool = True
    windows: bool = True
    padding: bool = True
    explicit_mask: bool = True
    softcap: bool = True
    alibi: bool = True
    custom_scale: bool = True
    gqa: bool = True
    split_head_dims: bool = True     # d_qk != d_v
    grads: bool = True
    extreme_logits: bool = True
    probes: bool = True              # values="probe": inputs that make mask and weight errors exact checks
    value_families: bool = True      # far_negative, anti_aligned, outlier_channel, large_sink, ties, zero_rows
    paged: bool | None = None        # paged KV caches, decode shapes, shared prefix pages; None: for the backends
                                     # that serve them (the harness decides), so other streams stay as they were
    unpaged: bool = True             # cases without a paged cache too (off for a backend that takes only paged ones)
    page_sizes: tuple[int, ...] = PAGE_SIZES
    compiled_share: float = 0.8      # for a backend that declares a compile key: the share of cases drawn inside
                                     # kernel configurations it compiled already (strategies/compiled.py); 0: off
    compile_time_share: float | None = None  # instead, the share of the search's time fresh draws (which compile)
                                     # get, at most 1 - compiled_share of the draws (TimeBalance: a campaign's);
                                     # None: the fixed share, as derandomized streams need
    storages: tuple[str, ...] = STORAGES  # per-tensor buffer layouts (Case.storage); ("plain",) turns them off
    single_key: bool = True          # skv = 1 (off for a kernel that refuses one key: cuDNN's SDPA); drawn as 2
    top_left_shift: bool = True      # top-left bands that move to the bottom-right diagonal only with a negative bound
                                     # (off for kernels that align bands bottom-right: top_left_shift_refused); drawn
                                     # bottom-right
    fp8: bool | None = None          # every case FP8 (strategies/fp8.py); None: for the backends that take FP8 inputs
                                     # (the harness decides), so other streams stay as they were
    fp8_formats: tuple[str, ...] = F.FORMATS
    fp8_plain_q: bool = True         # FP8 K and V with q in the case's dtype (FlashInfer's FP8 KV caches)
    fp8_outputs: tuple[str | None, ...] = (None, *F.FORMATS)   # None: the output in the case's dtype
    fp8_ps: tuple[str | None, ...] = (None, "e4m3")             # None: P kept wider than FP8
    fp8_scalings: tuple[str, ...] = F.SCALINGS
    fp8_grads: int | None = None     # 0: FP8 cases are forward-only (the streams as before); n: an FP8 case checks
                                     # gradients (an FP8 backward, strategies/fp8_backward.py) once in n (1: each);
                                     # None: for the backends that run an FP8 backward (the harness decides), else 0
    fp8_douts: tuple[str, ...] = F.FORMATS                      # dO's format
    fp8_dss: tuple[str | None, ...] = (None, *F.FORMATS)        # dS's; None: kept wider than FP8
    fp8_dqkvs: tuple[str | None, ...] = (None, *F.FORMATS)      # dQ, dK, dV's; None: in the case's dtype

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_len", "max_heads", "max_head_dim", "max_work", "long_one_in"):
            _positive(name, getattr(self, name))
        if not isinstance(self.long_edge_odds, (int, float)) or not self.long_edge_odds > 0:
            raise ValueError(f"Space: invalid long_edge_odds={self.long_edge_odds!r}: a number > 0 (1: half the long "
                             f"lengths at a tile residue)")
        for name in ("max_decode_len", "max_bytes"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.head_dims is not None and (not isinstance(self.head_dims, tuple) or not self.head_dims):
            raise ValueError(f"Space: invalid head_dims={self.head_dims!r}: a non-empty tuple of ints >= 1, or None")
        for d in self.head_dims or ():
            _positive("head_dims entry", d)
        _subset("dtypes", self.dtypes, DTYPES)
        _subset("layouts", self.layouts, LAYOUTS)
        _subset("memory", self.memory, MEMORY)
        _subset("softmaxes", self.softmaxes, SOFTMAXES)
        _subset("alignments", self.alignments, ALIGNMENTS)
        if not isinstance(self.compiled_share, (int, float)) or not 0 <= self.compiled_share < 1:
            raise ValueError(f"Space: invalid compiled_share={self.compiled_share!r}: a share in [0, 1) (0: draw every "
                             f"case fresh)")
        if self.compile_time_share is not None and not (isinstance(self.compile_time_share, (int, float))
                                                        and 0 < self.compile_time_share < 1):
            raise ValueError(f"Space: invalid compile_time_share={self.compile_time_share!r}: a share in (0, 1), or "
                             f"None for the fixed compiled_share")
        _subset("storages", self.storages, STORAGES)
        if self.storages[0] != "plain":
            raise ValueError(f"Space: invalid storages={self.storages!r}: the first is 'plain' (cases shrink to it)")
        _subset("fp8_formats", self.fp8_formats, F.FORMATS)
        _subset("fp8_outputs", self.fp8_outputs, (None, *F.FORMATS))
        _subset("fp8_ps", self.fp8_ps, (None, *F.FORMATS))
        _subset("fp8_scalings", self.fp8_scalings, F.SCALINGS)
        _subset("fp8_douts", self.fp8_douts, F.FORMATS)
        _subset("fp8_dss", self.fp8_dss, (None, *F.FORMATS))
        _subset("fp8_dqkvs", self.fp8_dqkvs, (None, *F.FORMATS))
        if self.fp8_grads is not None and (not isinstance(self.fp8_grads, int) or isinstance(self.fp8_grads, bool)
                                           or self.fp8_grads < 0):
            raise ValueError(f"Space: invalid fp8_grads={self.fp8_grads!r}: 0 (FP8 forward only), n >= 1 (an FP8 "
                             f"case checks gradients once in n) or None (the harness decides)")
        if not isinstance(self.page_sizes, tuple) or not self.page_sizes or any(
                not isinstance(p, int) or isinstance(p, bool) or p < 1 for p in self.page_sizes):
            raise ValueError(f"Space: invalid page_sizes={self.page_sizes!r}: a non-empty tuple of ints >= 1")

    def replace(self, **changes) -> Space:
        return dataclasses.replace(self, **changes)

    @property
    def decode_len(self) -> int:
        return self.max_decode_len if self.max_decode_len is not None else self.max_len

    @classmethod
    def for_device(cls, device: str, max_len: int | None = None) -> Space:
        """The default Space on `device`: a CPU's as Space(); on a GPU (the oracle runs there for large cases),
        lengths up to 16k, decode shapes up to 128k keys and 2**34 multiply-adds (GPU_MAX_WORK). `max_len` (--max-len) bounds every
        length, decode keys included."""
        space = cls() if device == "cpu" else cls(max_len=GPU_MAX_LEN, max_decode_len=GPU_MAX_DECODE_LEN,
                                                   max_work=GPU_MAX_WORK, long_edge_odds=GPU_EDGE_ODDS)
        return space if max_len is None else space.replace(max_len=max_len, max_decode_len=max_len)


GPU_MAX_LEN = 16384
GPU_MAX_DECODE_LEN = 131072
# A GPU case's oracle cost in multiply-adds, at most: the float64 oracle runs about 3.6e11 of them a second on an H200
# (a forward case of 2^35 took 120 ms; gradients ~2.7x that) and a small case's whole loop takes about 10 ms there,
# so a long case costs at most about 5 small cases (13 with gradients) and, drawn one time in Space.long_one_in,
# long cases hold a bounded share of a run's time (docs/performance.md). 2^34 still reaches every length: a 16k x 16k
# square with head dims to 32, 128k decode keys with any.
GPU_MAX_WORK = 2**34
# On a GPU, four long lengths in five sit at a tile residue (half of them on a CPU): a long case costs the same at a
# tile edge as beside one, and the edges, where a kernel's last tile is partial, are where its bugs are; a length
# beside an edge still comes one time in five, and shrinking drops the residue first.
GPU_EDGE_ODDS = 1.6


# Each switch is probed with a small case that turns on that one feature, in a dtype the backend takes.
_PROBE = Case(b=2, sq=32, skv=32, h=2, hk=2, d_qk=32, d_v=32, dtype="float16")
_SWITCHES: dict[str, dict] = {
    "causal": dict(causal=True),
    "windows": dict(window=(4, 4)),
    "padding": dict(seqlens_q=(32, 20), seqlens_kv=(32, 24)),
    "explicit_mask": dict(mask_density=0.5),
    "softcap": dict(softcap=20.0),
    "alibi": dict(alibi_slopes=(0.5, 0.25)),
    "custom_scale": dict(scale=0.3),
    "gqa": dict(h=4, hk=2),
    "split_head_dims": dict(d_v=64),  # d_qk = 32 (or the head dims narrow_to found), d_v another
    "grads": dict(grads=True),
    "paged": dict(page_size=16),
}


def narrow_to(space: Space, unsupported: Callable[[Case], str | None]) -> Space:
    """The part of `space` a backend does not refuse outright, probing one feature (or one choice) at a time. A
    backend that takes only paged KV caches is probed with paged cases and draws nothing else (unpaged=False)."""
    def takes(**fields) -> bool:
        try:
            return unsupported(base.replace(**fields)) is None
        except ValueError:  # the probe breaks a rule of the case language (gradients of a paged cache)
            return False

    base = _PROBE.replace(fp8=("e4m3",) * 3) if space.fp8 else _PROBE
    # the page size the probes use: 16 where the backend takes it, else the first it takes (FA2: multiples of 256)
    page = next((p for p in (16, *space.page_sizes) if takes(page_size=p)), 16) if space.paged else 16
    paged_only = space.paged and not takes() and takes(page_size=page)
    if paged_only:
        base = base.replace(page_size=page)
    dtypes = tuple(d for d in space.dtypes if takes(dtype=d)) or space.dtypes[:1]
    base = base.replace(dtype=dtypes[0])
    changes: dict = {"dtypes": dtypes, "unpaged": space.unpaged and not paged_only}
    # Head dims one at a time (d_qk = d_v): a kernel that stops at 256 never draws 512; pairs it refuses are
    # UNSUPPORTED. The probes below then use head dims it takes (32 and 64 where it takes them).
    listed = sorted({*HEAD_DIMS, *ODD_HEAD_DIMS} & set(space.head_dims or HEAD_DIMS + ODD_HEAD_DIMS))
    dims = tuple(d for d in listed if d <= space.max_head_dim and takes(d_qk=d, d_v=d))
    switches = {**_SWITCHES, "paged": dict(page_size=page)}
    if space.fp8:   # an FP8 case checks gradients with dO in FP8 (strategies/fp8_backward.py)
        switches["grads"] = dict(grads=True, fp8_dout=space.fp8_douts[0])
    if dims:
        changes["head_dims"] = dims
        wide = [d for d in dims if d >= 32] or list(dims)
        base = base.replace(d_qk=wide[0], d_v=wide[0])
        other = [d for d in wide if d >= 64 and d != wide[0]] or [d for d in dims if d != wide[0]]
        if other:
            switches["split_head_dims"] = dict(d_v=other[0])
        elif space.split_head_dims:  # one head dim: nothing to split
            changes["split_head_dims"] = False
    for switch, fields in switches.items():
        if getattr(space, switch) and not takes(**fields):
            changes[switch] = False
    if space.single_key and not takes(skv=1) and not takes(sq=1, skv=1) and takes():
        changes["single_key"] = False
    if (space.top_left_shift and not takes(causal=True, sq=16, alignment="top_left")
            and takes(causal=True, sq=16, alignment="bottom_right")):
        changes["top_left_shift"] = False
    choices = {"layouts": lambda v: dict(_SWITCHES["padding"], layout=v),
               "memory": lambda v: dict(h=4, hk=2, memory=v),
               "softmaxes": lambda v: dict(softmax=v),
               "page_sizes": lambda v: dict(page_size=v),
               "storages": lambda v: dict(storage=(v, v, v))}
    if space.fp8:
        if space.fp8_plain_q and not takes(fp8=(None, "e4m3", "e4m3")):
            changes["fp8_plain_q"] = False
        choices.update(fp8_formats=lambda v: dict(fp8=(v, v, v)), fp8_outputs=lambda v: dict(fp8_out=v),
                       fp8_ps=lambda v: dict(fp8_p=v),
                       fp8_scalings=lambda v: dict(fp8_scaling=v, page_size=base.page_size or (
                           page if v == "page" or not space.fp8_grads else None)))
        # (a scaling other than per page is probed on an unpaged case where FP8 gradients are on: a kernel that
        # serves no paged cache would refuse every paged probe; the forward-only streams keep their probes)
        if space.fp8_grads:   # an FP8 backward: gradients are probed with dO in FP8 (strategies/fp8_backward.py)
            douts = tuple(v for v in space.fp8_douts if takes(grads=True, fp8_dout=v))
            changes["fp8_grads"] = space.fp8_grads if douts else 0
            dout = (douts or space.fp8_douts)[0]
            choices.update(fp8_douts=lambda v: dict(grads=True, fp8_dout=v),
                           fp8_dss=lambda v: dict(grads=True, fp8_dout=dout, fp8_ds=v),
                           fp8_dqkvs=lambda v: dict(grads=True, fp8_dout=dout, fp8_dqkv=v))
    for name, fields in choices.items():
        changes[name] = tuple(v for v in getattr(space, name) if takes(**fields(v))) or getattr(space, name)[:1]
    # An alignment only shows when sq != skv; a backend may take it one way round only (FA: top-left with sq >= skv).
    changes["alignments"] = tuple(a for a in space.alignments if takes(causal=True, sq=16, alignment=a)
                                  or takes(causal=True, skv=16, alignment=a)) or space.alignments[:1]
    return space.replace(**changes)


def top_left_shift_refused(case: Case) -> bool:
    """Whether a top-left case is one a kernel that aligns bands (and ALiBi distances) bottom-right cannot take: its
    band, moved to the bottom-right diagonal by skv_n - sq_n, needs a negative bound, or its sequences need
    different shifts, or its ALiBi shifts (flash-attn measures the distance from the bottom-right diagonal)."""
    if case.alignment != "top_left":
        return False
    shifts = top_left_shifts(case)
    if case.alibi_slopes is not None and set(shifts) - {0}:
        return True
    if case.left is None and case.right is None:
        return False
    return len(shifts) > 1 or any(b is not None and b < 0 for d in shifts for b in shifted_band(case, d))


def fp8_narrowed(space: Space) -> Space:
    """`space` without what FP8 cases never hold (strategies/fp8.py): gradients (unless fp8_grads), probe and family
    values, drawn value ranges, memory formats and buffers other than plain, float64."""
    return space.replace(grads=space.grads and bool(space.fp8_grads), probes=False, value_families=False,
                         extreme_logits=False, memory=("contiguous",), storages=("plain",),
                         dtypes=tuple(d for d in space.dtypes if d in F.DTYPES) or ("bfloat16",))


def draws(space: Space, case: Case) -> bool:
    """Whether attention_cases(space) can draw `case`'s features: each one the space turns on, each choice among the
    space's, its lengths and head dims within bounds (its exact lengths and cost are not checked: a witness of a
    feature combination, fuzz/report/combos.py, needs the combination drawable, not the case)."""
    family = case.values not in ("gaussian", "probe")
    longest = case.skv if case.sq <= 16 else max(case.sq, case.skv)
    heads = space.head_dims is None or (case.d_qk in space.head_dims and case.d_v in space.head_dims)
    checks = (
        case.dtype in space.dtypes, case.layout in space.layouts, case.memory in space.memory,
        case.softmax in space.softmaxes, all(s in space.storages for s in case.storage),
        not case.causal or space.causal, case.window == (None, None) or space.windows,
        not case.padded or case.layout == "thd" or case.paged or space.padding,
        case.mask_density is None or space.explicit_mask, case.softcap is None or space.softcap,
        case.alibi_slopes is None or space.alibi, case.h == case.hk or space.gqa,
        case.d_qk == case.d_v or space.split_head_dims, not case.grads or space.grads,
        case.values != "probe" or space.probes, not family or space.value_families,
        space.paged if case.paged else space.unpaged,
        case.page_size is None or case.page_size in space.page_sizes,
        max(case.d_qk, case.d_v) <= space.max_head_dim and heads,
        case.skv != 1 or space.single_key,
        space.top_left_shift or not top_left_shift_refused(case),
        case.sq <= space.max_len and longest <= (space.decode_len if case.sq <= 16 else space.max_len),
        case.alignment in space.alignments or (case.right is None and case.alibi_slopes is None),
        # the float64 oracle's cost with one sequence and one group of heads (attnfuzz.strategies.lengths.work)
        case.sq * case.skv * (case.d_qk + case.d_v + 32) * (case.h // case.hk) <= space.max_work,
        (case.fp8 is not None) == bool(space.fp8),
        case.fp8 is None or (all(f in space.fp8_formats for f in case.fp8[1:]) and case.fp8_out in space.fp8_outputs
                             and (case.fp8[0] in space.fp8_formats or (case.fp8[0] is None and space.fp8_plain_q))
                             and case.fp8_p in space.fp8_ps and case.fp8_scaling in space.fp8_scalings),
        case.fp8_dout is None or (bool(space.fp8_grads) and case.fp8_dout in space.fp8_douts
                                  and case.fp8_ds in space.fp8_dss and case.fp8_dqkv in space.fp8_dqkvs),
    )
    return all(checks)
