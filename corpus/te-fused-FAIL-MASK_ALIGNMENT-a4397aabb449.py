"""attnfuzz repro: te-fused FAIL:MASK_ALIGNMENT
matches alignment='top_left'; out: worst of 5 rows at [2, 0, 0, 6]: diff_max=4.570e-03 baseline_max=3.496e-04
k=3 floor=1.846e-03 (ratio 1.58): got=0.967285 expected=0.962715

Run with: python3 te-fused-FAIL-MASK_ALIGNMENT-a4397aabb449.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'te-fused'
DEVICE = 'cuda'
CASE = {'b': 3, 'sq': 2, 'skv': 2, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [2, 2, 1], 'seqlens_kv': [2, 2, 2], 'causal': False, 'window': [None, None], 'alignment': 'bottom_right', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.00390625], 'softmax': 'vanilla', 'layout': 'sbhd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}

try:
    import torch  # exits 2 without it: 1 says the bug is there
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)

VALID_ROWS = [2, 2, 1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.004818517850595264, 0.002964289659587813, 0.003734750482400654, 0.00403216173405062, 0.0028947769986402585, float('inf')], dtype=torch.float64).reshape((3, 2, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.004818517850595264  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.00012324729930111852, 0.0001231831809027816, 0.00012349970771495094, 0.00012343250119359987, 0.00012281909364139735, float('inf')], dtype=torch.float64).reshape((3, 1, 2)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


def cu_seqlens(lens: tuple[int, ...], device) -> torch.Tensor:
    """Cumulative sequence starts, int32, length b + 1 (the varlen convention of FA and TE)."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


NVTE = {'NVTE_FLASH_ATTN': '0', 'NVTE_FUSED_ATTN': '1', 'NVTE_UNFUSED_ATTN': '0'}  # only FusedAttention eligible
ALIBI_SLOPES = torch.tensor([0.00390625], dtype=torch.float64).reshape((1,)).to(torch.float32)  # ALiBi slopes, one per query head


def attention(q, k, v):
    """TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*), as attnfuzz's te-fused
    adapter builds and calls it for spelling ''."""
    import os

    os.environ.update(NVTE)  # before TE is imported: only one backend eligible
    import transformer_engine.pytorch as te

    dpa = te.DotProductAttention(
        num_attention_heads=1, kv_channels=8, num_gqa_groups=1, attention_dropout=0.0, qkv_format='sbhd',
        attn_mask_type='padding', window_size=None, bottom_right_diagonal=True, softcap=0.0,
        attention_type='cross', softmax_scale=None, softmax_type='vanilla')
    dpa.train(False)
    lens_q, lens_kv = [2, 2, 1], [2, 2, 2]  # valid tokens per sequence
    q, k, v = (x.transpose(0, 1).contiguous() for x in (q, k, v))  # sbhd
    out = dpa(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_kv=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=2, max_seqlen_kv=2, core_attention_bias_type='alibi',
        alibi_slopes=ALIBI_SLOPES.to(q.device))
    out = out.reshape(*out.shape[:2], 1, 8)  # heads split out of h * d_v
    return out.transpose(0, 1)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125, -1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375, -0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([1.3218823321449136, -1.02777179417489, 0.34295708575392336, 0.5048226639696441, -1.9028135811607636, -1.5039837233835274, 0.00533091787136139, 0.0007797988571609515, 0.745430099352976, -0.43536989237753676, 0.3402401074375435, 0.47775350963237767, -0.6373054586869207, -1.1614431978665933, 0.42143111558361823, -0.49662849069342807, -0.5610393970909687, -0.7641313936636278, 1.6178786431195764, -0.3464169761067221, 0.25168345423040483, 1.040698478747667, 0.6422155317115116, 1.1676576838691604, -0.358955422948384, -1.7512691373283726, 0.6192831597657674, -0.16190153615403555, 0.671433928492701, 0.6322529743119139, -0.2812477332545419, 0.4448576333242473, -0.5315995943129704, -0.18533901862459776, -0.7126406009424935, -0.22421338635907262, 0.29945357271461975, -0.1877588516311579, 0.9627153271249671, -0.4921785344955104, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64).reshape((3, 2, 1, 8)).to(torch.float64)

    raw = attention(q, k, v)
    lse = raw[1] if isinstance(raw, tuple) and len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
    if out.shape != want.shape:  # before the checks below, which index it by the contract's axes
        print(f"{BACKEND}: wrong shape: got {tuple(out.shape)}, expected {tuple(want.shape)} (b, sq, h, d_v)")
        return 1
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
    if lse is not None:
        EXPECTED_LSE = torch.tensor([0.12450727292127806, 0.7790950806709324, 0.7394928979884506, 0.5507774150387685, 1.1496510345476734, -float('inf')], dtype=torch.float64).reshape((3, 1, 2)).to(torch.float64)
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
        return [f"wrong shape: lse got {tuple(lse.shape)}, expected {tuple(want.shape)} (b, h, sq)"]
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
    try:
        code = main()
    except ImportError as e:  # the backend's library (imported by the call), or attnfuzz where the script needs it
        print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is",
              file=sys.stderr)
        sys.exit(2)  # not 1: 1 says the bug is there
    sys.exit(code)
