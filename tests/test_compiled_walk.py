"""The walk that finishes a compile-aware search's findings (engine/compiled_search.py's finish_shrinking, on the
greedy shrink of engine/reshrink.py): through the compile fields Hypothesis's shrink kept, steps into compiled
configurations first, never into a known bug's case."""

from __future__ import annotations

from attnfuzz.engine.compiled_search import compiled_configs
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from bench.jit_fake import FakeJit
from tests.test_compiled import MINIMAL


def test_a_finding_is_walked_on_through_its_compile_fields():
    """finish_shrinking walks the compile fields Hypothesis's shrink kept (it shrank inside compiled configurations),
    the steps into a compiled configuration first; the configurations it compiles on the way count as compiled."""
    from attnfuzz.engine.compiled_search import finish_shrinking
    from attnfuzz.engine.harness import Finding, run_case
    backend = FakeJit(bug="config")
    case = MINIMAL.replace(b=2, d_qk=64, d_v=64, softcap=30.0)
    runs = []

    def run(c):
        runs.append(c)
        return run_case(backend, c)

    verdict = run(case)
    assert verdict.label == "FAIL:TOLERANCE"
    configs = compiled_configs(backend)
    configs.add(backend.compile_key(case), case)
    runs.clear()
    walked = finish_shrinking(Finding(backend.name, case, verdict), run, backend)
    assert walked.case == MINIMAL and walked.verdict.label == "FAIL:TOLERANCE"
    # the runtime steps first (the softcap's value, one sequence), each in the configuration compiled; then the
    # compile fields, one configuration a run
    assert runs[:2] == [case.replace(softcap=5.0), case.replace(softcap=5.0, b=1)], runs[:2]
    assert all(backend.compile_key(c) != backend.compile_key(case) for c in runs[2:])
    assert backend.compile_key(MINIMAL) in configs


def test_the_walk_does_not_step_into_a_known_bug():
    """A failure that a known bug's record takes is no shrink step: with the failures under head dim 64 known, the
    walk keeps the head dim it started from (without the record it walks down to MINIMAL's)."""
    from attnfuzz.engine.compiled_search import finish_shrinking
    from attnfuzz.engine.harness import Finding, run_case
    backend = FakeJit(bug="config")
    case = MINIMAL.replace(d_qk=64, d_v=64)
    verdict = run_case(backend, case)
    assert verdict.label == "FAIL:TOLERANCE"

    def known(name, c, v):
        return {"link": "x"} if c.d_qk < 64 else None

    walked = finish_shrinking(Finding(backend.name, case, verdict), lambda c: run_case(backend, c), backend, known)
    assert walked.case.d_qk == 64 and walked.verdict.failed
    unknown = finish_shrinking(Finding(backend.name, case, verdict), lambda c: run_case(backend, c), backend)
    assert unknown.case.d_qk == MINIMAL.d_qk


def test_the_greedy_shrink_tries_the_candidates_in_compiled_configurations_first():
    from attnfuzz.engine import reshrink
    case = Case(b=2, sq=8, skv=8, h=2, hk=2, d_qk=64, d_v=64, dtype="bfloat16", grads=True, causal=True)
    compiled = lambda c: (c.dtype, c.d_qk, c.grads, c.causal) == (case.dtype, case.d_qk, case.grads, case.causal)
    tried = []
    reshrink.shrink(case, lambda c: tried.append(c), cheap=compiled)   # nothing fails: one pass, every candidate
    cheap = [compiled(c) for c in tried]
    assert 0 < cheap.count(True) < len(cheap) and cheap == sorted(cheap, reverse=True)
    plain = []
    reshrink.shrink(case, lambda c: plain.append(c))
    assert set(plain) == set(tried) and [compiled(c) for c in plain] != cheap   # the default order: switches first


def test_the_greedy_shrink_tries_a_change_that_did_not_fail_after_the_others():
    """A gradient bug: turning gradients off never fails, and is the first candidate of every pass; run once and then
    once more before the shrink ends, not after every step (on a JIT backend, each is a compile)."""
    from attnfuzz.engine import reshrink
    case = Case(b=2, sq=8, skv=8, h=2, hk=2, d_qk=64, d_v=64, dtype="bfloat16", grads=True, causal=True)
    runs = []

    def gradient_bug(c):
        runs.append(c)
        return V.Verdict(V.FAIL, "GRADIENT", "planted") if c.grads else None

    shrunk, _, _ = reshrink.shrink(case, gradient_bug)
    assert (shrunk.b, shrunk.sq, shrunk.skv, shrunk.h, shrunk.d_qk, shrunk.dtype, shrunk.causal, shrunk.grads) == \
        (1, 1, 1, 1, 8, "float16", False, True)
    steps = sum(c.grads for c in runs)
    assert steps >= 6 and sum(not c.grads for c in runs) <= 2, (steps, len(runs))
