"""A worker broken by one case does not pin its death on the next: after a CUDA, cuDNN or cuBLAS error a fresh worker
serves the next case, and a death after other cases counts as a case's CRASH only once a fresh worker dies on it too.

The kernels (tests/misbehaving.py) break their own process on a causal case and exit(1) on a later call in it."""

from __future__ import annotations

import pytest

from attnfuzz.backends import get
from attnfuzz.engine.cuda_errors import may_break_context
from attnfuzz.engine.harness import fuzz
from attnfuzz.engine.isolate import Worker
from attnfuzz.engine.profiles import profile
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.space import Space
from tests.misbehaving import CUDNN_EXECUTE_FAILED

PLAIN = Case(sq=4, skv=4, d_qk=8, d_v=8)
CAUSAL = PLAIN.replace(causal=True)
BY_CUDNN, SILENT = "tests.misbehaving:poisoned_by_cudnn_when_causal", "tests.misbehaving:poisoned_silently_when_causal"


@pytest.mark.parametrize("text", [
    CUDNN_EXECUTE_FAILED,
    "mha_graph->execute(handle, variant_pack, workspace_ptr.get()).is_good() INTERNAL ASSERT FAILED at MHA.cpp:660",
    "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, ...)`",
    "AcceleratorError: CUDA error: misaligned address",
    "CUDA error: device-side assert triggered",
    "cudaErrorLaunchFailure: unspecified launch failure",
    "an illegal memory access was encountered",
])
def test_a_cuda_cudnn_or_cublas_runtime_error_may_break_the_context(text):
    assert may_break_context(text)


@pytest.mark.parametrize("text", [
    "causal is not implemented",
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",
    "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
    "Expected mha_graph->validate().is_good() to be true, but got false.",   # a graph cuDNN will not build
    "p.key_ptr is not correctly aligned",
    "No available kernel. Aborting execution.",
])
def test_a_refusal_or_an_error_of_the_backends_own_does_not(text):
    assert not may_break_context(text)


def test_after_a_cudnn_execution_failure_the_next_case_never_sees_that_worker():
    with Worker(BY_CUDNN, timeout_s=20) as worker:
        failed = worker.run(CAUSAL)
        after = worker.run(PLAIN)
        assert worker.deaths == 0, "no worker died: the broken one was replaced before the next case"
        assert worker.restarts == 1 and not worker.unattributed
    assert failed.label == "CRASH:RuntimeError" and "is_good()" in failed.message, failed
    assert after.status == V.PASS and not any("worker" in check for check in after.checks), after.checks


def test_control_a_worker_without_an_error_serves_case_after_case():
    with Worker(BY_CUDNN, timeout_s=20) as worker:
        verdicts = [worker.run(PLAIN.replace(seed=seed)) for seed in range(3)]
        assert worker.restarts == 0
    assert all(v.status == V.PASS for v in verdicts), verdicts


def test_a_death_after_another_case_broke_the_worker_is_not_the_next_cases_crash():
    with Worker(SILENT, timeout_s=20) as worker:
        assert worker.run(CAUSAL).status == V.PASS, "the breaking case itself looks fine"
        after = worker.run(PLAIN)
        assert worker.deaths == 1, "the broken worker died on the next case"
        [death] = worker.unattributed
    assert after.status == V.PASS, after
    assert (death.death, death.case, death.answered, death.before, death.fresh_label) == ("EXIT_1", PLAIN, 1,
                                                                                          CAUSAL, "PASS")
    assert any("unattributed worker death" in check for check in after.checks), after.checks


def test_control_a_case_that_kills_a_used_worker_and_a_fresh_one_is_a_crash():
    with Worker("tests.misbehaving:segfault_when_causal", timeout_s=20) as worker:
        assert worker.run(PLAIN).status == V.PASS
        crash = worker.run(CAUSAL)
        assert worker.deaths == 2, "the used worker died, then the fresh one it was rerun in"
        assert not worker.unattributed
    assert crash.label == "CRASH:SIGSEGV", crash
    assert any(check.startswith("confirmed:") for check in crash.checks), crash.checks


def test_control_a_death_in_a_fresh_worker_is_the_cases_without_a_rerun():
    with Worker("tests.misbehaving:segfault_when_causal", timeout_s=20) as worker:
        crash = worker.run(CAUSAL)
        assert worker.deaths == 1
    assert crash.label == "CRASH:SIGSEGV" and not any("worker" in check for check in crash.checks), crash


def test_a_fuzz_run_saves_no_crash_from_a_worker_an_earlier_case_broke():
    """The silent kernel breaks its worker on every causal case and is right on every case: the deaths that follow
    are no case's, so the search finds nothing."""
    with Worker(SILENT, timeout_s=20) as worker:
        tally, findings = fuzz(get(SILENT), space=Space(max_len=8, max_batch=1, max_heads=1), worker=worker,
                               settings=profile("ci", max_examples=25), seed=0)
        assert worker.unattributed, "the search did run a case after a causal one in the same worker"
    assert findings == [], [f.verdict.label for f in findings]
    assert tally.labels.get("CRASH:EXIT_1", 0) == 0, tally.labels


def test_attnfuzz_run_isolate_says_a_death_was_no_cases_and_saves_nothing(tmp_path, capsys):
    import json

    from attnfuzz.cli import main
    from attnfuzz.store import corpus as corpus_io
    code = main(["run", "--backend", SILENT, "--isolate", "--max-examples", "25", "--max-len", "8", "--profile", "ci",
                 "--seed", "0", "--corpus", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    deaths = json.loads(out)[SILENT]["unattributed_deaths"]
    assert code == 0 and not corpus_io.entry_paths(tmp_path), err[-3000:]
    assert deaths and all(d["death"] == "EXIT_1" and d["before"]["causal"] for d in deaths), deaths
    assert f"[{SILENT}] a worker died (EXIT_1)" in err and "unattributed worker death" in err, err[-3000:]
