"""attnfuzz repro: sdpa-efficient CRASH:RuntimeError
RuntimeError: The expanded size of the tensor (1) must match the existing size (2) at non-singleton dimension
1.  Target sizes: [1, 1, 1, 1].  Tensor sizes: [2, 1, 1] (at sdpa.py:325)

Run with: python3 sdpa-efficient-CRASH-RuntimeError-bf72628cb100.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'sdpa-efficient'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 2, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.0625, 0.00390625], 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.0029471391612597227  # k * naive same-dtype error + rounding floor, as the fuzzer graded it

MASK = torch.tensor([-0.0, -0.0], dtype=torch.float64).reshape((1, 2, 1, 1)).to(torch.float16)  # attn_mask: True / 0 = query i may see key j


def attention(q, k, v):
    """torch SDPA forced to EFFICIENT_ATTENTION, spelled 'float_mask+enable_gqa', layout bshd."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    mask = MASK.to(q.device) if isinstance(MASK, torch.Tensor) else MASK
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, scale=None, enable_gqa=True)
    return out.transpose(1, 2)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125], dtype=torch.float64).reshape((1, 1, 2, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375, -0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 2, 8)).to(torch.float64)

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
