"""attnfuzz repro: ring-allgather FAIL:GRADIENT
dq: diff_max=1.395e-07 baseline_max=0.000e+00 k=4 floor=1.000e-07 (ratio 1.39) worst at [0, 5, 0, 4]:
got=1.19044 expected=1.19044

Run with: python3 ring-allgather-FAIL-GRADIENT-e86cfdf976d0.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'ring-allgather'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 8, 'skv': 8, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float64', 'seqlens_q': None, 'seqlens_kv': None, 'causal': True, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 4746, 'grads': True, 'spelling': ''}
VALID_ROWS = [8]  # graded query rows per sequence (rows past them are padding)
BOUND = 1.0000000248988762e-07  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


# sharding helpers, verbatim from attnfuzz (fuzz/cp/shard.py)

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
Q_PARTS, KV_PARTS = head_tail(8, WORLD), head_tail(8, WORLD)  # rank r holds positions Q_PARTS[r]: chunks r and 2W-1-r of 2W (torch's load balancing)


def run_rank(rank, tmp, q, k, v):
    """One rank: join the process group, run torch's ring attention (KV rotated by allgather) on this rank's
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

    ring._cp_options.rotate_method = ring._RotateMethod.ALL_GATHER
    ring._cp_options.enable_load_balance = True
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, heads, s_local, d]
    out = ring._templated_ring_attention(
        dist.group.WORLD, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v,
        is_causal=True, dropout_p=0.0, scale=0.35355339059327373)[0]
    out = out.transpose(1, 2)
    torch.save(out.detach().cpu(), f'{tmp}/out{rank}.pt')
    dist.destroy_process_group()


def attention(q, k, v):
    """Spawn WORLD ranks (gloo on the CPU), let each run torch's ring attention (KV rotated by allgather) on
    its shard, gather their output rows and put them back in sequence order."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(tmp, q.detach().cpu(), k.detach().cpu(), v.detach().cpu()), nprocs=WORLD)
        pieces = [torch.load(f'{tmp}/out{rank}.pt') for rank in range(WORLD)]
    return unshard(pieces, Q_PARTS, dim=1).to(q.device)


def main():
    q = torch.tensor([-1.2204620212378798, 0.45867671174417457, -0.2451475780274935, -0.01520725141879357, 0.5720452467310028, -0.26005610927244815, 0.22151094124942897, 1.0021517262409916, 0.38454452579581044, 1.2901249562066968, -0.6224586731155378, -0.200454820305323, -0.34198880526193176, 0.4503257054194574, 0.5653553089958149, 1.2747332918543588, -1.2491241241635138, -1.2561054451885816, -1.4381495533059827, -0.8007506033342184, -0.0636191603970272, 0.3617567840630053, -1.0818834539460531, -0.9211880537099222, -0.262498395328474, 0.14750171301599993, -0.005648821556634078, 0.8967540610348405, 0.13591340153562712, -0.6201627920286932, -1.574640491247123, -0.37187210651526054, -0.8271940254379149, -0.2989545221854355, 0.697092750740285, -1.535785001075859, -0.963016837675195, 0.7317068243479876, -1.3928918940664106, -0.3786768623481566, 0.13104687410773416, 0.9220846418781077, 0.12140813171727402, -0.01565934963449495, 1.2355484008162079, 0.2580439737382114, 0.17311969179804992, -0.528723326002056, -0.13362423959459271, -0.8746805648651079, 0.23656454728928925, -1.0735261059399863, -0.0049561114638953995, -0.22892318786074553, -0.8147893844890209, 1.3223403486304102, -0.6105144870911576, -0.43393445591681373, 0.8883504726364038, -0.14088435012777623, 0.09190374909364697, 2.082902742542073, -0.5020402454592919, -1.0705517978291241], dtype=torch.float64).reshape((1, 8, 1, 8)).to(torch.float64).to(DEVICE)
    k = torch.tensor([-0.23817218803128368, -1.448036223922415, -0.03594383778890703, 0.06363673324079909, 0.14359851147675948, -0.2835329901510468, -0.5916577789178307, 0.20762340179443659, 1.564826652416522, -0.2073270720189982, 0.09260536568936557, 1.0486296836934597, -1.9730657092998163, 0.9110000192987391, -1.5182605432810576, -0.22752901329723596, -0.13384368806585856, -0.9501837983894297, -2.0261089863920385, -1.5968097808973998, -2.158712479721734, 1.4928023592519886, 0.5616835606871098, 0.11011536455052137, 0.27266734945959026, -0.8887268873167257, -0.7974603531439767, 0.48117509564815736, -0.3121896841528862, -0.24712327330352502, -0.4451155847413174, 1.0396096382171813, 1.3364985545881796, -0.5554120272988183, -1.3016273403177538, -0.8036608276589327, 0.2567638681076365, -0.13605478007261984, -0.3326355026566807, -1.1702492214955307, -0.3998089196677438, 0.7550763169810243, 1.0697714069755795, 0.4869131541291033, 1.7708468042161747, 0.24525255383549424, 0.6586579432064386, 0.10937675735032915, -1.1139268989181508, 0.7801888562057845, 0.9522703792537942, 1.4657860369259155, -0.9915111477980112, 1.086834441072996, -0.4440545196532711, -2.42642632155419, 1.5396435166911846, 1.696813674533945, -0.27731560355687884, -1.4654656720050419, 0.10319441336309157, 0.9557182959129376, 0.16568913804623134, -0.15369156263613407], dtype=torch.float64).reshape((1, 8, 1, 8)).to(torch.float64).to(DEVICE)
    v = torch.tensor([-0.9939036044714634, 1.1148663094633706, 1.1857022544910059, 0.21766854166770983, -1.8015418993856853, 0.054900295490926974, 1.4382279335529282, -0.49824134895004446, -1.4059934632200126, -0.6815190554905033, -2.0761584065472682, 1.3798334553800797, 0.38471960883727674, -0.46819615967457345, -1.5748752009809217, 0.9702191563656974, -0.15553866813376566, -0.6513997630059891, -0.3490358625385494, -0.2515516748430458, 0.30064648812759376, 0.6045605774448111, 1.1855252432111103, 0.45128568694524396, -0.18420330065398893, 1.3210398275666784, -0.05988357679425532, 0.07856380536882147, -0.4816819807310239, 1.0678073567928477, -0.19213393348018462, 0.70284764650275, -0.1439582076431434, -0.19093906489336984, 0.9355469201754759, -1.6748807694897785, -2.0698521211958156, 1.0414312615791257, -0.27759873097087756, -0.9905305484801076, 0.5149645535045557, -0.2980030577941117, -0.6642519812973936, -0.2001073306642316, -0.08382003463968674, -2.4265876443813954, 0.15190317173124793, 1.2861095192504952, -0.40135202778335843, 0.3809029757022318, -0.5082709298781819, 0.3012414131026001, 0.2946255485015737, 0.11229186825531572, -0.5244339230344227, -0.19155106867083632, -1.0446762611382883, -0.6757974713794858, -0.15087356938680418, -0.3260850797469816, -0.8698915875248826, -0.7273352031923362, -1.5513829480253374, 1.1334524888412056], dtype=torch.float64).reshape((1, 8, 1, 8)).to(torch.float64).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([-0.9939036044714634, 1.1148663094633706, 1.1857022544910059, 0.21766854166770983, -1.8015418993856853, 0.054900295490926974, 1.4382279335529282, -0.49824134895004446, -1.27626463385525, -0.11600411855133164, -1.0493013846527544, 1.0139756440702863, -0.3035311212542552, -0.3035216613028847, -0.6263288242624256, 0.5079373062334909, -0.45611076994496763, -0.24582067288691783, -0.1419535348557423, -0.0037349992920961417, -0.17794834222868974, 0.38588578165831644, 1.0080671016732001, 0.2762054947139591, -0.9203991268010665, 0.31561802110756987, -0.5787820271276514, 0.6464414823360793, -0.44027721282514926, 0.11676253127728775, -0.2483624351190126, 0.46948845983730725, -0.5696657600407116, -0.17395727437512354, -0.33828938214902027, 0.06093014778981601, -0.329983598564264, 0.3622060768510622, 0.3256508545647592, 0.28382390180598704, 0.0032110647324000152, -0.04667765625291179, -0.210399188992159, -0.3033522626183004, -0.6146355665526716, -0.9207563717553365, 0.09496511584338473, 0.5568851085751352, -0.4592694138466174, 0.3493575527149584, 0.03109404737962746, -0.018967577057114438, -0.6854897545971316, 0.2650418354075666, 0.3620471800279101, 0.22234233021623362, -0.473759021144289, 0.07663989193119833, -0.46183833714283473, 0.17037391077871836, -0.08354877864456549, -0.10649651706246246, -0.3363114988774323, 0.1840458270251264], dtype=torch.float64).reshape((1, 8, 1, 8)).to(torch.float64)

    out = attention(q, k, v)
    out = (out[0] if isinstance(out, tuple) else out).detach().to("cpu", torch.float64)
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
    print(f"{BACKEND}: max |out - float64| = {err:.4g}, bound {BOUND:.4g}", *problems, sep="\n  ")
    return 1 if problems else 0


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    sys.exit(main())
