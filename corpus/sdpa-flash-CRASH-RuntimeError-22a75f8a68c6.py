"""attnfuzz repro: sdpa-flash CRASH:RuntimeError
RuntimeError: Input tensor must have contiguous last dimension (at adapter.py:260)

Run with: python3 sdpa-flash-CRASH-RuntimeError-22a75f8a68c6.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'sdpa-flash'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 2, 'hk': 2, 'd_qk': 1, 'd_v': 1, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'bottom_right', 'mask_density': None, 'scale': 1.0, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': '', 'values': 'probe', 'storage': ['plain', 'plain', 'offset']}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.0017094420028686524, 0.0017094420028686524], dtype=torch.float64).reshape((1, 1, 2)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.0017094420028686524  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.00012240873107910156, 0.00012240873107910156], dtype=torch.float64).reshape((1, 2, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)

MASK = None  # attn_mask: True / 0 = query i may see key j


def attention(q, k, v):
    """torch SDPA forced to FLASH_ATTENTION, spelled 'no_mask', layout bshd."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    mask = MASK.to(q.device) if isinstance(MASK, torch.Tensor) else MASK
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=False, scale=1.0, enable_gqa=False)
    return out.transpose(1, 2)


def main():
    q = torch.tensor([0.0, 0.0], dtype=torch.float64).reshape((1, 1, 2, 1)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-2.1796875, 0.568359375], dtype=torch.float64).reshape((1, 1, 2, 1)).to(torch.float16).to(DEVICE)
    v = torch.tensor([1.0, 1.0], dtype=torch.float64).reshape((1, 1, 2, 1)).to(torch.float16).to(DEVICE)


    def stored(x, kind):
        """The values of x in a buffer of the storage `kind`, keeping x's stride order; unused elements hold NaN.
        plain: x. offset: one element into the buffer. padded_rows: each innermost (head-dim) row followed by 8 unused
        elements. strided: the innermost dim at stride 2. A stride-0 (expanded) dim stays expanded. Self-contained
        (torch only): repro scripts embed its source."""
        import torch
        if kind == "plain":
            return x
        for dim, (size, stride) in enumerate(zip(x.shape, x.stride())):
            if stride == 0 and size > 1:
                return stored(x.narrow(dim, 0, 1), kind).expand(x.shape)
        # outermost first, as the buffer holds them; a size-1 dim has no stride of its own: outermost
        order = sorted(range(x.dim()), key=lambda d: (x.shape[d] != 1, -x.stride(d), d))
        shape = [x.shape[d] for d in order]
        inner = shape[-1]
        if kind == "offset":
            buf = torch.full((x.numel() + 1,), float("nan"), dtype=x.dtype, device=x.device)
            y = buf[1:].view(shape)
        elif kind == "padded_rows":
            y = torch.full(shape[:-1] + [inner + 8], float("nan"), dtype=x.dtype, device=x.device)[..., :inner]
        elif kind == "strided":
            y = torch.full(shape[:-1] + [2 * inner], float("nan"), dtype=x.dtype, device=x.device)[..., ::2]
        else:
            raise ValueError(f"storage {kind!r} is unknown")
        y = y.permute([order.index(d) for d in range(x.dim())])
        y.copy_(x)
        return y


    q, k, v = (stored(x, kind) for x, kind in zip((q, k, v), ('plain', 'plain', 'offset')))  # storage
    EXPECTED = torch.tensor([1.0, 1.0], dtype=torch.float64).reshape((1, 1, 2, 1)).to(torch.float64)

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
        EXPECTED_LSE = torch.tensor([0.0, 0.0], dtype=torch.float64).reshape((1, 2, 1)).to(torch.float64)
        problems += check_lse(lse, EXPECTED_LSE)
    if False:
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


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    try:
        code = main()
    except ImportError as e:  # the backend's library (imported by the call), or attnfuzz where the script needs it
        print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is",
              file=sys.stderr)
        sys.exit(2)  # not 1: 1 says the bug is there
    sys.exit(code)
