"""Crash isolation: one backend in a worker process, so a segfault, an abort, a fatal CUDA error or a hang costs one
case, not the run.

The worker builds the backend from its spec (a registry name or package.module:function), then runs and grades
cases (attnfuzz.engine.harness.run_case) as they come. When it dies the case is a CRASH named after the signal or exit code.
When it does not answer within the timeout it is killed, and a fresh worker runs the same case once more with
`confirm_factor` times the limit (default 2): a JIT compile can take minutes on a loaded host, and a slow case is
not a hung one. If that attempt answers, its verdict stands, with a line among its checks saying the first attempt
timed out and how long the second took; if it is silent too, the case is a HANG (TIMEOUT). So a HANG costs
timeout x (1 + confirm_factor). Either way a fresh worker serves the next case, so Hypothesis can shrink a crash like
any other failure, each attempt in a clean process. Once a worker has been replaced, spare workers are kept starting
behind the one at work: shrinking a crash replaces the worker at every step, and a backend whose start-up takes
seconds (TE: importing it takes about 10 s on an H200 host and initialises CUDA, so the fork server cannot import it
for them) then pays it while the steps before run, not after each. As many spares start as the last fresh start-up
lasts in cases (start-up / the last case's seconds, a case counted as at least 1 s, rounded up), at most MAX_SPARES:
one for a backend that starts in a blink, several when each crash step takes a second or two and each start a dozen.
They are stopped once CALM_CASES cases in a row have been answered without a replacement (the crash's shrink is
over), so a long campaign over many backends does not keep a process (and on a GPU a CUDA context) per spare for its
whole run.

A worker that dies on a case after answering others may have been broken by one of them (a CUDA error that left its
context unusable): the case runs again in a fresh worker, and only a death there makes it that case's CRASH. Else the
case keeps the fresh worker's verdict, and the death is recorded as an unattributed one (Worker.unattributed), with
the case the dead worker answered last. A death in a worker that had answered nothing is the case's at once.

Once a HANG is confirmed, the worker's later cases get an adaptive limit instead of the timeout: max(HANG_FLOOR_S,
HANG_FACTOR x the slowest answer seen so far), never above the timeout, with the same confirmation at confirm_factor
times that. A backend that hangs on some shapes hangs on most of its shrink steps, and each then costs seconds, not
3 x the timeout; a case has to outlast HANG_FACTOR x confirm_factor times the slowest answer seen (whose first
compile it includes) to be called a HANG.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import signal
import time

from attnfuzz.engine import interrupt, memshare, poison
from attnfuzz.engine.cuda_errors import left_context_broken, may_break_context, surfaced
from attnfuzz.engine.deaths import HarnessError, UnattributedDeath, WorkerHarnessError, death_name
from attnfuzz.engine.worker_process import serve
from attnfuzz.oracles import verdict as V
from attnfuzz.strategies.case import Case


STARTUP_S = 300
# Imported once by the fork server, so a fresh worker is a fork (tens of ms), not a new interpreter importing torch
# (seconds): a crash that recurs on every shrink attempt stays cheap. Nothing here may initialise CUDA.
PRELOAD = ["torch", "attnfuzz.engine.harness", "attnfuzz.engine.worker_process", "attnfuzz.backends"]
HANG_FLOOR_S = 2.0   # the least a case gets once a hang is confirmed
HANG_FACTOR = 10.0   # ... else this many times the slowest answer seen
MAX_SPARES = 4       # workers kept starting behind the one at work, once one has been replaced (each holds a process)
CALM_CASES = 20      # ... until this many cases in a row are answered by the same worker


def _start_fork_server() -> None:
    """Start the fork server (if not running) with SIGINT ignored, a disposition it and the workers forked from it
    keep: a Ctrl-C meant for the run reaches the whole process group, and must not kill the server in its seconds of
    importing torch, nor a worker mid-case (the run would see a CRASH). The run's own SIGINT is ignored only for the
    spawn itself (milliseconds)."""
    from multiprocessing import forkserver
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signal dispositions are the main thread's to set
        forkserver.ensure_running()
        return
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


class Worker:
    """A backend in a child process. `run(case)` returns the verdict; the process is replaced after a death or a
    timeout (which counts from the case's hand-over; start-up is waited for apart). A timed-out case is tried once
    more in a fresh worker with `timeout_s * confirm_factor` before it is a HANG; confirm_factor None, 0 or 1 turns
    that off. `restarts` counts the workers replaced, `hangs` the HANGs confirmed, `slowest_s` the slowest answer;
    after a HANG, `limit_s` is the adaptive limit (module docstring; hang_factor None keeps the timeout). `env`:
    variables set in the worker before the backend is built. `spares`: the most workers kept starting once one has
    been replaced (module docstring; 0 turns them off). Use as a context manager, or call close()."""

    def __init__(self, spec: str, device: str = "cpu", timeout_s: float = 120.0, threads: int = 1,
                 confirm_factor: float | None = 2.0, hang_floor_s: float = HANG_FLOOR_S,
                 hang_factor: float | None = HANG_FACTOR, env: dict[str, str] | None = None,
                 spares: int = MAX_SPARES):
        self.spec, self.device, self.timeout_s, self.threads = spec, device, timeout_s, threads
        self.confirm_factor = confirm_factor
        self.hang_floor_s, self.hang_factor = hang_floor_s, hang_factor
        self.hangs, self.slowest_s = 0, 0.0
        self.env = {**memshare.inherited(), **(env or {})}   # a fork server started earlier lacks the share
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        self._process = None
        self._conn = None
        self._unavailable: str | None = None
        self.restarts = 0
        self.spares = spares
        self._spares: list[tuple] = []  # (process, pipe) of each spare worker, oldest first
        self.startup_s = 0.0   # how long the last freshly spawned worker took to be ready
        self.case_s = 0.0      # the last case's seconds from hand-over to answer (or death)
        self._calm = 0         # cases answered in a row by the worker at work: all it answered since it started
        self._last_case: Case | None = None   # the last case the worker at work answered
        self._suspect: tuple[int, Case | None] | None = None   # a death after answering cases: (answered, the last)
        self.deaths = 0        # workers that died on a case
        self.unattributed: list[UnattributedDeath] = []
        self._closed = False   # close() was called: no worker starts again (a case in flight in another thread ends)
        self._prestarted: float | None = None   # when prestart() spawned the first worker, until it is at work

    def _spawn(self) -> tuple:
        """A new worker process and the parent's end of its pipe; it builds its backend while the caller goes on."""
        parent, child = self._context.Pipe()
        process = self._context.Process(target=serve, daemon=True,
                                        args=(child, self.spec, self.device, self.threads, poison.enabled(), self.env,
                                              os.getpid()))
        _start_fork_server()
        process.start()
        child.close()
        return process, parent

    def prestart(self) -> Worker:
        """Start the first worker now, without waiting for it: its start-up (importing the backend: TE's import takes
        about 10 s on an H200 host) overlaps whatever the caller does before its first case, such as asking the
        backend's availability in this process, which imports the same library. No-op once a worker is started."""
        if self._process is None and not self._spares and not self._closed:
            self._spares.append(self._spawn())
            self._prestarted = time.perf_counter()
        return self

    def _start(self) -> None:
        """The next worker: the oldest spare alive (its start-up overlapped the cases before), else a new one; then,
        once a worker has been replaced, spares topped up behind it."""
        spare = None
        while self._spares and spare is None:
            spare = self._spares.pop(0)
            if not spare[0].is_alive():
                spare[0].join(timeout=10)
                spare = None
        spawned = time.perf_counter()
        self._process, self._conn = spare or self._spawn()
        if self._closed:   # close() ran from another thread (a hang's confirmation, or during the spawn): stop it
            self._stop()
            raise RuntimeError(f"{self.spec}: the worker was closed")
        # start-up (importing the backend) is not the case's time
        try:
            hello = self._conn.recv() if self._conn.poll(STARTUP_S) else None
            ready = isinstance(hello, tuple) and hello[0] == "ready"
        except (EOFError, ConnectionResetError):
            ready = False
        self._unavailable = hello[1] if ready else None
        if not ready:
            code = self._process.exitcode
            self._stop()
            raise RuntimeError(f"{self.spec}: the worker did not start within {STARTUP_S}s (exit code {code}); run "
                               f"`attnfuzz run --backend {self.spec}` without --isolate to see why")
        self._calm, self._last_case = 0, None
        if spare is None or self._prestarted is not None:  # a prestarted worker's start-up counts from its spawn
            self.startup_s = time.perf_counter() - (spawned if spare is None else self._prestarted)
        self._prestarted = None
        if self.restarts:
            wanted = min(self.spares, math.ceil(self.startup_s / max(self.case_s, 1.0)))
            self._spares += [self._spawn() for _ in range(wanted - len(self._spares))]

    def _stop(self) -> None:
        started = self._process is not None and self._process.pid is not None  # a start may have been interrupted
        if started and self._process.is_alive():
            self._process.kill()
        if started:
            self._process.join(timeout=10)
        self._process = self._conn = None

    def _attempt(self, case: Case, timeout_s: float) -> tuple[V.Verdict | None, float]:
        """One try in the current worker (started if need be): its verdict, a CRASH when it died, or None when it
        stayed silent for timeout_s (it is killed); and the seconds from hand-over to answer."""
        if self._process is None:
            self._start()
        start = time.perf_counter()
        try:
            self._conn.send(case)  # Case and Verdict are frozen dataclasses: pickled as they are
            if self._conn.poll(timeout_s):
                verdict = self._conn.recv()
                if isinstance(verdict, HarnessError) and not may_break_context(verdict.traceback):
                    raise WorkerHarnessError(f"attnfuzz itself failed in the {self.spec} worker on {case!r} (not "
                                             f"the backend: a bug of attnfuzz to report):\n{verdict.traceback}")
                if isinstance(verdict, HarnessError):
                    return self._fault_surfaced(verdict.traceback, start)
                self.case_s = time.perf_counter() - start
                self._calm += 1
                self._last_case = case
                if self._calm >= CALM_CASES:
                    self._stop_spares()
                return verdict, self.case_s
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the pipe closed: the worker died
            process = self._process
            self.restarts += 1
            self.deaths += 1
            self._suspect = (self._calm, self._last_case) if self._calm else None
            process.join(timeout=30)
            name = death_name(process.exitcode)
            self._stop()
            if process.exitcode is not None and -process.exitcode in interrupt.STOPS:
                # stopped from outside (a job's SIGTERM to every process of the run, a kill): not the case's doing
                raise interrupt.Interrupted(-process.exitcode, where=f" (sent to the {self.spec} worker)")
            self.case_s = time.perf_counter() - start
            return (V.Verdict(V.CRASH, name, f"{self.spec}: the worker process died ({name}) while running this case"),
                    self.case_s)
        self.restarts += 1  # silent: a hang, or a case slower than the limit
        self._stop()
        self.case_s = time.perf_counter() - start
        return None, self.case_s

    def _fault_surfaced(self, text: str, start: float) -> tuple[V.Verdict, float]:
        """A CUDA error raised in attnfuzz's own code in the worker: a kernel's asynchronous fault that the next CUDA
        call reported, this case's or one an earlier case of the worker left pending. Handled as the worker's death:
        it is replaced, and where it had answered cases before, run() tries this one again in a fresh worker."""
        self.restarts += 1
        self.deaths += 1
        self._suspect = (self._calm, self._last_case) if self._calm else None
        self._stop()
        self.case_s = time.perf_counter() - start
        name, line = surfaced(text)
        return (V.Verdict(V.CRASH, name, f"{line[:300]} (met by attnfuzz's code in the {self.spec} worker: a kernel's "
                                         "asynchronous fault)"), self.case_s)

    @property
    def limit_s(self) -> float:
        """The seconds the next case gets before it is tried again: the timeout until a HANG is confirmed, then
        max(hang_floor_s, hang_factor x the slowest answer seen), at most the timeout."""
        if not self.hangs or self.hang_factor is None:
            return self.timeout_s
        return min(self.timeout_s, max(self.hang_floor_s, self.hang_factor * self.slowest_s))

    def _answered(self, verdict: V.Verdict | None, took: float) -> V.Verdict | None:
        if verdict is not None:
            self.slowest_s = max(self.slowest_s, took)
        return verdict

    def run(self, case: Case) -> V.Verdict:
        self._suspect = None
        verdict = self._run(case)
        if self._suspect is not None:
            verdict = self._confirm_death(case, verdict, *self._suspect)
        if self._process is not None and left_context_broken(verdict):
            # a CUDA, cuDNN or cuBLAS error the backend raised (a misaligned or illegal address, a failed cuDNN graph
            # execution) may leave the process's context unusable, and the next case would die of it: it gets a fresh
            # worker instead
            self.restarts += 1
            self._stop()
        return verdict

    def _confirm_death(self, case: Case, death: V.Verdict, answered: int, before: Case | None) -> V.Verdict:
        """The case again in a fresh worker, after a worker that had answered `answered` cases died on it: a death
        there too is the case's CRASH; else the fresh verdict stands and the death is recorded as unattributed."""
        deaths = self.deaths
        verdict = self._run(case)
        if self.deaths > deaths:
            confirmed = (f"confirmed: the first worker to die on it ({death.diagnosis}) had answered {answered} "
                         f"case(s) before; a fresh worker died on it too")
            return dataclasses.replace(verdict, checks=verdict.checks + (confirmed,))
        unattributed = UnattributedDeath(death.diagnosis, case, answered, before, verdict.label)
        self.unattributed.append(unattributed)
        return dataclasses.replace(verdict, checks=verdict.checks + (unattributed.describe(),))

    def _run(self, case: Case) -> V.Verdict:
        limit = self.limit_s
        adapted = "" if limit == self.timeout_s else (
            f" (the limit after {self.hangs} HANG(s): {self.hang_factor:g} x the slowest answer, "
            f"{self.slowest_s:.2f}s, at least {self.hang_floor_s:g}s)")
        verdict = self._answered(*self._attempt(case, limit))
        if verdict is not None:
            return verdict
        if not self.confirm_factor or self.confirm_factor <= 1:
            self.hangs += 1
            return V.Verdict(V.HANG, "TIMEOUT", f"{self.spec}: no answer within {limit:g}s{adapted}; worker killed")
        longer = limit * self.confirm_factor
        verdict, took = self._attempt(case, longer)  # in a fresh worker: the first was killed
        if verdict is None:
            self.hangs += 1
            return V.Verdict(V.HANG, "TIMEOUT", f"{self.spec}: timed out twice (no answer within {limit:g}s, "
                                                f"then {longer:g}s in a fresh worker){adapted}; worker killed")
        self._answered(verdict, took)
        if verdict.status == V.CRASH:
            return verdict
        slow = (f"slow: no answer within {limit:g}s at first; a fresh worker answered in {took:.1f}s "
                f"(limit {longer:g}s)")
        return dataclasses.replace(verdict, checks=verdict.checks + (slow,))

    def available(self) -> str | None:
        """Why the backend cannot run in the worker, or None; judged there (started if need be), as the backends'
        own available() is: TE, for one, imports in a fresh worker but not in a process that has loaded cuDNN."""
        if self._process is None:
            self._start()
        return self._unavailable

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._stop()
        self._stop_spares()

    @property
    def spares_alive(self) -> int:
        """How many spare workers are alive (started or ready)."""
        return sum(process.is_alive() for process, _ in self._spares)

    def _stop_spares(self) -> None:
        spares, self._spares = self._spares, []
        for process, conn in spares:
            conn.close()
            process.kill()
        for process, _ in spares:
            process.join(timeout=10)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def isolated(backend, device: str, timeout_s: float, enabled: bool = True) -> Worker | None:
    """A Worker for `backend` (an adapter), its first worker starting at once (prestart: it imports the backend while
    the caller does, e.g. to ask its availability), or None when isolation is off or the backend already runs its
    kernel in processes of its own (context parallelism: a worker, being a daemon, could not start its ranks)."""
    if not enabled or backend.own_processes:
        return None
    return Worker(backend.name, device, timeout_s=timeout_s).prestart()


class Workers:
    """Workers by (backend name, device), each started on first use and kept: for replaying many corpus entries,
    unrelated cases, so without the adaptive limit after a hang."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s, self._workers = timeout_s, {}

    def __call__(self, backend: str, device: str) -> Worker:
        if (backend, device) not in self._workers:
            self._workers[backend, device] = Worker(backend, device, timeout_s=self.timeout_s, hang_factor=None)
        return self._workers[backend, device]

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()

