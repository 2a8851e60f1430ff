"""One rank of the context-parallel pool: joins the process group once, then serves cases until told to stop.

Messages from the pool (over a multiprocessing Pipe):
    ("case", engine_pickle, case_json, whole)
        -> ("ok", payload, whole_payload | None, ran, seconds) | ("unsupported", reason) | ("error", traceback)
    ("stop",)                           -> the rank leaves the process group and exits
On start the rank answers ("ready", rank) or ("error", traceback_text).
"""

from __future__ import annotations

import io
import pickle
import time
import traceback
from datetime import timedelta

import torch

from attnfuzz.backends.base import Unsupported
from attnfuzz.backends.cp import shard
from attnfuzz.backends.cp.engine import CPEngine, LocalInputs, RankContext, RankOutput
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, materialize

FIELDS = ("out", "lse", "dq", "dk", "dv")


def dumps(result: RankOutput | None) -> bytes:
    """A rank's tensors as bytes (moved to the CPU), for the pipe back to the pool."""
    data = {} if result is None else {name: getattr(result, name).detach().cpu() for name in FIELDS
                                      if getattr(result, name) is not None}
    buf = io.BytesIO()
    torch.save(data, buf)
    return buf.getvalue()


def loads(payload: bytes) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(payload), weights_only=True)


def local_inputs(case: Case, tensors: Tensors, p: shard.Plan, rank: int) -> LocalInputs:
    """Cut this rank's shard out of the whole tensors, following the plan."""
    q_pos, kv_pos = p.q_parts[rank], p.kv_parts[rank]
    if p.packed:
        def take(x, lens, padded, pos):
            return shard.pack_padded(x, lens, padded).index_select(0, pos.to(x.device))
        q = take(tensors.q, case.lens_q, p.padded_q, q_pos)
        k = take(tensors.k, case.lens_kv, p.padded_kv, kv_pos)
        v = take(tensors.v, case.lens_kv, p.padded_kv, kv_pos)
        dout = take(tensors.dout, case.lens_q, p.padded_q, q_pos) if tensors.dout is not None else None
    else:
        def take(x, pos):
            return x.index_select(1, pos.to(x.device))
        q, k, v = take(tensors.q, q_pos), take(tensors.k, kv_pos), take(tensors.v, kv_pos)
        dout = take(tensors.dout, q_pos) if tensors.dout is not None else None
    return LocalInputs(q=q, k=k, v=v, dout=dout, q_pos=q_pos, kv_pos=kv_pos, packed=p.packed, padded_q=p.padded_q,
                       padded_kv=p.padded_kv, whole=tensors)


def run_one(ctx: RankContext, engine_pickle: bytes, case_json: str, whole: bool) -> tuple:
    """Run one case on this rank; every failure (an engine that cannot be unpickled included) becomes a message,
    never an exit."""
    start = time.perf_counter()
    try:
        engine: CPEngine = pickle.loads(engine_pickle)
        case = Case.from_json(case_json)
        tensors = materialize(case, ctx.device)
        p = shard.plan(engine.convention(case), case, ctx.world)
        result = engine.run_rank(ctx, case, local_inputs(case, tensors, p, ctx.rank))
        whole_result = None
        if whole and ctx.rank == 0:
            try:  # the second signal never decides the case: a non-CP run that fails only goes missing
                whole_result = engine.run_whole(ctx, case, tensors)
            except Exception as e:  # noqa: BLE001
                result.ran = f"{result.ran}; no non-CP run ({type(e).__name__}: {str(e)[:200]})"
        return ("ok", dumps(result), dumps(whole_result) if whole_result is not None else None, result.ran,
                time.perf_counter() - start)
    except Unsupported as e:
        return ("unsupported", str(e))
    except Exception:  # noqa: BLE001 - the pool reports it with the rank's traceback
        return ("error", traceback.format_exc())


def main(rank: int, world: int, dist_backend: str, device_kind: str, init_method: str, conn,
         pg_timeout_s: float) -> None:
    """Process entry point (spawned by attnfuzz.backends.cp.pool)."""
    import torch.distributed as dist

    try:
        if device_kind == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            torch.set_num_threads(1)  # W ranks share the machine's cores
            device = torch.device("cpu")
        kwargs = {"device_id": device} if device_kind == "cuda" else {}
        dist.init_process_group(dist_backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=pg_timeout_s), **kwargs)
        ctx = RankContext(rank=rank, world=world, device=device, group=dist.group.WORLD)
        conn.send(("ready", rank))
    except Exception:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "stop":
            break
        _, engine_pickle, case_json, whole = msg
        conn.send(run_one(ctx, engine_pickle, case_json, whole))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - leaving anyway
        pass
