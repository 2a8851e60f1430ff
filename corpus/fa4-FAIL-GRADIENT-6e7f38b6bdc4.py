"""attnfuzz repro: fa4 FAIL:GRADIENT
dv: worst of 2 rows at [1, 0, 0, 1]: diff_max=2.990e+00 baseline_max=4.883e-04 k=4 floor=8.768e-03 (ratio
278.85): got=0 expected=2.98975

Run with: python3 fa4-FAIL-GRADIENT-6e7f38b6bdc4.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 2, 'sq': 1, 'skv': 1, 'h': 2, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [1, 1], 'seqlens_kv': [1, 1], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}
VALID_ROWS = [1, 1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.0018048174046391915, 0.0018047246974805641, 0.005831816919068213, 0.005831439024952332], dtype=torch.float64).reshape((2, 1, 2)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.005831816919068213  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.00012268590278408884, 0.00012255214442199831, 0.00012354355494063838, 0.00012318711691928306], dtype=torch.float64).reshape((2, 2, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)
VALID_KEYS = [1, 1]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 0.027229523563635734, 'dk': 0.03588145656113845, 'dv': 0.014702395541900656}


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


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_varlen_func) as attnfuzz's fa4 adapter calls it for spelling
    ''."""
    from flash_attn.cute import flash_attn_varlen_func

    lens_q, lens_kv = [1, 1], [1, 1]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # varlen: [total, heads, d]
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_k=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=1, max_seqlen_k=1, softmax_scale=None, causal=False, window_size=(None, None),
        learnable_sink=None, softcap=0.0, return_lse=True)[0]
    return unpack(out, lens_q, 1)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((2, 1, 2, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((2, 1, 2, 8)).to(torch.float64)
    DOUT = torch.tensor([-0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375], dtype=torch.float64).reshape((2, 1, 2, 8)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((2, 1, 2, 8)).to(torch.float64), 'dk': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64), 'dv': torch.tensor([-2.1982421875, 0.3701171875, 0.630615234375, 0.790283203125, -2.5458984375, 3.681640625, -0.61376953125, 1.14111328125, -0.33929443359375, 2.98974609375, -2.72021484375, -0.048821449279785156, -0.203125, -1.356689453125, 1.072601318359375, 1.068115234375], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64)}

    raw = attention(q, k, v)
    lse = raw[1] if isinstance(raw, tuple) and len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
    rows = torch.arange(out.shape[1])[None, :] < torch.tensor(VALID_ROWS)[:, None]
    got, want = out[rows], want[rows]
    err = (got - want).abs().max().item() if got.numel() else 0.0
    over = ((out - EXPECTED.to("cpu", torch.float64)).abs().amax(-1) / ROW_BOUNDS.to(torch.float64))[rows]
    over = over.nan_to_num(nan=float("inf")).max().item() if over.numel() else 0.0
    problems = []
    if not torch.isfinite(got).all():
        problems.append("non-finite output")
    if got.numel() and (got == 0).all() and (want != 0).any():
        problems.append("all-zero output")
    if not over <= 1:
        problems.append(f"max |out - float64| = {err:.4g}: a row's error > bound ({over:.4g} x its own)")
    print(f"{BACKEND}: max |out - float64| = {err:.4g}; worst row at {over:.4g} x its bound (largest {BOUND:.4g})")
    if lse is not None:
        EXPECTED_LSE = torch.tensor([-0.005050931009106179, 0.16430392026736088, -2.4868559936225103, 1.3601034665725522], dtype=torch.float64).reshape((2, 2, 1)).to(torch.float64)
        problems += check_lse(lse, EXPECTED_LSE)
    if True:
        problems += check_grads(raw, q, k, v, DOUT, EXPECTED_GRADS)
    if problems:
        print("  " + "\n  ".join(problems))
    return 1 if problems else 0




def check_lse(lse, want):
    """The LSE against the float64 one: -inf exactly on a row that sees no key, else within its row's bound."""
    lse, want = lse.detach().to("cpu", torch.float64), want.to("cpu", torch.float64)
    if lse.shape != want.shape:
        return [f"lse has shape {tuple(lse.shape)}, expected {tuple(want.shape)} (b, h, sq)"]
    rows = (torch.arange(want.shape[2])[None, :] < torch.tensor(VALID_ROWS)[:, None])[:, None, :].expand_as(want)
    empty, graded = rows & torch.isinf(want), rows & torch.isfinite(want)
    over = ((lse - want).abs() / LSE_BOUNDS)[graded].nan_to_num(nan=float("inf"), posinf=float("inf"))
    over = over.max().item() if over.numel() else 0.0
    err = (lse - want)[graded].abs().max().item() if graded.any() else 0.0
    print(f"{BACKEND}: max |lse - float64| = {err:.4g}; worst row at {over:.4g} x its bound")
    problems = []
    if not torch.equal(lse[empty], want[empty]):
        problems.append("lse of a row that sees no key is not -inf")
    if not over <= 1:
        problems.append(f"max |lse - float64| = {err:.4g}: a row's error > bound ({over:.4g} x its own)")
    return problems


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
