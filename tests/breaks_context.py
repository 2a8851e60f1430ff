"""Kernels that break their process's CUDA context as a faulting GPU kernel does, without a GPU: after a causal case,
every later case in the same process fails in attnfuzz's own input drawing with a CUDA error. A fresh process (an
isolated worker) is sound until it meets a causal case itself."""

from attnfuzz.engine import harness
from tests.misbehaving import _plain

FAULT = "CUDA error: an illegal memory access was encountered"
_draw = harness.draw
_broken = []


def _draw_in_a_broken_context(case, device):
    if _broken:
        raise RuntimeError(f"planted: {FAULT}")
    return _draw(case, device)


harness.draw = _draw_in_a_broken_context


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
