"""attnfuzz repro: te-cp-p2p-fused FAIL:TOLERANCE
out: diff_max=2.924e+00 baseline_max=0.000e+00 k=3 floor=5.298e-02 (ratio 55.19) worst at [0, 0, 0, 26]:
got=0.466797 expected=3.39062

Run with: python3 te-cp-p2p-fused-FAIL-TOLERANCE-1ca73db022a3.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-cp-p2p-fused'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 4, 'skv': 4, 'h': 1, 'hk': 1, 'd_qk': 64, 'd_v': 64, 'dtype': 'bfloat16', 'seqlens_q': [1], 'seqlens_kv': [1], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'thd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.05298009867181336  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


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


def dual_chunk(lens: tuple[int, ...], world: int) -> list[torch.Tensor]:
    """TE's DualChunkSwap over sequences of lengths `lens` laid back to back: within each sequence, rank r holds
    chunks r and 2W-1-r of 2W; every length must be a multiple of 2W."""
    _need(all(n % (2 * world) == 0 for n in lens),
          f"dual_chunk sharding: every sequence length in {tuple(lens)} must be a multiple of 2*world={2 * world}")
    parts: list[list[torch.Tensor]] = [[] for _ in range(world)]
    start = 0
    for n in lens:
        for r, idx in enumerate(head_tail(n, world)):
            parts[r].append(idx + start)
        start += n
    return [torch.cat(p) if p else torch.zeros(0, dtype=torch.long) for p in parts]


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


def pack_padded(x: torch.Tensor, lens: tuple[int, ...], padded_lens: tuple[int, ...]) -> torch.Tensor:
    """[b, s, heads, d] -> [sum(padded_lens), heads, d]: each sequence's valid tokens, then zeros to its padded
    length."""
    out = x.new_zeros(sum(padded_lens), *x.shape[2:])
    start = 0
    for n, (length, p) in enumerate(zip(lens, padded_lens)):
        out[start:start + length] = x[n, :length]
        start += p
    return out


def unpack_padded(y: torch.Tensor, lens: tuple[int, ...], padded_lens: tuple[int, ...], s: int, *,
                  dim: int = 0, fill: float = 0.0) -> torch.Tensor:
    """Inverse of pack_padded along `dim`: back to a batch axis before `dim`, `fill` past each length. For
    [t, heads, d] (dim 0) it gives [b, s, heads, d]; for an LSE [heads, t] (dim 1) it gives [b, heads, s]."""
    y = y.movedim(dim, 0)
    out = y.new_full((len(lens), s, *y.shape[1:]), fill)
    start = 0
    for n, (length, p) in enumerate(zip(lens, padded_lens)):
        out[n, :length] = y[start:start + length]
        start += p
    return out.movedim(1, dim + 1) if dim else out


WORLD = 2  # ranks, one process each
NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only the fused kernel eligible
LENS_Q = [1]  # valid tokens per sequence
LENS_KV = [1]  # valid keys per sequence
PADDED_Q = [4]  # each sequence padded to a multiple of 2 * WORLD
PADDED_KV = [4]  # the same for keys
Q_PARTS, KV_PARTS = dual_chunk(PADDED_Q, WORLD), dual_chunk(PADDED_KV, WORLD)  # rank r holds positions Q_PARTS[r]: chunks r and 2W-1-r of 2W of each sequence (TE's DualChunkSwap)


def run_rank(rank, tmp, q, k, v):
    """One rank: join the process group, run TransformerEngine DotProductAttention with cp_comm_type='p2p' on
    this rank's shard, save its output rows."""
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device('cuda', rank)
    dist.init_process_group('nccl', init_method=f'file://{tmp}/rendezvous', rank=rank, world_size=WORLD, device_id=device)
    q = pack_padded(q, LENS_Q, PADDED_Q).index_select(0, Q_PARTS[rank]).to(device)
    k, v = (pack_padded(x, LENS_KV, PADDED_KV).index_select(0, KV_PARTS[rank]).to(device) for x in (k, v))
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=(64, 64), num_gqa_groups=1, attention_dropout=0.0,
        qkv_format='thd', attn_mask_type='padding', window_size=(-1, -1), softmax_scale=0.125,
        softmax_type='vanilla').to(device)
    group = dist.group.WORLD
    dpa.set_context_parallel_group(group, list(range(WORLD)), torch.cuda.Stream(), 'p2p')
    q, k, v = (x.contiguous() for x in (q, k, v))  # qkv_format thd
    out = dpa(
        q, k, v, cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32, device=device),
        cu_seqlens_kv=torch.tensor([0, 1], dtype=torch.int32, device=device),
        cu_seqlens_q_padded=torch.tensor([0, 4], dtype=torch.int32, device=device),
        cu_seqlens_kv_padded=torch.tensor([0, 4], dtype=torch.int32, device=device))
    out = out.reshape(out.shape[0], 1, -1)
    torch.save(out.detach().cpu(), f'{tmp}/out{rank}.pt')
    dist.destroy_process_group()


def attention(q, k, v):
    """Spawn WORLD ranks (NCCL, one GPU each), let each run TransformerEngine DotProductAttention with
    cp_comm_type='p2p' on its shard, gather their output rows and put them back in sequence order."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(tmp, q.detach().cpu(), k.detach().cpu(), v.detach().cpu()), nprocs=WORLD)
        pieces = [torch.load(f'{tmp}/out{rank}.pt') for rank in range(WORLD)]
    return unpack_padded(unshard(pieces, Q_PARTS, dim=0), LENS_Q, PADDED_Q, 4).to(q.device)


def main():
    q = torch.tensor([-1.125, -1.15625, -0.25, -0.43359375, 0.84765625, 0.69140625, -0.31640625, -2.109375, 0.322265625, -1.265625, 0.349609375, 0.30859375, 0.11962890625, 1.234375, 1.1171875, -0.2470703125, -1.3515625, -1.6953125, 0.56640625, 0.79296875, 0.59765625, -1.5546875, -0.341796875, 1.8515625, 0.75, -0.5859375, -0.173828125, 0.18359375, 1.390625, 1.5859375, 0.9453125, -0.84375, -0.61328125, 0.031494140625, -0.4921875, 0.248046875, 0.439453125, 0.1123046875, 0.640625, 0.44140625, -0.1025390625, 0.79296875, -0.2890625, 0.052490234375, 0.5234375, 2.296875, -1.46875, -1.5859375, -0.671875, 0.87109375, 1.0546875, 0.177734375, -0.23046875, -0.392578125, 0.54296875, -0.39453125, -0.4453125, 0.7421875, 1.5234375, 3.40625, -1.53125, -1.234375, 1.8203125, -0.55078125, -0.5703125, 0.921875, 1.109375, 1.2890625, -1.4765625, 2.5625, -0.47265625, 0.3359375, -1.6328125, -0.55078125, -0.48046875, -0.5, -1.0703125, 1.1171875, -0.140625, 0.8046875, -0.09326171875, 0.6875, -0.83984375, 0.00089263916015625, 0.84375, -0.400390625, 1.0390625, 0.357421875, -0.24609375, 2.296875, -1.8828125, -0.0498046875, -1.046875, -0.95703125, 0.033447265625, 0.7109375, 1.6484375, -1.359375, 0.34375, 0.51953125, -2.609375, -1.6953125, -0.228515625, 0.279296875, 0.2470703125, 0.07666015625, 0.337890625, 0.455078125, 0.45703125, -0.8671875, 0.78125, -0.92578125, -0.21875, -2.4375, -0.07275390625, -0.033935546875, 0.9609375, 0.349609375, -0.921875, -0.05615234375, -0.62109375, -0.462890625, 1.921875, -0.40234375, 0.1240234375, 1.1640625, 0.921875, 1.390625, -0.8828125, -0.41796875, -0.8046875, 0.56640625, 0.609375, 0.466796875, 1.953125, -1.0625, -0.0771484375, 0.1162109375, -0.59375, -1.2421875, -0.10205078125, -1.03125, -0.3125, 0.24609375, -0.259765625, 0.1181640625, 0.244140625, 1.1640625, 0.2890625, 0.38671875, -0.201171875, -0.1181640625, 0.1923828125, -0.7734375, -1.8984375, 0.130859375, -0.703125, 0.314453125, 0.1572265625, 0.384765625, 0.96875, -0.9921875, 0.30078125, -0.107421875, 1.0, -0.498046875, 0.76171875, 0.6171875, 0.314453125, 0.212890625, -0.1201171875, 0.361328125, -0.314453125, -1.078125, 0.2412109375, -1.3984375, -0.06591796875, -0.357421875, -1.5625, -0.35546875, 1.078125, 0.1318359375, 1.5703125, 0.78125, -1.078125, -0.72265625, 1.46875, 0.275390625, 0.66796875, -0.99609375, -1.1875, -1.1953125, -0.55859375, 0.53515625, 0.40625, 0.39453125, 0.171875, 0.875, -0.287109375, 1.0234375, -0.07421875, -1.09375, 0.392578125, 0.59375, 0.6640625, -1.203125, 0.609375, -0.546875, 1.171875, 0.09765625, 0.96484375, 0.83984375, -1.25, 0.98828125, -0.494140625, -1.28125, 0.95703125, 1.28125, -0.6640625, 0.56640625, 0.287109375, -0.033447265625, -1.0625, -0.1142578125, -0.34375, 1.5703125, 0.19140625, 0.380859375, -0.14453125, 0.63671875, -0.28125, -1.328125, -0.1416015625, -0.53515625, -0.5234375, 0.86328125, -0.88671875, 0.83984375, 1.15625, -1.7578125, -1.4765625, -1.7578125, 0.076171875, -1.078125, 1.4375, -0.1103515625, 0.578125, -0.1689453125, -0.06396484375, 1.0390625, 0.90625, -0.474609375, -0.87109375, 0.14453125, 1.90625, 0.390625], dtype=torch.float64).reshape((1, 4, 1, 64)).to(torch.bfloat16).to(DEVICE)
    k = torch.tensor([-0.039306640625, -0.80078125, -0.49609375, -0.361328125, 0.5859375, -1.15625, -0.1435546875, -0.1943359375, -0.08544921875, 1.390625, 0.59765625, -0.482421875, -0.365234375, -1.328125, 1.6953125, 2.0625, -0.234375, 0.70703125, 0.578125, 0.267578125, -2.0625, 0.53515625, -0.53515625, -0.86328125, -0.0234375, 1.171875, 0.3984375, -0.1982421875, -1.15625, -0.31640625, 0.94140625, -1.1484375, 0.55859375, 0.79296875, -0.1845703125, -0.73046875, -0.08056640625, -0.98046875, 0.060546875, -0.48828125, -0.8125, 0.8203125, -0.6328125, 1.296875, 1.4609375, -0.62109375, 0.98828125, -0.431640625, -0.625, -0.2158203125, -0.48828125, 0.78515625, 0.107421875, -1.0703125, -0.11669921875, -1.015625, -1.1953125, 0.478515625, -1.2265625, -1.3671875, 1.546875, -0.033203125, -0.41796875, -0.255859375, -0.12890625, -0.0546875, 0.408203125, 1.125, 1.9375, 1.0078125, 1.0078125, -0.43359375, -1.2421875, 1.28125, 0.244140625, 0.53125, -0.0145263671875, -2.234375, 1.46875, -1.21875, 0.64453125, 3.9375, -0.12451171875, 0.294921875, 0.3828125, -0.55078125, -0.9921875, 1.34375, 1.9453125, -1.2890625, -2.34375, -2.0625, 0.91015625, -0.6953125, 1.9609375, -1.1015625, 0.54296875, 1.5390625, 1.0859375, 1.25, 0.115234375, 1.6171875, 0.462890625, 1.296875, 0.875, 0.06494140625, 0.7734375, -0.96875, -0.88671875, -0.318359375, -0.333984375, 0.455078125, 0.498046875, 0.87890625, 0.388671875, 1.4609375, 0.48046875, -0.53515625, -0.03466796875, 0.65625, -0.310546875, -0.5625, -0.484375, -1.2734375, -0.173828125, 0.5546875, -0.181640625, -0.234375, 0.294921875, 0.796875, 1.265625, 0.93359375, 0.546875, -1.5390625, 0.3125, 0.73828125, 1.453125, 4.09375, 1.1171875, -1.5703125, -0.69921875, 0.57421875, 1.234375, -0.640625, -0.765625, 0.2412109375, 0.166015625, -2.234375, 1.390625, -0.50390625, 1.6796875, -1.0234375, 1.6875, -1.21875, 0.765625, 1.1953125, -0.7109375, -0.0654296875, 2.203125, 1.7890625, -0.0118408203125, 0.98046875, -1.0625, 1.7734375, -0.279296875, -0.27734375, 0.75, -0.64453125, -0.953125, 0.271484375, 0.671875, 1.8515625, 1.1875, -0.58984375, 0.96484375, -1.5078125, 2.25, 1.2265625, -0.486328125, 0.453125, 1.3515625, 0.43359375, -0.51171875, -0.185546875, 0.275390625, 0.10986328125, 0.359375, -0.75390625, 0.2294921875, -0.25390625, 1.578125, -0.244140625, -1.1953125, -0.025634765625, 1.8046875, -1.0625, 3.40625, -0.5703125, -0.474609375, 1.7421875, -0.2041015625, -0.31640625, 1.296875, 1.34375, 0.1943359375, 1.5703125, -0.3828125, 1.3984375, 0.341796875, -1.6015625, -0.5859375, 0.6015625, 0.4375, -0.0966796875, 0.330078125, -0.1875, -1.4296875, 0.59375, -1.15625, 0.03564453125, 0.2158203125, -0.91796875, 1.5625, -3.15625, -0.5625, -0.4296875, -0.333984375, -1.546875, -0.01470947265625, 1.2265625, 1.59375, -1.6328125, -0.056884765625, 0.62890625, 0.271484375, -0.6875, -1.09375, 1.6796875, -0.87890625, 0.578125, 0.36328125, 0.087890625, -1.3046875, -0.70703125, -0.1640625, -0.97265625, -1.03125, 0.6484375, -0.1904296875, 0.71484375, -2.0, -2.40625, 0.2197265625, -1.6953125, 1.3125, -1.6640625], dtype=torch.float64).reshape((1, 4, 1, 64)).to(torch.bfloat16).to(DEVICE)
    v = torch.tensor([-0.546875, -0.62890625, -0.6328125, 0.9765625, 0.2099609375, 0.0299072265625, 1.7109375, -0.7265625, -0.7734375, 0.59765625, -1.25, 1.1484375, 0.73828125, 1.25, -0.4453125, 0.8203125, -0.81640625, 0.359375, -1.6171875, -2.46875, 0.0361328125, -0.341796875, -0.380859375, -0.056884765625, 0.84375, 0.68359375, 3.390625, -1.671875, 0.51171875, -0.28515625, 0.3359375, 1.171875, 1.296875, 0.890625, -0.490234375, -1.171875, -0.6875, -2.328125, 0.09423828125, -0.2021484375, -0.0595703125, 2.015625, -0.3359375, 0.326171875, 0.53515625, 1.9765625, -0.20703125, -0.030517578125, 0.126953125, 0.00555419921875, 0.79296875, 0.40625, -0.361328125, 1.3125, -0.96484375, 0.87890625, -0.1025390625, -0.67578125, -0.41015625, -1.6171875, 0.5078125, 2.328125, 0.2294921875, -0.53125, -0.875, 0.0042724609375, -1.2578125, -1.0859375, 0.75390625, 0.32421875, -0.275390625, 1.3046875, 0.2119140625, 0.271484375, -0.92578125, -2.734375, -0.5625, -0.2734375, 0.1396484375, 0.5078125, 0.27734375, -0.98046875, 0.890625, 1.5703125, -0.08203125, -0.349609375, 0.2021484375, -0.2890625, 0.1484375, 2.421875, 1.328125, -0.263671875, 0.365234375, 2.546875, -2.6875, 2.4375, 0.0103759765625, -0.99609375, 0.9765625, -0.44140625, -0.26171875, 0.796875, -1.109375, 2.328125, -0.765625, -0.474609375, -0.49609375, -0.1982421875, 2.21875, -0.13671875, -1.015625, 0.1787109375, -0.51171875, -0.5625, -0.91796875, -0.75, -0.0947265625, 1.1015625, 1.3125, -0.29296875, -0.7890625, -0.169921875, -2.171875, 0.71875, 0.28515625, 0.2294921875, 1.28125, -1.3828125, 0.5390625, -0.94921875, 0.2021484375, -0.3515625, 0.546875, 1.5390625, 0.6015625, -0.337890625, 0.404296875, 0.89453125, -1.453125, 1.1875, -0.298828125, 2.296875, 0.330078125, 2.171875, -1.2421875, 2.5, -0.70703125, 1.1484375, -0.55078125, 0.81640625, 2.0, -0.439453125, -0.431640625, -0.47265625, 0.326171875, -0.97265625, 0.796875, -0.57421875, 0.2060546875, 0.2138671875, 0.953125, 0.734375, -1.453125, -2.046875, -0.1767578125, 0.625, -1.6875, 0.81640625, -0.388671875, 1.28125, 0.515625, 0.34765625, -1.0390625, -0.95703125, 0.91796875, 0.48828125, 0.984375, 0.99609375, -1.1640625, -0.5859375, -0.1865234375, -1.234375, 1.1875, -0.1953125, -1.3359375, 1.0546875, -1.0234375, -0.287109375, 1.8515625, -2.390625, 0.408203125, -0.169921875, 0.5859375, 1.046875, 1.2890625, -1.6171875, -0.76953125, -1.21875, 0.57421875, 0.69921875, 0.251953125, 0.279296875, -0.0947265625, 1.609375, -0.12158203125, -1.390625, -0.90625, -0.34765625, 0.703125, 0.030517578125, -0.85546875, 0.5390625, -0.52734375, -1.3359375, 1.546875, 0.408203125, -2.046875, 0.52734375, 0.59765625, -0.408203125, 0.453125, -0.392578125, 2.140625, -0.2060546875, -0.09814453125, 0.486328125, 0.70703125, 0.04296875, -0.439453125, -0.67578125, 1.7421875, -0.94140625, -1.0625, -0.2294921875, -1.2578125, 0.55859375, 0.1572265625, 1.0234375, 1.2265625, -0.001220703125, -1.8125, 0.69140625, 1.1953125, 1.3203125, -0.34765625, 1.2109375, -0.6484375, 0.52734375, -0.94921875, -2.140625, 0.3828125, -0.41015625, -0.73828125, 1.65625, 0.51953125, -0.232421875], dtype=torch.float64).reshape((1, 4, 1, 64)).to(torch.bfloat16).to(DEVICE)
    EXPECTED = torch.tensor([-0.546875, -0.62890625, -0.6328125, 0.9765625, 0.2099609375, 0.0299072265625, 1.7109375, -0.7265625, -0.7734375, 0.59765625, -1.25, 1.1484375, 0.73828125, 1.25, -0.4453125, 0.8203125, -0.81640625, 0.359375, -1.6171875, -2.46875, 0.0361328125, -0.341796875, -0.380859375, -0.056884765625, 0.84375, 0.68359375, 3.390625, -1.671875, 0.51171875, -0.28515625, 0.3359375, 1.171875, 1.296875, 0.890625, -0.490234375, -1.171875, -0.6875, -2.328125, 0.09423828125, -0.2021484375, -0.0595703125, 2.015625, -0.3359375, 0.326171875, 0.53515625, 1.9765625, -0.20703125, -0.030517578125, 0.126953125, 0.00555419921875, 0.79296875, 0.40625, -0.361328125, 1.3125, -0.96484375, 0.87890625, -0.1025390625, -0.67578125, -0.41015625, -1.6171875, 0.5078125, 2.328125, 0.2294921875, -0.53125, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 4, 1, 64)).to(torch.float64)

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
