"""attnfuzz repro: te-flash CRASH:CompilerDiagnosticError
CompilerDiagnosticError: [91merror:[0m PTX assembly failed: (C7602) Insufficient registers (128) to compile
instruction at line 1360 in function kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm
90_object_at__tensor0000o11101213_tensor0000o11101213_tensor0000o11101213_tensor0000o11101213_None_None_None_N
one__0. Try to compile with register target of 158 or higher.    --> /tmp/attn-
stack/site/flash_attn/cute/flash_fwd_sm90.py:406:0       in function `[92m__call__[0m(...)`:    |   404 |
(at compiler.py:289)

Run with: python3 te-flash-CRASH-CompilerDiagnosticError-ba47cdea70b6.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'te-flash'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 256, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.0058308428085791205], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.0058308428085791205  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.0001228968695450602], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


NVTE = {'NVTE_FLASH_ATTN': '1', 'NVTE_FUSED_ATTN': '0', 'NVTE_UNFUSED_ATTN': '0'}  # only FlashAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FlashAttention enabled (NVTE_*), as attnfuzz's te-flash
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=(8, 256), num_gqa_groups=1, attention_dropout=0.0,
        qkv_format='bshd', attn_mask_type='no_mask', window_size=None, bottom_right_diagonal=False,
        softcap=0.0, attention_type='self', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    out = dpa(q, k, v)
    out = out.reshape(*out.shape[:2], 1, 256)  # heads split out of h * d_v
    return out


def main():
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875, 0.568359375, -1.0849609375, -1.3984375, 0.4033203125, 0.837890625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375, 1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625, -0.5595703125, 0.53369140625, 0.406982421875, 0.39453125, 0.1715087890625, 0.8759765625, -0.287109375, 1.021484375, -0.07440185546875, -1.091796875, 0.39208984375, 0.5947265625, 0.662109375, -1.2060546875, 0.607421875, -0.54736328125, 1.1708984375, 0.09747314453125, 0.96337890625, 0.84033203125, -1.25390625, 0.98681640625, -0.49462890625, -1.283203125, 0.955078125, 1.283203125, -0.666015625, 0.56494140625, 0.28759765625, -0.03338623046875, -1.0615234375, -0.11444091796875, -0.34326171875, 1.5712890625, 0.191650390625, 0.3798828125, -0.144775390625, 0.6376953125, -0.28125, -1.330078125, -0.1419677734375, -0.5341796875, -0.5234375, 0.861328125, -0.88720703125, 0.8388671875, 1.1533203125, -1.7607421875, -1.4775390625, -1.755859375, 0.076171875, -1.078125, 1.4404296875, -0.110595703125, 0.57666015625, -0.169189453125, -0.06402587890625, 1.0380859375, 0.90673828125, -0.4755859375, -0.87060546875, 0.144775390625, 1.9033203125, 0.390380859375, -0.03936767578125, -0.80126953125, -0.49560546875, -0.361572265625, 0.5849609375, -1.15625, -0.143310546875, -0.1947021484375, -0.0855712890625, 1.39453125, 0.5966796875, -0.48291015625, -0.3662109375, -1.3271484375, 1.6953125, 2.06640625, -0.2340087890625, 0.70751953125, 0.580078125, 0.268310546875, -2.05859375, 0.5341796875, -0.53515625, -0.86376953125, -0.02349853515625, 1.171875, 0.398681640625, -0.19873046875, -1.15625, -0.316650390625, 0.9404296875, -1.146484375], dtype=torch.float64).reshape((1, 1, 1, 256)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375, 1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625, -0.5595703125, 0.53369140625, 0.406982421875, 0.39453125, 0.1715087890625, 0.8759765625, -0.287109375, 1.021484375, -0.07440185546875, -1.091796875, 0.39208984375, 0.5947265625, 0.662109375, -1.2060546875, 0.607421875, -0.54736328125, 1.1708984375, 0.09747314453125, 0.96337890625, 0.84033203125, -1.25390625, 0.98681640625, -0.49462890625, -1.283203125, 0.955078125, 1.283203125, -0.666015625, 0.56494140625, 0.28759765625, -0.03338623046875, -1.0615234375, -0.11444091796875, -0.34326171875, 1.5712890625, 0.191650390625, 0.3798828125, -0.144775390625, 0.6376953125, -0.28125, -1.330078125, -0.1419677734375, -0.5341796875, -0.5234375, 0.861328125, -0.88720703125, 0.8388671875, 1.1533203125, -1.7607421875, -1.4775390625, -1.755859375, 0.076171875, -1.078125, 1.4404296875, -0.110595703125, 0.57666015625, -0.169189453125, -0.06402587890625, 1.0380859375, 0.90673828125, -0.4755859375, -0.87060546875, 0.144775390625, 1.9033203125, 0.390380859375, -0.03936767578125, -0.80126953125, -0.49560546875, -0.361572265625, 0.5849609375, -1.15625, -0.143310546875, -0.1947021484375, -0.0855712890625, 1.39453125, 0.5966796875, -0.48291015625, -0.3662109375, -1.3271484375, 1.6953125, 2.06640625, -0.2340087890625, 0.70751953125, 0.580078125, 0.268310546875, -2.05859375, 0.5341796875, -0.53515625, -0.86376953125, -0.02349853515625, 1.171875, 0.398681640625, -0.19873046875, -1.15625, -0.316650390625, 0.9404296875, -1.146484375], dtype=torch.float64).reshape((1, 1, 1, 256)).to(torch.float64)

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
