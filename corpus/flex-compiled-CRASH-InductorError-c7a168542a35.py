"""attnfuzz repro: flex-compiled CRASH:InductorError
InductorError: CppCompileError: C++ compile error  Command: g++
/tmp/torchinductor_root/57/c57saxpx46hqicx3mocxv2yt5hutxmfxbiuyu6hgc4rwmg6ebldo.main.cpp -D
TORCH_INDUCTOR_CPP_WRAPPER -D STANDALONE_TORCH_HEADER -D TORCH_INDUCTOR_PRECOMPILE_HEADERS -D
C10_USING_CUSTOM_GENERATED_MACROS -D CPU_CAPABILITY_AVX512 -O3 -DNDEBUG -fno-omit-frame-pointer -g1 -fno-
trapping-math -funsafe-math-optimizations -ffinite-math-only -fno-signed-zeros -fno-finite-math-only -fno-
unsafe-math-optimizations -fmath-errno -ffp-contract=o (at cpp_builder.py:713)

Run with: python3 flex-compiled-CRASH-InductorError-c7a168542a35.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'flex-compiled'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 3, 'hk': 3, 'd_qk': 1, 'd_v': 1, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.0016372140532385198  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


# mask_mods and score_mods, verbatim from attnfuzz's flex adapter (fuzz/backends/flex/mods.py)

def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


def attention(q, k, v):
    """torch flex_attention, compiled (a fresh graph of this one call), as attnfuzz's flex adapter ran it:
    spelling '' (no mask), layout bshd."""
    from torch.nn.attention.flex_attention import flex_attention

    device = q.device
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    out = compiled(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False)
    return out.transpose(1, 2)


def main():
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875], dtype=torch.float64).reshape((1, 1, 3, 1)).to(torch.float16).to(DEVICE)
    k = torch.tensor([0.568359375, -1.0849609375, -1.3984375], dtype=torch.float64).reshape((1, 1, 3, 1)).to(torch.float16).to(DEVICE)
    v = torch.tensor([0.4033203125, 0.837890625, -0.71923828125], dtype=torch.float64).reshape((1, 1, 3, 1)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([0.4033203125, 0.837890625, -0.71923828125], dtype=torch.float64).reshape((1, 1, 3, 1)).to(torch.float64)

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
    if False:
        problems += check_grads(raw, q, k, v, DOUT, EXPECTED_GRADS)
    if problems:
        print("  " + "\n  ".join(problems))
    return 1 if problems else 0



if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    sys.exit(main())
