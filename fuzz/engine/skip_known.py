"""Cases a known crash or hang takes, answered without running them while the record proves precise.

An isolated worker that crashes or hangs costs its case a new process (CUDA's start, the backend's imports, its
kernels compiled again) or the whole time limit, and a known bug that kills the process on every case of its
condition (a misaligned pointer, a TMA descriptor) can take a third of a stream's time. Where a corpus known_bug
record with a crash or hang label takes a case before it runs (its `when`, judged as store/known.py judges a
failure, on the face the entry's own verdict shows), the first such case and one in CHECK_EVERY after it still run;
the others are answered with that face, marked "not run". A checked case that does not fail as a known bug makes the
record imprecise for the rest of the run, and every later case of it runs: an old record never hides what the
kernel does now. The Hypothesis stream is the same either way (a known failure is not a finding), so a seed draws the
same cases with the skip as without it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable

from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

CHECK_EVERY = 8
NOT_RUN = "not run"


def answered_unrun(message: str) -> bool:
    """Whether a verdict's message (a case log's `message`) is that of a case answered without running it."""
    return message.startswith(f"{NOT_RUN}:")


def skipping(worker, backend: str, known: Callable | None):
    """`worker` wrapped in SkipKnownCrashes where `known` lists crash or hang faces of `backend`, else `worker`."""
    crash_faces = faces(known, backend) if worker is not None else []
    return SkipKnownCrashes(worker, backend, known, crash_faces) if crash_faces else worker


def faces(known: Callable | None, backend: str) -> list[tuple[str, V.Verdict]]:
    """(entry id, the verdict its bug shows) for each crash or hang label of `backend`'s known bugs, as the `known`
    predicate (store/known.py's known_bugs_of) lists them; none for a predicate that does not list its faces."""
    return [(entry_id, face) for b, entry_id, face in getattr(known, "crash_faces", ()) if b == backend]


class SkipKnownCrashes:
    """A worker whose cases a precise known crash or hang takes are answered without running most of them (the
    module's docstring). `skipped` counts them by entry id; `imprecise` holds the ids whose check ran clean."""

    def __init__(self, worker, backend: str, known: Callable, crash_faces: list[tuple[str, V.Verdict]]):
        self.worker, self.backend, self.known, self.crash_faces = worker, backend, known, crash_faces
        self.seen, self.skipped, self.imprecise = Counter(), Counter(), set()

    def run(self, case: Case) -> V.Verdict:
        taken = next(((entry_id, face) for entry_id, face in self.crash_faces
                      if entry_id not in self.imprecise and self._takes(entry_id, case, face)), None)
        if taken is None:
            return self.worker.run(case)
        entry_id, face = taken
        self.seen[entry_id] += 1
        if (self.seen[entry_id] - 1) % CHECK_EVERY == 0:
            verdict = self.worker.run(case)
            if not (verdict.failed and self._takes(entry_id, case, verdict)):
                self.imprecise.add(entry_id)
            return verdict
        self.skipped[entry_id] += 1
        return dataclasses.replace(face, message=f"{NOT_RUN}: known bug {entry_id} takes this case, checked one case "
                                                 f"in {CHECK_EVERY}: {face.message}")

    def _takes(self, entry_id: str, case: Case, verdict: V.Verdict) -> bool:
        hit = self.known(self.backend, case, verdict)
        return hit is not None and hit.get("id") == entry_id

    def summary(self) -> str | None:
        """What the run answered without running, for its report; None when nothing."""
        if not self.skipped and not self.imprecise:
            return None
        done = ", ".join(f"{n} of {entry_id}" for entry_id, n in self.skipped.most_common())
        clean = f"; ran every case of {', '.join(sorted(self.imprecise))}: a checked one did not fail so" \
            if self.imprecise else ""
        return f"cases a known crash or hang takes, not run: {done or 'none'}{clean}"

    def __getattr__(self, name):  # rerun, restarts, close, timeout_s: the worker's own
        return getattr(self.worker, name)
