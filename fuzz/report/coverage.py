"""Coverage of the case space: which cells each backend has run, passed, failed, and refused.

A cell is one value on each axis below (a coarse class of a Case, not the case itself). The space is the product of
the axes' value lists (`SPACE_SIZE`); some of its cells cannot be drawn (thd needs padding, sq = skv leaves the
alignment n/a), so it is an upper bound, counted honestly rather than guessed down.

- mask: the causal flag and per-sequence padding; an explicit boolean mask is classed by its keep density instead
  (empty 0, sparse < 0.5, dense < 1, full 1).
- alignment: top_left / bottom_right, or n/a where the offset skv_n - sq_n is 0 for every sequence, or where nothing
  reads it (no band and no ALiBi).
- window: the raw window (a right bound of 0 under causal is causal's own, not a window), first match of: none;
  zero (a bound is 0); beyond (a bound >= max(sq, skv): the band is as wide as the sequence); left; right; both.
- layout, dtype: the Case field.
- heads: MHA (h = hk), MQA (hk = 1 < h), GQA.
- length: the size class of sq and skv, first match of: sq=1; tiny (both <= 16); tile_edge (a length, padded or
  per sequence, within 1 of a multiple of 64); small (<= 512); long; then /eq when every sequence has as many
  queries as keys, /ne when one does not.
- kv: how the keys reach the backend, first match of: contiguous (not paged); paged_shared (leading pages shared by
  every sequence); paged_tail (a cache length ends inside a page: a partly filled last page); paged (every cache
  length a whole number of pages).
- storage: the least plain Case.storage class among q, k and v (in STORAGES order: plain, offset, padded_rows,
  strided).

Beside the cells, the realized distribution (`Distribution`): the share of drawn cases in each class of a few finer
shape classes (SHAPE_CLASSES: sq and skv buckets, decode and tall shapes, head dim classes, causal x length, tile
residues of skv) and the share of cases that repeat an earlier one, so a run shows what it drew, not what the
strategy meant to draw.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, fields
from typing import Callable

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import DTYPES, LAYOUTS, STORAGES, Case
from attnfuzz.strategies.features import at_tile_edge, heads_class

Cell = tuple[str, ...]

MASKS = ("none", "causal", "padding", "padding_causal", "bool_empty", "bool_sparse", "bool_dense", "bool_full")
ALIGNMENT_CLASSES = ("top_left", "bottom_right", "n/a")
WINDOWS = ("none", "zero", "beyond", "left", "right", "both")
HEADS = ("MHA", "GQA", "MQA")
SIZES = ("sq=1", "tiny", "tile_edge", "small", "long")
LENGTHS = tuple(f"{size}/{eq}" for size in SIZES for eq in ("eq", "ne"))
SMALL_MAX = 512
TINY_MAX = 16


def mask_class(case: Case) -> str:
    density = case.mask_density
    if density is not None:
        return ("bool_empty" if density == 0 else "bool_sparse" if density < 0.5 else
                "bool_dense" if density < 1 else "bool_full")
    base = "causal" if case.causal else "none"
    if case.padded:
        return "padding" if base == "none" else "padding_causal"
    return base


def alignment_class(case: Case) -> str:
    no_offset = all(q == k for q, k in zip(case.lens_q, case.lens_kv))
    unread = case.left is None and case.right is None and case.alibi_slopes is None
    return "n/a" if no_offset or unread else case.alignment


def window_class(case: Case) -> str:
    left, right = case.window
    if case.causal and right == 0:
        right = None
    bounds = [w for w in (left, right) if w is not None]
    if not bounds:
        return "none"
    if 0 in bounds:
        return "zero"
    if any(w >= max(case.sq, case.skv) for w in bounds):
        return "beyond"
    return "both" if len(bounds) == 2 else ("left" if left is not None else "right")


def length_class(case: Case) -> str:
    longest = max(case.sq, case.skv)
    lengths = (case.sq, case.skv, *case.lens_q, *case.lens_kv)
    size = ("sq=1" if case.sq == 1 else "tiny" if longest <= TINY_MAX else
            "tile_edge" if any(at_tile_edge(n) for n in lengths) else "small" if longest <= SMALL_MAX else "long")
    equal = all(q == k for q, k in zip(case.lens_q, case.lens_kv))
    return f"{size}/{'eq' if equal else 'ne'}"


KV_CLASSES = ("contiguous", "paged", "paged_tail", "paged_shared")


def kv_class(case: Case) -> str:
    if case.page_size is None:
        return "contiguous"
    if case.shared_prefix_pages:
        return "paged_shared"
    return "paged_tail" if any(n % case.page_size for n in case.lens_kv) else "paged"


def storage_class(case: Case) -> str:
    return max(case.storage, key=STORAGES.index)


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[str, ...]
    of: Callable[[Case], str]


AXES = (Axis("mask", MASKS, mask_class), Axis("alignment", ALIGNMENT_CLASSES, alignment_class),
        Axis("window", WINDOWS, window_class), Axis("layout", LAYOUTS, lambda c: c.layout),
        Axis("dtype", DTYPES, lambda c: c.dtype), Axis("heads", HEADS, heads_class),
        Axis("length", LENGTHS, length_class), Axis("kv", KV_CLASSES, kv_class),
        Axis("storage", STORAGES, storage_class))
AXIS_NAMES = tuple(a.name for a in AXES)
SPACE_SIZE = math.prod(len(a.values) for a in AXES)


def cell_of(case: Case | dict) -> Cell:
    """The cell of a Case (or of its to_dict()), one value per axis in AXES order."""
    if isinstance(case, dict):
        case = Case.from_dict(case)
    return tuple(axis.of(case) for axis in AXES)


@dataclass
class Counts:
    """Cases in a cell (or a marginal) by outcome. failed = FAIL, CRASH, HANG, FLAKY; refused = UNSUPPORTED."""

    cases: int = 0
    passed: int = 0
    failed: int = 0
    known: int = 0
    refused: int = 0

    def add(self, label: str) -> None:
        status = label.split(":", 1)[0]
        self.cases += 1
        if status == "PASS":
            self.passed += 1
        elif status in V.FAILED:
            self.failed += 1
        elif status == "KNOWN":
            self.known += 1
        elif status == "UNSUPPORTED":
            self.refused += 1

    def merge(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def covered(self) -> bool:
        """At least one case here ran (was not refused)."""
        return self.cases > self.refused


@dataclass(frozen=True)
class Marginal:
    """One value of one axis: the cases on it and how many of its cells were covered."""

    value: str
    counts: Counts
    cells_covered: int
    cells_total: int


LENGTH_BUCKETS = (1, 4, 16, 64, 160, 512, 1024, 2048, 16384)


def _bucket(n: int) -> str:
    lo = 1
    for hi in LENGTH_BUCKETS:
        if n <= hi:
            return str(hi) if lo == hi else f"{lo}-{hi}"
        lo = hi + 1
    return f">{LENGTH_BUCKETS[-1]}"


def _buckets() -> tuple[str, ...]:
    return tuple(_bucket(n) for n in (1, *(hi + 1 for hi in LENGTH_BUCKETS)))


def shape_class(case: Case) -> str:
    """decode: at most 16 queries over 512 or more keys; tall: 4x as many queries as keys (over 64 of them); else
    square (within 4x) or wide."""
    if case.sq <= 16 and case.skv >= 512:
        return "decode"
    if case.sq >= 4 * case.skv and case.sq > 64:
        return "tall"
    return "square" if max(case.sq, case.skv) <= 4 * min(case.sq, case.skv) else "wide"


def head_dim_class(case: Case) -> str:
    """The larger head dim's class, '+split' when d_qk != d_v: <=64, 65-128, 129-192, 193-256, >256."""
    d = max(case.d_qk, case.d_v)
    name = "<=64" if d <= 64 else "65-128" if d <= 128 else "129-192" if d <= 192 else "193-256" if d <= 256 else ">256"
    return name + ("+split" if case.d_qk != case.d_v else "")


def causal_length_class(case: Case) -> str:
    longest = max(case.sq, case.skv)
    size = "<=160" if longest <= 160 else "161-299" if longest < 300 else ">=300"
    return f"{'causal' if case.causal else 'non-causal'}/{size}"


def residue_class(case: Case) -> str:
    """Where skv falls against a 128-key tile: <64 (no full tile), %128=64, %64=1, %64=0, %64=63, else other
    (first match)."""
    n = case.skv
    return ("<64" if n < 64 else "%128=64" if n % 128 == 64 else "%64=1" if n % 64 == 1 else "%64=0" if n % 64 == 0 else
            "%64=63" if n % 64 == 63 else "other")


HEAD_DIM_CLASSES = tuple(f"{c}{s}" for c in ("<=64", "65-128", "129-192", "193-256", ">256") for s in ("", "+split"))
SHAPE_CLASSES: dict[str, tuple[tuple[str, ...], Callable[[Case], str]]] = {
    "sq": (_buckets(), lambda c: _bucket(c.sq)),
    "skv": (_buckets(), lambda c: _bucket(c.skv)),
    "shape": (("square", "wide", "tall", "decode"), shape_class),
    "head dim": (HEAD_DIM_CLASSES, head_dim_class),
    "causal x length": (tuple(f"{m}/{s}" for m in ("causal", "non-causal") for s in ("<=160", "161-299", ">=300")),
                        causal_length_class),
    "skv residue": (("<64", "%128=64", "%64=1", "%64=0", "%64=63", "other"), residue_class),
}


class Distribution:
    """The drawn cases per class of each of SHAPE_CLASSES, and how many repeated an earlier case."""

    def __init__(self) -> None:
        self.cases = 0
        self.repeats = 0
        self.counts: dict[str, Counter] = {name: Counter() for name in SHAPE_CLASSES}
        self._seen: set[int] = set()

    def add(self, case: Case) -> None:
        self.cases += 1
        key = hash(repr(sorted(case.to_dict().items())))
        self.repeats += key in self._seen
        self._seen.add(key)
        for name, (_, of) in SHAPE_CLASSES.items():
            self.counts[name][of(case)] += 1

    def shares(self) -> dict[str, list[tuple[str, float]]]:
        """Per class name, (value, share of the cases) in the class's order, listed values only where drawn."""
        return {name: [(v, self.counts[name][v] / max(self.cases, 1)) for v in values if self.counts[name][v]]
                for name, (values, _) in SHAPE_CLASSES.items()}

    def describe(self) -> str:
        lines = [f"{self.cases} cases, {100 * self.repeats / max(self.cases, 1):.1f}% repeat an earlier one"]
        for name, shares in self.shares().items():
            lines.append(f"  {name}: " + ", ".join(f"{v} {100 * s:.1f}%" for v, s in shares))
        return "\n".join(lines)


class Coverage:
    """Counts per backend per cell; `add` per case, `summary` for a live line, `marginals` for tables, and the
    realized distribution per backend (`distribution`)."""

    def __init__(self) -> None:
        self.cells: dict[str, dict[Cell, Counts]] = {}
        self.drawn: dict[str, Distribution] = {}
        self.batch: dict[str, Counter] = {}  # per backend: cases batch-checked, and those batch invariant

    def add(self, backend: str, case: Case | dict, label: str, batch_invariant: bool | None = None) -> Cell:
        if isinstance(case, dict):
            case = Case.from_dict(case)
        cell = cell_of(case)
        self.cells.setdefault(backend, {}).setdefault(cell, Counts()).add(label)
        self.drawn.setdefault(backend, Distribution()).add(case)
        if batch_invariant is not None:
            seen = self.batch.setdefault(backend, Counter())
            seen["checked"] += 1
            seen["invariant"] += bool(batch_invariant)
        return cell

    def batch_invariance(self, backend: str) -> str:
        """The observed property (attnfuzz.engine.batch), e.g. 'batch invariant on 12 of 15 checked cases', or ''."""
        seen = self.batch.get(backend)
        return f"batch invariant on {seen['invariant']} of {seen['checked']} checked cases" if seen else ""

    def distribution(self, backend: str) -> Distribution:
        return self.drawn.get(backend, Distribution())

    def backends(self) -> list[str]:
        return sorted(self.cells)

    def cell_counts(self, backend: str | None = None) -> dict[Cell, Counts]:
        """One backend's cells, or (None) every backend's merged."""
        if backend is not None:
            return self.cells.get(backend, {})
        merged: dict[Cell, Counts] = {}
        for cells in self.cells.values():
            for cell, counts in cells.items():
                merged.setdefault(cell, Counts()).merge(counts)
        return merged

    def tally(self, backend: str | None = None) -> Counter:
        """Cells that are covered, failing (a failure in them), known (a known bug), refused_only."""
        t = Counter()
        for counts in self.cell_counts(backend).values():
            t["covered"] += counts.covered
            t["failing"] += counts.failed > 0
            t["known"] += counts.known > 0
            t["refused_only"] += not counts.covered
        return t

    def summary(self, backend: str | None = None) -> str:
        """One line for a live display, e.g. 'cells 123/51840 covered (0.24%), 7 failing, 40 refused only'."""
        t = self.tally(backend)
        line = (f"cells {t['covered']}/{SPACE_SIZE} covered ({100 * t['covered'] / SPACE_SIZE:.2f}%), "
                f"{t['failing']} failing")
        if t["known"]:
            line += f", {t['known']} known"
        return f"{line}, {t['refused_only']} refused only"

    def marginals(self, backend: str | None = None) -> dict[str, list[Marginal]]:
        """Per axis, one row per value (in the axis's order): summed counts and covered cells."""
        cells = self.cell_counts(backend)
        out = {}
        for i, axis in enumerate(AXES):
            sums = {v: Counts() for v in axis.values}
            covered = Counter()
            for cell, counts in cells.items():
                sums.setdefault(cell[i], Counts()).merge(counts)
                covered[cell[i]] += counts.covered
            per_value = SPACE_SIZE // len(axis.values)
            out[axis.name] = [Marginal(v, sums[v], covered[v], per_value) for v in sums]
        return out
