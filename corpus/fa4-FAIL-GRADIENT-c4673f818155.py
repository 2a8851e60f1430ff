"""attnfuzz repro: fa4 FAIL:GRADIENT
dq: diff_max=4.695e-01 baseline_max=5.035e-04 k=4 floor=9.406e-04 (ratio 158.90) worst at [1, 0, 0, 7]: got=0
expected=-0.469498

Run with: python3 fa4-FAIL-GRADIENT-c4673f818155.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 2, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [1, 1], 'seqlens_kv': [1, 1], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'learnable', 'layout': 'thd', 'memory': 'transposed', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 168, 'grads': True, 'spelling': 'neg'}
VALID_ROWS = [1, 1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.0026721091712380092  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [1, 1]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 0.0029625417035387203, 'dk': 0.0025076976384251653, 'dv': 0.003187135351698161}


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


LEARNABLE_SINK = torch.tensor([0.41338393092155457], dtype=torch.float64).reshape((1,)).to(torch.float32)  # learnable_sink, as the adapter passes it


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_varlen_func) as attnfuzz's fa4 adapter calls it for spelling
    'neg'."""
    from flash_attn.cute import flash_attn_varlen_func

    lens_q, lens_kv = [1, 1], [1, 1]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # varlen: [total, heads, d]
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_k=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=1, max_seqlen_k=1, softmax_scale=None, causal=False, window_size=(-1, -1),
        learnable_sink=LEARNABLE_SINK.to(q.device), softcap=0.0, return_lse=True)[0]
    return unpack(out, lens_q, 1)


def main():
    q = torch.tensor([-0.10028076171875, 0.28076171875, 0.0921630859375, -1.8291015625, 0.003993988037109375, 0.05743408203125, 1.00390625, 1.3037109375, -0.25341796875, 1.53125, -0.9013671875, 0.5107421875, -0.6474609375, -0.1865234375, 0.1009521484375, -1.2236328125], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([0.60498046875, 0.39794921875, -1.1376953125, -0.0670166015625, -0.059051513671875, 0.50048828125, -0.51123046875, -2.58984375, -0.9931640625, -0.441162109375, -0.19580078125, -0.59130859375, -1.416015625, -0.97021484375, 0.1634521484375, 1.595703125], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-1.5322265625, -0.153564453125, -0.67041015625, -1.4755859375, -0.451904296875, -0.049102783203125, 0.93359375, 1.818359375, 1.16015625, -0.408935546875, -0.8828125, -1.0546875, -0.329345703125, 2.359375, -1.8125, -0.1400146484375], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # head-major buffers
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([-0.22603561040348846, -0.022653983260642805, -0.09889958351943584, -0.21767992818334678, -0.06666537840294091, -0.007243692183301724, 0.13772469314578392, 0.2682462119638595, 0.33439416541702427, -0.11786831377809673, -0.25445481947558074, -0.3039946958336584, -0.09492797330546417, 0.6800473936427025, -0.5224205143215463, -0.040356703254769234], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64)
    DOUT = torch.tensor([0.09063720703125, 3.310546875, -1.2998046875, 0.073974609375, -0.50439453125, 0.71044921875, 0.5888671875, 0.082275390625, 0.77197265625, 0.361083984375, -1.458984375, 0.6708984375, 1.48828125, -2.451171875, -0.3623046875, -1.65625], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.027098164432700713, 0.017824861995682874, -0.05095942141097067, -0.003001794244058251, -0.002645023616690672, 0.022417771221564353, -0.022898933140466222, -0.11600376444797787, 0.2922148967233736, 0.12980145486212785, 0.057609721527076115, 0.17397848570895055, 0.4166289087993036, 0.28546263509800557, -0.048091905938126504, -0.4694976806745255], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64), 'dk': torch.tensor([-0.004491755867930516, 0.012575822880389758, 0.0041281505542148985, -0.08192875219120006, 0.00017889791515989236, 0.00257257594140147, 0.04496676842101103, 0.058395560157635924, 0.0745622081609788, -0.450533882067109, 0.2652058502219015, -0.15027373744967984, 0.19049997691995743, 0.05488008384873585, -0.029702767894571037, 0.3600248432589844], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64), 'dv': torch.tensor([0.013370892345808651, 0.4883752194186271, -0.19174850060359666, 0.010912809106478173, -0.0744087908052274, 0.1048061864681567, 0.08687028239216286, 0.012137348742188593, 0.222507228756025, 0.10407596183749555, -0.4205259959032275, 0.1933744037386327, 0.428970293009718, -0.7065061912430395, -0.104427807550266, -0.47738426308693027], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64)}

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
