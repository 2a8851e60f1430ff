"""attnfuzz repro: sdpa-efficient FAIL:MASK_IGNORED
matches attention with no causal mask or window at all (the band was dropped) (relabelled from sdpa-efficient-
FAIL-TOLERANCE-590b78d0318a.json)

Run with: python3 sdpa-efficient-FAIL-MASK_IGNORED-bbc703f1fc56.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'sdpa-efficient'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 3, 'skv': 2, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': True, 'window': [None, None], 'alignment': 'bottom_right', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [3]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.005735709813530976  # k * naive same-dtype error + rounding floor, as the fuzzer graded it

import torch.nn.attention.bias

MASK = torch.nn.attention.bias.causal_lower_right(3, 2)  # attn_mask: True / 0 = query i may see key j


def attention(q, k, v):
    """torch SDPA forced to EFFICIENT_ATTENTION, spelled 'causal_lower_right', layout bshd."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    mask = MASK.to(q.device) if isinstance(MASK, torch.Tensor) else MASK
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, scale=None, enable_gqa=False)
    return out.transpose(1, 2)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.468017578125, -0.15771484375, 1.443359375, 0.26611328125, 0.16650390625, 0.87451171875, -0.1434326171875, -0.11163330078125, 0.931640625, 1.2587890625, 2.005859375, 0.053741455078125, 0.6181640625, -0.412841796875, -0.84130859375, -2.31640625], dtype=torch.float64).reshape((1, 3, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.2158203125, -0.74267578125, 0.5625, 0.259521484375, -0.1739501953125, -0.6787109375, 0.9384765625, 0.48876953125, 1.203125, 0.08453369140625, -1.2001953125, -0.004787445068359375, -0.51806640625, -0.306640625, -1.5810546875, 1.70703125], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([0.20556640625, -0.450439453125, -0.5732421875, -0.55517578125, 0.59423828125, 1.5419921875, 0.50732421875, -0.5908203125, -1.3251953125, 0.1885986328125, -0.069091796875, -0.494873046875, -1.49609375, -0.19384765625, 0.445556640625, 1.3251953125], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.20556640625, -0.450439453125, -0.5732421875, -0.55517578125, 0.59423828125, 1.5419921875, 0.50732421875, -0.5908203125, -0.26987002747312805, -0.25196180316163674, -0.41665905581925683, -0.5364464671942404, -0.054994054561391115, 1.0028609205508068, 0.4881399415997685, 0.004271415069235895], dtype=torch.float64).reshape((1, 3, 1, 8)).to(torch.float64)

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
