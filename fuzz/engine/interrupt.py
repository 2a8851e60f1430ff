"""Stopping a run on purpose vs a run that died: what a write-ahead file left behind means.

A case waits on disk while it runs (attnfuzz.engine.harness.write_ahead), so a case that kills the process is not lost. But
the process may also stop because someone stopped it: Ctrl-C (SIGINT), a job's time limit (SIGTERM, then SIGKILL a
grace period later), the OOM killer, a power cut. Only a crash of the process itself is a finding. So:

- `interruptible()` turns SIGINT and SIGTERM into an `Interrupted` exception (a KeyboardInterrupt, so pytest and
  Hypothesis treat it as the user stopping the run): the stack unwinds, the write-ahead file is removed on the way,
  and the run exits 128 + the signal (130, 143) saying it was interrupted. A signal whose exception was swallowed on
  its way up (a gc callback, a library's `except BaseException`) is raised again at the next case boundary
  (`check()`), so no verdict of a case that was interrupted is ever kept.
- `crash_record(path)` points faulthandler at a file beside the write-ahead file: a fatal signal in the process
  (SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL) writes "Fatal Python error: ..." and the Python stack there before the
  process dies, so the next start knows the case crashed it and how. SIGINT and SIGTERM dump the stack there too: if
  the run never got back to Python to stop (stuck in native code) and was killed later, the record shows where.
- `read_record(path)` says which of these happened; a write-ahead with no record at all means the process was
  killed from outside (SIGKILL, OOM killer, power loss) or left through a native exit(): not a finding by itself.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

STOPS = (signal.SIGINT, signal.SIGTERM)

# faulthandler's header line for each fatal signal it handles
FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Floating point exception": "SIGFPE",
         "Bus error": "SIGBUS", "Illegal instruction": "SIGILL"}


class Interrupted(KeyboardInterrupt):
    """The run was stopped by SIGINT or SIGTERM (sent to this process, or to an isolated worker from outside)."""

    def __init__(self, signum: int, where: str = ""):
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        super().__init__(f"interrupted by {self.signal_name}{where}: the case that was running is not a finding")

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process stopped by a signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


_received: list[int] = []  # signals received while interruptible() was active; the first one is raised


def _handler(signum, frame) -> None:
    first = not _received
    _received.append(signum)
    if first:  # later ones (a Ctrl-C on top of a job's SIGTERM) would break the cleanup the first one started
        raise Interrupted(signum)


@contextlib.contextmanager
def interruptible():
    """While active, SIGINT and SIGTERM raise Interrupted (once). Only the main thread can hold signal handlers;
    elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is _handler:
        yield  # not the main thread, or already inside interruptible()
        return
    previous = {s: signal.getsignal(s) for s in STOPS}
    unraisable = sys.unraisablehook
    _received.clear()
    for s in STOPS:
        signal.signal(s, _handler)

    def quiet(report) -> None:  # raised where Python drops exceptions (a gc callback, a __del__): check() raises it
        if not isinstance(report.exc_value, Interrupted):
            unraisable(report)

    sys.unraisablehook = quiet
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        sys.unraisablehook = unraisable
        _received.clear()


def check() -> None:
    """Raise Interrupted if a signal arrived whose exception did not make it up the stack."""
    if _received:
        raise Interrupted(_received[0])


def record_path(inflight: Path) -> Path:
    """The crash record beside a write-ahead file: .inflight-X.json -> .inflight-X.crash"""
    return inflight.with_suffix(".crash")


@contextlib.contextmanager
def crash_record(path: Path | None):
    """faulthandler writes to `path` while active (fatal signals, and a stack dump on SIGINT / SIGTERM); the file is
    removed when the block ends (a process that dies inside it leaves it behind). Afterwards faulthandler writes to
    stderr again if it did before (pytest turns it on)."""
    if path is None:
        yield
        return
    was_enabled = faulthandler.is_enabled()
    registered = []
    record = open(path, "w")
    try:
        faulthandler.enable(file=record, all_threads=True)
        if threading.current_thread() is threading.main_thread() and hasattr(faulthandler, "register"):
            for s in STOPS:  # chained: the handler in place (interruptible's, or the default) still runs after
                faulthandler.register(s, file=record, all_threads=True, chain=True)
                registered.append(s)
        yield
    finally:  # the process is alive and leaving in Python: nothing crashed it
        for s in registered:
            faulthandler.unregister(s)
        faulthandler.disable()
        if was_enabled:
            faulthandler.enable(file=sys.__stderr__, all_threads=True)
        record.close()
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Record:
    """What a crash record says: `fatal` is the signal that killed the process (SIGSEGV, ...), or None; `stack` the
    dump (empty when nothing was written)."""

    fatal: str | None
    stack: str

    @property
    def signalled(self) -> bool:
        """SIGINT or SIGTERM dumped the stack, and the process did not get back to Python to stop (it was killed)."""
        return self.fatal is None and bool(self.stack.strip())

    def excerpt(self, frames: int = 6) -> str:
        """The innermost frames of the thread the signal hit (faulthandler's "Current thread"), one line each."""
        lines = self.stack.splitlines()
        start = next((i + 1 for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
        taken = []
        for line in lines[start:]:
            if not line.startswith("  "):
                break
            taken.append(line.strip())
        return " <- ".join(taken[:frames]) or self.stack.strip()[:500]


def read_record(path: Path) -> Record:
    """The record at `path`; empty (fatal None, stack '') when there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return Record(None, "")
    for line in text.splitlines():
        if line.startswith("Fatal Python error: "):
            what = line.removeprefix("Fatal Python error: ").strip()
            return Record(FATAL.get(what, what.replace(" ", "_").upper() or "FATAL"), text)
    return Record(None, text)
