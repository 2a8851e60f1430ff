"""What runs inside an isolated worker process (attnfuzz.engine.isolate): it builds one backend, warms a GPU's context,
then runs and grades the cases its parent hands it, one at a time, and hands back each verdict, or the traceback of
an error of attnfuzz's own (deaths.HarnessError)."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback

from attnfuzz.engine import memshare, poison
from attnfuzz.engine.deaths import HarnessError
from attnfuzz.oracles import verdict as V


PARENT_POLL_S = 1.0   # how often a worker looks whether the process that hands it cases is still there


def serve(conn, spec: str, device: str, threads: int, poisoned: bool, env: dict | None = None,
          parent: int | None = None) -> None:
    if parent is not None:
        exit_when_gone(parent)
    # Ctrl-C reaches the whole foreground process group: the parent stops the run and then this worker, which must
    # not die of it first (the parent would see a worker that died on its case: a CRASH). The fork server ignores it
    # already (isolate._start_fork_server); this holds for a server started elsewhere.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if env:  # passed, not inherited, for the same reason as `poisoned`; before anything reads it
        os.environ.update(env)
    import torch
    torch.set_num_threads(threads)
    memshare.apply(device)   # a campaign lane's share of a GPU other lanes use too (inherited with the environment)
    if poisoned:  # passed, not inherited: a fork server already running keeps the environment it started with
        poison.enable()
    from attnfuzz.backends import get
    from attnfuzz.engine.harness import run_case
    backend = get(spec, device)
    # asked here, not in the parent: TE, for one, must be imported before torch loads cuDNN, which the parent may have
    unavailable = backend.available()
    if unavailable is None and str(device).startswith("cuda"):
        warm_cuda(device)
    try:
        conn.send(("ready", unavailable))
        while True:
            case = conn.recv()
            if case is None:
                return
            if unavailable is not None:
                conn.send(V.Verdict(V.UNSUPPORTED, None, f"{spec} is not available here: {unavailable}"))
                continue
            try:  # the backend's own exceptions are its CRASH verdicts (harness): what escapes is attnfuzz's
                verdict = run_case(backend, case, device=device)
            except Exception:  # noqa: BLE001 - sent to the parent, which raises it there as the in-process run would
                verdict = HarnessError(traceback.format_exc())
            conn.send(verdict)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone (a run interrupted while this worker started, before it knew its pid)


def warm_cuda(device: str) -> None:
    """The worker's CUDA context, allocator and cuBLAS handle, made before it is ready (after its backend: TE's import
    comes first), so a spare's first case does not pay for them; an error is left for the first case to meet."""
    import torch
    try:
        x = torch.ones(8, 8, device=device)
        (x @ x).sum().item()
    except Exception:  # noqa: BLE001 - the first case reports what is wrong with the device
        pass


def exit_when_gone(parent: int) -> None:
    """Exit this process once `parent` is gone. A worker is the fork server's child, not its run's: a run killed by
    SIGKILL (the OOM killer, a job's limit on one pid) cannot take it along, and a worker in a hung or sleeping case
    would then hold its GPU memory, and keep the fork server alive, for good. PR_SET_PDEATHSIG, which ties a campaign
    lane to its campaign (campaign.supervisor), watches the fork server here, not the run. A thread looks every
    PARENT_POLL_S."""
    def watch() -> None:
        while _alive(parent):
            time.sleep(PARENT_POLL_S)
        os._exit(1)
    threading.Thread(target=watch, name="attnfuzz-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether process `pid` runs: neither gone nor a zombie (killed, not yet reaped by its own parent)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] != "Z"
        except FileNotFoundError:
            return False
    try:  # no /proc (macOS): ask the kernel
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or the pid is another user's process now
        return False
    return True
