"""One corpus entry's case run again through every backend and spelling that can take it here, each graded against
the float64 oracle: what `attnfuzz report-bug` tabulates as which backends agree."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from attnfuzz.store import corpus as corpus_io
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

CANNOT, NOT_RUN = "cannot run here", "not run"


@dataclass
class Row:
    """One backend and spelling on the entry's case: its verdict, or why it did not run (CANNOT, NOT_RUN)."""
    backend: str
    spelling: str
    outcome: str  # a verdict status, CANNOT or NOT_RUN
    detail: str = ""
    version: str = ""
    verdict: V.Verdict | None = None
    own: bool = False  # the entry's backend
    case: Case | None = None
    note: str = ""


def saved_label(verdict: V.Verdict) -> str:
    """The failure a saved verdict stands for: a FLAKY entry's is the label it flaked with."""
    return (verdict.diagnosis or "") if verdict.status == V.FLAKY else verdict.label


def _resolved(backend, case: Case) -> str:
    """The named spelling that "" stands for, where the adapter can say (SDPA), else ""."""
    try:
        return getattr(backend._resolve(case), "name", "") or ""  # type: ignore[attr-defined]
    except Exception:
        return ""


def _spelling(backend, case: Case) -> str:
    name = case.spelling or _resolved(backend, case)
    return name if case.spelling else (f"default ({name})" if name else "default")


def _version(backend) -> str:
    try:
        return backend.version() or ""
    except Exception:
        return ""


def cross_check(entry: corpus_io.Entry, device: str, *, isolate: bool = False, timeout_s: float = 120.0,
                known=None) -> list[Row]:
    """The entry's backend in every spelling it takes (the entry's first), then every other registered backend in
    its default spelling and, where it takes it too, the entry's. A failure another entry's known bug takes is noted.
    An entry that crashed or hung runs its own backend in a worker even without `isolate`."""
    from attnfuzz import backends
    try:
        own = backends.get(entry.backend, device)
    except Exception as e:  # a name this attnfuzz does not know, a bring-your-own module that does not import
        own, rows = None, [Row(entry.backend, "every spelling", CANNOT, f"{type(e).__name__}: {e}", own=True)]
    if own is not None:
        dies = saved_label(entry.verdict).split(":")[0] in (V.CRASH, V.HANG)
        rows = _rows(own, entry, device, isolate or dies, timeout_s, mine=True)
    for name, factory in backends.factories().items():
        if name == entry.backend:
            continue
        backend = factory(device)
        if backend.own_processes and not (own is not None and own.own_processes):
            rows.append(Row(name, "-", NOT_RUN, "context parallel (runs its own ranks): run for context-parallel "
                                                "entries only"))
        else:
            rows += _rows(backend, entry, device, isolate, timeout_s, mine=False)
    for row in rows:
        hit = known(row.backend, row.case, row.verdict) if known and row.verdict and row.verdict.failed else None
        if hit is not None and hit["entry"] != entry.filename:
            row.note = f"known bug: {hit['link']}"
    return rows


def _rows(backend, entry: corpus_io.Entry, device: str, isolate: bool, timeout_s: float, *, mine: bool) -> list[Row]:
    from attnfuzz.engine.harness import run_case
    from attnfuzz.engine.isolate import isolated
    case, worker = (entry.case if mine else entry.case.replace(spelling="")), None
    try:
        worker = isolated(backend, device, timeout_s, enabled=isolate)
        why = worker.available() if worker is not None else backend.available()
    except Exception as e:  # a worker that did not start
        why = f"{type(e).__name__}: {e}"
    try:
        if why is not None:
            return [Row(backend.name, "every spelling" if mine else "-", CANNOT, why,
                        _version(backend) or "not installed", own=mine)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                taken = list(backend.spellings(case.replace(spelling="")))
            except Exception:
                taken = [""]
            # its own: every spelling it takes; another backend: its default, and the entry's where it has that too
            named = entry.case.spelling
            wanted = [case.spelling] + [s for s in taken if (s != named if mine else s == named)]
            if named and {named, ""} <= set(wanted) and _resolved(backend, case.replace(spelling="")) == named:
                wanted.remove("")  # the default is the entry's spelling under another name
            rows = []
            for spelling in dict.fromkeys(wanted):
                spelled = case.replace(spelling=spelling)
                verdict = worker.run(spelled) if worker is not None else run_case(backend, spelled, device=device)
                rows.append(Row(backend.name, _spelling(backend, spelled), verdict.status, verdict.message,
                                _version(backend), verdict, own=mine, case=spelled))
            return rows
    finally:
        if worker is not None:
            worker.close()
        backend.close()  # a context-parallel backend's rank pool, say
