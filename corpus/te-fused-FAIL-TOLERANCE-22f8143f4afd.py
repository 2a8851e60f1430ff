"""attnfuzz repro: te-fused FAIL:TOLERANCE
out: diff_max=1.482e+00 baseline_max=1.086e-03 k=3 floor=5.776e-03 (ratio 164.06) worst at [0, 1, 0, 3]:
got=0.334717 expected=1.81661

Run with: python3 te-fused-FAIL-TOLERANCE-22f8143f4afd.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 2, 'skv': 2, 'h': 2, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'transposed', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [2]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.009032539615579569  # k * naive same-dtype error + rounding floor, as the fuzzer graded it

def attention(q, k, v):
    """No standalone spelling for this backend yet: call it through attnfuzz's adapter."""
    from fuzz.backends import get
    from strategies import Case, materialize
    case = Case.from_dict(CASE)
    t = materialize(case, DEVICE)
    t = type(t)(q=q, k=k, v=v, mask=t.mask, sink=t.sink, alibi=t.alibi, dout=t.dout)
    return get(BACKEND, DEVICE).run(case, t).out

q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float16).to(DEVICE)
k = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
v = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
EXPECTED = torch.tensor([-0.4781108853134428, 0.762246144876614, 1.455218210520695, 2.9561637681696378, -1.3485316995027694, -1.1160375964125095, 1.6401324396303318, -0.5297774370437318, -0.6618506043672436, 0.8667877091658456, 1.078234993841345, 0.3348038431558494, -0.2935132803452505, -0.4327555161811878, 0.6054085476312338, -0.40286239403350954, -0.5579858977941944, 0.8076922726673865, 1.2913367193963943, 1.8166107210371916, -0.8898959193263851, -0.8190023937497146, 1.1903190611557546, -0.4746051493280403, -0.5019718585885384, 0.7758222158779615, 1.4062620756976538, 2.615746359036417, -1.2115239450886024, -1.0273046020457477, 1.5057601914238123, -0.5132958811500505], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float64)

out = attention(q, k, v)
out = (out[0] if isinstance(out, tuple) else out).detach().to("cpu", torch.float64)
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
print(f"{BACKEND}: max |out - float64| = {err:.4g}, bound {BOUND:.4g}", *problems, sep="\n  ")
sys.exit(1 if problems else 0)
