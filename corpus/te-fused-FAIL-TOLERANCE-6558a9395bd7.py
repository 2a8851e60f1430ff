"""attnfuzz repro: te-fused FAIL:TOLERANCE
out: diff_max=1.878e+00 baseline_max=1.848e-02 k=3 floor=2.935e-02 (ratio 22.15) worst at [0, 30, 0, 46]:
got=9.08971e-07 expected=-1.87768

Run with: python3 te-fused-FAIL-TOLERANCE-6558a9395bd7.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 41, 'skv': 117, 'h': 3, 'hk': 3, 'd_qk': 72, 'd_v': 72, 'dtype': 'bfloat16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'bottom_right', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.15749013123685915, 0.024803141437003122, 0.00390625], 'softmax': 'off_by_one', 'layout': 'sbhd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}
VALID_ROWS = [41]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.08478224731257857  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [117]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 0.07572411832646307, 'dk': 0.06470408248696277, 'dv': 0.10398056858330382}


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible
ALIBI_SLOPES = torch.tensor([0.15749013423919678, 0.02480314113199711, 0.00390625], dtype=torch.float64).reshape((3,)).to(torch.float32)  # ALiBi slopes, one per query head


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*), as attnfuzz's te-fused
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=3, kv_channels=72, num_gqa_groups=3, attention_dropout=0.0, qkv_format='sbhd',
        attn_mask_type='no_mask', window_size=None, bottom_right_diagonal=True, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='off-by-one')
    dpa.train(True)
    q, k, v = (x.transpose(0, 1).contiguous() for x in (q, k, v))  # sbhd
    out = dpa(q, k, v, core_attention_bias_type='alibi', alibi_slopes=ALIBI_SLOPES.to(q.device))
    out = out.reshape(*out.shape[:2], 3, 72)  # heads split out of h * d_v
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
