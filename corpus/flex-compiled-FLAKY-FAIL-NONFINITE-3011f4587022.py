"""attnfuzz repro: flex-compiled FLAKY:FAIL:NONFINITE
FAIL:NONFINITE in 1 of 4 identical runs (FAIL:NONFINITE x1, PASS x2, FAIL:TOLERANCE x1): non-finite output,
first at [0, 0, 0, 0]: nan

Run with: python3 flex-compiled-FLAKY-FAIL-NONFINITE-3011f4587022.py   (exits 1 while the bug is there)
"""
import os

RECORDED_ISA = 'AVX2'  # the CPU vector ISA this entry was found under
os.environ.setdefault("ATEN_CPU_CAPABILITY", RECORDED_ISA.lower())  # read once, when torch loads
if os.environ["ATEN_CPU_CAPABILITY"] == RECORDED_ISA.lower():  # oneDNN picks its own ISA: hold it there too
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", 'AVX2')
import sys

import torch

BACKEND = 'flex-compiled'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 1, 'skv': 24, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.0020545101397548195], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.0020545101397548195  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.00012461402004180564], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


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
    q = torch.tensor([1.541015625, -0.29345703125, -2.1796875, 0.568359375, -1.0849609375, -1.3984375, 0.4033203125, 0.837890625], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375, -0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375, 1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625, -0.5595703125, 0.53369140625, 0.406982421875, 0.39453125, 0.1715087890625, 0.8759765625, -0.287109375, 1.021484375, -0.07440185546875, -1.091796875, 0.39208984375, 0.5947265625, 0.662109375, -1.2060546875, 0.607421875, -0.54736328125], dtype=torch.float64).reshape((1, 24, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([1.1708984375, 0.09747314453125, 0.96337890625, 0.84033203125, -1.25390625, 0.98681640625, -0.49462890625, -1.283203125, 0.955078125, 1.283203125, -0.666015625, 0.56494140625, 0.28759765625, -0.03338623046875, -1.0615234375, -0.11444091796875, -0.34326171875, 1.5712890625, 0.191650390625, 0.3798828125, -0.144775390625, 0.6376953125, -0.28125, -1.330078125, -0.1419677734375, -0.5341796875, -0.5234375, 0.861328125, -0.88720703125, 0.8388671875, 1.1533203125, -1.7607421875, -1.4775390625, -1.755859375, 0.076171875, -1.078125, 1.4404296875, -0.110595703125, 0.57666015625, -0.169189453125, -0.06402587890625, 1.0380859375, 0.90673828125, -0.4755859375, -0.87060546875, 0.144775390625, 1.9033203125, 0.390380859375, -0.03936767578125, -0.80126953125, -0.49560546875, -0.361572265625, 0.5849609375, -1.15625, -0.143310546875, -0.1947021484375, -0.0855712890625, 1.39453125, 0.5966796875, -0.48291015625, -0.3662109375, -1.3271484375, 1.6953125, 2.06640625, -0.2340087890625, 0.70751953125, 0.580078125, 0.268310546875, -2.05859375, 0.5341796875, -0.53515625, -0.86376953125, -0.02349853515625, 1.171875, 0.398681640625, -0.19873046875, -1.15625, -0.316650390625, 0.9404296875, -1.146484375, 0.55859375, 0.7919921875, -0.1846923828125, -0.73193359375, -0.08062744140625, -0.97998046875, 0.06048583984375, -0.489013671875, -0.81396484375, 0.81982421875, -0.63330078125, 1.294921875, 1.462890625, -0.62060546875, 0.98828125, -0.43212890625, -0.623046875, -0.2161865234375, -0.48876953125, 0.787109375, 0.10760498046875, -1.0712890625, -0.11663818359375, -1.0166015625, -1.1982421875, 0.478515625, -1.2294921875, -1.3701171875, 1.5439453125, -0.033203125, -0.418701171875, -0.255615234375, -0.1292724609375, -0.054595947265625, 0.408447265625, 1.1259765625, 1.9345703125, 1.0078125, 1.0048828125, -0.43359375, -1.2421875, 1.2841796875, 0.2437744140625, 0.5302734375, -0.01453399658203125, -2.236328125, 1.4658203125, -1.21875, 0.64404296875, 3.9296875, -0.12445068359375, 0.29541015625, 0.382568359375, -0.5498046875, -0.994140625, 1.345703125, 1.9453125, -1.2900390625, -2.349609375, -2.068359375, 0.9091796875, -0.69482421875, 1.958984375, -1.103515625, 0.541015625, 1.5390625, 1.0859375, 1.24609375, 0.11505126953125, 1.619140625, 0.463623046875, 1.30078125, 0.873046875, 0.06512451171875, 0.7734375, -0.97021484375, -0.8876953125, -0.318359375, -0.33447265625, 0.454345703125, 0.4990234375, 0.8779296875, 0.389404296875, 1.462890625, 0.4794921875, -0.533203125, -0.034637451171875, 0.6572265625, -0.311279296875, -0.56201171875, -0.4833984375, -1.2724609375, -0.174072265625, 0.55419921875, -0.181640625, -0.2344970703125, 0.294189453125, 0.79736328125, 1.2646484375, 0.935546875, 0.54541015625, -1.537109375, 0.3125, 0.740234375, 1.4501953125, 4.1015625, 1.1181640625, -1.56640625, -0.69921875, 0.57421875, 1.23828125, -0.640625], dtype=torch.float64).reshape((1, 24, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([0.4642433102410484, 0.6769081613849661, -0.11196563911524993, -0.3749984482322383, -0.16378527144963254, -0.48862962728438947, 0.5771313692071018, -0.5133895055327786], dtype=torch.float64).reshape((1, 1, 1, 8)).to(torch.float64)

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
        EXPECTED_LSE = torch.tensor([3.9641469106167957], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)
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
