"""Corpus entries replayed by several isolated workers at once, each with a time limit and timed:
`pytest corpus --attnfuzz-isolate --attnfuzz-replay-workers N`.

The entries go to N threads longest first, as far as a replay's cost can be told before it runs (a HANG entry's
three limits, then the entries of backends that compile kernels), so that no slow entry starts last while the other
threads idle; each thread keeps isolated workers of its own
(attnfuzz.engine.isolate.Worker, one per backend, device and limit), so up to N entries run at once, each in a
process of its own; a crash or a hang costs its entry only. An entry gets --case-timeout, or `hang_timeout_s` when
it was saved as a HANG: confirming a hang takes the limit and then twice it in a fresh worker, so a HANG entry
replays in 3 x hang_timeout_s (a minute by default), not 3 x --case-timeout. Replayed entries are unrelated cases, so
the fuzzer's adaptive limit after a hang is off here. Every worker is handed the same compile-cache locations
(shared_cache_env), so a kernel one worker compiled is found by the others. Each entry's replay time is kept beside
its verdict.
"""

from __future__ import annotations

import getpass
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from attnfuzz.engine.isolate import Worker
from attnfuzz.oracles.verdict import HANG, Verdict
from attnfuzz.store import corpus as corpus_io
from attnfuzz.store import replay as replay_io

HANG_TIMEOUT_S = 20.0


def _user() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "unknown"
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def shared_cache_env(environ=os.environ) -> dict[str, str]:
    """The compile-cache variables every replay worker is given: the ones set here, else the locations torch
    inductor and FA4's CuTe DSL default to (with FA4's disk cache on, as attnfuzz runs it). TRITON_CACHE_DIR and
    FLASHINFER_WORKSPACE_BASE are passed on when set; unset, inductor keeps Triton's kernels under its own cache dir
    and FlashInfer its JIT modules under ~/.cache/flashinfer."""
    tmp = tempfile.gettempdir()
    defaults = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, f"torchinductor_{_user()}"),
                "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": os.path.join(tmp, _user(), "flash_attention_cute_dsl_cache"),
                "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1"}
    env = {name: environ.get(name) or default for name, default in defaults.items()}
    for name in ("TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        if environ.get(name):
            env[name] = environ[name]
    return env


JIT_REPLAY_S = 30.0   # a rough replay time of an entry whose backend compiles kernels (FA4, FlashInfer, compiled flex)


def expected_seconds(entry: corpus_io.Entry, limit_s: float) -> float:
    """A rough replay time, only to start the slow entries first: a HANG's limit three times (the hang and its
    confirmation at twice the limit), JIT_REPLAY_S for a backend that declares a compile key, else 1."""
    if entry.verdict.status == HANG:
        return 3 * limit_s
    if ":" in entry.backend:   # a bring-your-own kernel: its module is not imported here
        return 1.0
    from attnfuzz.backends import get
    from attnfuzz.engine.compiled_search import declares_compile_key
    try:
        return JIT_REPLAY_S if declares_compile_key(get(entry.backend, entry.device)) else 1.0
    except Exception:  # an unknown backend, or one whose adapter cannot be built here: its replay says why
        return 1.0


def replay_device(entry: corpus_io.Entry, chosen: str) -> str:
    """The device an entry replays on: its own; `chosen` picks which GPU a CUDA entry runs on (cuda:1, ...)."""
    return chosen if entry.device.startswith("cuda") and chosen.startswith("cuda") else entry.device


@dataclass(frozen=True)
class Replayed:
    verdict: Verdict
    seconds: float     # from the start of the entry's replay to its verdict (a worker's start-up included)
    limit_s: float     # the entry's time limit before the confirmation


class ParallelReplay:
    """Replays `entries` ((path, entry, device) each) in `workers` threads as soon as it is built; result(path)
    waits for one. Use as a context manager, or call close()."""

    def __init__(self, entries: list[tuple[Path, corpus_io.Entry, str]], workers: int, timeout_s: float,
                 hang_timeout_s: float = HANG_TIMEOUT_S, env: dict[str, str] | None = None):
        self.timeout_s, self.hang_timeout_s = timeout_s, hang_timeout_s
        self.env = shared_cache_env() if env is None else env
        self._local = threading.local()
        self._started: list[Worker] = []
        self._closed = False
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attnfuzz-replay")
        first = sorted(entries, key=lambda job: -expected_seconds(job[1], self.limit_for(job[1])))   # stable
        self.order = [path for path, _, _ in first]   # the order the entries start in
        self._futures: dict[Path, Future] = {path: self._executor.submit(self._replay, entry, device)
                                              for path, entry, device in first}

    def limit_for(self, entry: corpus_io.Entry) -> float:
        return min(self.timeout_s, self.hang_timeout_s) if entry.verdict.status == HANG else self.timeout_s

    def _worker(self, backend: str, device: str, limit: float) -> Worker:
        mine = self._local.__dict__.setdefault("workers", {})
        if (backend, device, limit) not in mine:
            worker = Worker(backend, device, timeout_s=limit, hang_factor=None, env=self.env)
            with self._lock:
                if self._closed:   # an entry that started as close() ran: no worker for it
                    raise RuntimeError("the replay pool was closed")
                self._started.append(worker)
            mine[backend, device, limit] = worker
        return mine[backend, device, limit]

    def _replay(self, entry: corpus_io.Entry, device: str) -> Replayed:
        limit = self.limit_for(entry)
        start = time.perf_counter()
        try:
            verdict = replay_io.replay(entry, device, worker=self._worker(entry.backend, device, limit))
        except ValueError as e:  # a backend name this attnfuzz does not know
            from attnfuzz.oracles.verdict import UNSUPPORTED
            verdict = Verdict(UNSUPPORTED, None, str(e))
        return Replayed(verdict, time.perf_counter() - start, limit)

    def __contains__(self, path: Path) -> bool:
        return path in self._futures

    def result(self, path: Path) -> Replayed:
        """The entry's replay, waiting for it if need be (an error in the replay is raised here)."""
        return self._futures[path].result()

    def close(self) -> None:
        """Drop the entries not started, and stop every worker (one still running a case is killed)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._closed = True
            started, self._started = self._started, []
        for worker in started:
            worker.close()

    def __enter__(self) -> ParallelReplay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
