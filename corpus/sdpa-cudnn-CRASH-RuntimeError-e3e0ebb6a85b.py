"""attnfuzz repro: sdpa-cudnn CRASH:RuntimeError
RuntimeError: The expanded size of the tensor (1) must match the existing size (2) at non-singleton dimension
1.  Target sizes: [1, 1, 2, 2].  Tensor sizes: [2, 2, 2] (at sdpa.py:325)

Run with: python3 sdpa-cudnn-CRASH-RuntimeError-e3e0ebb6a85b.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'sdpa-cudnn'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 2, 'skv': 2, 'h': 2, 'hk': 2, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.0625, 0.00390625], 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [2]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.005196068456174286  # k * naive same-dtype error + rounding floor, as the fuzzer graded it

MASK = torch.tensor([-0.0, -0.0625, -0.0625, -0.0, -0.0, -0.00390625, -0.00390625, -0.0], dtype=torch.float64).reshape((1, 2, 2, 2)).to(torch.float16)  # attn_mask: True / 0 = query i may see key j


def attention(q, k, v):
    """torch SDPA forced to CUDNN_ATTENTION, spelled 'float_mask', layout bshd."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    mask = MASK.to(q.device) if isinstance(MASK, torch.Tensor) else MASK
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, scale=None, enable_gqa=False)
    return out.transpose(1, 2)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.35459437345005773, 0.8148502237095039, 0.23123005243633077, 0.7084721362630096, -0.43176408006826444, 1.2281194210368773, 0.20905023614343116, 0.34569205268083447, -0.8883607351674184, 0.9776970858787419, -1.2305445003703026, -0.25876317009889266, -1.0553552394812697, 0.005821498511468404, -0.047362283671340294, 0.7544161426810625, -0.39230967630320424, 0.8333040762146464, 0.38563115379487173, 0.8106133907958324, -0.6156062333270433, 1.4631642447161095, 0.08923560048635237, 0.3438930922164967, -1.4874059125618877, -0.25793604196607733, -0.6231976111874202, -0.45370798497743975, -1.0650846341887092, 0.903252405982466, -0.12280475051285844, 0.7958718244779788], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float64)

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
