"""A persistent pool of torch.distributed ranks (gloo on CPU, NCCL on GPUs) that runs context-parallel cases.

Start-up (spawning W processes, importing torch, joining the process group) is paid once; then each case travels
as JSON, every rank materializes its own tensors from the seed, runs the engine on its shard, and sends its pieces
back; the pool un-permutes them into one Output in logical shapes.

Failures never take the pool down:
- a rank that raises is reported with its traceback (status "error"); if the other ranks are left waiting in a
  collective, they are killed and the pool restarts before the next case;
- a case on which some rank does not answer within `timeout_s` is a hang: the case is saved under `hang_dir`, the
  ranks are killed and the pool restarts (status "hang").
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

import torch

from attnfuzz.backends.cp import shard
from attnfuzz.backends.cp.engine import CPEngine
from attnfuzz.backends.cp.worker import loads, main as worker_main
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case

OK, UNSUPPORTED, ERROR, HANG = "ok", "unsupported", "error", "hang"


@dataclass
class PoolResult:
    """The outcome of one case: `output` (gathered, logical shapes) when status is "ok"; `whole` the engine's
    non-CP run when asked for; `rank_errors` rank -> traceback; `saved` the case file of a hang."""

    status: str
    output: Output | None = None
    whole: Output | None = None
    message: str = ""
    rank_errors: dict[int, str] = field(default_factory=dict)
    saved: str | None = None
    seconds: float = 0.0


def _kill(procs: list, init_dir: str | None = None) -> None:
    """Kill the ranks and remove their rendezvous directory (also run at exit for a pool never closed)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)
    if init_dir is not None:
        shutil.rmtree(init_dir, ignore_errors=True)


class CPPool:
    """W spawned ranks serving cases one at a time. Use as a context manager, or call close()."""

    def __init__(self, world: int = 2, *, device: str = "cpu", timeout_s: float = 60.0,
                 start_timeout_s: float = 300.0, grace_s: float = 2.0, hang_dir: str | os.PathLike = "runs/cp_hangs"):
        if world not in (2, 4):
            raise ValueError(f"CPPool: world={world} is not supported; use 2 or 4 ranks")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"CPPool: device={device!r}; use 'cpu' (gloo) or 'cuda' (NCCL, one GPU per rank)")
        if device == "cuda" and torch.cuda.device_count() < world:
            raise ValueError(f"CPPool: world={world} needs {world} GPUs, this machine has "
                             f"{torch.cuda.device_count()}; lower world or use device='cpu'")
        self.world, self.device = world, device
        self.timeout_s, self.start_timeout_s, self.grace_s = timeout_s, start_timeout_s, grace_s
        self.hang_dir = Path(hang_dir)
        self.restarts = 0
        self.cases = 0
        self.start_seconds = 0.0
        self._procs: list = []
        self._conns: list = []
        self._finalizer = None
        self._init_dir: str | None = None

    # -- life cycle --------------------------------------------------------------------------------------------
    def start(self) -> CPPool:
        """Spawn the ranks and wait until every one has joined the process group."""
        if self._procs:
            return self
        t0 = time.perf_counter()
        ctx = mp.get_context("spawn")
        self._init_dir = tempfile.mkdtemp(prefix="attnfuzz-cp-")  # a fresh rendezvous file per start
        init_method = f"file://{os.path.join(self._init_dir, 'rendezvous')}"
        backend = "nccl" if self.device == "cuda" else "gloo"
        for rank in range(self.world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, name=f"attnfuzz-cp-rank{rank}", daemon=True,
                            args=(rank, self.world, backend, self.device, init_method, child, self.timeout_s))
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        self._finalizer = weakref.finalize(self, _kill, list(self._procs), self._init_dir)
        replies = self._collect(time.monotonic() + self.start_timeout_s, grace_s=0.0)
        bad = {r: m for r, m in replies.items() if m[0] != "ready"}
        if len(replies) < self.world or bad:
            self._stop_procs()
            missing = sorted(set(range(self.world)) - set(replies))
            detail = "; ".join(f"rank {r}: {m[1]}" for r, m in bad.items())
            raise RuntimeError(f"CPPool: ranks failed to start (no answer from {missing} within "
                               f"{self.start_timeout_s:.0f}s) {detail}")
        self.start_seconds = time.perf_counter() - t0
        return self

    def close(self) -> None:
        """Ask the ranks to leave, then make sure they are gone."""
        for c in self._conns:
            try:
                c.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 10
        for p in self._procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        self._stop_procs()

    def restart(self) -> None:
        self._stop_procs()
        self.restarts += 1
        self.start()

    def _stop_procs(self) -> None:
        _kill(self._procs)
        for c in self._conns:
            c.close()
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._init_dir is not None:
            shutil.rmtree(self._init_dir, ignore_errors=True)
        self._procs, self._conns, self._finalizer, self._init_dir = [], [], None, None

    def __enter__(self) -> CPPool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one case ----------------------------------------------------------------------------------------------
    def run(self, engine: CPEngine, case: Case, *, whole: bool = False, timeout_s: float | None = None) -> PoolResult:
        """Run `case` on every rank with `engine`; `whole` also asks rank 0 for the engine's non-CP run."""
        if engine.world != self.world:
            raise ValueError(f"CPPool.run: engine {engine.name} needs world={engine.world}, this pool has "
                             f"world={self.world}; use a pool of {engine.world} ranks")
        if self._procs and not all(p.is_alive() for p in self._procs):
            self.restart()  # a rank died after answering its last case (e.g. killed from outside)
        self.start()
        t0 = time.perf_counter()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        message = ("case", pickle.dumps(engine), case.to_json(), whole)
        for c in self._conns:
            c.send(message)
        replies = self._collect(time.monotonic() + timeout, grace_s=self.grace_s)
        self.cases += 1
        result = self._judge(engine, case, replies, timeout)
        result.seconds = time.perf_counter() - t0
        return result

    def _collect(self, deadline: float, grace_s: float) -> dict[int, tuple]:
        """Replies by rank until all have answered or the deadline passes; after the first error the others get
        `grace_s` more (they may be stuck in a collective the failed rank never entered)."""
        replies: dict[int, tuple] = {}
        pending = {c: r for r, c in enumerate(self._conns)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for c in wait(list(pending), timeout=left):
                rank = pending.pop(c)
                try:
                    replies[rank] = c.recv()
                except (EOFError, OSError):
                    code = self._procs[rank].exitcode if rank < len(self._procs) else None
                    replies[rank] = ("error", f"rank {rank} died (exit code {code})")
                if replies[rank][0] == "error":
                    deadline = min(deadline, time.monotonic() + grace_s)
        return replies

    def _judge(self, engine: CPEngine, case: Case, replies: dict[int, tuple], timeout: float) -> PoolResult:
        missing = sorted(set(range(self.world)) - set(replies))
        errors = {r: m[1] for r, m in replies.items() if m[0] == "error"}
        if missing:
            self.restart()
            if errors:
                return PoolResult(ERROR, message=f"rank(s) {sorted(errors)} raised; rank(s) {missing} were left "
                                                 f"waiting and the pool restarted", rank_errors=errors)
            saved = self._save_hang(engine, case, timeout, missing)
            return PoolResult(HANG, message=f"rank(s) {missing} gave no answer within {timeout:g}s; the pool "
                                            f"restarted; case saved to {saved}", saved=str(saved))
        if errors:
            return PoolResult(ERROR, message=f"rank(s) {sorted(errors)} raised", rank_errors=errors)
        unsupported = {r: m[1] for r, m in replies.items() if m[0] == "unsupported"}
        if unsupported:
            if len(unsupported) < self.world:
                return PoolResult(ERROR, message=f"only rank(s) {sorted(unsupported)} refused the case: "
                                                 f"{next(iter(unsupported.values()))}")
            return PoolResult(UNSUPPORTED, message=unsupported[0])
        return self._assemble(engine, case, [replies[r] for r in range(self.world)])

    def _assemble(self, engine: CPEngine, case: Case, replies: list[tuple]) -> PoolResult:
        p = shard.plan(engine.convention(case), case, self.world)
        pieces = [loads(m[1]) for m in replies]
        ran = {m[3] for m in replies}
        try:
            output = gather(case, p, pieces)
        except ValueError as e:
            return PoolResult(ERROR, message=f"could not gather the ranks' pieces: {e}")
        output.ran = ran.pop() if len(ran) == 1 else " | ".join(f"rank {r}: {m[3]}" for r, m in enumerate(replies))
        whole = None
        if replies[0][2] is not None:
            w = loads(replies[0][2])
            whole = Output(out=w["out"], lse=w.get("lse"), dq=w.get("dq"), dk=w.get("dk"), dv=w.get("dv"),
                           ran=f"{engine.name} without context parallelism")
        return PoolResult(OK, output=output, whole=whole)

    def _save_hang(self, engine: CPEngine, case: Case, timeout: float, missing: list[int]) -> Path:
        self.hang_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha1(case.to_json().encode()).hexdigest()[:12]
        path = self.hang_dir / f"{engine.name}-{digest}.json"
        path.write_text(json.dumps({"engine": engine.name, "world": self.world, "device": self.device,
                                    "timeout_s": timeout, "silent_ranks": missing, "case": case.to_dict()},
                                   indent=1, sort_keys=True))
        return path


def gather(case: Case, p: shard.Plan, pieces: list[dict[str, torch.Tensor]]) -> Output:
    """Un-permute every rank's pieces into an Output in logical shapes: out [b, sq, h, d_v], lse [b, h, sq],
    grads like q/k/v. A quantity is gathered only when every rank returned it."""

    def join(name: str, parts, dim_batched: int, dim_packed: int, lens, padded_lens, s: int, fill: float):
        if not all(name in piece for piece in pieces):
            return None
        dim = dim_packed if p.packed else dim_batched
        full = shard.unshard([piece[name] for piece in pieces], list(parts), dim)
        if p.packed:
            full = shard.unpack_padded(full, lens, padded_lens, s, dim=dim_packed, fill=fill)
        return full

    if not all("out" in piece for piece in pieces):
        raise ValueError("a rank returned no out")
    q_args = (p.q_parts, case.lens_q, p.padded_q, case.sq)
    kv_args = (p.kv_parts, case.lens_kv, p.padded_kv, case.skv)
    return Output(out=join("out", q_args[0], 1, 0, *q_args[1:], 0.0),
                  lse=join("lse", q_args[0], 2, 1, *q_args[1:], float("-inf")),
                  dq=join("dq", q_args[0], 1, 0, *q_args[1:], 0.0),
                  dk=join("dk", kv_args[0], 1, 0, *kv_args[1:], 0.0),
                  dv=join("dv", kv_args[0], 1, 0, *kv_args[1:], 0.0))
