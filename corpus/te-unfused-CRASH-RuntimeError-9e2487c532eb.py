"""attnfuzz repro: te-unfused CRASH:RuntimeError
RuntimeError: cannot reshape tensor of 0 elements into shape [0, -1] because the unspecified dimension size -1
can be any value and is ambiguous (at backends.py:806)

Run with: python3 te-unfused-CRASH-RuntimeError-9e2487c532eb.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-unfused'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [0], 'seqlens_kv': [1], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'thd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [0]  # graded query rows per sequence (rows past them are padding)
BOUND = 1e-07  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


def pack(x: torch.Tensor, lens: tuple[int, ...]) -> torch.Tensor:
    """[b, s, heads, d] -> [sum(lens), heads, d]: the valid tokens of every sequence, back to back."""
    return torch.cat([x[n, :length] for n, length in enumerate(lens)], dim=0)


def unpack(x: torch.Tensor, lens: tuple[int, ...], s: int) -> torch.Tensor:
    """[sum(lens), heads, d] -> [b, s, heads, d], zeros past each length."""
    out = x.new_zeros(len(lens), s, *x.shape[1:])
    start = 0
    for n, length in enumerate(lens):
        out[n, :length] = x[start:start + length]
        start += length
    return out


def cu_seqlens(lens: tuple[int, ...], device) -> torch.Tensor:
    """Cumulative sequence starts, int32, length b + 1 (the varlen convention of FA and TE)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '0', 'NVTE_UNFUSED_ATTN': '1'}  # only UnfusedDotProductAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only UnfusedDotProductAttention enabled (NVTE_*), as
    attnfuzz's te-unfused adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=8, num_gqa_groups=1, attention_dropout=0.0, qkv_format='thd',
        attn_mask_type='padding', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    lens_q, lens_kv = [0], [1]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # thd: [total, heads, d]
    out = dpa(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=1, max_seqlen_kv=1)
    return unpack(out.reshape(out.shape[0], 1, 8), lens_q, 1)


def main():
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875, 0.568359375, -1.0849609375, -1.3984375, 0.4033203125, 0.837890625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)

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
