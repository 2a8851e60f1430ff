"""attnfuzz repro: te-fused FAIL:EMPTY_ROWS
rows that see no key must be 0, got -3.15234 at [2, 13, 6, 49]; every other row passes

Run with: python3 te-fused-FAIL-EMPTY_ROWS-f5ee5e6c2e52.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 3, 'sq': 104, 'skv': 104, 'h': 8, 'hk': 4, 'd_qk': 80, 'd_v': 64, 'dtype': 'float16', 'seqlens_q': [104, 104, 104], 'seqlens_kv': [104, 104, 0], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625], 'softmax': 'learnable', 'layout': 'sbhd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 8683, 'grads': True, 'spelling': 'wide'}
VALID_ROWS = [104, 104, 104]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.01434307601570788  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [104, 104, 0]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 0.018205009068247922, 'dk': 0.017400083476173802, 'dv': 0.01828158811061997}


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
    EXPECTED = reference(Case.from_dict(CASE), _t).out
    DOUT = _t.dout
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED_GRADS = {'dq': _ref.dq, 'dk': _ref.dk, 'dv': _ref.dv}

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
