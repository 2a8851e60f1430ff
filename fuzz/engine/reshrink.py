"""Greedy shrinking of one case outside Hypothesis: simpler cases one field at a time (the switches off, then fewer
sequences, shorter lengths, fewer heads, no shared pages, smaller pages, smaller head dims), each kept while the
backend still fails the same way. `attnfuzz shrink` (fuzz/tools/shrink.py) walks saved corpus entries with it, and
engine/compiled_search.py finishes a compile-aware search's findings with it (a draw pinned to a compiled
configuration cannot shrink that configuration's fields; strategies/compiled.py)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import STORAGES, Case
from attnfuzz.strategies.cases import HEAD_DIMS, SOFTCAPS
from attnfuzz.strategies.space import PAGE_SIZES

SWITCHES = ("grads", "causal", "window", "mask_density", "softcap", "alibi_slopes", "scale", "softmax", "memory",
            "mean", "std", "alignment", "spelling", "dtype", "layout", "values", "seed")
# switch -> its plainest value: the Case default, but float16, the dtype the strategies shrink toward
PLAIN = {**{name: getattr(Case(), name) for name in SWITCHES}, "dtype": "float16"}


def _smaller(n: int, low: int = 1) -> list[int]:
    """Values below n to try, the most drastic first."""
    return sorted({v for v in (low, n // 4, n // 2, n - 1) if low <= v < n})


def _valid(case: Case, **changes) -> Case | None:
    try:
        return case.replace(**changes)
    except ValueError:  # the change breaks a rule of the case language (a thd case needs its lengths, ...)
        return None


def _clip(lens: tuple[int, ...] | None, full: int) -> tuple[int, ...] | None:
    return None if lens is None else tuple(min(n, full) for n in lens)


def _heads(case: Case, h: int, hk: int) -> Case | None:
    slopes = None if case.alibi_slopes is None else tuple(2.0 ** (-8.0 * (i + 1) / h) for i in range(h))
    memory = case.memory if case.memory != "expanded_kv" or hk > 1 else "contiguous"
    return _valid(case, h=h, hk=hk, alibi_slopes=slopes, memory=memory)


def _sequences(case: Case, keep: slice) -> Case | None:
    lens_q, lens_kv = case.seqlens_q, case.seqlens_kv
    b = len(range(case.b)[keep])
    return _valid(case, b=b, seqlens_q=None if lens_q is None else lens_q[keep],
                  seqlens_kv=None if lens_kv is None else lens_kv[keep])


def candidates(case: Case) -> Iterator[Case]:
    """Valid cases one step simpler than `case`, the switches first, then the sizes."""
    for field, plain in PLAIN.items():
        if getattr(case, field) != plain:
            yield _valid(case, **{field: plain})
    if case.softcap is not None and case.softcap != SOFTCAPS[0]:   # a softcap kept, at the value drawn first
        yield _valid(case, softcap=SOFTCAPS[0])
    for i, kind in enumerate(case.storage):  # one tensor's buffer at a time, plain first
        for plainer in STORAGES[:STORAGES.index(kind)]:
            yield _valid(case, storage=case.storage[:i] + (plainer,) + case.storage[i + 1:])
    left, right = case.window
    if left is not None:
        yield _valid(case, window=(None, right))
    if right is not None and not case.causal:
        yield _valid(case, window=(left, None))
    if case.seqlens_q is not None:
        yield _valid(case, seqlens_q=None, seqlens_kv=None)
        yield _valid(case, seqlens_q=(case.sq,) * case.b)
        yield _valid(case, seqlens_kv=(case.skv,) * case.b)
    for b in _smaller(case.b):
        yield _sequences(case, slice(0, b))       # the first sequences
        yield _sequences(case, slice(case.b - b, None))   # the last ones (a bug may need the second sequence)
    for sq in _smaller(case.sq):
        yield _valid(case, sq=sq, seqlens_q=_clip(case.seqlens_q, sq))
    for skv in _smaller(case.skv):
        yield _valid(case, skv=skv, seqlens_kv=_clip(case.seqlens_kv, skv))
    if case.h != case.hk:
        yield _heads(case, case.hk, case.hk)                   # no GQA
        yield _heads(case, case.h // case.hk, 1)               # the same group size over one KV head
    for h in _smaller(case.h):
        if h % case.hk == 0:
            yield _heads(case, h, case.hk)
        yield _heads(case, h, 1)
    if case.shared_prefix_pages:
        yield _valid(case, shared_prefix_pages=0)
    for page_size in (p for p in PAGE_SIZES if case.page_size is not None and p < case.page_size):
        yield _valid(case, page_size=page_size, shared_prefix_pages=0)
    if case.d_v != case.d_qk:
        yield _valid(case, d_v=case.d_qk)
    for d in (d for d in HEAD_DIMS if d < case.d_qk):
        yield _valid(case, d_qk=d, d_v=d if case.d_v == case.d_qk else case.d_v)
    for d in (d for d in HEAD_DIMS if d < case.d_v):
        yield _valid(case, d_v=d)


CLEAR = 2.0   # how far past its bound a FAIL a shrink keeps must stay (or as far as the failure it started from)


def as_clear(verdict: V.Verdict, first: V.Verdict) -> bool:
    """Whether a shrink step's verdict is as clear a failure as the one the shrink started from, up to CLEAR times
    the bound: a FAIL far past its bound (788x, on an H200) is not traded for one barely past it (1.2x, and flaky),
    which may be another effect, or rounding. Crashes, hangs and non-finite output have no such measure."""
    if verdict.status != V.FAIL or first.status != V.FAIL:
        return True
    return verdict.ratio >= min(first.ratio, CLEAR)


def shrink(case: Case, fails: Callable[[Case], V.Verdict | None], *, max_runs: int = 400,
           on_step: Callable[[Case, V.Verdict], None] | None = None,
           cheap: Callable[[Case], bool] | None = None) -> tuple[Case, V.Verdict | None, int]:
    """Greedy: take the first simpler candidate that `fails` (a verdict of the same failure, or None), start over
    from it, until none does or `max_runs` runs are spent. Returns the smallest case, its verdict and the runs.
    With `cheap`, the candidates it says cost little to run (a kernel compiled already) are tried first. A field
    whose change did not fail once is changed after the others from then on: each step taken starts the candidates
    over, and a change that cannot fail (no gradients for a gradient bug) would otherwise be run again after every
    step, on a JIT backend a compile each time; it is still tried before the shrink ends."""
    tried, runs, last = {case}, 0, None
    futile: set[str] = set()
    progress = True
    while progress and runs < max_runs:
        progress = False
        ordered = [(c, cheap is None or cheap(c), _changed(case, c)) for c in candidates(case)
                   if c is not None and c not in tried]
        ordered.sort(key=lambda row: (not row[1], not row[2].isdisjoint(futile)))   # stable: candidates' order within
        for candidate, _, changed in ordered:
            if candidate in tried:   # a candidate yielded twice in one pass
                continue
            tried.add(candidate)
            runs += 1
            verdict = fails(candidate)
            if verdict is not None:
                case, last, progress = candidate, verdict, True
                if on_step is not None:
                    on_step(case, verdict)
                break
            futile |= changed
            if runs >= max_runs:
                break
    return case, last, runs


def _changed(case: Case, candidate: Case) -> set[str]:
    return {f.name for f in dataclasses.fields(Case) if getattr(case, f.name) != getattr(candidate, f.name)}
