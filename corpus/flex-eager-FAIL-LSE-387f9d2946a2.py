"""attnfuzz repro: flex-eager FAIL:LSE
lse: worst of 1 rows at [0, 0, 0]: diff_max=8.219e-02 baseline_max=6.618e-09 k=2 floor=1.229e-04 (ratio
668.81): got=-0.267863 expected=-0.185669

Run with: python3 flex-eager-FAIL-LSE-387f9d2946a2.py   (exits 1 while the bug is there)
"""
import os

RECORDED_ISA = 'AVX512'  # the CPU vector ISA this entry was found under
os.environ.setdefault("ATEN_CPU_CAPABILITY", RECORDED_ISA.lower())  # read once, when torch loads
import sys

import torch

BACKEND = 'flex-eager'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': 'flash'}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.002579853046751071], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.002579853046751071  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.0001228968695450602], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


# mask_mods and score_mods, verbatim from attnfuzz's flex adapter (fuzz/backends/flex/mods.py)

def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


RETURNS_LSE = True  # attention returns (out, lse): the script checks both


def attention(q, k, v):
    """torch flex_attention, eager, as attnfuzz's flex adapter ran it: spelling 'flash' (no mask,
    kernel_options {'BACKEND': 'FLASH'}), layout bshd."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    device = q.device
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views
    out, aux = flex_attention(
        q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
        kernel_options={'BACKEND': 'FLASH'}, return_aux=AuxRequest(lse=True))
    return out.transpose(1, 2), aux.lse


def main():
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875, 0.568359375, -1.0849609375, -1.3984375, 0.4033203125, 0.837890625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.71923828125, -0.4033203125, -0.5966796875, 0.1820068359375, -0.8564453125, 1.1005859375, -1.0712890625, 0.1226806640625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.56640625, 0.373046875, -0.89208984375, -1.5087890625, 0.370361328125, 1.4560546875, 0.93994140625, 0.77490234375], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)

    raw = attention(q, k, v)
    lse = raw[1] if isinstance(raw, tuple) and len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
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
    isa = torch.backends.cpu.get_cpu_capability()
    print(f"CPU ISA {isa}" + ("" if isa == RECORDED_ISA else f"; recorded on {RECORDED_ISA}, which this run is not "
                                                             f"(ATEN_CPU_CAPABILITY, or a CPU without it)"))
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
        return [f"lse has shape {tuple(lse.shape)}, expected {tuple(want.shape)} (b, h, sq)"]
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
    sys.exit(main())
