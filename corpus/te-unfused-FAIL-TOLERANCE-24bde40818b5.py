"""attnfuzz repro: te-unfused FAIL:TOLERANCE
out: diff_max=2.219e+00 baseline_max=0.000e+00 k=3 floor=4.335e-03 (ratio 511.84) worst at [0, 2, 0, 6]: got=0
expected=-2.21875

Run with: python3 te-unfused-FAIL-TOLERANCE-24bde40818b5.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-unfused'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 3, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': 'padding'}
VALID_ROWS = [3]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.004334834117391615  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


def cu_seqlens(lens: tuple[int, ...], device) -> torch.Tensor:
    """Cumulative sequence starts, int32, length b + 1 (the varlen convention of FA and TE)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '0', 'NVTE_UNFUSED_ATTN': '1'}  # only UnfusedDotProductAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only UnfusedDotProductAttention enabled (NVTE_*), as
    attnfuzz's te-unfused adapter builds and calls it for spelling 'padding'."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=8, num_gqa_groups=1, attention_dropout=0.0, qkv_format='bshd',
        attn_mask_type='padding', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    lens_q, lens_kv = [3], [1]  # valid tokens per sequence
    out = dpa(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=3, max_seqlen_kv=1)
    out = out.reshape(*out.shape[:2], 1, 8)  # heads split out of h * d_v
    return out


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.468017578125, -0.15771484375, 1.443359375, 0.26611328125, 0.16650390625, 0.87451171875, -0.1434326171875, -0.11163330078125, 0.931640625, 1.2587890625, 2.005859375, 0.053741455078125, 0.6181640625, -0.412841796875, -0.84130859375, -2.31640625], dtype=torch.float64).reshape((1, 3, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375, 0.19189453125, 1.263671875, -1.2900390625, -0.791015625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.0208740234375, -0.71826171875, 0.5185546875, -1.3125, 0.1920166015625, 0.54296875, -2.21875, 0.259033203125], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.0208740234375, -0.71826171875, 0.5185546875, -1.3125, 0.1920166015625, 0.54296875, -2.21875, 0.259033203125, -0.0208740234375, -0.71826171875, 0.5185546875, -1.3125, 0.1920166015625, 0.54296875, -2.21875, 0.259033203125, -0.0208740234375, -0.71826171875, 0.5185546875, -1.3125, 0.1920166015625, 0.54296875, -2.21875, 0.259033203125], dtype=torch.float64).reshape((1, 3, 1, 8)).to(torch.float64)

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
