"""attnfuzz repro: fa4 FAIL:GRADIENT
dq: worst of 2 rows at [1, 0, 0, 5]: diff_max=2.441e-01 baseline_max=5.809e-05 k=4 floor=8.686e-04 (ratio
221.70): got=0 expected=0.244077

Run with: python3 fa4-FAIL-GRADIENT-b8ce46c52d0f.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 2, 'sq': 1, 'skv': 2, 'h': 1, 'hk': 1, 'd_qk': 8, 'd_v': 8, 'dtype': 'float16', 'seqlens_q': [1, 1], 'seqlens_kv': [2, 2], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [1, 1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.008049710378760405, 0.004911589980447616], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.008049710378760405  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.00012333339324509363, 0.000123006405800495], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)
GRAD_ROW_BOUNDS = {'dq': torch.tensor([0.0008209282601813791, 0.001719913877539922], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64), 'dk': torch.tensor([0.0003689897600734492, 0.0003984646145455909, 0.0009968380455120827, 0.000997424184625494], dtype=torch.float64).reshape((2, 2, 1)).to(torch.float64), 'dv': torch.tensor([0.0007111347043360452, 0.0030433375431331102, 0.005023980563279873, 0.005033000051822485], dtype=torch.float64).reshape((2, 2, 1)).to(torch.float64)}  # per dQ row (batch, query, head) and dK / dV row (batch, key, KV head): the grader's bound


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


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_varlen_func) as attnfuzz's fa4 adapter calls it for spelling
    ''."""
    from flash_attn.cute import flash_attn_varlen_func

    lens_q, lens_kv = [1, 1], [2, 2]  # valid tokens per sequence
    q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # varlen: [total, heads, d]
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens(lens_q, q.device), cu_seqlens_k=cu_seqlens(lens_kv, q.device),
        max_seqlen_q=1, max_seqlen_k=2, softmax_scale=None, causal=False, window_size=(None, None),
        learnable_sink=None, softcap=0.0, return_lse=True)[0]
    return unpack(out, lens_q, 1)


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375, -0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625], dtype=torch.float64).reshape((2, 2, 1, 8)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625], dtype=torch.float64).reshape((2, 2, 1, 8)).to(torch.float16).to(DEVICE)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    EXPECTED = torch.tensor([-0.47989572363774613, 0.7632616563369936, 1.4515562146484176, 2.930700010632339, -1.338283304016724, -1.1094002288940066, 1.6300811841531668, -0.5285445907442939, -1.106530964249134, 0.17478038628345927, 0.30418768940850005, 0.3826250668553222, -1.2700740524088614, 1.830671863134366, -0.30455936386928095, 0.5738449840769199], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64)
    DOUT = torch.tensor([-0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float16)
    EXPECTED_GRADS = {'dq': torch.tensor([0.0014247020205839416, 0.0007527164646605846, -0.0005015904001870079, -0.00041333232680318004, 0.0005360002957143458, 0.002128119692614005, 0.000872489370246133, -0.001827033106749774, 0.05699610738225473, 0.08479021153709768, 0.02263520827782145, -0.021829237069611762, 0.00927717070040518, 0.2440766479140326, -0.23505793211583814, -0.22599840764887352], dtype=torch.float64).reshape((2, 1, 1, 8)).to(torch.float64), 'dk': torch.tensor([0.0007629732604427713, 0.000780839936966583, 0.0001697334269762106, 0.0002939730016927157, -0.0005750422925626785, -0.00046883482656002036, 0.00021406925390566914, 0.0014333044944657785, -0.0007629732604427685, -0.0007808399369665801, -0.00016973342697620999, -0.0002939730016927146, 0.0005750422925626763, 0.0004688348265600186, -0.00021406925390566835, -0.0014333044944657733, -0.03591162851769749, 0.14081711303606229, -0.039013087344225914, -0.034333693325253205, -0.013351236132621245, -0.1378788888846143, -0.12449364552801796, 0.027559454309414817, 0.03591162851769749, -0.14081711303606229, 0.039013087344225914, 0.034333693325253205, 0.013351236132621245, 0.1378788888846143, 0.12449364552801796, -0.027559454309414817], dtype=torch.float64).reshape((2, 2, 1, 8)).to(torch.float64), 'dv': torch.tensor([-0.013842829978344245, 0.10190640564829485, -0.12435913183946144, 0.00013226624866898167, 0.12486612888248778, -0.05935486810858396, 0.15412710108000813, 0.05312604729426032, -0.07947992392790576, 0.5851053131017052, -0.7140197744105387, 0.0007594192371708622, 0.7169307461175123, -0.3407916162664161, 0.884935398919992, 0.3050282495807397, -0.12126569133502246, 1.1352635242401308, -0.9277577655685887, -0.024508909576271908, -0.5151535076068448, -0.4715821128045836, 0.016534862875581847, 0.3500155140468936, -0.12470598835247755, 1.1674708507598692, -0.9540781719314114, -0.025204225189353092, -0.5297683673931552, -0.48496085594541644, 0.017003955483793156, 0.35994542345310643], dtype=torch.float64).reshape((2, 2, 1, 8)).to(torch.float64)}

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
        EXPECTED_LSE = torch.tensor([1.4179229826319169, 0.8715363918341987], dtype=torch.float64).reshape((2, 1, 1)).to(torch.float64)
        problems += check_lse(lse, EXPECTED_LSE)
    if True:
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


def check_grads(out, q, k, v, dout, expected):
    """dQ, dK, dV by autograd through the call, each row (query or key, head) against its float64 answer within the
    bound the fuzzer graded that row with (GRAD_ROW_BOUNDS; inf: a row not graded)."""
    if not out.requires_grad:
        print("  gradients not checked: this call's output is not differentiable here")
        return []
    grads = torch.autograd.grad(out, (q, k, v), dout.to(out.device, out.dtype))
    problems = []
    for name, got in zip(("dq", "dk", "dv"), grads):
        got, want = got.detach().to("cpu", torch.float64), expected[name].to("cpu", torch.float64)
        bounds = GRAD_ROW_BOUNDS[name].to(torch.float64)
        graded = torch.isfinite(bounds)
        if not graded.any():
            continue
        err = (got - want).abs().amax(-1).nan_to_num(nan=float("inf"))[graded]
        ratios = err / bounds[graded]
        worst = int(ratios.argmax())
        over = ratios[worst].item()
        print(f"{BACKEND}: max |{name} - float64| = {err.max().item():.4g}; worst row at {over:.4g} x its bound")
        if not torch.isfinite(got.amax(-1)[graded]).all():
            problems.append(f"non-finite {name}")
        elif not over <= 1.0:
            problems.append(f"max |{name} - float64| on its worst row = {err[worst].item():.4g} > bound "
                            f"{bounds[graded][worst].item():.4g} ({over:.4g} x)")
    return problems


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    try:
        code = main()
    except ImportError as e:  # the backend's library (imported by the call), or attnfuzz where the script needs it
        print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is",
              file=sys.stderr)
        sys.exit(2)  # not 1: 1 says the bug is there
    sys.exit(code)
