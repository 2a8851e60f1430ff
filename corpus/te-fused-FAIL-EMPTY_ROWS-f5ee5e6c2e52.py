"""attnfuzz repro: te-fused FAIL:EMPTY_ROWS
rows that see no key must be 0, got -3.15234 at [2, 13, 6, 49]; every other row passes

Run with: python3 te-fused-FAIL-EMPTY_ROWS-f5ee5e6c2e52.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 3, 'sq': 104, 'skv': 104, 'h': 8, 'hk': 4, 'd_qk': 80, 'd_v': 64, 'dtype': 'float16', 'seqlens_q': [104, 104, 104], 'seqlens_kv': [104, 104, 0], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625], 'softmax': 'learnable', 'layout': 'sbhd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 8683, 'grads': True, 'spelling': 'wide'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [104, 104, 104]  # graded query rows per sequence (rows past them are padding)
try:
    from attnfuzz.store.repro_bounds import graded_bounds  # too many bounds to write out: recomputed
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)
_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)
ROW_BOUNDS = _BOUNDS['out']  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.007683200183662119  # the largest, for the summary line
LSE_BOUNDS = _BOUNDS['lse']  # per LSE row (batch, head, query): the grader's bound (inf: not graded)
GRAD_ROW_BOUNDS = {'dq': _BOUNDS['dq'], 'dk': _BOUNDS['dk'], 'dv': _BOUNDS['dv']}  # per dQ row (batch, query, head) and dK / dV row (batch, key, KV head): the grader's bound


def cu_seqlens(lens: tuple[int, ...], device) -> torch.Tensor:
    """Cumulative sequence starts, int32, length b + 1 (the varlen convention of FA and TE)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible
ALIBI_SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625], dtype=torch.float64).reshape((8,)).to(torch.float32)  # ALiBi slopes, one per query head
SINK = torch.tensor([-0.5495441555976868, 1.1496003866195679, 0.2721655070781708, 0.34631726145744324, 0.412032812833786, 0.7988409996032715, 2.336061716079712, -0.5306764245033264], dtype=torch.float64).reshape((8,)).to(torch.float32)  # the learnable sink logits drawn from the seed


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*), as attnfuzz's te-fused
    adapter builds and calls it for spelling 'wide'."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=8, kv_channels=(80, 64), num_gqa_groups=4, attention_dropout=0.0,
        qkv_format='sbhd', attn_mask_type='padding', window_size=(104, 104), bottom_right_diagonal=False,
        softcap=0.0, attention_type='cross', softmax_scale=None, softmax_type='learnable')
    with torch.no_grad():
        dpa.softmax_offset.copy_(SINK.to(dpa.softmax_offset))
    dpa.train(True)
    lens_q, lens_kv = [104, 104, 104], [104, 104, 0]  # valid tokens per sequence
    q, k, v = (x.transpose(0, 1).contiguous() for x in (q, k, v))  # sbhd
    out = dpa(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=104, max_seqlen_kv=104, core_attention_bias_type='alibi',
        alibi_slopes=ALIBI_SLOPES.to(q.device))
    out = out.reshape(*out.shape[:2], 8, 64)  # heads split out of h * d_v
    return out.transpose(0, 1)


def main():
    from attnfuzz.strategies import Case, materialize  # too large to inline: regenerated from the seed
    _t = materialize(Case.from_dict(CASE), DEVICE)
    q, k, v = _t.q, _t.k, _t.v
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    from attnfuzz.oracles.reference import reference
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED = _ref.out
    DOUT = _t.dout
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED_GRADS = {'dq': _ref.dq, 'dk': _ref.dk, 'dv': _ref.dv}

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
