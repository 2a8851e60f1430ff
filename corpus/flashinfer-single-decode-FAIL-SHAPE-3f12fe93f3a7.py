"""attnfuzz repro: flashinfer-single-decode FAIL:SHAPE
lse has shape (), expected (1, 1, 1) (b, h, sq)

Run with: python3 flashinfer-single-decode-FAIL-SHAPE-3f12fe93f3a7.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'flashinfer-single-decode'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 64, 'd_v': 64, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': 'softcap_zero+return_lse+tensor_cores'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.00333594429939268], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.00333594429939268  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.0001239227582291973], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


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
    """FlashInfer's single_decode_with_kv_cache as attnfuzz's flashinfer-single-decode adapter calls it
    (kv_layout NHD, backend 'fa2', spelling 'softcap_zero+return_lse+tensor_cores')."""
    import flashinfer

    lens_q, lens_kv = [1], [1]  # valid tokens per sequence
    out, lse = flashinfer.single_decode_with_kv_cache(
        q[0, 0], k[0, :lens_kv[0]], v[0, :lens_kv[0]], kv_layout='NHD', use_tensor_cores=True,
        return_lse=True, sm_scale=0.125, window_left=-1, logits_soft_cap=0.0)
    return out[None, None]


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375, -0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((1, 1, 1, 64)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375, 1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125], dtype=torch.float64).reshape((1, 1, 1, 64)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625], dtype=torch.float64).reshape((1, 1, 1, 64)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625], dtype=torch.float64).reshape((1, 1, 1, 64)).to(torch.float64)

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
        EXPECTED_LSE = torch.tensor([-1.4297628417261876], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)
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
