"""attnfuzz repro: ring-alltoall FAIL:TOLERANCE
out: diff_max=1.145e-07 baseline_max=0.000e+00 k=4 floor=1.000e-07 (ratio 1.14) worst at [0, 0, 0, 12]:
got=2.74281 expected=2.74281

Run with: python3 ring-alltoall-FAIL-TOLERANCE-943225cdf1ae.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'ring-alltoall'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 4, 'skv': 4, 'h': 1, 'hk': 1, 'd_qk': 16, 'd_v': 16, 'dtype': 'float64', 'seqlens_q': None, 'seqlens_kv': None, 'causal': True, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 1, 'grads': False, 'spelling': ''}
VALID_ROWS = [4]  # graded query rows per sequence (rows past them are padding)
BOUND = 1.0000000331111256e-07  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


# sharding helpers, verbatim from attnfuzz (fuzz/backends/cp/shard.py)

def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def head_tail(n: int, world: int) -> list[torch.Tensor]:
    """Rank r holds chunks r and 2W-1-r of 2W equal chunks; n must be a multiple of 2W."""
    _need(world >= 1 and n % (2 * world) == 0,
          f"head_tail sharding: length n={n} must be a multiple of 2*world={2 * world}")
    c = n // (2 * world)
    return [torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange((2 * world - 1 - r) * c, (2 * world - r) * c)])
            for r in range(world)]


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
Q_PARTS, KV_PARTS = head_tail(4, WORLD), head_tail(4, WORLD)  # rank r holds positions Q_PARTS[r]: chunks r and 2W-1-r of 2W (torch's load balancing)


def run_rank(rank, tmp, q, k, v):
    """One rank: join the process group, run torch's ring attention (KV rotated by alltoall) on this rank's
    shard, save its output rows."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    device = torch.device('cpu')
    dist.init_process_group('gloo', init_method=f'file://{tmp}/rendezvous', rank=rank, world_size=WORLD)
    q = q.index_select(1, Q_PARTS[rank]).to(device)
    k, v = (x.index_select(1, KV_PARTS[rank]).to(device) for x in (k, v))
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    except ImportError:  # where older torch releases kept it
        from torch.distributed.tensor.experimental import _attention as ring

    ring._cp_options.rotate_method = ring._RotateMethod.ALL_TO_ALL
    ring._cp_options.enable_load_balance = True
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, heads, s_local, d]
    out = ring._templated_ring_attention(
        dist.group.WORLD, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v,
        is_causal=True, dropout_p=0.0, scale=0.25)[0]
    out = out.transpose(1, 2)
    torch.save(out.detach().cpu(), f'{tmp}/out{rank}.pt')
    dist.destroy_process_group()


def attention(q, k, v):
    """Spawn WORLD ranks (gloo on the CPU), let each run torch's ring attention (KV rotated by alltoall) on
    its shard, gather their output rows and put them back in sequence order."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(tmp, q.detach().cpu(), k.detach().cpu(), v.detach().cpu()), nprocs=WORLD)
        pieces = [torch.load(f'{tmp}/out{rank}.pt') for rank in range(WORLD)]
    return unshard(pieces, Q_PARTS, dim=1).to(q.device)


def main():
    q = torch.tensor([-0.31128955419003207, -0.7130302768401124, -0.729068152895376, -0.29920233004408114, -0.25289846946006805, -0.36018000135378847, 0.9393532606557873, 1.16142070644801, -0.1705634409839206, 0.014932963521677391, -0.04759475759569801, 0.548012110089419, -1.2490838162314513, 0.3195131020577657, 0.594450724343618, 1.0562236505127134, 0.8035157004758826, 0.3739858166762804, 0.5739008402091161, 1.5697184649359581, 0.8734455849426772, -3.704663800207429, -1.8141539905872015, -1.8425712793844078, -1.1827915167384517, 0.5462183247259068, 1.052307808929565, -0.15636439667930063, -2.1010054062092243, 1.5797411191469026, 1.0833573008638342, 0.8896745158287568, 0.644344364616798, 0.09578445220533666, -1.5084106407056563, -0.5842388085089033, -2.067962430690414, -0.1941494909295202, 0.3637087362110191, -0.3647873365742472, 1.5557913692854093, 2.259669415942446, 2.0955714036030395, 0.21419370885074568, 1.370093892857187, 0.8451349076347527, -1.038963834549605, 0.7534002479421004, 0.25306794146620326, -0.8420786526801944, 1.1816510879454611, 0.606144573168124, -0.9036419880656171, 1.9062940790023233, 1.115014239945059, 0.05603585598449382, -0.9169317660172939, -0.0006154817104287245, -0.8844198270024983, 0.4709343516587111, -0.5035592383152663, -0.16015664406754435, 1.210387076720329, 0.819744450242707], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64).to(DEVICE)
    k = torch.tensor([0.06447501554868859, -1.1714121011051852, -1.0242811060210302, -0.7120026534780047, -1.1948715109728594, 0.12520999984623957, -0.3137559168016638, 0.7011703646183947, 0.8500710782508866, -0.28016672592235514, 0.38957495889805815, -0.9225601978731296, -0.2874129424088212, 0.7741640677355631, -0.5169946614841917, -1.0475461266021293, -0.02020351746384866, 0.08737857261825491, 2.306880372222595, -1.1814166687118122, -1.603242266545204, -1.667593007326246, 1.0649897496375862, -2.837784014403392, -0.14649938067656476, 0.807006168103694, -0.0036715050877938805, -0.41700503332411476, 0.8807487554895109, -0.4496352593200994, -1.220691269934242, 1.3082985869861348, -0.21654545425983682, -1.3393142741370458, -1.675139187064058, -2.201954744585422, 2.5368940858810554, -1.0294731944757973, 0.9825481992919948, 0.9285896800305921, -0.46001938802460374, -1.6507976629001784, 1.1867453840570412, 0.1739067719064165, -0.7044631369416755, -0.11169131591932442, -0.2964285640230658, -1.2125337657904307, -0.551754019707133, -0.1776699054165141, 0.5976263976824102, 0.039464620292000506, -1.2305055776032034, -0.9227874824730455, 0.28887594325575344, -1.1791327893651435, -2.433237616716527, -0.3781962417137767, -0.1074397267519889, 0.644799518563086, 2.015307453128026, -0.152244620296926, 0.607951445354353, 0.15445974094127468], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64).to(DEVICE)
    v = torch.tensor([0.8167748134005844, -0.9034671904434315, -1.387986783216828, 1.281698163164755, 1.2905387653398763, -0.6284545794592158, -0.3700995262699945, -0.5292485101835143, -0.25728464611467783, 1.451660490355372, -0.2985032021588692, 0.9957099338816828, 2.7428132248162047, 0.1600749670941512, -1.4975329122324896, -0.03793494266787883, -0.731418231646838, -0.31678734911767925, 0.06289723073046784, -0.4122841550031765, 0.055320608842457326, -1.133212160657981, -0.8186371742623603, -0.9660559714306025, 0.14072764862485185, 0.4689357852226216, -0.7607170161824368, 0.5290669221486697, 0.8434204127942843, -1.1063073538011639, -0.6021807867001846, 2.663267929064731, 0.054612334154339415, 0.7406442691462959, 1.4366444869658364, -0.6554844277483028, -0.19946464027416827, -0.295168901107763, -0.5568403834223776, -0.2502953068858862, -0.6811461429279089, 0.03606845456142835, -0.38617575262589715, -1.5382092044935607, 0.4365018188548933, -0.054632759545854476, 0.8541089707864062, 0.0902641282329102, 0.9409580302589913, 0.8276536813209379, 1.1183000963674183, -1.7328502233615237, -1.4539901934258186, 1.069905360623451, 0.16390753324059287, 0.6695067800808702, 0.9448570798955426, 0.9672124453572433, 1.6106248904752947, -1.5449423435359901, -0.22830732766469783, 0.045191085938866234, 1.4266476017253376, 0.41497656673109895], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64).to(DEVICE)
    EXPECTED = torch.tensor([0.8167748134005844, -0.9034671904434315, -1.387986783216828, 1.281698163164755, 1.2905387653398763, -0.6284545794592158, -0.3700995262699945, -0.5292485101835143, -0.25728464611467783, 1.451660490355372, -0.2985032021588692, 0.9957099338816828, 2.7428132248162047, 0.1600749670941512, -1.4975329122324896, -0.03793494266787883, -0.6168690378970597, -0.3601951806074881, -0.044452168980221224, -0.286948164512034, 0.14671311598780012, -1.0958656720205542, -0.7854503400311204, -0.9337370415207935, 0.11127913274967838, 0.5416465644184401, -0.7265182966456314, 0.5635933534189688, 0.9839545121607947, -1.0126090425333414, -0.6684269595724661, 2.4634087370205773, -0.1019298633055716, -0.5154371638304531, -0.464909206023687, 0.24400855070439026, 0.5315965641328487, -0.9108561190338208, -0.6352609456136541, -0.7739119628523479, -0.039345490614707296, 0.8410806032581246, -0.5686659844217298, 0.6509804470774534, 1.575343616887299, -0.5793716920776678, -0.9099826725765165, 1.5296037211138689, 0.4019993866984632, 0.2621441832644031, 0.4932823305405829, -0.8981285176762054, -0.5929644552190877, 0.1446547444325661, -0.22397570606555406, -0.004677023308104766, 0.4762755057987692, 0.8454517685802154, 0.5791854687953922, -0.6072356342102881, 0.5097533441695837, -0.2751458372980554, 0.4240033681649972, 0.9854588556179131], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64)

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
