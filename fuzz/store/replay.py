"""Replay: a corpus entry's case through its backend again, in this process, in a worker, or in a fresh interpreter
under the vector ISA a CPU entry was recorded on (the entry's environment, cpu_capability). An entry saved unconfirmed
is settled by its replay: confirmed when it fails as saved, dropped (moved out of the corpus) when it passes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from attnfuzz.engine.cuda_errors import left_context_broken, may_break_context
from attnfuzz.store.corpus import Entry, host_isa
from attnfuzz.store.isa import emulating
from attnfuzz.oracles.verdict import CRASH, HANG, PASS, UNSUPPORTED, Verdict

UNREPRODUCED_DIR = ".unreproduced"  # beside an entry saved unconfirmed that its replay did not reproduce: no entry


def replay(entry: Entry, device: str | None = None, worker=None) -> Verdict:
    """Run the entry's case through its backend again (in `worker`, a attnfuzz.engine.isolate.Worker for that backend, when
    given); UNSUPPORTED (with why) when the backend is unavailable, or when the entry hung and no worker is given
    (in-process, nothing could stop it). A CPU entry recorded under another vector ISA than this process runs is
    replayed under that ISA, in a fresh interpreter (replay_under_isa)."""
    device = device or entry.device
    isa = entry.recorded_isa(device)
    if isa is not None and isa != host_isa():
        return replay_under_isa(entry, device, isa, worker)
    return _replay_here(entry, device, worker)


class Replayer:
    """Entries replayed one after another: in `workers` (attnfuzz.engine.isolate.Workers) when given, else in this
    process until a CUDA error may have broken its context. That is a crash whose message names one, or one that
    attnfuzz's own code raised for an earlier kernel's asynchronous fault; the entry it surfaced in and every later
    one then replay in isolated workers with `case_timeout_s`, as --isolate does from the start, and `switched` says
    why, for the user."""

    def __init__(self, workers=None, case_timeout_s: float = 300.0):
        self.workers, self.case_timeout_s, self.switched = workers, case_timeout_s, None

    def __call__(self, entry: Entry, device: str | None = None) -> Verdict:
        device = device or entry.device
        if self.workers is not None:
            return replay(entry, device, worker=self.workers(entry.backend, device))
        try:
            verdict = replay(entry, device)
        except Exception as e:   # noqa: BLE001 -- attnfuzz's own code met a CUDA error a kernel left behind
            if not may_break_context(str(e)):
                raise
            self._isolate(f"replaying {entry.backend} raised {type(e).__name__}: {str(e).splitlines()[0][:160]}",
                          "it and the entries after it")
            return replay(entry, device, worker=self.workers(entry.backend, device))
        if left_context_broken(verdict):
            self._isolate(f"{entry.backend} crashed with {verdict.label}" if verdict.status == CRASH else
                          f"a run of {entry.backend} the verdict notes raised a CUDA error", "the entries after it")
        return verdict

    def _isolate(self, why: str, which: str) -> None:
        from attnfuzz.engine.isolate import Workers
        self.switched = (f"{why}, which may leave this process's CUDA context broken: {which} replayed in "
                         f"isolated workers (--isolate)")
        self.workers = Workers(self.case_timeout_s)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()


def settle_unconfirmed(path: Path, entry: Entry, verdict: Verdict) -> str | None:
    """What the replay `verdict` makes of an entry saved unconfirmed: "confirmed" when it failed as saved (the flag
    leaves its file), "dropped" when it passed (its file and repro script move to .unreproduced/ beside it, out of
    the corpus); None when it says nothing either way (refused here, failed otherwise) or the entry is confirmed."""
    if entry.unconfirmed is None:
        return None
    if verdict.label == entry.verdict.label:
        data = json.loads(path.read_text())
        data.pop("confirmed", None)
        data.pop("unconfirmed_reason", None)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return "confirmed"
    if verdict.status != PASS:
        return None
    aside = path.parent / UNREPRODUCED_DIR
    aside.mkdir(exist_ok=True)
    for saved in (path, path.with_suffix(".py")):
        if saved.exists():
            saved.replace(aside / saved.name)
    return "dropped"


def backend_of(entry: Entry, device: str):
    """The entry's backend. A bring-your-own kernel whose module does not import from here is imported from the
    folder the entry recorded (kernel_path; the repro script, which goes into bug reports, records none); ValueError
    says how to fix it where it is not there. (A worker started later inherits this process's sys.path.)"""
    from attnfuzz.backends import get
    try:
        return get(entry.backend, device)
    except ValueError as e:
        folder = entry.kernel_path
        if ":" not in entry.backend:
            raise
        if folder and os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)
            return get(entry.backend, device)
        where = (f"the entry records {folder}, which is not a folder here" if folder and not os.path.isdir(folder)
                 else "the entry records no folder it was imported from" if not folder else f"nor from {folder}")
        raise ValueError(f"{e}; {where}: replay from the folder that holds the module") from None


def _replay_here(entry: Entry, device: str, worker=None) -> Verdict:
    from attnfuzz.engine.harness import run_case
    backend = backend_of(entry, device)
    if worker is not None and not backend.own_processes:
        return worker.run(entry.case)  # the worker judges availability in its own process (TE after cuDNN fails here)
    why = backend.available()
    if why is not None:
        return Verdict(UNSUPPORTED, None, f"{entry.backend} is not available here: {why}")
    if entry.verdict.status == HANG and not backend.own_processes:
        return Verdict(UNSUPPORTED, None, f"{entry.backend}: this entry hung its backend; replay it with --isolate, "
                                          f"where a case that does not answer is timed out")
    return run_case(backend, entry.case, device=device)


_CHILD_MARK = "attnfuzz-replay-verdict: "
_UNRUNNABLE: set[str] = set()   # ISAs a fresh interpreter here did not run: asked once per process


def replay_under_isa(entry: Entry, device: str, isa: str, worker=None) -> Verdict:
    """Replay an entry under the vector ISA it was recorded on. torch picks its CPU kernels' ISA once, when it loads
    (ATEN_CPU_CAPABILITY), and inductor's C++ follows the same variable, so this runs in a fresh interpreter with
    ATEN_CPU_CAPABILITY set (with a worker inside it when `worker` is given). Where this CPU cannot run that ISA,
    the entry is replayed here instead, and a known bug that does not fail here is UNSUPPORTED ("recorded on ISA X,
    host runs Y"), not fixed: a kernel that is right under Y says nothing of X."""
    verdict = None if isa in _UNRUNNABLE else _child_replay(entry, device, isa, worker)
    if verdict is not None:
        return verdict
    _UNRUNNABLE.add(isa)
    here = _replay_here(entry, device, worker)
    if entry.known_bug and not here.failed:
        return Verdict(UNSUPPORTED, None, f"recorded on ISA {isa}, host runs {host_isa()} and cannot run {isa}: "
                                          f"the known bug does not fail here ({here.label}), which says nothing "
                                          f"of {isa}; replay it on a {isa} CPU")
    return here


def _child_replay(entry: Entry, device: str, isa: str, worker) -> Verdict | None:
    """The entry's verdict from a fresh interpreter under ATEN_CPU_CAPABILITY=isa; None when torch there does not run
    that ISA (this CPU lacks it)."""
    import torch

    from attnfuzz.engine import poison
    from attnfuzz.engine.deaths import death_name
    request = {"entry": entry.to_dict(), "device": device, "isa": isa, "threads": torch.get_num_threads(),
               "poison": poison.enabled(),
               "isolate_timeout": None if worker is None else getattr(worker, "timeout_s", 300.0)}
    env = emulating(isa, dict(os.environ))
    done = subprocess.run([sys.executable, "-c", "from attnfuzz.store.replay import replay_child; replay_child()"],
                          input=json.dumps(request), capture_output=True, text=True, env=env)
    answers = [line[len(_CHILD_MARK):] for line in done.stdout.splitlines() if line.startswith(_CHILD_MARK)]
    if not answers:
        name = death_name(done.returncode)
        return Verdict(CRASH, name, f"{entry.backend}: the process replaying this entry under "
                                    f"ATEN_CPU_CAPABILITY={isa.lower()} died ({name}): {done.stderr[-400:].strip()}")
    answer = json.loads(answers[-1])
    if answer is None:
        return None
    verdict = Verdict.from_dict(answer)
    where = (f"replayed in a fresh process under ATEN_CPU_CAPABILITY={isa.lower()}, the ISA it was recorded on "
             f"(this process runs {host_isa()})")
    return dataclasses.replace(verdict, checks=tuple(verdict.checks) + (where,))


def replay_child() -> None:
    """The fresh interpreter of _child_replay: reads the request on stdin, prints the verdict (null when torch here
    does not run the asked ISA) on a marked line."""
    import torch

    from attnfuzz.engine import poison
    request = json.loads(sys.stdin.read())
    torch.set_num_threads(request["threads"])
    if request["poison"]:
        poison.enable()
    if host_isa() != request["isa"]:
        print(_CHILD_MARK + "null", flush=True)
        return
    entry = Entry.from_dict(request["entry"], "replay request")
    worker = None
    if request["isolate_timeout"] is not None:
        from attnfuzz.engine.isolate import Worker
        worker = Worker(entry.backend, request["device"], timeout_s=request["isolate_timeout"])
    try:
        verdict = _replay_here(entry, request["device"], worker)
    finally:
        if worker is not None:
            worker.close()
    print(_CHILD_MARK + json.dumps(verdict.to_dict()), flush=True)
