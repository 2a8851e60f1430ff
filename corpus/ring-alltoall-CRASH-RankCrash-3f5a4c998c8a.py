"""attnfuzz repro: ring-alltoall CRASH:RankCrash
RankCrash: ring-alltoall: could not gather the ranks' pieces: unshard: rank 0 returned 32 positions along dim
1, its shard holds 1 (at cp.py:89)

Run with: python3 ring-alltoall-CRASH-RankCrash-3f5a4c998c8a.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'ring-alltoall'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 2, 'skv': 2, 'h': 1, 'hk': 1, 'd_qk': 16, 'd_v': 16, 'dtype': 'float32', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [2]  # graded query rows per sequence (rows past them are padding)
BOUND = 1.666862918500018e-06  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


# sharding helpers, verbatim from attnfuzz (fuzz/backends/cp/shard.py)

def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def contiguous(n: int, world: int) -> list[torch.Tensor]:
    """Rank r holds positions [r*n/W, (r+1)*n/W); n must be a multiple of W."""
    _need(world >= 1 and n % world == 0, f"contiguous sharding: length n={n} must be a multiple of world={world}")
    size = n // world
    return [torch.arange(r * size, (r + 1) * size) for r in range(world)]


def unshard(pieces: list[torch.Tensor], parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Inverse of shard: put every rank's piece back at its positions along `dim`."""
    _need(len(pieces) == len(parts), f"unshard: got {len(pieces)} pieces for {len(parts)} ranks")
    for r, (p, idx) in enumerate(zip(pieces, parts)):
        _need(p.shape[dim] == idx.numel(), f"unshard: rank {r} returned {p.shape[dim]} positions along dim {dim}, "
                                           f"its shard holds {idx.numel()}")
    order = torch.cat(list(parts)).to(pieces[0].device)
    gathered = torch.cat(pieces, dim=dim)
    out = torch.empty_like(gathered)
    out.index_copy_(dim, order, gathered)
    return out


WORLD = 2  # ranks, one process each
Q_PARTS, KV_PARTS = contiguous(2, WORLD), contiguous(2, WORLD)  # rank r holds positions Q_PARTS[r]: one contiguous block per rank (load balancing off)


def run_rank(rank, tmp, q, k, v):
    """One rank: join the process group, run torch's ring attention (KV rotated by alltoall) on this rank's
    shard, save its output rows."""
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device('cuda', rank)
    dist.init_process_group('nccl', init_method=f'file://{tmp}/rendezvous', rank=rank, world_size=WORLD, device_id=device)
    q = q.index_select(1, Q_PARTS[rank]).to(device)
    k, v = (x.index_select(1, KV_PARTS[rank]).to(device) for x in (k, v))
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    except ImportError:  # where older torch releases kept it
        from torch.distributed.tensor.experimental import _attention as ring

    ring._cp_options.rotate_method = ring._RotateMethod.ALL_TO_ALL
    ring._cp_options.enable_load_balance = False
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, heads, s_local, d]
    out = ring._templated_ring_attention(
        dist.group.WORLD, 2, torch.ops.aten._scaled_dot_product_efficient_attention.default, q, k, v,
        is_causal=False, attn_bias=None, compute_log_sumexp=True, dropout_p=0.0, scale=0.25)[0]
    out = out.transpose(1, 2)
    torch.save(out.detach().cpu(), f'{tmp}/out{rank}.pt')
    dist.destroy_process_group()


def attention(q, k, v):
    """Spawn WORLD ranks (NCCL, one GPU each), let each run torch's ring attention (KV rotated by alltoall) on
    its shard, gather their output rows and put them back in sequence order."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(tmp, q.detach().cpu(), k.detach().cpu(), v.detach().cpu()), nprocs=WORLD)
        pieces = [torch.load(f'{tmp}/out{rank}.pt') for rank in range(WORLD)]
    return unshard(pieces, Q_PARTS, dim=1).to(q.device)


def main():
    q = torch.tensor([-1.1258398294448853, -1.152360200881958, -0.2505785822868347, -0.4338788092136383, 0.8487103581428528, 0.6920091509819031, -0.31601276993751526, -2.1152193546295166, 0.32227492332458496, -1.2633347511291504, 0.34998318552970886, 0.30813392996788025, 0.11984150856733322, 1.237657904624939, 1.1167771816253662, -0.2472781538963318, -1.3526537418365479, -1.6959311962127686, 0.5666506290435791, 0.7935083508491516, 0.5988394618034363, -1.5550950765609741, -0.3413603901863098, 1.85300612449646, 0.750189483165741, -0.5854975581169128, -0.1733967512845993, 0.18347793817520142, 1.3893661499023438, 1.586334228515625, 0.946298360824585, -0.843676745891571], dtype=torch.float64).reshape((1, 2, 1, 16)).to(torch.float32).to(DEVICE)
    k = torch.tensor([-0.6135830879211426, 0.03159274160861969, -0.4926769733428955, 0.2484147548675537, 0.4396958351135254, 0.11241118609905243, 0.6407923698425293, 0.441156268119812, -0.10230965167284012, 0.7924439907073975, -0.28966769576072693, 0.05250748619437218, 0.5228604674339294, 2.3022053241729736, -1.4688938856124878, -1.586688756942749, -0.6730899214744568, 0.8728312253952026, 1.0553574562072754, 0.17784371972084045, -0.23033547401428223, -0.3917543888092041, 0.5432947278022766, -0.3951575458049774, -0.4462171792984009, 0.7440207004547119, 1.5209795236587524, 3.4105026721954346, -1.5311843156814575, -1.2341350317001343, 1.8197252750396729, -0.5515286922454834], dtype=torch.float64).reshape((1, 2, 1, 16)).to(torch.float32).to(DEVICE)
    v = torch.tensor([-0.5692480802536011, 0.9199714064598083, 1.1108161211013794, 1.2898740768432617, -1.4781739711761475, 2.567232847213745, -0.4731197953224182, 0.3355507552623749, -1.6293259859085083, -0.54974365234375, -0.47983425855636597, -0.4996815323829651, -1.0669803619384766, 1.114939570426941, -0.14067143201828003, 0.8057535886764526, -0.09334823489189148, 0.6870502233505249, -0.8383153676986694, 0.0008918217499740422, 0.8418940901756287, -0.4000341594219208, 1.0394619703292847, 0.3581531047821045, -0.24600094556808472, 2.302516460418701, -1.881689190864563, -0.049727022647857666, -1.0449786186218262, -0.9565008282661438, 0.03353185951709747, 0.7100865840911865], dtype=torch.float64).reshape((1, 2, 1, 16)).to(torch.float32).to(DEVICE)
    EXPECTED = torch.tensor([-0.3302558925058616, 0.8030006957806106, 0.13198159687017613, 0.6425599578848497, -0.3130587749636245, 1.0771007522798859, 0.286483782707079, 0.3469014312766812, -0.934633854823845, 0.8826331198247888, -1.1838319178173236, -0.2737188351544716, -1.0559313044093364, 0.07468272332408227, -0.05318826478746567, 0.7577105667172248, -0.5101166577734625, 0.8910305252696904, 0.8686329839205358, 1.129715684193665, -1.1899012893176422, 2.1985445177451957, -0.2851787562734882, 0.3383591383528949, -1.457445330377819, -0.1953451388859132, -0.6540172869101122, -0.4437738651052674, -1.0642466052624946, 0.8575593284467179, -0.11902635579141149, 0.7938667891309703], dtype=torch.float64).reshape((1, 2, 1, 16)).to(torch.float64)

    raw = attention(q, k, v)
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
    rows = torch.arange(out.shape[1])[None, :] < torch.tensor(VALID_ROWS)[:, None]
    got, want = out[rows], want[rows]
    err = (got - want).abs().max().item() if got.numel() else 0.0
    problems = []
    if not torch.isfinite(got).all():
        problems.append("non-finite output")
    if got.numel() and (got == 0).all() and (want != 0).any():
        problems.append("all-zero output")
    if not err <= BOUND:
        problems.append(f"max |out - float64| = {err:.4g} > bound {BOUND:.4g}")
    print(f"{BACKEND}: max |out - float64| = {err:.4g}, bound {BOUND:.4g}")
    if False:
        problems += check_grads(raw, q, k, v, DOUT, EXPECTED_GRADS)
    if problems:
        print("  " + "\n  ".join(problems))
    return 1 if problems else 0



if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    sys.exit(main())
