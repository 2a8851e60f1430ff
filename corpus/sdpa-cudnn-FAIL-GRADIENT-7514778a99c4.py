"""attnfuzz repro: sdpa-cudnn FAIL:GRADIENT
dk: worst of 2 rows at [0, 0, 0, 0]: diff_max=inf baseline_max=0.000e+00 k=4 floor=1.459e-07 (ratio inf):
got=nan expected=0

Run with: python3 sdpa-cudnn-FAIL-GRADIENT-7514778a99c4.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'sdpa-cudnn'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 2, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [0], 'seqlens_kv': [2], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': 'float_mask+explicit_scale'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [0]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([float('inf')], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.0  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([float('inf')], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)
GRAD_ROW_BOUNDS = {'dq': torch.tensor([float('inf')], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64), 'dk': torch.tensor([1.4593347943179466e-07, 1.4593347943179466e-07], dtype=torch.float64).reshape((1, 2, 1)).to(torch.float64), 'dv': torch.tensor([1e-07, 1e-07], dtype=torch.float64).reshape((1, 2, 1)).to(torch.float64)}  # per dQ row (batch, query, head) and dK / dV row (batch, key, KV head): the grader's bound

MASK = torch.tensor([-float('inf'), -float('inf')], dtype=torch.float64).reshape((1, 1, 1, 2)).to(torch.float16)  # attn_mask: True / 0 = query i may see key j


def attention(q, k, v):
    """torch SDPA forced to CUDNN_ATTENTION, spelled 'float_mask+explicit_scale', layout bshd."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    mask = MASK.to(q.device) if isinstance(MASK, torch.Tensor) else MASK
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, scale=0.35355339059327373, enable_gqa=False)
    return out.transpose(1, 2)


def main():
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875, 0.568359375, -1.0849609375, -1.3984375, 0.4033203125, 0.837890625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)
    DOUT = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64), 'dk': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float64), 'dv': torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float64)}

    raw = attention(q, k, v)
    lse = raw[1] if isinstance(raw, tuple) and len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
    if out.shape != want.shape:  # before the checks below, which index it by the contract's axes
        print(f"{BACKEND}: wrong shape: got {tuple(out.shape)}, expected {tuple(want.shape)} (b, sq, h, d_v)")
        return 1
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
        EXPECTED_LSE = torch.tensor([-float('inf')], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)
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
        return [f"wrong shape: lse got {tuple(lse.shape)}, expected {tuple(want.shape)} (b, h, sq)"]
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
    """dQ, dK, dV by autograd through the call, each row (query or key, head) against its float64 answer within the
    bound the fuzzer graded that row with (GRAD_ROW_BOUNDS; inf: a row not graded)."""
    if not out.requires_grad:
        print("  gradients not checked: this call's output is not differentiable here")
        return []
    grads = torch.autograd.grad(out, (q, k, v), dout.to(out.device, out.dtype))
    problems = []
    for name, got in zip(("dq", "dk", "dv"), grads):
        got, want = got.detach().to("cpu", torch.float64), expected[name].to("cpu", torch.float64)
        bounds = GRAD_ROW_BOUNDS[name].to(torch.float64)
        graded = torch.isfinite(bounds)
        if not graded.any():
            continue
        err = (got - want).abs().amax(-1).nan_to_num(nan=float("inf"))[graded]
        ratios = err / bounds[graded]
        worst = int(ratios.argmax())
        over = ratios[worst].item()
        print(f"{BACKEND}: max |{name} - float64| = {err.max().item():.4g}; worst row at {over:.4g} x its bound")
        if not torch.isfinite(got.amax(-1)[graded]).all():
            problems.append(f"non-finite {name}")
        elif not over <= 1.0:
            problems.append(f"max |{name} - float64| on its worst row = {err[worst].item():.4g} > bound "
                            f"{bounds[graded][worst].item():.4g} ({over:.4g} x)")
    return problems


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    try:
        code = main()
    except ImportError as e:  # the backend's library (imported by the call), or attnfuzz where the script needs it
        print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is",
              file=sys.stderr)
        sys.exit(2)  # not 1: 1 says the bug is there
    sys.exit(code)
