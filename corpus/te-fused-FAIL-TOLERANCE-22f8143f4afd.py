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


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*), as attnfuzz's te-fused
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=2, kv_channels=8, num_gqa_groups=1, attention_dropout=0.0, qkv_format='bshd',
        attn_mask_type='no_mask', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='self', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    out = dpa(q, k, v)
    out = out.reshape(*out.shape[:2], 2, 8)  # heads split out of h * d_v
    return out


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125], dtype=torch.float64).reshape((1, 2, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # head-major buffers
    EXPECTED = torch.tensor([-0.4781108853134428, 0.762246144876614, 1.455218210520695, 2.9561637681696378, -1.3485316995027694, -1.1160375964125095, 1.6401324396303318, -0.5297774370437318, -0.6618506043672436, 0.8667877091658456, 1.078234993841345, 0.3348038431558494, -0.2935132803452505, -0.4327555161811878, 0.6054085476312338, -0.40286239403350954, -0.5579858977941944, 0.8076922726673865, 1.2913367193963943, 1.8166107210371916, -0.8898959193263851, -0.8190023937497146, 1.1903190611557546, -0.4746051493280403, -0.5019718585885385, 0.7758222158779616, 1.406262075697654, 2.6157463590364176, -1.2115239450886024, -1.027304602045748, 1.5057601914238128, -0.5132958811500505], dtype=torch.float64).reshape((1, 2, 2, 8)).to(torch.float64)

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
