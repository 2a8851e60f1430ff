"""One case through one backend, and the Hypothesis property that fuzzes a backend with it.

Every case is written to disk before it runs (write-ahead), so a case that kills the process is found by the next
start and saved as a CRASH. A FAIL raises an exception whose *type* carries the diagnosis: Hypothesis shrinks each
distinct exception type separately, so a shrink can never turn an ALL_ZERO into a TOLERANCE failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

import hypothesis
import torch
from hypothesis import strategies as st

from attnfuzz.engine import batch, hooks, interrupt, memshare, poison
from attnfuzz.engine.cuda_errors import crash_diagnosis
from attnfuzz.engine.skip_known import SkipKnownCrashes, skipping
from attnfuzz.engine.compiled_search import (BuildFailures, compile_aware_cases, compiled_configs, finish_shrinking,
                                             is_compile_aware, open_after)
from attnfuzz.engine.rootcause import Evidence, merge_root_causes, twin_known
from attnfuzz.engine.tally import CountedKnown, Tally
from attnfuzz.backends.base import Backend, Hang, Unsupported
from attnfuzz.oracles import verdict as V
from attnfuzz.oracles.grade import Oracle, grade
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.cases import attention_cases
from attnfuzz.strategies.choices import pick
from attnfuzz.strategies.materialize import Tensors, draw, draw_device, with_storage
from attnfuzz.strategies.space import Space, narrow_to
from attnfuzz.strategies.streams import seed_only_streams, stream_seed

if sys.version_info < (3, 11):  # Python 3.10: the backport Hypothesis depends on there
    from exceptiongroup import BaseExceptionGroup


class Finding(AssertionError):
    """A failing case; subclasses per verdict label (see finding_type) keep Hypothesis's shrinks apart."""

    def __init__(self, backend: str, case: Case, verdict: V.Verdict):
        super().__init__(f"{backend}: {verdict.label}: {verdict.message}\n  {case!r}")
        self.backend, self.case, self.verdict = backend, case, verdict
        self.attached: list[tuple[Case, V.Verdict]] = []  # the same root cause, seen under other labels (merge)


_FINDING_TYPES: dict[str, type[Finding]] = {}


def finding_type(label: str) -> type[Finding]:
    """One Finding subclass per verdict label, e.g. Finding_FAIL_ALL_ZERO."""
    name = "Finding_" + "".join(ch if ch.isalnum() else "_" for ch in label)
    if name not in _FINDING_TYPES:
        _FINDING_TYPES[name] = type(name, (Finding,), {"__module__": __name__})
    return _FINDING_TYPES[name]


# Score elements (b * h * sq * skv) up to which a GPU case's oracle runs on the CPU: a small float64 reference is a
# few hundred tiny kernels, and launching them costs more than the CPU's arithmetic (4.7 ms vs about 1 ms per case
# on the H200 runner). That oracle reads the CPU draw the device tensors were copied from: the same values, and no
# copy back from the device. (A case drawn on the device, strategies/materialize.py's draw_device, has no CPU draw:
# its oracle runs on the device.)
ORACLE_ON_CPU_UP_TO = 1 << 16
CONFIRM_RERUNS = 3   # the more times a finding's case is run: a failure that does not come back every time is FLAKY


def oracle_inputs(case: Case, drawn: Tensors, tensors: Tensors, device: str) -> tuple[Tensors, str]:
    """The tensors and the device the float64 oracle of a case runs on: the CPU draw for small GPU cases, else the
    backend's inputs on their device."""
    if (torch.device(device).type != "cpu" and drawn.q.device.type == "cpu"
            and case.b * case.h * case.sq * case.skv <= ORACLE_ON_CPU_UP_TO):
        return drawn, "cpu"
    return tensors, device


def run_case(backend: Backend, case: Case, *, device: str = "cpu", inflight: Path | None = None) -> V.Verdict:
    """UNSUPPORTED with the reason, CRASH with the exception, or the graded verdict. With `inflight`, the case is on
    disk while it runs and removed after."""
    reason = backend.unsupported(case)
    if reason is not None:
        return V.Verdict(V.UNSUPPORTED, None, reason)
    with write_ahead(inflight, backend.name, device, case):
        return _graded(backend, case, device)


@contextlib.contextmanager
def write_ahead(inflight: Path | None, backend: str, device: str, case: Case, *, isolated: bool = False):
    """Keep `case` on disk at `inflight` while it runs, so a process that dies or is killed meanwhile (a segfault in
    process, a job's time limit) leaves the case behind; removed once the case has a verdict, and on the way out of
    an interruption (attnfuzz.engine.interrupt), which is not the case's doing. `isolated`: a worker process runs it, so a
    case left behind was not what ended the run. A case that a SIGINT / SIGTERM interrupted gives no verdict."""
    interrupt.check()  # a stop whose exception was swallowed between cases: do not start another
    try:
        if inflight is not None:
            inflight.write_text(json.dumps({"backend": backend, "device": device, "case": case.to_dict(),
                                            "isolated": isolated}))
        yield
    finally:
        if inflight is not None:
            inflight.unlink(missing_ok=True)
    interrupt.check()  # ... or during this one, whatever verdict the backend came back with


class WrittenAhead:
    """A worker whose case waits on disk while the worker runs it: the process waiting for it may be killed from
    outside meanwhile. (A wrapper, not a line in fuzz_property: its source seeds the derandomized ci streams.)"""

    def __init__(self, worker, inflight: Path, backend: str, device: str):
        self.worker, self.inflight, self.backend, self.device = worker, inflight, backend, device

    def run(self, case: Case) -> V.Verdict:
        with write_ahead(self.inflight, self.backend, self.device, case, isolated=True):
            return self.worker.run(case)

    def __getattr__(self, name):  # rerun, restarts, close: the worker's own
        return getattr(self.worker, name)


def _graded(backend: Backend, case: Case, device: str) -> V.Verdict:
    """Run the backend on the case's inputs and grade its output against the float64 oracle."""
    drawn = draw(case, draw_device(case, device))  # on the CPU, or on the device for a large case
    moved = drawn.to(device)
    tensors = with_storage(case, moved)  # the backend's buffers; the oracle reads the plain ones (the same values)
    if poison.enabled():  # outputs cut from NaN memory: an element the backend never writes reads NaN
        poison.poison(device)
    try:
        output = backend.run(case, tensors)
        if torch.device(device).type == "cuda":  # a kernel's asynchronous fault belongs to this case, not the next
            torch.cuda.synchronize(device)
    except Unsupported as e:
        return V.Verdict(V.UNSUPPORTED, None, str(e) or type(e).__name__)
    except Hang as e:
        return V.Verdict(V.HANG, type(e).__name__, str(e))
    except Exception as e:  # the backend crashed on a case it said it supports: a finding
        if (over_share := memshare.refusal(e)) is not None:  # more than a lane's share of a shared GPU: no finding
            return V.Verdict(V.UNSUPPORTED, None, over_share)
        where = traceback.extract_tb(e.__traceback__)[-1]
        return V.Verdict(V.CRASH, crash_diagnosis(e),
                         f"{type(e).__name__}: {str(e)[:500]} (at {Path(where.filename).name}:{where.lineno})")
    oracle_tensors, oracle_device = oracle_inputs(case, drawn, moved, device)
    try:
        oracle = Oracle.of(case, oracle_tensors, device=oracle_device, family=backend.family)
        verdict = grade(case, oracle_tensors, output, family=backend.family, oracle=oracle)
    except Exception as e:  # the oracle past a lane's share of the GPU is a refusal too; any other error is ours
        if (over_share := memshare.refusal(e)) is None:
            raise
        return V.Verdict(V.UNSUPPORTED, None, over_share)
    if backend.deterministic:
        verdict = _check_bitwise(backend, case, tensors, output, verdict)
    if batch.checked(case):  # on a share of the batched cases: bits alone vs in the batch (claimed, or observed)
        verdict = batch.checked_verdict(backend, case, tensors, output, verdict)
    signal = getattr(backend, "last_agreement", None)  # CP vs non-CP: reported beside the grade, never graded
    if signal is not None:
        verdict = dataclasses.replace(verdict, checks=verdict.checks + (signal.describe(),))
    return verdict


def _check_bitwise(backend: Backend, case: Case, tensors, first: V.Output, verdict: V.Verdict) -> V.Verdict:
    """A backend that declares itself deterministic runs the case again on the same inputs; any bit that differs is a
    FAIL:NONDETERMINISTIC (a failed grade stays the verdict, with the difference noted)."""
    second = backend.run(case, tensors)
    for name in ("out", "lse", "dq", "dk", "dv"):
        a, b = getattr(first, name), getattr(second, name)
        if a is None or b is None or torch.equal(batch.bits(a), batch.bits(b)):
            continue
        delta = (a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max().item()
        message = f"{name} is not bitwise reproducible: a second identical run differs by up to {delta:.3g}"
        if verdict.failed:
            return dataclasses.replace(verdict, checks=verdict.checks + (message,))
        return V.Verdict(V.FAIL, V.NONDETERMINISTIC, message, ratio=verdict.ratio, checks=verdict.checks)
    return verdict


FP8_GRADS_ONE_IN = 4   # an FP8 case checks gradients as often as any case does (strategies/cases.py)


def served_space(backend: Backend, space: Space) -> Space:
    """`space` with paged KV caches only for a backend that serves them, and FP8 cases only (every case) for one that
    takes FP8 inputs (neither where the space turns it off); FP8 cases check gradients (one in FP8_GRADS_ONE_IN,
    where the space leaves it to the harness) only for a backend that runs an FP8 backward."""
    fp8_grads = space.fp8_grads if space.fp8_grads is not None else FP8_GRADS_ONE_IN if backend.fp8_backward else 0
    return space.replace(paged=backend.serves_paged and space.paged is not False,
                         fp8=backend.serves_fp8 and space.fp8 is not False,
                         fp8_grads=fp8_grads if backend.fp8_backward else 0)


def cases_for(backend: Backend, space: Space = Space()) -> st.SearchStrategy[Case]:
    """Cases from `space` narrowed to what `backend` takes (or the backend's own strategy, where it has one), each
    with one of the spellings the backend lists; paged KV caches only for a backend that `serves_paged`; for a
    backend that declares a compile key, drawn mostly inside the configurations it compiled (compiled_search)."""
    space = served_space(backend, space)
    takes_space = "space" in inspect.signature(backend.cases).parameters  # an own strategy bounded by the space
    own = backend.cases(space=space) if takes_space else backend.cases()
    drawn = own if own is not None else attention_cases(narrow_to(space, backend.unsupported))

    @st.composite
    def spelled(draw) -> Case:  # a flatmap would build a strategy per case, which costs more than drawing it
        case = draw(drawn)
        return case.replace(spelling=spelling_of(draw, tuple(backend.spellings(case))))

    if not is_compile_aware(backend, space):
        return spelled()
    return compile_aware_cases(backend, spelled(), space)


def spelling_of(draw, spellings: tuple[str, ...]) -> str:
    """One of a case's spellings. Where several share their first '+'-joined part (SDPA's mask spellings, each in up
    to a dozen argument forms), the first part is drawn first and then one spelling of it, so that each way to spell
    the mask keeps its share however many forms it has; else one spelling, uniformly."""
    heads: dict[str, list[str]] = {}
    for spelling in spellings:
        heads.setdefault(spelling.split("+", 1)[0], []).append(spelling)
    if len(heads) == len(spellings):
        return pick(draw, spellings)
    return pick(draw, tuple(heads[pick(draw, tuple(heads))]))


KnownBugs = Callable[[str, Case, V.Verdict], "dict | None"]


def fuzz_property(backend: Backend, *, device: str, space: Space, tally: Tally, inflight: Path | None,
                  on_case: Callable[[Case, V.Verdict, Tally], None] | None = None, known: KnownBugs | None = None,
                  worker=None, scores: bool = True):
    """The Hypothesis test for one backend: grade each drawn case, raise on failure. A failure that `known`
    recognises as a known bug is tallied as KNOWN and the search goes on past it. With `scores`, each passing case's
    error / bound goes to Hypothesis (hypothesis.target): its target phase climbs on it, and its generate phase keeps
    a mutation of a case only where that does not lower it."""

    @hypothesis.given(case=cases_for(backend, space))
    def fuzz_backend(case: Case) -> None:
        if worker is not None:  # attnfuzz.engine.isolate.Worker: the backend runs in a child process
            verdict = worker.run(case)
        else:
            verdict = run_case(backend, case, device=device, inflight=inflight)
        if verdict.failed and known is not None and known(backend.name, case, verdict) is not None:
            verdict = dataclasses.replace(verdict, status=V.KNOWN)
        tally.add(verdict)
        if on_case is not None:
            on_case(case, verdict, tally)
        if verdict.status == V.UNSUPPORTED:  # refused: no graded case, so it spends none of max_examples
            hypothesis.reject()
        if verdict.status == V.PASS and scores:
            hypothesis.target(min(verdict.ratio, 1e9), label="error / bound")
        if verdict.failed:
            raise finding_type(verdict.label)(backend.name, case, verdict)

    return fuzz_backend


def findings_of(error: BaseException) -> list[Finding]:
    """The minimal Findings Hypothesis reported: one, or several in an exception group."""
    if isinstance(error, Finding):
        return [error]
    if isinstance(error, BaseExceptionGroup):
        return [f for sub in error.exceptions for f in findings_of(sub)]
    return []


def confirm(finding: Finding, run: Callable[[Case], V.Verdict], reruns: int) -> Finding:
    """Run a finding's case `reruns` more times: when the runs disagree it is FLAKY, with how often it failed. A hang
    is not re-run (each attempt would cost the whole timeout), nor what is FLAKY already."""
    if finding.verdict.status in (V.HANG, V.FLAKY):
        return finding
    labels = [finding.verdict.label] + [run(finding.case).label for _ in range(reruns)]
    same = labels.count(finding.verdict.label)
    if same == len(labels):
        return finding
    seen = ", ".join(f"{label} x{n}" for label, n in Counter(labels).items())
    flaky = V.Verdict(V.FLAKY, finding.verdict.label, f"{finding.verdict.label} in {same} of {len(labels)} identical "
                      f"runs ({seen}): {finding.verdict.message}", finding.verdict.worst, finding.verdict.ratio)
    return Finding(finding.backend, finding.case, flaky)


def fuzz(backend: Backend, *, device: str = "cpu", space: Space = Space(), settings: hypothesis.settings | None = None,
         seed: int | None = None, inflight: Path | None = None,
         on_case: Callable[[Case, V.Verdict, Tally], None] | None = None,
         known: KnownBugs | None = None, worker=None, reruns: int = CONFIRM_RERUNS,
         database_key: str | None = None) -> tuple[Tally, list[Finding]]:
    """Fuzz one backend under `settings` (the active profile when None). Returns what it saw and the shrunk
    findings, one per distinct verdict label, merged where one explains another (merge_root_causes, which runs a few
    grown cases to tell them apart: the others are in its `attached`). Each finding's case is run `reruns` more
    times: a failure that does not come back every time (or that Hypothesis could not reproduce) is a FLAKY finding,
    with how often it failed. A compile-aware search shrinks inside the configurations it compiled, and the harness
    walks each finding's compile fields after (engine/compiled_search.py).

    `worker` is anything with run(case) -> Verdict (attnfuzz.engine.isolate.Worker; a campaign's resumable cache); without one,
    cases run in this process. `database_key` names the backend's failures in the settings' example database, so that
    runs with other seeds, other processes and other machines replay them (Hypothesis keys by function source
    otherwise, which is the same for every backend). A failure `known` takes is KNOWN: counted in the tally under
    the entry that took it, and named so (Verdict.known_entry) in the verdict `on_case` sees."""
    tally = Tally()
    twin_known_by = known if known is not None else getattr(worker, "known", None)  # a campaign's runner holds it
    if worker is not None and inflight is not None:
        worker = WrittenAhead(worker, inflight, backend.name, device)
    worker = skipping(worker, backend.name, known, backend.build_errors)   # a precise known crash's cases, mostly unrun
    skip = worker if isinstance(worker, SkipKnownCrashes) else None
    evidence = Evidence()
    configs = compiled_configs(backend) if is_compile_aware(backend, space) else None
    plain_known = known
    known = CountedKnown(known, tally) if known is not None else None  # KNOWN per entry, in the tally and verdicts

    def seen(case: Case, verdict: V.Verdict, so_far: Tally) -> None:  # every case's verdict, for merge_root_causes
        verdict = known.named(case, verdict) if known is not None else verdict
        evidence.add(verdict)
        if verdict.failed and configs is not None:  # from now on, only configurations compiled: compiled_search
            configs.closed = True
        if on_case is not None:
            on_case(case, verdict, so_far)

    run = (getattr(worker, "rerun", worker.run) if worker is not None
           else (lambda c: run_case(backend, c, device=device, inflight=inflight)))
    builds = None   # a shrink step of a kernel that failed to build is answered without building it again
    if configs is not None and backend.build_errors:
        builds = BuildFailures(worker.run if worker is not None else run, backend, configs)
    active = settings if settings is not None else hypothesis.settings.default
    seed = stream_seed(seed, active.derandomize)
    # Scores, except where Hypothesis keeps an example database (a seeded run keeps none) and runs no target phase:
    # there they would feed only the Pareto front it keeps beside the database, which cost a small case as much as
    # the case itself.
    scores = hypothesis.Phase.target in active.phases or active.database is None or seed is not None
    prop = fuzz_property(backend, device=device, space=space, tally=tally, inflight=inflight, on_case=seen,
                         known=known, worker=builds or worker, scores=scores)
    if settings is not None:
        prop = settings(prop)
    if seed is not None:
        prop = hypothesis.seed(seed)(prop)
    if database_key is not None:
        prop._hypothesis_internal_database_key = database_key.encode()  # read by Hypothesis; set last, on the wrapper
    # the crash record sits beside the write-ahead file: the next start tells a crash from a stop by it
    with interrupt.crash_record(interrupt.record_path(inflight) if inflight is not None else None):
        with seed_only_streams(), open_after(configs):   # the same cases for a seed, whatever else the process imported
            findings = _search(prop, tally)
        if builds is not None:
            findings = [builds.settle(f, run) for f in findings]
        if is_compile_aware(backend, space):
            findings = [finish_shrinking(f, run, backend, plain_known) for f in findings]
        if reruns > 0:
            findings = [confirm(f, run, reruns) for f in findings]
        probe = functools.lru_cache(maxsize=None)(run)   # a twin the merge ran is not run again for known bugs
        findings = merge_root_causes(findings, evidence, probe=probe)
        findings = [f for f in findings if not _known_by_twin(backend.name, f, probe, twin_known_by, tally)]
    tally.not_run = skip.summary() if skip is not None else None
    return tally, findings


def _known_by_twin(backend: str, finding: Finding, run, known, tally: Tally) -> bool:
    """Whether a known bug takes the finding's probe twin (rootcause.twin_known): counted as KNOWN in the tally."""
    hit = twin_known(backend, finding, run, known)
    if hit is not None:
        tally.add_known(V.as_known(finding.verdict, hit.get("link", ""), None).label, hit)
    return hit is not None


def _search(prop, tally: Tally) -> list[Finding]:
    """Run the Hypothesis test: the minimal Findings it reports (FLAKY where it could not reproduce one)."""
    start = time.perf_counter()
    findings: list[Finding] = []
    try:
        with hooks.listening(tally.note_phases):
            prop()
    except hypothesis.errors.FlakyFailure as e:
        flaky_findings = findings_of(e)
        if not flaky_findings:
            raise  # something other than a backend failure (the harness, the oracle) misbehaved: say so
        for f in flaky_findings:
            flaky = V.Verdict(V.FLAKY, f.verdict.label, f"did not reproduce on a second run: {f.verdict.message}",
                              f.verdict.worst, f.verdict.ratio)
            findings.append(Finding(f.backend, f.case, flaky))
    except hypothesis.errors.Unsatisfiable:  # the backend refused every case it was offered: the tally says why
        pass
    except (Finding, BaseExceptionGroup) as e:
        stop = e.subgroup(KeyboardInterrupt) if isinstance(e, BaseExceptionGroup) else None
        if stop is not None:  # an interruption travelling with findings: the run was stopped, keep none
            raise next(_leaves(stop)) from e
        findings = findings_of(e)
        if not findings:
            raise
    finally:
        tally.seconds = time.perf_counter() - start
    return findings


def _leaves(group: BaseExceptionGroup):
    for sub in group.exceptions:
        yield from (_leaves(sub) if isinstance(sub, BaseExceptionGroup) else (sub,))
