"""attnfuzz repro: te-unfused CRASH:IndexError
IndexError: index 0 is out of bounds for dimension 3 with size 0 (at utils.py:2086)

Run with: python3 te-unfused-CRASH-IndexError-94b663686a23.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'te-unfused'
DEVICE = 'cuda'
CASE = {'b': 2, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [1, 1], 'seqlens_kv': [0, 0], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'thd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': 'no-max-seqlen'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [1, 1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([1e-07, 1e-07], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 1e-07  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([float('inf'), float('inf')], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


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


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '0', 'NVTE_UNFUSED_ATTN': '1'}  # only UnfusedDotProductAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only UnfusedDotProductAttention enabled (NVTE_*), as
    attnfuzz's te-unfused adapter builds and calls it for spelling 'no-max-seqlen'."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=8, num_gqa_groups=1, attention_dropout=0.0, qkv_format='thd',
        attn_mask_type='padding', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    lens_q, lens_kv = [1, 1], [0, 0]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # thd: [total, heads, d]
    out = dpa(q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device))
    return unpack(out.reshape(out.shape[0], 1, 8), lens_q, 1)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64)

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
        EXPECTED_LSE = torch.tensor([-float('inf'), -float('inf')], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64)
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
