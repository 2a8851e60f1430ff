"""attnfuzz repro: sdpa-flash FAIL:LSE
a row with no visible key must have lse -inf, got 0.0 at [0, 0, 0]

Run with: python3 sdpa-flash-FAIL-LSE-77f5c7de4c2f.py   (exits 1 while the bug is there, 2 when attnfuzz or the kernel cannot be imported here)
"""
import sys

import torch

BACKEND = 'sdpa-flash'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 2, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, 0], 'alignment': 'bottom_right', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.00390625], 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [2]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([1e-07, 0.0025796068307516783], dtype=torch.float64).reshape((1, 2, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.0025796068307516783  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([float('inf'), 0.00012272106420608701], dtype=torch.float64).reshape((1, 1, 2)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


KERNEL_PATH = None  # the folder on sys.path that the fuzzing run imported the kernel's module from


def _adapter():
    """BACKEND's adapter, through attnfuzz; exits 2 (1 means the bug is there) when it cannot be made here."""
    import os
    if KERNEL_PATH and os.path.isdir(KERNEL_PATH) and KERNEL_PATH not in sys.path:
        sys.path.insert(0, KERNEL_PATH)  # import the kernel's module the way the run did, from any folder
    try:
        from attnfuzz.backends import get
        from attnfuzz.strategies import Case, materialize
        return get(BACKEND, DEVICE), Case, materialize
    except (ImportError, ValueError) as e:  # attnfuzz, or the kernel's module, is not importable here
        where = f" (the run imported it from {KERNEL_PATH})" if KERNEL_PATH else ""
        print(f"{BACKEND}: cannot run this repro here{where}: {e}", file=sys.stderr)
        sys.exit(2)


def attention(q, k, v):
    """No standalone spelling for this backend or case: call it through attnfuzz's adapter."""
    backend, Case, materialize = _adapter()
    case = Case.from_dict(CASE)
    t = materialize(case, DEVICE)
    t = type(t)(q=q, k=k, v=v, mask=t.mask, sink=t.sink, alibi=t.alibi, dout=t.dout)
    result = backend.run(case, t)
    return result.out if result.lse is None else (result.out, result.lse)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.0, 0.0, -0.0, -0.0, 0.0, 0.0, 0.0, 0.0, -0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float64)

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
        EXPECTED_LSE = torch.tensor([-float('inf'), 0.05552066520941624], dtype=torch.float64).reshape((1, 1, 2)).to(torch.float64)
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


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    sys.exit(main())
