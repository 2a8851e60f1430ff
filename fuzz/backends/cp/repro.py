"""Context parallelism's standalone repro source: a script that spawns the world's ranks itself
(torch.multiprocessing; gloo on CPU, NCCL with one GPU per rank on CUDA), cuts each rank's shard with the engine's
convention (the sharding helpers of fuzz/backends/cp/shard.py, embedded verbatim), calls the engine on every rank as
fuzz/backends/cp/ring.py (torch's ring attention) or fuzz/backends/cp/te.py (TransformerEngine's CP API) does, and gathers and
un-permutes the output rows for the script's float64 check."""

from __future__ import annotations

import torch

from attnfuzz.backends import source as src
from attnfuzz.backends.te.repro import construction
from attnfuzz.backends.cp import shard
from attnfuzz.backends.cp.capabilities import common_refusal
from attnfuzz.backends.cp.ring import RingEngine, expands_kv, sdpa_ops
from attnfuzz.backends.cp.te import A2A_GROUPS, P2P_GROUPS, TEEngine, translate
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize, torch_dtype

CONVENTION_WHY = {"contiguous": "one contiguous block per rank (load balancing off)",
                  "head_tail": "chunks r and 2W-1-r of 2W (torch's load balancing)",
                  "dual_chunk": "chunks r and 2W-1-r of 2W of each sequence (TE's DualChunkSwap)"}

_SPAWN = ["import tempfile", "", "import torch.multiprocessing as mp", "",
          "with tempfile.TemporaryDirectory() as tmp:",
          "    mp.spawn(run_rank, args=(tmp, q.detach().cpu(), k.detach().cpu(), v.detach().cpu()), nprocs=WORLD)",
          "    pieces = [torch.load(f'{tmp}/out{rank}.pt') for rank in range(WORLD)]"]

_RING_IMPORT = '''try:
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring
except ImportError:  # where older torch releases kept it
    from torch.distributed.tensor.experimental import _attention as ring'''

_GROUP_OF = '''

def group_of(rank, rank_lists):
    """The process group of the rank list holding `rank`; every rank makes every group (new_group is collective)."""
    import torch.distributed as dist
    groups = [(ranks, dist.new_group(ranks)) for ranks in rank_lists]
    return next(group for ranks, group in groups if rank in ranks)
'''


def _join(cuda: bool) -> list[str]:
    """Rank body lines: pick the device and join the world's process group through a file in `tmp`."""
    if cuda:
        device = ["torch.cuda.set_device(rank)", "device = torch.device('cuda', rank)"]
        init = ("dist.init_process_group('nccl', init_method=f'file://{tmp}/rendezvous', rank=rank, "
                "world_size=WORLD, device_id=device)")
    else:
        device = ["torch.set_num_threads(1)  # the ranks share the machine's cores", "device = torch.device('cpu')"]
        init = "dist.init_process_group('gloo', init_method=f'file://{tmp}/rendezvous', rank=rank, world_size=WORLD)"
    return ["import torch.distributed as dist", "", *device, init]


def _ring_body(engine: RingEngine, case: Case) -> tuple[list[str], str]:
    """(rank body lines computing `out` [b, s_local, h, d_v] from the local q, k, v; what runs)."""
    device = torch.device(engine.device)
    ops = sdpa_ops(device, torch_dtype(case))
    rotate = "ALL_GATHER" if engine.rotate == "allgather" else "ALL_TO_ALL"
    lines = [*_RING_IMPORT.split("\n"), "", f"ring._cp_options.rotate_method = ring._RotateMethod.{rotate}",
             f"ring._cp_options.enable_load_balance = {engine.load_balanced(case)}"]
    if expands_kv(case, device):
        lines.append(f"k, v = (x.repeat_interleave({case.h // case.hk}, dim=2) for x in (k, v))  # the CUDA ops take "
                     f"no grouped KV heads")
    lines.append("q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, heads, s_local, d]")
    kwargs = {"is_causal": repr(case.causal), **{n: repr(x) for n, x in ops.fwd_kwargs(case.softmax_scale).items()}}
    lines.append("out = " + src.call("ring._templated_ring_attention",
                                     ["dist.group.WORLD", "2", f"torch.ops.{ops.fwd}", "q", "k", "v"], kwargs) + "[0]")
    lines.append("out = out.transpose(1, 2)")
    return lines, f"torch's ring attention (KV rotated by {engine.rotate})"


def _te_body(engine: TEEngine, case: Case) -> tuple[list[str], str]:
    """(rank body lines computing `out` (logical local rows) from the local q, k, v; what runs)."""
    call = translate(case, engine.kernel, engine.world)
    packed = case.layout == "thd"
    lines = construction(call.init, learnable=case.softmax == "learnable", suffix=".to(device)")
    if engine.comm_type == "a2a+p2p":
        lines.append(f"group = [group_of(rank, {A2A_GROUPS!r}), group_of(rank, {P2P_GROUPS!r})]  # heads, then KV")
    else:
        lines.append("group = dist.group.WORLD")
    lines.append(src.call("dpa.set_context_parallel_group",
                          ["group", "list(range(WORLD))", "torch.cuda.Stream()", repr(engine.comm_type)], {}))
    to_te = "x.transpose(0, 1)" if case.layout == "sbhd" else "x"
    grad = ".requires_grad_()" if case.grads else ""
    lines.append(f"q, k, v = ({to_te}.contiguous(){grad} for x in (q, k, v))  # qkv_format {case.layout}")
    cu = {name: f"torch.tensor({vals!r}, dtype=torch.int32, device=device)" for name, vals in call.cu_seqlens.items()}
    lines.append("out = " + src.call("dpa", ["q", "k", "v"], cu))
    split = f"out.reshape(out.shape[0], {case.h}, -1)" if packed else f"out.reshape(*out.shape[:2], {case.h}, -1)"
    lines.append(f"out = {split}.transpose(0, 1)" if case.layout == "sbhd" else f"out = {split}")
    return lines, f"TransformerEngine DotProductAttention with cp_comm_type={engine.comm_type!r}"


def _shards(p: shard.Plan, case: Case) -> tuple[list, dict, str, list[str], str]:
    """(sharding helpers, constants, the line making Q_PARTS / KV_PARTS, rank lines cutting the local q, k, v, the
    expression gathering the output pieces)."""
    split = {"contiguous": shard.contiguous, "head_tail": shard.head_tail, "dual_chunk": shard.dual_chunk}
    functions = [shard._need, *([shard.head_tail] if p.convention != "contiguous" else []), split[p.convention],
                 shard.unshard]
    named = {}
    if p.packed:
        functions += [shard.pack_padded, shard.unpack_padded]
        named.update(LENS_Q=(list(case.lens_q), "valid tokens per sequence"),
                     LENS_KV=(list(case.lens_kv), "valid keys per sequence"),
                     PADDED_Q=(list(p.padded_q), "each sequence padded to a multiple of 2 * WORLD"),
                     PADDED_KV=(list(p.padded_kv), "the same for keys"))
        lengths = ("PADDED_Q", "PADDED_KV")
        take = ["q = pack_padded(q, LENS_Q, PADDED_Q).index_select(0, Q_PARTS[rank]).to(device)",
                "k, v = (pack_padded(x, LENS_KV, PADDED_KV).index_select(0, KV_PARTS[rank]).to(device) "
                "for x in (k, v))"]
        gather = f"unpack_padded(unshard(pieces, Q_PARTS, dim=0), LENS_Q, PADDED_Q, {case.sq})"
    else:
        one = "({},)" if p.convention == "dual_chunk" else "{}"  # dual_chunk takes sequence lengths
        lengths = (one.format(case.sq), one.format(case.skv))
        take = ["q = q.index_select(1, Q_PARTS[rank]).to(device)",
                "k, v = (x.index_select(1, KV_PARTS[rank]).to(device) for x in (k, v))"]
        gather = "unshard(pieces, Q_PARTS, dim=1)"
    fn = split[p.convention].__name__
    parts = (f"Q_PARTS, KV_PARTS = {fn}({lengths[0]}, WORLD), {fn}({lengths[1]}, WORLD)  # rank r holds positions "
             f"Q_PARTS[r]: {CONVENTION_WHY[p.convention]}\n")
    return functions, named, parts, take, gather


def cp_source(backend, case: Case) -> str | None:
    """Source of `attention(q, k, v)` and the per-rank function it spawns, for a CPBackend; None for a case whose
    features the engine does not spell."""
    engine = backend.engine
    named: dict = {"WORLD": (engine.world, "ranks, one process each")}
    if isinstance(engine, RingEngine):
        if engine.unsupported(case) is not None:
            return None
        body, what = _ring_body(engine, case)
        cuda, extra = backend.device.startswith("cuda"), ""
    elif isinstance(engine, TEEngine):
        if common_refusal(case) is not None or case.spelling != "":
            return None
        body, what = _te_body(engine, case)
        cuda, extra = True, _GROUP_OF if engine.comm_type == "a2a+p2p" else ""
        named["NVTE"] = (translate(case, engine.kernel, engine.world).env, f"only the {engine.kernel} kernel eligible")
    else:
        return None
    p = shard.plan(engine.convention(case), case, engine.world)
    functions, lengths, parts, take, gather = _shards(p, case)
    named.update(lengths)
    if case.softmax == "learnable":
        named["SINK"] = (materialize(case, "cpu").sink, "the learnable sink logits drawn from the seed")
    rank_body = [*_join(cuda), *take, *body, "torch.save(out.detach().cpu(), f'{tmp}/out{rank}.pt')",
                 "dist.destroy_process_group()"]
    rank_fn = src.function("run_rank(rank, tmp, q, k, v)", f"One rank: join the process group, run {what} on "
                           f"this rank's shard, save its output rows.", rank_body)
    how = "NCCL, one GPU each" if cuda else "gloo on the CPU"
    doc = (f"Spawn WORLD ranks ({how}), let each run {what} on its shard, gather their output rows and put them back "
           f"in sequence order.")
    return ("\n\n# sharding helpers, verbatim from attnfuzz (fuzz/backends/cp/shard.py)" + src.preamble(functions, named)
            + parts + extra + rank_fn + src.attention(doc, [*_SPAWN, f"return {gather}.to(q.device)"]))
