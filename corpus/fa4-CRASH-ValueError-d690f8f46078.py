"""attnfuzz repro: fa4 CRASH:ValueError
ValueError: Expected IntTuple, whose leaves are integers, but got 1 (at core.py:376)

Run with: python3 fa4-CRASH-ValueError-d690f8f46078.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [1], 'seqlens_kv': [1], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': 'max_seqlen_tensor'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.002579853046751071], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.002579853046751071  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.0001228968695450602], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


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


MAX_SEQLEN_Q = torch.tensor([1.0], dtype=torch.float64).reshape(()).to(torch.int32)  # max_seqlen_q, as the adapter passes it
MAX_SEQLEN_K = torch.tensor([1.0], dtype=torch.float64).reshape(()).to(torch.int32)  # max_seqlen_k, as the adapter passes it


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_varlen_func) as attnfuzz's fa4 adapter calls it for spelling
    'max_seqlen_tensor'."""
    from flash_attn.cute import flash_attn_varlen_func

    lens_q, lens_kv = [1], [1]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # varlen: [total, heads, d]
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_k=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=MAX_SEQLEN_Q.to(q.device), max_seqlen_k=MAX_SEQLEN_K.to(q.device), softmax_scale=None,
        causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0, return_lse=True)[0]
    return unpack(out, lens_q, 1)


def main():
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875, 0.568359375, -1.0849609375, -1.3984375, 0.4033203125, 0.837890625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)

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
        EXPECTED_LSE = torch.tensor([-0.18566866880807126], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)
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
