"""An isolated worker whose CUDA context a kernel broke without its case crashing (an asynchronous fault the next CUDA
call reports, or a fault in a run the verdict only notes) is replaced, and the error that surfaces in attnfuzz's own
code is not taken for a bug of attnfuzz: a campaign lane once died of it. The planted kernels are
tests/breaks_context.py."""

from __future__ import annotations

from attnfuzz.engine import batch
from attnfuzz.engine.isolate import Worker
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case

CAUSAL = Case(sq=3, skv=3, d_qk=8, d_v=8, causal=True)
PLAIN = Case(sq=4, skv=5, d_qk=8, d_v=8)


def test_a_fault_an_earlier_case_left_pending_costs_a_fresh_worker_not_the_run():
    with Worker("tests.breaks_context:faults_later", timeout_s=30) as worker:
        assert worker.run(CAUSAL).status == V.PASS            # right answer, context left broken
        verdict = worker.run(PLAIN)                           # its draw meets the fault: tried again in a fresh worker
        assert verdict.status == V.PASS, verdict
        assert worker.restarts == 1 and len(worker.unattributed) == 1
        assert worker.unattributed[0].case == PLAIN
        assert worker.run(PLAIN).status == V.PASS and worker.restarts == 1


def test_a_fault_that_surfaces_in_the_grading_of_its_own_case_is_that_cases_crash():
    with Worker("tests.breaks_context:faults_unseen", timeout_s=30) as worker:
        verdict = worker.run(CAUSAL)                          # the first case of its worker: nothing else to suspect
        assert verdict.status == V.CRASH and "attnfuzz's code" in verdict.message, verdict
        assert worker.restarts == 1 and not worker.unattributed
        assert worker.run(PLAIN).status == V.PASS


def test_a_batch_check_run_that_faults_leaves_the_case_as_graded_and_replaces_the_worker():
    case = Case(b=2, sq=3, skv=3, d_qk=8, d_v=8, seed=0)
    assert batch.checked(case)
    with Worker("tests.breaks_context:faults_alone", timeout_s=30) as worker:
        verdict = worker.run(case)
        assert verdict.status == V.PASS and any("CUDA error" in note for note in verdict.checks), verdict
        assert worker.restarts == 1                           # replaced before the next case meets the fault
        assert worker.run(case.replace(seed=1)).status == V.PASS and not worker.unattributed
