"""Kernels that break their process's CUDA context as a faulting GPU kernel does, without a GPU: after a causal case,
every later case in the same process fails in attnfuzz's own input drawing with a CUDA error. A fresh process (an
isolated worker) is sound until it meets a causal case itself."""

from attnfuzz.engine import harness
from tests.misbehaving import _plain

FAULT = "CUDA error: an illegal memory access was encountered"
_draw, _grade = harness.draw, harness.grade
_broken = []
_broken_now = []   # broken by the case at work: its own grading meets the fault


def _draw_in_a_broken_context(case, device):
    if _broken:
        raise RuntimeError(f"planted: {FAULT}")
    return _draw(case, device)


def _grade_in_a_broken_context(*args, **kwargs):
    if _broken_now:
        raise RuntimeError(f"planted: {FAULT}")
    return _grade(*args, **kwargs)


harness.draw, harness.grade = _draw_in_a_broken_context, _grade_in_a_broken_context


def faults(q, k, v, *, causal, window, bottom_right, scale):
    """Raises the fault on a causal case, as a kernel whose fault the launch reports."""
    if causal:
        _broken.append(True)
        raise RuntimeError(f"planted: {FAULT}")
    return _plain(q, k, v, scale)


def faults_later(q, k, v, *, causal, window, bottom_right, scale):
    """Returns a right answer on a causal case but leaves the context broken, as an asynchronous fault does: the
    next CUDA call, whoever makes it, reports it."""
    if causal:
        _broken.append(True)
    return _plain(q, k, v, scale, causal)


def faults_unseen(q, k, v, *, causal, window, bottom_right, scale):
    """Returns on a causal case with the fault still pending, as a kernel whose launch reports nothing: attnfuzz's
    grading of the same case is the next CUDA call, and meets it."""
    if causal:
        _broken_now.append(True)
    return _plain(q, k, v, scale, causal)


def faults_alone(q, k, v, *, causal, window, bottom_right, scale):
    """Faults on a batch of one only: a batched case passes, and the batch check's run of one sequence alone, a run
    the verdict only notes, leaves the context broken."""
    if q.shape[0] == 1:
        _broken.append(True)
        raise RuntimeError(f"planted: {FAULT}")
    return _plain(q, k, v, scale)
