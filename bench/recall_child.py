"""bench/recall.py's tasks, each run in a fresh process (`child`): the plan, a seed's search, a backend's availability
and the replay of its entries. The child imports attnfuzz from one build's folder, prints its result after MARK and
each failure a seed meets after FAILED, for the parent to judge while the search goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

GRACE_S = 60.0   # past the budget, a seed's process is killed (a case that will not return)
MARK = "RECALL "  # the prefix of a child's result line on stdout
FAILED = "RECALL-FAILED "  # the prefix of a failure a seed met, for the parent to judge


def child_env(site: Path | None, environ: dict) -> dict:
    """A child's environment: attnfuzz from `site` first where given, ahead of what PYTHONPATH already holds (the
    GPU stack a runner's env script puts there), and no user site-packages."""
    if site is None:
        return dict(environ)
    path = [str(site)] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**environ, "PYTHONNOUSERSITE": "1", "PYTHONPATH": os.pathsep.join(path)}


def kill(pid: int) -> None:
    """SIGKILL a child's process group (its worker, its fork server), if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def child(site: Path | None, task: str, *args, timeout: float | None = None, isa: str | None = None,
          judge=None) -> dict:
    """Run `task` (a function of bench/recall.py: plan, why_not, search; or "module.function" of another module in
    bench/: recall_replay.reproduces) in a fresh process from an empty folder, importing attnfuzz from `site` alone
    where given, with torch's CPU kernels held to `isa` where given; its result, or {"error": ...} with the
    process's last words. Killed after `timeout` seconds, or as soon as `judge` returns a result for one of the
    failures it prints (then that result)."""
    env = child_env(site, os.environ)
    hold = (f"import os; from attnfuzz.store.isa import emulating; os.environ.update(emulating({isa!r}, "
            f"dict(os.environ))); " if isa else "")   # before torch is imported: the child's own attnfuzz says how
    module, _, function = task.rpartition(".")
    code = (f"{hold}import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import recall_child, "
            f"{module or 'recall'} as tasks; print(recall_child.MARK + json.dumps(tasks.{function}("
            f"*json.loads(sys.argv[1]))), flush=True)")
    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        timer = threading.Timer(timeout, kill, (proc.pid,)) if timeout else None
        if timer:
            timer.start()
        lines, verdict = [], None
        try:
            for line in proc.stdout:
                if line.startswith(MARK):
                    lines.append(line[len(MARK):])
                elif line.startswith(FAILED) and judge is not None and verdict is None:
                    verdict = judge(json.loads(line[len(FAILED):]))
                    if verdict is not None:
                        kill(proc.pid)
            proc.wait()
        finally:
            expired = timer is not None and not timer.is_alive() and verdict is None   # the timer killed it
            if timer:
                timer.cancel()
            kill(proc.pid)   # what the process left behind (its worker, its fork server)
        err.seek(0)
        last_words = err.read().strip()
    rows = [json.loads(line) for line in lines]
    for row in rows[:1]:
        if site and "module" in row and not Path(os.path.abspath(row["module"])).is_relative_to(os.path.abspath(site)):
            raise SystemExit(f"recall.py: error: {site}: attnfuzz was imported from {row['module']}, not from this "
                             f"folder")
    if verdict is not None:
        return verdict
    if rows and set(rows[-1]) != {"module"}:   # its result, after the announcement
        return rows[-1]
    if expired:
        return {"found": False, "error": f"killed {GRACE_S:.0f} s past the budget: {last_words[-300:]}"}
    return {"found": False, "error": f"exited {proc.returncode}: {last_words[-600:]}"}
