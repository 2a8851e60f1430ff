"""attnfuzz repro: fa4 FAIL:LSE
lse: diff_max=1.798e+308 baseline_max=1.110e-14 k=2 floor=5.114e-04 (ratio inf) worst at [0, 0, 0]: got=inf
expected=-0.47657

Run with: python3 fa4-FAIL-LSE-0e47f2949758.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 2, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'learnable', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [10.0, 10.0, 1.0], 'seed': 2, 'grads': False, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 1.000000519530868e-07  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


LEARNABLE_SINK = torch.tensor([-0.4765695631504059, 0.24804358184337616], dtype=torch.float64).reshape((2,)).to(torch.float32)  # learnable_sink, as the adapter passes it


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_func) as attnfuzz's fa4 adapter calls it for spelling ''."""
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(
        q, k, v, softmax_scale=None, causal=False, window_size=(None, None),
        learnable_sink=LEARNABLE_SINK.to(q.device), softcap=0.0, return_lse=True)[0]
    return out


def main():
    q = torch.tensor([-10.40625, 9.1640625, -13.0390625, -11.09375, -12.1875, 11.6796875, -10.5703125, -1.1884765625, -9.078125, 3.453125, -5.71484375, -2.3515625, 10.078125, -7.52734375, -2.25, -4.328125], dtype=torch.float64).reshape((1, 1, 2, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-3.919921875, -10.4296875, 13.1875, 7.4765625, -13.265625, -12.4140625, -1.0283203125, -9.5], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([0.6181640625, -0.238525390625, 0.024505615234375, -0.4912109375, -0.05914306640625, -1.5654296875, 0.42578125, -1.4814453125], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([2.580110135131889e-42, -9.95563823864082e-43, 1.0228220964212613e-43, -2.0502296966371882e-42, -2.468529542795024e-43, -6.533833406976964e-42, 1.7771374706437657e-42, -6.183297116895854e-42, 6.833989932657748e-15, -2.636970049054747e-15, 2.709169587245345e-16, -5.430484891195651e-15, -6.53844415950371e-16, -1.7306296780490314e-14, 4.707139985211339e-15, -1.6377824214600003e-14], dtype=torch.float64).reshape((1, 1, 2, 8)).to(torch.float64)

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
