"""attnfuzz repro: te-flash FAIL:GRADIENT
dv: diff_max=1.617e+01 baseline_max=1.173e+00 k=4 floor=2.559e-01 (ratio 3.27) worst at [1, 13, 0, 0]:
got=0.000602722 expected=16.1707

Run with: python3 te-flash-FAIL-GRADIENT-90f1fcbea1de.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-flash'
DEVICE = 'cuda'
CASE = {'b': 3, 'sq': 150, 'skv': 150, 'h': 8, 'hk': 4, 'd_qk': 16, 'd_v': 16, 'dtype': 'bfloat16', 'seqlens_q': [19, 149, 94], 'seqlens_kv': [150, 30, 150], 'causal': False, 'window': [None, None], 'alignment': 'bottom_right', 'mask_density': None, 'scale': 0.125, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'thd', 'memory': 'expanded_kv', 'mean': [0.0, 3.0, 0.0], 'std': [10.0, 10.0, 100.0], 'seed': 20426, 'grads': True, 'spelling': 'wide'}
VALID_ROWS = [19, 149, 94]  # graded query rows per sequence (rows past them are padding)
BOUND = 414.0894071089221  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [150, 30, 150]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 3249.7227127537576, 'dk': 3146.802264394754, 'dv': 4.94921400616001}


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


NVTE = {'NVTE_FLASH_ATTN': '1', 'NVTE_FUSED_ATTN': '0', 'NVTE_UNFUSED_ATTN': '0'}  # only FlashAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FlashAttention enabled (NVTE_*), as attnfuzz's te-flash
    adapter builds and calls it for spelling 'wide'."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=8, kv_channels=16, num_gqa_groups=4, attention_dropout=0.0, qkv_format='thd',
        attn_mask_type='padding', window_size=(150, 150), bottom_right_diagonal=True, softcap=0.0,
        attention_type='cross', softmax_scale=0.125, softmax_type='vanilla')
    dpa.train(True)
    lens_q, lens_kv = [19, 149, 94], [150, 30, 150]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # thd: [total, heads, d]
    out = dpa(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=150, max_seqlen_kv=150)
    return unpack(out.reshape(out.shape[0], 8, 16), lens_q, 150)


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
