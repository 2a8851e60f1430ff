"""attnfuzz repro: te-flash CRASH:AssertionError
AssertionError: GQA backward requires head_dim == head_dim_v (at flash_bwd_sm90.py:116)

Run with: python3 te-flash-CRASH-AssertionError-01c3473be6c4.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-flash'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 2, 'hk': 1, 'd_qk': 8, 'd_v': 16, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'bottom_right', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.004497911224757558  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [1]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 1.495163091031116e-05, 'dk': 2.446055315237088e-05, 'dv': 0.009595293184256693}


NVTE = {'NVTE_FLASH_ATTN': '1', 'NVTE_FUSED_ATTN': '0', 'NVTE_UNFUSED_ATTN': '0'}  # only FlashAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FlashAttention enabled (NVTE_*), as attnfuzz's te-flash
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=2, kv_channels=(8, 16), num_gqa_groups=1, attention_dropout=0.0,
        qkv_format='bshd', attn_mask_type='no_mask', window_size=None, bottom_right_diagonal=True,
        softcap=0.0, attention_type='self', softmax_scale=None, softmax_type='vanilla')
    dpa.train(True)
    out = dpa(q, k, v)
    out = out.reshape(*out.shape[:2], 2, 16)  # heads split out of h * d_v
    return out


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125], dtype=torch.float64).reshape((1, 1, 2, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((1, 1, 1, 16)).to(torch.float16).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((1, 1, 2, 16)).to(torch.float64)
    DOUT = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625], dtype=torch.float64).reshape((1, 1, 2, 16)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 2, 8)).to(torch.float64), 'dk': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64), 'dv': torch.tensor([-1.2421875, 1.79296875, 2.166015625, 1.4678955078125, -1.7088623046875, 2.174560546875, 0.0703125, -0.059814453125, -2.0751953125, 0.1943359375, 1.040771484375, 2.910400390625, -2.5986328125, -0.119140625, 1.6787109375, 0.25390625], dtype=torch.float64).reshape((1, 1, 1, 16)).to(torch.float64)}

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
    if True:
        problems += check_grads(raw, q, k, v, DOUT, EXPECTED_GRADS)
    if problems:
        print("  " + "\n  ".join(problems))
    return 1 if problems else 0



def check_grads(out, q, k, v, dout, expected):
    """dQ, dK, dV by autograd through the call, each against its float64 answer on the graded rows / keys."""
    if not out.requires_grad:
        print("  gradients not checked: this call's output is not differentiable here")
        return []
    grads = torch.autograd.grad(out, (q, k, v), dout.to(out.device, out.dtype))
    rows = torch.arange(q.shape[1])[None, :] < torch.tensor(VALID_ROWS)[:, None]
    keys = torch.arange(k.shape[1])[None, :] < torch.tensor(VALID_KEYS)[:, None]
    problems = []
    for name, got, where in zip(("dq", "dk", "dv"), grads, (rows, keys, keys)):
        got, want = got.detach().to("cpu", torch.float64)[where], expected[name].to(torch.float64)[where]
        err = (got - want).abs().max().item() if got.numel() else 0.0
        print(f"{BACKEND}: max |{name} - float64| = {err:.4g}, bound {GRAD_BOUNDS[name]:.4g}")
        if not torch.isfinite(got).all():
            problems.append(f"non-finite {name}")
        elif not err <= GRAD_BOUNDS[name]:
            problems.append(f"max |{name} - float64| = {err:.4g} > bound {GRAD_BOUNDS[name]:.4g}")
    return problems


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    sys.exit(main())
