"""attnfuzz repro: te-fused FAIL:GRADIENT
dk: diff_max=8.464e+03 baseline_max=3.376e-04 k=4 floor=7.078e-04 (ratio 4112343.30) worst at [2, 1, 0, 4]:
got=8464 expected=0

Run with: python3 te-fused-FAIL-GRADIENT-73f70aafd6ca.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 3, 'sq': 2, 'skv': 2, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [2, 2, 0], 'seqlens_kv': [2, 2, 2], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}
VALID_ROWS = [2, 2, 0]  # graded query rows per sequence (rows past them are padding)
BOUND = 0.0068793492157805235  # k * naive same-dtype error + rounding floor, as the fuzzer graded it
VALID_KEYS = [2, 2, 2]  # graded keys per sequence (dK, dV)
GRAD_BOUNDS = {'dq': 0.003748553395685787, 'dk': 0.0024128435385356224, 'dv': 0.004844387703139094}


def cu_seqlens(lens: tuple[int, ...], device) -> torch.Tensor:
    """Cumulative sequence starts, int32, length b + 1 (the varlen convention of FA and TE)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*), as attnfuzz's te-fused
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=8, num_gqa_groups=1, attention_dropout=0.0, qkv_format='bshd',
        attn_mask_type='padding', window_size=None, bottom_right_diagonal=False, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='vanilla')
    dpa.train(True)
    lens_q, lens_kv = [2, 2, 0], [2, 2, 2]  # valid tokens per sequence
    out = dpa(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=2, max_seqlen_kv=2)
    out = out.reshape(*out.shape[:2], 1, 8)  # heads split out of h * d_v
    return out


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375, -0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([1.3209096768234583, -1.0267722267702626, 0.3429525013612064, 0.5047769898347971, -1.9006782729085818, -1.5034057503165403, 0.006033009126352906, -5.948459469465317e-05, 0.7466839664752654, -0.436658452340689, 0.34024601725901543, 0.47781238896482003, -0.6400581221991684, -1.162188273136607, 0.4205260373693098, -0.49554655559951594, -0.5612428084132094, -0.7631377721034591, 1.6188837976773016, -0.3466027034993758, 0.2512609467092461, 1.0411096070445696, 0.6431450605599246, 1.1683852314870293, -0.35859832042031226, -1.7530135081292415, 0.6175185419966457, -0.16157547897728539, 0.6721756694256692, 0.6315312103876223, -0.28287958490383786, 0.44358037357896, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float64)
    DOUT = torch.tensor([-0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.02286589906091844, -0.013009908086384622, 0.04691451703878094, 0.326220981268351, -0.13129411976950853, -0.08503256213279045, 0.12876852208228423, -0.01579422553669043, -0.06586553849373547, 0.03747522017747021, -0.13513791518542279, -0.939684048370486, 0.3781945278705491, 0.24493747127357884, -0.3709195088020061, 0.045495485101815156, 0.03143880622828218, 0.04360866670374637, 0.0471799412361296, 0.05310550425334963, -0.01219883633373911, 0.04305812539652312, -0.00986627974260842, -0.013951875759371301, 0.19225128592413177, 0.26667113853992486, 0.2885098214801546, 0.32474520209903474, -0.07459704274106874, 0.2633045261596867, -0.060333237656375036, -0.08531704532024834, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float64), 'dk': torch.tensor([0.2073276263800503, -0.25107002551297397, 0.12705990801349032, 0.13335669419218346, -0.050817189784430825, 0.28987563701250924, 0.35666937234069185, 0.14158228337246048, -0.2073276263800503, 0.25107002551297397, -0.12705990801349032, -0.13335669419218346, 0.050817189784430825, -0.28987563701250924, -0.35666937234069185, -0.14158228337246048, 0.09595045250097907, -0.1565565459263073, -0.014630761507848422, 0.05683247963453976, 0.2699037493898403, 0.24162719707406888, 0.1615701689250683, -0.09812506509068979, -0.09595045250097914, 0.15655654592630713, 0.01463076150784845, -0.0568324796345397, -0.2699037493898402, -0.2416271970740689, -0.16157016892506829, 0.09812506509068988, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float64), 'dv': torch.tensor([-0.13063262459693675, -0.1849631761819208, -0.4916677007833332, 0.94135505742147, -0.029993089483496965, 0.409411584371177, -0.09816314342659455, 0.04710824823198495, 0.06324981209693681, -0.4686623120993294, -1.164704369529167, 0.3544213097660299, -0.3855342542665031, 0.2920044312538231, 0.05446197155159459, 0.2202257361430151, 0.35221412337849567, -0.011031635668111578, -0.03270485002657251, 0.21932692820024174, -0.05362645870850022, -0.7813562489024996, 0.2731051879769277, -0.8192326549580045, 0.9290358766215042, -0.7668003955818883, 0.21416236955782245, 0.033724829612258284, 0.7381967712085001, -0.7965246104725003, 0.7289700073355722, 0.0409123424580044, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float64)}

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
