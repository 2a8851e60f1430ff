"""A worker broken by one case does not pin its death on the next: after a CUDA, cuDNN or cuBLAS error a fresh worker
serves the next case.

The kernel (tests/misbehaving.py) breaks its own process on a causal case and exit(1)s on the next call in it."""

from __future__ import annotations

import pytest

from attnfuzz.engine.cuda_errors import may_break_context
from attnfuzz.engine.isolate import Worker
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case
from tests.misbehaving import CUDNN_EXECUTE_FAILED

PLAIN = Case(sq=4, skv=4, d_qk=8, d_v=8)
CAUSAL = PLAIN.replace(causal=True)
BY_CUDNN = "tests.misbehaving:poisoned_by_cudnn_when_causal"


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
        assert worker.restarts == 1, "the broken worker was replaced before the next case, which no death replaced"
    assert failed.label == "CRASH:RuntimeError" and "is_good()" in failed.message, failed
    assert after.status == V.PASS and not any("worker" in check for check in after.checks), after.checks


def test_control_a_worker_without_an_error_serves_case_after_case():
    with Worker(BY_CUDNN, timeout_s=20) as worker:
        verdicts = [worker.run(PLAIN.replace(seed=seed)) for seed in range(3)]
        assert worker.restarts == 0
    assert all(v.status == V.PASS for v in verdicts), verdicts
