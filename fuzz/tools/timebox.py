"""A deadline on work in this process: `until(deadline, why)` raises OverTime(why) once the deadline (time.monotonic)
passes, through SIGALRM in the main thread. It lands at the next Python instruction: a native call in progress (a
kernel, a compiler's C++) finishes first, a Python-level wait (a subprocess, a pipe, a sleep) is cut at once. An
import in progress finishes first too: one cut half-way leaves modules half-built for whatever imports them next
(a lazily imported torch._dynamo without its functions, and every later torch.compile crashing). Off the main
thread, or where there is no SIGALRM, the deadline is only checked on the way in."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time


RETRY_S = 0.05  # while an import is in progress, how often the deadline is tried again


class OverTime(BaseException):
    """The deadline passed. A BaseException, so a backend's `except Exception` does not take it for its own failure."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def _importing(frame) -> bool:
    """Whether `frame` runs inside an import (importlib's frozen bootstrap is on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _can_signal() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def until(deadline: float | None, why: str):
    """Run the body until `deadline` (None or inf: no limit); OverTime(why) past it, or at once if it has passed.
    A timer set before is put back afterwards, less the time spent here."""
    if deadline is None or deadline == math.inf:
        yield
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise OverTime(why)
    if not _can_signal():
        yield
        return

    def fire(signum, frame):
        if _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        raise OverTime(why)

    previous = signal.signal(signal.SIGALRM, fire)
    armed = time.monotonic()
    earlier, _ = signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:  # even when the alarm lands between the body's end and the line above
            signal.signal(signal.SIGALRM, previous)
            if earlier:
                signal.setitimer(signal.ITIMER_REAL, max(earlier - (time.monotonic() - armed), 1e-3))
