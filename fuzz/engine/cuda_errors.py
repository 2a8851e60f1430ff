"""CUDA errors as a crash's message shows them: which one it names, and whether the process's CUDA context may be
broken after it (an isolated worker that raised one is replaced before the next case, attnfuzz.engine.isolate)."""

from __future__ import annotations

import re

from attnfuzz.oracles import verdict as V

# CUDA errors reach Python wrapped in whatever touched the device next (AcceleratorError, CUDADialectError from FA4's
# CuTe runtime, InternalTorchDynamoError inside torch.compile, a RuntimeError naming only the code from FA4's
# launcher): named by the error, one crash is one label.
CUDA_ERRORS = {V.CUDA_ILLEGAL_ADDRESS: ("an illegal memory access was encountered", "cudaErrorIllegalAddress",
                                        "CUDA Error Code: 700")}

# A CUDA, cuDNN or cuBLAS runtime error, however wrapped. Not a library's refusal (NOT_SUPPORTED, BAD_PARAM,
# INVALID_VALUE, a graph cuDNN cannot build) nor torch's "CUDA out of memory": those leave the context as it was.
CONTEXT_BREAKING = re.compile("|".join((
    r"CUDA error", r"cudaError", r"CUDA Error Code", r"CUDA_ERROR_",
    r"misaligned address", r"illegal memory access", r"illegal instruction", r"device-side assert",
    r"unspecified launch failure",
    r"(?:CUDNN|CUBLAS)_STATUS_(?!NOT_SUPPORTED|BAD_PARAM|INVALID_VALUE)",
    r"execute\(.*?\)\s*\.?\s*is_good\(\)",  # torch's check of a cuDNN graph's execution (SDPA's MHA.cpp)
)))


def may_break_context(text: str) -> bool:
    """Whether an error's text shows a CUDA, cuDNN or cuBLAS runtime error, after which the process's CUDA context
    may be unusable (an error of the backend's own, a refusal or a failed check, leaves the process fit)."""
    return CONTEXT_BREAKING.search(text) is not None


def raised_cuda_error(verdict: V.Verdict) -> bool:
    """Whether a crash the backend raised (not a worker's death) was such an error."""
    return verdict.status == V.CRASH and (verdict.diagnosis in CUDA_ERRORS or may_break_context(verdict.message))


def left_context_broken(verdict: V.Verdict) -> bool:
    """Whether the case may have left its process's CUDA context broken: it raised such an error, or a run the
    verdict only notes did (the batch check's compositions, attnfuzz.engine.batch)."""
    return raised_cuda_error(verdict) or any(may_break_context(note) for note in verdict.checks)


def named(text: str, otherwise: str) -> str:
    """The CUDA error an error's text names (CUDA_ERRORS), else `otherwise`."""
    return next((name for name, needles in CUDA_ERRORS.items() if any(n in text for n in needles)), otherwise)


def crash_diagnosis(error: Exception) -> str:
    """The CUDA error a crash reports, else the exception's type name."""
    return named(str(error), type(error).__name__)


def surfaced(trace: str) -> tuple[str, str]:
    """(diagnosis, the line that says it) of a traceback whose error may break the context (may_break_context): the
    exception's own line where one names such an error, its type the diagnosis unless CUDA_ERRORS names it."""
    lines = [x.strip() for x in trace.splitlines() if may_break_context(x)]
    line = next((x for x in lines if re.match(r"[\w.]*(Error|Exception): ", x)), lines[0])
    return named(trace, line.split(":")[0].rsplit(".", 1)[-1] if ":" in line else "CUDA_ERROR"), line
