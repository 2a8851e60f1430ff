"""One corpus entry's case run again through every backend and spelling that can take it here, each graded against
the float64 oracle: what `attnfuzz report-bug` tabulates as which backends agree.

The cheap answers come first, so no library is imported for a backend that cannot take the case: whether a backend
that needs nothing beyond torch can run here (available()), then whether the backend takes the case (unsupported(),
a static table for most). A library several backends share (Backend.library_module: TE's three, FlashInfer's five) is
imported once, and a failed import answers for all of them. What runs is time-boxed (attnfuzz.tools.timebox): the
cross-check within `budget_s` in all, each backend within `backend_s`, the entry's own spelling whatever it takes. A
backend cut off, or not reached, gets an OVER_BUDGET row naming the limit it met."""

from __future__ import annotations

import importlib.util
import math
import time
import warnings
from dataclasses import dataclass, field

from attnfuzz.store import corpus as corpus_io
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.tools import timebox

CANNOT, NOT_RUN, OVER_BUDGET = "cannot run here", "not run", "over the time budget"
NO_LIMIT = (None, "")   # timebox.until's (deadline, why) for work that runs however long it takes


@dataclass
class Row:
    """One backend and spelling on the entry's case: its verdict, or why it did not run (CANNOT, NOT_RUN, OVER_BUDGET,
    or UNSUPPORTED without a verdict: refused before it ran)."""
    backend: str
    spelling: str
    outcome: str  # a verdict status, CANNOT, NOT_RUN or OVER_BUDGET
    detail: str = ""
    version: str = ""
    verdict: V.Verdict | None = None
    own: bool = False  # the entry's backend
    case: Case | None = None
    note: str = ""


@dataclass
class Clock:
    """The cross-check's limits: `budget_s` in all from its start, `backend_s` for each backend."""
    budget_s: float = math.inf
    backend_s: float = math.inf
    start: float = field(default_factory=time.monotonic)

    def whole(self) -> tuple[float, str]:
        """The deadline of the whole cross-check, and what a backend it cuts off is told."""
        return self.start + self.budget_s, f"the cross-check's {self.budget_s:g} s were spent (--budget)"

    def one(self) -> tuple[float, str]:
        """The deadline of a backend starting now: its own limit, or the whole budget's where that comes first."""
        mine, (end, why) = time.monotonic() + self.backend_s, self.whole()
        if mine < end:
            return mine, f"cut off after {self.backend_s:g} s, the most one backend may take (--backend-limit)"
        return end, why


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
                known=None, budget_s: float = math.inf, backend_s: float = math.inf) -> list[Row]:
    """The entry's backend in every spelling it takes (the entry's first), then every other registered backend in
    its default spelling and, where it takes it too, the entry's. A failure another entry's known bug takes is noted.
    An entry that crashed or hung runs its own backend in a worker even without `isolate`. Time-boxed by `budget_s`
    and `backend_s` (the module's docstring)."""
    from attnfuzz import backends
    clock, loaded = Clock(budget_s, backend_s), {}
    try:
        own = backends.get(entry.backend, device)
    except Exception as e:  # a name this attnfuzz does not know, a bring-your-own module that does not import
        own, rows = None, [Row(entry.backend, "every spelling", CANNOT, f"{type(e).__name__}: {e}", own=True)]
    if own is not None:
        dies = saved_label(entry.verdict).split(":")[0] in (V.CRASH, V.HANG)
        rows = _rows(own, entry, device, isolate or dies, timeout_s, clock, loaded, mine=True)
    for name, factory in backends.factories().items():
        if name == entry.backend:
            continue
        backend = factory(device)
        if backend.own_processes and not (own is not None and own.own_processes):
            rows.append(Row(name, "-", NOT_RUN, "context parallel (runs its own ranks): run for context-parallel "
                                                "entries only"))
        else:
            rows += _rows(backend, entry, device, isolate, timeout_s, clock, loaded, mine=False)
    for row in rows:
        hit = known(row.backend, row.case, row.verdict) if known and row.verdict and row.verdict.failed else None
        if hit is not None and hit["entry"] != entry.filename:
            row.note = f"known bug: {hit['link']}"
    return rows


def _refused(backend, case: Case) -> Row | None:
    """A row for another backend that cannot take the case, asked without importing its library: available() where
    it needs nothing beyond torch, then unsupported(case). None where it may take the case, or could not say."""
    try:
        why = None if backend.library_module else backend.available()
        if why is not None:
            return Row(backend.name, "-", CANNOT, why, _version(backend) or "not installed")
        reason = backend.unsupported(case)
    except Exception:  # left to the run, which records what it raises
        return None
    return None if reason is None else Row(backend.name, "-", V.UNSUPPORTED, reason)


def _load_once(backend, loaded: dict, limit: tuple | None) -> str | None:
    """Why the backend's library does not import, asked once for every backend naming it (`loaded` keeps the
    answers). A library not installed at all is said so at once, whatever the budget; else it is imported within
    `limit`, (deadline, why): an import serves the family. `limit` None: workers import it in processes of their own
    (isolate), not this one. Raises OverTime where the limit ran out."""
    name = backend.library_module
    if name and name not in loaded:
        top = name.split(".")[0]
        try:
            if importlib.util.find_spec(top) is None:  # its import fails at once, running none of its code
                loaded[name] = backend.load() or f"No module named {top!r}"
            elif limit is None:
                loaded[name] = None
            else:
                with timebox.until(*limit):
                    loaded[name] = backend.load()
        except timebox.OverTime as over:
            loaded[name] = over
        except Exception as e:
            loaded[name] = f"{type(e).__name__}: {e}"
    answer = loaded.get(name) if name else None
    if isinstance(answer, timebox.OverTime):
        raise timebox.OverTime(answer.why)
    return answer


def _rows(backend, entry: corpus_io.Entry, device: str, isolate: bool, timeout_s: float, clock: Clock,
          loaded: dict, *, mine: bool) -> list[Row]:
    case = entry.case if mine else entry.case.replace(spelling="")
    rows: list[Row] = []
    wanted: list[str] = []
    worker = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not mine:
                refused = _refused(backend, case)
                if refused is not None:
                    return [refused]
            # the entry's own backend loads and runs its spelling whatever it takes; the rest within the limits
            if not (mine and isolate):  # its worker says why it cannot run, in its own words
                # isolated, workers import the library in processes of their own; else here, the own backend's at once
                limit = None if isolate else NO_LIMIT if mine else clock.whole()
                missing = _load_once(backend, loaded, limit)
                if missing is not None:
                    return [Row(backend.name, "every spelling" if mine else "-", CANNOT, missing,
                                (_version(backend) if mine else "") or "not installed", own=mine)]
            limit = NO_LIMIT if mine else clock.one()
            with timebox.until(*limit):
                worker, why = _started(backend, device, timeout_s, isolate)
                if why is not None:
                    return [Row(backend.name, "every spelling" if mine else "-", CANNOT, why,
                                _version(backend) or "not installed", own=mine)]
                wanted = _wanted(backend, case, entry.case.spelling, mine=mine)
                if mine:
                    rows.append(_run(backend, worker, case.replace(spelling=wanted[0]), device, mine))
            if wanted[len(rows):]:  # the own backend's other spellings get a backend's limit from here
                with timebox.until(*(clock.one() if mine else limit)):
                    for spelling in wanted[len(rows):]:
                        rows.append(_run(backend, worker, case.replace(spelling=spelling), device, mine))
    except timebox.OverTime as over:
        rest = wanted[len(rows):]
        named = ", ".join(s or "default" for s in rest) if rows else "-"
        rows.append(Row(backend.name, named, OVER_BUDGET, over.why, own=mine))
    finally:
        if worker is not None:
            worker.close()
        backend.close()  # a context-parallel backend's rank pool, say
    return rows


def _started(backend, device: str, timeout_s: float, isolate: bool):
    """(the worker running the backend, or None in this process; why it cannot run here, or None)."""
    from attnfuzz.engine.isolate import isolated
    worker = None
    try:
        worker = isolated(backend, device, timeout_s, enabled=isolate)
        return worker, worker.available() if worker is not None else backend.available()
    except Exception as e:  # a worker that did not start
        return worker, f"{type(e).__name__}: {e}"
    except BaseException:  # cut off while it started
        if worker is not None:
            worker.close()
        raise


def _wanted(backend, case: Case, named: str, *, mine: bool) -> list[str]:
    """Its own: every spelling it takes; another backend: its default, and the entry's where it has that too."""
    try:
        taken = list(backend.spellings(case.replace(spelling="")))
    except Exception:
        taken = [""]
    wanted = [case.spelling] + [s for s in taken if (s != named if mine else s == named)]
    if named and {named, ""} <= set(wanted) and _resolved(backend, case.replace(spelling="")) == named:
        wanted.remove("")  # the default is the entry's spelling under another name
    return list(dict.fromkeys(wanted))


def _run(backend, worker, spelled: Case, device: str, mine: bool) -> Row:
    from attnfuzz.engine.harness import run_case
    verdict = worker.run(spelled) if worker is not None else run_case(backend, spelled, device=device)
    return Row(backend.name, _spelling(backend, spelled), verdict.status, verdict.message, _version(backend),
               verdict, own=mine, case=spelled)
