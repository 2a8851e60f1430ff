"""attnfuzz repro: fa4 CRASH:MLIRError
MLIRError: Operation creation failed: error: unknown: expected top-level shape equivalence between the SMEM
layout and the CTA V-map, but got '!cute.composed_layout<"S<2,4,3> o 0 o ((8,16),(32,1)):((32,256),(1,0))">'
and '!cute.layout<"(128,16):(1@0,1@1)">' (at _cute_nvgpu_ops_gen.py:4226)

Run with: python3 fa4-CRASH-MLIRError-1ea4e7441de5.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 32, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.004333788246914601  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [1]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 5.282633258384998e-06, 'dk': 3.314657399101348e-06, 'dv': 0.0021280207512940712}


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_func) as attnfuzz's fa4 adapter calls it for spelling ''."""
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(
        q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
        return_lse=True)[0]
    return out


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((1, 1, 1, 32)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((1, 1, 1, 32)).to(torch.float16).to(DEVICE)
    v = torch.tensor([0.1920166015625, 0.54296875, -2.21875, 0.259033203125, -1.029296875, -0.5009765625, 0.2734375, -0.91796875], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([0.1920166015625, 0.54296875, -2.21875, 0.259033203125, -1.029296875, -0.5009765625, 0.2734375, -0.91796875], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)
    DOUT = torch.tensor([-0.040435791015625, 0.2880859375, -0.007537841796875, -0.91455078125, -1.0888671875, -0.2666015625, 0.189453125, -0.218994140625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 32)).to(torch.float64), 'dk': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 32)).to(torch.float64), 'dv': torch.tensor([-0.040435791015625, 0.2880859375, -0.007537841796875, -0.91455078125, -1.0888671875, -0.2666015625, 0.189453125, -0.218994140625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)}

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
