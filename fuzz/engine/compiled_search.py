"""The compile-aware search of a backend that says which cases share a compiled kernel (Backend.compile_key).

Its cases come from strategies/compiled.py's compile_aware over the kernel configurations the backend met in this
process, closed to new ones once a failure is met; its findings, shrunk by Hypothesis inside the configurations
compiled (where a kernel that failed to build is not built again: BuildFailures), are shrunk further with
engine/reshrink.py. (Compiling the plainest configurations before a run's workers fan out is engine/warm.py's.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Callable

from hypothesis import strategies as st

from attnfuzz.engine import reshrink
from attnfuzz.backends.base import Backend
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.lengths import device_bytes, work
from attnfuzz.strategies.compiled import CompiledConfigs, compile_aware
from attnfuzz.strategies.space import Space

FINISH_RUNS = 120   # runs the greedy shrink may spend on one finding of a compile-aware search
FROM_BUILD_FAILURE = "answered without running: this compile key failed to build earlier in the search"

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def declares_compile_key(backend: Backend) -> bool:
    """Whether the backend says which cases share a compiled kernel (Backend.compile_key overridden)."""
    return getattr(type(backend), "compile_key", Backend.compile_key) is not Backend.compile_key


def is_compile_aware(backend: Backend, space: Space) -> bool:
    """Whether a search of `backend` in `space` is compile-aware: the backend declares a compile key and the space
    gives compiled configurations a share of the draws."""
    return declares_compile_key(backend) and space.compiled_share > 0


def compiled_configs(backend: Backend) -> CompiledConfigs:
    """The kernel configurations `backend` met in this process, in order: one list per backend object, shared by
    every search of it (a campaign's repeated runs, a replay before a fuzz run)."""
    if backend not in _COMPILED:
        _COMPILED[backend] = CompiledConfigs()
    return _COMPILED[backend]


def compile_aware_cases(backend: Backend, cases: st.SearchStrategy[Case], space: Space) -> st.SearchStrategy[Case]:
    """`cases` drawn, at the space's compiled_share, inside the configurations `backend` compiled already."""
    def takes(case: Case) -> bool:   # and, pinned to a configuration, within the device memory a case may hold
        return backend.unsupported(case) is None and (space.max_bytes is None or device_bytes(case) <= space.max_bytes)

    return compile_aware(cases, compiled_configs(backend), backend.compile_key, takes, space.compiled_share,
                         space.max_work, space.compile_time_share)


@contextlib.contextmanager
def open_after(configs: CompiledConfigs | None):
    """A search of its own: `configs` (None for a search that is not compile-aware) open to new configurations when
    it starts and after it ends. The search closes them at its first failure (CompiledConfigs.closed): from then on
    Hypothesis shrinks that failure, and goes on searching, inside the configurations compiled already, where a step
    costs milliseconds and not a compile; finish_shrinking walks the compile fields afterwards, one compile a step."""
    def reopen():
        if configs is not None:
            configs.closed = False
            if configs.balance is not None:   # the time between two searches is neither kind of draw's
                configs.balance.pause()

    reopen()
    try:
        yield
    finally:
        reopen()


def finish_shrinking(finding, run: Callable[[Case], V.Verdict], backend: Backend, known=None):
    """A compile-aware search's finding (attnfuzz.engine.harness.Finding) shrunk further outside Hypothesis, which
    shrank it inside the configurations compiled (open_after): the greedy shrinker walks its dtype, head dims and
    switches toward plain, each step kept while the case fails with the same label and as clearly
    (reshrink.as_clear), so the shrunk finding is of the same type; the steps into a configuration compiled already
    go first. A step whose failure `known` (the harness's KnownBugs) takes is no step: walking a new bug into a known
    bug's case would report the known one and lose the new one. A hang is not re-run (each run would cost the whole
    timeout), nor what is FLAKY."""
    if finding.verdict.status in (V.HANG, V.FLAKY):
        return finding
    configs = compiled_configs(backend)

    def fails(case: Case) -> V.Verdict | None:
        verdict = run(case)
        key = backend.compile_key(case)
        if key is not None and verdict.status != V.UNSUPPORTED:   # compiled now: later passes count it cheap
            configs.add(key, case)
        if known is not None and verdict.failed and known(backend.name, case, verdict) is not None:
            return None
        return verdict if verdict.label == finding.verdict.label and reshrink.as_clear(verdict, finding.verdict) \
            else None

    case, verdict, _ = reshrink.shrink(finding.case, fails, max_runs=FINISH_RUNS,
                                       cheap=lambda c: backend.compile_key(c) in configs)
    if verdict is None:
        return finding
    shrunk = type(finding)(finding.backend, case, verdict)
    shrunk.attached = finding.attached
    return shrunk


class BuildFailures:
    """Runs cases through `run` (a worker's, or in process), remembering each compile key whose kernel failed to
    build (a CRASH named in backend.build_errors). While `configs` is closed, that is while Hypothesis shrinks a
    failure, a case of such a key is answered with the remembered failure, marked FROM_BUILD_FAILURE, instead of
    building again: FA4 caches only the kernels that build, so each shrink step of a build failure compiled and
    failed again (1.3 s a step on an H200, 55 steps for one finding). A search that is not closed runs every case.
    A finding answered so is run for real before it is kept (settle)."""

    def __init__(self, run: Callable[[Case], V.Verdict], backend: Backend, configs: CompiledConfigs):
        self.inner, self.backend, self.configs = run, backend, configs
        self.failed: dict[tuple, V.Verdict] = {}
        self.smallest: dict[str, tuple[Case, V.Verdict]] = {}   # by label: the smallest case that really failed
        self.answered = 0

    def run(self, case: Case) -> V.Verdict:
        # the compile key is read only where a build failed or may be remembered: not on an everyday passing case
        if self.failed and self.configs.closed:
            failure = self.failed.get(self.backend.compile_key(case))
            if failure is not None:
                self.answered += 1
                return dataclasses.replace(failure, checks=failure.checks + (FROM_BUILD_FAILURE,))
        verdict = self.inner(case)
        if not verdict.failed:
            return verdict
        if verdict.status == V.CRASH and verdict.diagnosis in self.backend.build_errors:
            key = self.backend.compile_key(case)
            if key is not None:
                self.failed.setdefault(key, verdict)
        smallest = self.smallest.get(verdict.label)
        if smallest is None or work(case) < work(smallest[0]):
            self.smallest[verdict.label] = (case, verdict)
        return verdict

    def settle(self, finding, run: Callable[[Case], V.Verdict]):
        """`finding` (attnfuzz.engine.harness.Finding) as the backend answers it: a finding that was answered from a
        remembered build failure is run; where it fails the same way it keeps that verdict, else (the compile key
        missed something the kernel is built for) the finding falls back to the smallest case (the oracle's work)
        that really failed with its label, which the finishing shrink takes on from there."""
        if FROM_BUILD_FAILURE not in finding.verdict.checks:
            return finding
        verdict = run(finding.case)
        case = finding.case
        if verdict.label != finding.verdict.label:
            case, verdict = self.smallest[finding.verdict.label]
        settled = type(finding)(finding.backend, case, verdict)
        settled.attached = finding.attached
        return settled
