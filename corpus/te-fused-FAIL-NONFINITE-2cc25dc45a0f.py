"""attnfuzz repro: te-fused FAIL:NONFINITE
non-finite output (NaN) with stride-0 K/V; comes and goes between identical runs

Run with: python3 te-fused-FAIL-NONFINITE-2cc25dc45a0f.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 2, 'hk': 2, 'd_qk': 32, 'd_v': 32, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'expanded_kv', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 3, 'grads': False, 'spelling': ''}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.005131884827097031  # k * naive same-dtype error + rounding floor, as the fuzzer graded it


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*), as attnfuzz's te-fused
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=2, kv_channels=32, num_gqa_groups=2, attention_dropout=0.0, qkv_format='bshd',
        attn_mask_type='no_mask', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='self', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    out = dpa(q, k, v)
    out = out.reshape(*out.shape[:2], 2, 32)  # heads split out of h * d_v
    return out


def main():
    q = torch.tensor([-0.07666015625, 0.35986328125, -0.7822265625, 0.071533203125, 0.6650390625, -0.286865234375, 1.6201171875, -1.5966796875, -0.051666259765625, -0.305908203125, 0.24853515625, -0.2225341796875, 0.9130859375, 0.204345703125, 0.57421875, 0.416259765625, 0.261474609375, 0.93115234375, -0.5146484375, -1.6513671875, 1.0458984375, 0.52197265625, -0.1668701171875, 0.05303955078125, 0.56396484375, 2.255859375, 1.869140625, -1.1953125, 0.998046875, 0.459228515625, 2.435546875, -0.1468505859375, -0.47607421875, -0.29296875, -0.34814453125, 0.3486328125, 0.037078857421875, -0.06768798828125, 0.428955078125, -0.8681640625, -0.271240234375, 0.1416015625, 0.1295166015625, 0.681640625, -0.95849609375, 0.06390380859375, 0.65869140625, 0.8193359375, -0.455322265625, 2.212890625, -0.376953125, -0.1436767578125, 0.64794921875, -2.326171875, 1.2685546875, -0.248291015625, 0.9580078125, -1.2890625, -1.6484375, 0.8291015625, -0.83740234375, -0.52978515625, 1.3544921875, 1.3779296875], dtype=torch.float64).reshape((1, 1, 2, 32)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.0751953125, -0.42333984375, 0.421630859375, -0.257568359375, -1.5830078125, 1.396484375, -1.0322265625, 1.138671875, 0.5126953125, -0.0198516845703125, -1.1220703125, -0.489013671875, -0.6337890625, -0.78955078125, -0.89794921875, -1.8876953125, 0.18701171875, -0.1812744140625, -0.09136962890625, -0.73486328125, 1.986328125, 0.362548828125, -1.3896484375, -0.1593017578125, 0.328857421875, 0.332275390625, 0.302490234375, -0.98095703125, 1.103515625, -0.01265716552734375, -0.68505859375, -0.309326171875, -0.0751953125, -0.42333984375, 0.421630859375, -0.257568359375, -1.5830078125, 1.396484375, -1.0322265625, 1.138671875, 0.5126953125, -0.0198516845703125, -1.1220703125, -0.489013671875, -0.6337890625, -0.78955078125, -0.89794921875, -1.8876953125, 0.18701171875, -0.1812744140625, -0.09136962890625, -0.73486328125, 1.986328125, 0.362548828125, -1.3896484375, -0.1593017578125, 0.328857421875, 0.332275390625, 0.302490234375, -0.98095703125, 1.103515625, -0.01265716552734375, -0.68505859375, -0.309326171875], dtype=torch.float64).reshape((1, 1, 2, 32)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.496337890625, -0.6015625, -0.4775390625, -0.298828125, 0.39306640625, 0.91845703125, -0.26025390625, 0.050994873046875, -0.328125, 1.6220703125, 0.859375, 0.69970703125, -1.2666015625, 1.2724609375, -1.2421875, -0.88525390625, -0.381591796875, 0.50537109375, 0.5830078125, -0.0215301513671875, 2.24609375, -0.30712890625, -0.7001953125, -2.626953125, -0.470947265625, 0.030181884765625, 0.1595458984375, 0.39990234375, 0.01776123046875, 2.357421875, -0.79638671875, 0.1854248046875, -0.496337890625, -0.6015625, -0.4775390625, -0.298828125, 0.39306640625, 0.91845703125, -0.26025390625, 0.050994873046875, -0.328125, 1.6220703125, 0.859375, 0.69970703125, -1.2666015625, 1.2724609375, -1.2421875, -0.88525390625, -0.381591796875, 0.50537109375, 0.5830078125, -0.0215301513671875, 2.24609375, -0.30712890625, -0.7001953125, -2.626953125, -0.470947265625, 0.030181884765625, 0.1595458984375, 0.39990234375, 0.01776123046875, 2.357421875, -0.79638671875, 0.1854248046875], dtype=torch.float64).reshape((1, 1, 2, 32)).to(torch.float16).to(DEVICE)
    k, v = (x[:, :, :1].expand(x.shape) for x in (k, v))  # one KV head seen hk times, stride 0
    EXPECTED = torch.tensor([-0.496337890625, -0.6015625, -0.4775390625, -0.298828125, 0.39306640625, 0.91845703125, -0.26025390625, 0.050994873046875, -0.328125, 1.6220703125, 0.859375, 0.69970703125, -1.2666015625, 1.2724609375, -1.2421875, -0.88525390625, -0.381591796875, 0.50537109375, 0.5830078125, -0.0215301513671875, 2.24609375, -0.30712890625, -0.7001953125, -2.626953125, -0.470947265625, 0.030181884765625, 0.1595458984375, 0.39990234375, 0.01776123046875, 2.357421875, -0.79638671875, 0.1854248046875, -0.496337890625, -0.6015625, -0.4775390625, -0.298828125, 0.39306640625, 0.91845703125, -0.26025390625, 0.050994873046875, -0.328125, 1.6220703125, 0.859375, 0.69970703125, -1.2666015625, 1.2724609375, -1.2421875, -0.88525390625, -0.381591796875, 0.50537109375, 0.5830078125, -0.0215301513671875, 2.24609375, -0.30712890625, -0.7001953125, -2.626953125, -0.470947265625, 0.030181884765625, 0.1595458984375, 0.39990234375, 0.01776123046875, 2.357421875, -0.79638671875, 0.1854248046875], dtype=torch.float64).reshape((1, 1, 2, 32)).to(torch.float64)

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
