"""attnfuzz repro: te-fused-fp8 FAIL:TOLERANCE
out: worst of 15384 rows at [2, 369, 7, 9]: diff_max=2.250e+00 baseline_max=0.000e+00 k=3 floor=3.586e-01
(ratio 6.28): got=1 expected=-1.25

Run with: python3 te-fused-fp8-FAIL-TOLERANCE-4fef5c56f611.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'te-fused-fp8'
DEVICE = 'cuda'
CASE = {'b': 3, 'sq': 641, 'skv': 1, 'h': 8, 'hk': 2, 'd_qk': 16, 'd_v': 16, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': '', 'fp8': ['e4m3', 'e4m3', 'e4m3'], 'fp8_out': 'e4m3', 'fp8_p': 'e4m3'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [641, 641, 641]  # graded query rows per sequence (rows past them are padding)
try:
    from attnfuzz.store.repro_bounds import graded_bounds  # too many bounds to write out: recomputed
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)
_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)
ROW_BOUNDS = _BOUNDS['out']  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.6200613840912071  # the largest, for the summary line
LSE_BOUNDS = _BOUNDS['lse']  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible
Q_DESCALE = torch.tensor([1.0], dtype=torch.float64).reshape((1,)).to(torch.float32)  # q's descale: q = encoding * descale
K_DESCALE = torch.tensor([1.0], dtype=torch.float64).reshape((1,)).to(torch.float32)  # k's descale: k = encoding * descale
V_DESCALE = torch.tensor([1.0], dtype=torch.float64).reshape((1,)).to(torch.float32)  # v's descale: v = encoding * descale
P_SCALE = 1.0  # scale_s: cuDNN quantises P * P_SCALE to e4m3
O_SCALE = 1.0  # scale_o: cuDNN encodes O * O_SCALE in e4m3


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*) under FP8 attention
    (DelayedScaling, fp8_dpa), as attnfuzz's te-fused-fp8 adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format
    from transformer_engine.pytorch.cpp_extensions.fused_attn import META_O, META_S

    dpa = te.DotProductAttention(
        num_attention_heads=8, kv_channels=16, num_gqa_groups=2, attention_dropout=0.0, qkv_format='bshd',
        attn_mask_type='no_mask', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    pairs = ((q, Q_DESCALE), (k, K_DESCALE), (v, V_DESCALE))
    encoded = [((x / d.to(x.device)).contiguous().to(torch.float8_e4m3fn), d.to(x.device))
               for x, d in pairs]  # the e4m3 encodings (exact)
    q, k, v = (te.Float8Tensor(shape=x.shape, dtype=torch.float16, data=x.view(torch.uint8), fp8_scale_inv=d,
                               fp8_dtype=te.DType.kFloat8E4M3, requires_grad=False, device=x.device)
               for x, d in encoded)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, fp8_dpa=True)
    with torch.no_grad(), te.autocast(enabled=True, recipe=recipe):
        dpa.init_fp8_metadata(num_gemms=3)  # the S and O scales exist from here
        dpa.fp8_meta['scaling_fwd'].scale[META_S] = P_SCALE
        dpa.fp8_meta['scaling_fwd'].scale[META_O] = O_SCALE
        out = dpa(q, k, v, fp8_output=False)
    out = out.reshape(*out.shape[:2], 8, 16)  # heads split out of h * d_v
    return out


def main():
    from attnfuzz.strategies import Case, materialize  # too large to inline: regenerated from the seed
    _t = materialize(Case.from_dict(CASE), DEVICE)
    q, k, v = _t.q, _t.k, _t.v
    from attnfuzz.oracles.reference import reference
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED = _ref.out

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
        EXPECTED_LSE = _ref.lse
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
