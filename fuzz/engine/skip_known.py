"""Cases a known crash or hang takes, answered without running them while the record holds.

An isolated worker that crashes or hangs costs its case a new process (CUDA's start, the backend's imports, its
kernels compiled again) or the whole time limit, and a known bug that kills the process on every case of its
condition (a misaligned pointer, a TMA descriptor) can take a third of a stream's time. On a GPU a fault costs more
than its own process: the driver's recovery from it stalls every process on the GPU, about 5.5 s each time (in a
10-minute SDPA campaign of 12 lanes on an H100, 33 such stalls held 8 or more lanes at once, 30 % of the run; each
began with a misaligned-address fault of a known bug). Where a corpus known_bug record with a crash or hang label
takes a case before it runs (its `when`, judged as store/known.py judges a failure, on the face the entry's own
verdict shows), every such case runs until one fails as the bug; after that one in CHECK_EVERY still runs, and the
others are answered with that face, marked "not run". A record is trusted only once a case has shown its bug here:
one whose condition is far wider than the bug (an empty `when`) would otherwise answer seven cases in eight unrun,
cases that pass, until its clean checks end the skip (in a 265-case flex-compiled stream, 63 cases were answered as
two crashes and a hang whose checks never failed as them).

Only a costly face is skipped (`costly`): a worker's death or hang, a CUDA error (a fresh worker, and on a GPU the
stall), a kernel that fails to build. A record of an exception the kernel raises and survives (its own check, an
IndexError) saves nothing by skipping, and a skip would hide the bugs under its condition: its cases all run.

The checks keep the record honest. A check that fails in a way no known bug takes makes the record imprecise at
once: something else lives under its condition, and every later case of it runs, so the search can find and shrink
it. A check the kernel refuses at call time ran nothing and is no check (the next case is checked instead), and a
check counts as the bug whenever this record takes its failure, even where `known` names another record first. A
check that passes (or shows another known bug) counts against the record: once it has been checked
MIN_CHECKS times and fewer than one check in HOLDS_ONE_IN failed as the bug (a kernel fixed since, or a condition
far wider than the bug), every later case runs. A condition the bug fills only in part (a fault on some offset
pointers, not all) is kept: its cases that would pass are then sampled one in CHECK_EVERY, and so is any other bug
that lives only under that condition, which is the price of not stalling the GPU for each fault
(`bench/skip_known.py --backend tests.misbehaving:segfault_when_causal_and_odd` shows both). Where the record holds on
every case it takes, the Hypothesis stream is the same either way (a known failure is not a finding), so a seed draws
the same cases with the skip as without it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable

from attnfuzz.engine.cuda_errors import raised_cuda_error
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

CHECK_EVERY = 8    # one case in this many of those a record takes still runs
MIN_CHECKS = 4     # checks before a record's share of clean checks can end its skip
HOLDS_ONE_IN = 8   # the record keeps skipping while at least one check in this many failed as its bug
NOT_RUN = "not run"


def answered_unrun(message: str) -> bool:
    """Whether a verdict's message (a case log's `message`) is that of a case answered without running it."""
    return message.startswith(f"{NOT_RUN}:")


def skipping(worker, backend: str, known: Callable | None, build_errors: tuple[str, ...] = ()):
    """`worker` wrapped in SkipKnownCrashes where `known` lists costly crash or hang faces of `backend` (`costly`,
    with the exception types of a kernel build that fails, Backend.build_errors), else `worker`."""
    crash_faces = faces(known, backend, build_errors) if worker is not None else []
    return SkipKnownCrashes(worker, backend, known, crash_faces) if crash_faces else worker


def faces(known: Callable | None, backend: str, build_errors: tuple[str, ...] = ()) -> list[tuple[str, V.Verdict]]:
    """(entry id, the verdict a skipped case is answered with) for `backend`'s known bugs that crash or hang at a
    cost, as the `known` predicate (store/known.py's known_bugs_of) lists them: each crash or hang label, or the
    entry's own failure where it mostly reads wrong and crashes at times; none for a predicate that does not list
    its faces."""
    return [(entry_id, face) for b, entry_id, face in getattr(known, "crash_faces", ())
            if b == backend and costly(face, build_errors)]


def costly(face: V.Verdict, build_errors: tuple[str, ...] = ()) -> bool:
    """Whether a case of this face costs more than its own run: a worker (a death, a hang), a fresh worker and the
    GPU's stall (a CUDA error), or a kernel build (one of the backend's `build_errors`). An exception the kernel
    raises otherwise (a RuntimeError of its own checks, an IndexError) costs milliseconds and leaves the worker fit:
    skipping it saves nothing, so its cases all run, and each checks the record."""
    if face.status != V.CRASH:   # a HANG, or a failure that crashes at times
        return True
    died = (face.diagnosis or "").startswith(("EXIT_", "SIG", "PROCESS_DIED"))
    return died or face.diagnosis in build_errors or raised_cuda_error(face)


class SkipKnownCrashes:
    """A worker whose cases a known crash or hang takes are answered without running most of them (the module's
    docstring). `skipped` counts them by entry id, `checked` and `held` the checks run and those that failed as the
    bug; `imprecise` holds the ids whose cases all run now."""

    def __init__(self, worker, backend: str, known: Callable, crash_faces: list[tuple[str, V.Verdict]]):
        self.worker, self.backend, self.known, self.crash_faces = worker, backend, known, crash_faces
        self.seen, self.skipped, self.checked, self.held = Counter(), Counter(), Counter(), Counter()
        self.imprecise: set[str] = set()

    def run(self, case: Case) -> V.Verdict:
        taken = next(((entry_id, face) for entry_id, face in self.crash_faces
                      if entry_id not in self.imprecise and self._takes(entry_id, case, face)), None)
        if taken is None:
            return self.worker.run(case)
        entry_id, face = taken
        self.seen[entry_id] += 1
        if not self.held[entry_id] or (self.seen[entry_id] - 1) % CHECK_EVERY == 0:
            verdict = self.worker.run(case)
            self._judge(entry_id, case, verdict)
            return verdict
        self.skipped[entry_id] += 1
        return dataclasses.replace(face, message=f"{NOT_RUN}: known bug {entry_id} takes this case, checked one case "
                                                 f"in {CHECK_EVERY}: {face.message}")

    def _judge(self, entry_id: str, case: Case, verdict: V.Verdict) -> None:
        """Count a check; the record turns imprecise on another failure, or on too few checks that failed as it. A
        case the kernel refused ran nothing and is no check: the next case the record takes is checked instead."""
        if verdict.status == V.UNSUPPORTED:
            self.seen[entry_id] -= 1
            return
        self.checked[entry_id] += 1
        if verdict.failed and self._takes(entry_id, case, verdict):
            self.held[entry_id] += 1
        elif verdict.failed and self.known(self.backend, case, verdict) is None:
            self.imprecise.add(entry_id)   # news under the record's condition: run it all, so it can be shrunk
        checked, held = self.checked[entry_id], self.held[entry_id]
        if checked >= MIN_CHECKS and held * HOLDS_ONE_IN < checked:
            self.imprecise.add(entry_id)

    def _takes(self, entry_id: str, case: Case, verdict: V.Verdict) -> bool:
        """Whether the entry's record takes the verdict, even where another record would be named first (a predicate
        that lists crash faces is store/known.py's, which answers that too)."""
        return self.known.takes(entry_id, self.backend, case, verdict)

    def summary(self) -> str | None:
        """What the run answered without running, for its report; None when nothing."""
        if not self.skipped and not self.imprecise:
            return None
        done = ", ".join(f"{n} of {entry_id} ({self.held[entry_id]} of {self.checked[entry_id]} checks failed as it)"
                         for entry_id, n in self.skipped.most_common())
        ran = f"; ran every case of {', '.join(sorted(self.imprecise))}: its checks did not hold" \
            if self.imprecise else ""
        return f"cases a known crash or hang takes, not run: {done or 'none'}{ran}"

    def __getattr__(self, name):  # rerun, restarts, close, timeout_s: the worker's own
        return getattr(self.worker, name)
