"""attnfuzz repro: fa4 CRASH:CompilerDiagnosticError
CompilerDiagnosticError: [91merror:[0m PTX assembly failed: (C7602) Insufficient registers (128) to compile
instruction at line 1640 in function kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm
90_object_at__tensor0000o11101213_tensorptrf16gmemalign16oi64div81i64div8i64div8_tensorptrf16gmemalign16oi64di
v81i_0. Try to compile with register target of 158 or higher.    --> /tmp/attn-
stack/site/flash_attn/cute/flash_fwd_sm90.py:406:0       in function `[92m__call__[0m(...)`:    |   404 |
(at compiler.py:289)

Run with: python3 fa4-CRASH-CompilerDiagnosticError-35286a1b5f35.py   (exits 1 while the bug is there)
"""
import sys

import torch

BACKEND = 'fa4'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 1, 'skv': 1, 'h': 1, 'hk': 1, 'd_qk': 16, 'd_v': 256, 'dtype': 'float16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': '', 'page_size': 1}
VALID_ROWS = [1]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([0.005832082652996504], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.005832082652996504  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([0.00012324720835604476], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


def pool_from_table(k, v, block_table, lens, page_size, num_pages, garbage_k, garbage_v):
    """(k_cache, v_cache) [num_pages, page_size, hk, d]: sequence n's first lens[n] keys of the logical k / v
    [b, s, hk, d] in the pages block_table[n] names, in order, and the garbage values in every other slot. Pages
    several sequences name (a shared prefix) get the same keys from each."""
    k_cache = k.new_full((num_pages, page_size, *k.shape[2:]), garbage_k)
    v_cache = v.new_full((num_pages, page_size, *v.shape[2:]), garbage_v)
    for n, length in enumerate(lens):
        for p in range(-(-length // page_size)):
            page, count = int(block_table[n, p]), min(page_size, length - p * page_size)
            k_cache[page, :count] = k[n, p * page_size:p * page_size + count]
            v_cache[page, :count] = v[n, p * page_size:p * page_size + count]
    return k_cache, v_cache


def kvcache_inputs(k, v, lens_kv, new, block_table, page_size, num_pages, garbage_k, garbage_v):
    """k_cache, v_cache, cache_seqlens and (new > 0) the appended k / v of flash_attn_with_kvcache, from logical
    k / v [b, skv, hk, d]: sequence n's first lens_kv[n] - new keys in its cache (rows of a contiguous cache, or the
    pages block_table[n] names: pool_from_table), its last `new` keys handed over as k / v, and every other slot
    garbage."""
    lens = [n - new for n in lens_kv]
    if block_table is None:
        k_cache, v_cache = k.contiguous().clone(), v.contiguous().clone()
        for n, length in enumerate(lens):
            k_cache[n, length:], v_cache[n, length:] = garbage_k, garbage_v
    else:
        k_cache, v_cache = pool_from_table(k, v, block_table, lens, page_size, num_pages, garbage_k, garbage_v)
    inputs = {"k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
              "cache_seqlens": torch.tensor(lens, dtype=torch.int32, device=k.device)}
    if new:
        inputs["k"] = torch.stack([k[n, length:length + new] for n, length in enumerate(lens)])
        inputs["v"] = torch.stack([v[n, length:length + new] for n, length in enumerate(lens)])
    return inputs


BLOCK_TABLE = torch.tensor([0.0], dtype=torch.float64).reshape((1, 1)).to(torch.int32)  # pool pages of each sequence, in shuffled order


def attention(q, k, v):
    """flash-attn-4 (flash_attn.cute.flash_attn_varlen_func) as attnfuzz's fa4 adapter calls it for spelling
    ''."""
    from flash_attn.cute import flash_attn_varlen_func

    lens_q, lens_kv = [1], [1]  # valid tokens per sequence
    cache = kvcache_inputs(k, v, lens_kv, 0, BLOCK_TABLE.to(q.device), 1, 2, 0.0, 10000.0)
    out = flash_attn_varlen_func(
        q, cache["k_cache"], cache["v_cache"], seqused_k=cache["cache_seqlens"],
        page_table=cache["block_table"], max_seqlen_q=1, max_seqlen_k=1, softmax_scale=None, causal=False,
        window_size=(None, None), learnable_sink=None, softcap=0.0, return_lse=True)[0]
    return out


def main():
    q = torch.tensor([-1.1259765625, -1.15234375, -0.25048828125, -0.433837890625, 0.8486328125, 0.69189453125, -0.31591796875, -2.115234375, 0.322265625, -1.263671875, 0.35009765625, 0.30810546875, 0.11981201171875, 1.2373046875, 1.1171875, -0.247314453125], dtype=torch.float64).reshape((1, 1, 1, 16)).to(torch.float16).to(DEVICE)
    k = torch.tensor([-1.3525390625, -1.6962890625, 0.56689453125, 0.79345703125, 0.5986328125, -1.5546875, -0.34130859375, 1.8525390625, 0.75, -0.58544921875, -0.17333984375, 0.1834716796875, 1.3896484375, 1.5859375, 0.9462890625, -0.84375], dtype=torch.float64).reshape((1, 1, 1, 16)).to(torch.float16).to(DEVICE)
    v = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375, 1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625, -0.5595703125, 0.53369140625, 0.406982421875, 0.39453125, 0.1715087890625, 0.8759765625, -0.287109375, 1.021484375, -0.07440185546875, -1.091796875, 0.39208984375, 0.5947265625, 0.662109375, -1.2060546875, 0.607421875, -0.54736328125, 1.1708984375, 0.09747314453125, 0.96337890625, 0.84033203125, -1.25390625, 0.98681640625, -0.49462890625, -1.283203125, 0.955078125, 1.283203125, -0.666015625, 0.56494140625, 0.28759765625, -0.03338623046875, -1.0615234375, -0.11444091796875, -0.34326171875, 1.5712890625, 0.191650390625, 0.3798828125, -0.144775390625, 0.6376953125, -0.28125, -1.330078125, -0.1419677734375, -0.5341796875, -0.5234375, 0.861328125, -0.88720703125, 0.8388671875, 1.1533203125, -1.7607421875, -1.4775390625, -1.755859375, 0.076171875, -1.078125, 1.4404296875, -0.110595703125, 0.57666015625, -0.169189453125, -0.06402587890625, 1.0380859375, 0.90673828125, -0.4755859375, -0.87060546875, 0.144775390625, 1.9033203125, 0.390380859375, -0.03936767578125, -0.80126953125, -0.49560546875, -0.361572265625, 0.5849609375, -1.15625, -0.143310546875, -0.1947021484375, -0.0855712890625, 1.39453125, 0.5966796875, -0.48291015625, -0.3662109375, -1.3271484375, 1.6953125, 2.06640625, -0.2340087890625, 0.70751953125, 0.580078125, 0.268310546875, -2.05859375, 0.5341796875, -0.53515625, -0.86376953125, -0.02349853515625, 1.171875, 0.398681640625, -0.19873046875, -1.15625, -0.316650390625, 0.9404296875, -1.146484375], dtype=torch.float64).reshape((1, 1, 1, 256)).to(torch.float16).to(DEVICE)
    EXPECTED = torch.tensor([-0.61376953125, 0.031585693359375, -0.49267578125, 0.2484130859375, 0.439697265625, 0.1124267578125, 0.640625, 0.441162109375, -0.102294921875, 0.79248046875, -0.28955078125, 0.052520751953125, 0.52294921875, 2.302734375, -1.46875, -1.5869140625, -0.6728515625, 0.873046875, 1.0556640625, 0.1778564453125, -0.2303466796875, -0.391845703125, 0.54345703125, -0.395263671875, -0.4462890625, 0.744140625, 1.5205078125, 3.41015625, -1.53125, -1.234375, 1.8193359375, -0.5517578125, -0.5693359375, 0.919921875, 1.1103515625, 1.2900390625, -1.478515625, 2.56640625, -0.47314453125, 0.33544921875, -1.62890625, -0.5498046875, -0.479736328125, -0.499755859375, -1.0673828125, 1.115234375, -0.140625, 0.8056640625, -0.09332275390625, 0.68701171875, -0.83837890625, 0.0008916854858398438, 0.841796875, -0.400146484375, 1.0390625, 0.358154296875, -0.2459716796875, 2.302734375, -1.8818359375, -0.049713134765625, -1.044921875, -0.95654296875, 0.033538818359375, 0.7099609375, 1.6455078125, -1.3603515625, 0.344482421875, 0.52001953125, -2.61328125, -1.6962890625, -0.228271484375, 0.280029296875, 0.2469482421875, 0.076904296875, 0.337890625, 0.454345703125, 0.45703125, -0.865234375, 0.78125, -0.9267578125, -0.2188720703125, -2.435546875, -0.07293701171875, -0.03399658203125, 0.96240234375, 0.34912109375, -0.92138671875, -0.056182861328125, -0.62255859375, -0.463623046875, 1.921875, -0.402587890625, 0.1239013671875, 1.1650390625, 0.92333984375, 1.3876953125, -0.88330078125, -0.4189453125, -0.8046875, 0.5654296875, 0.6103515625, 0.466796875, 1.9501953125, -1.0634765625, -0.07733154296875, 0.11639404296875, -0.59375, -1.244140625, -0.10211181640625, -1.033203125, -0.312744140625, 0.2457275390625, -0.259521484375, 0.11834716796875, 0.2440185546875, 1.1650390625, 0.28857421875, 0.38671875, -0.2010498046875, -0.117919921875, 0.192138671875, -0.77197265625, -1.900390625, 0.1307373046875, -0.7041015625, 0.314697265625, 0.1573486328125, 0.38525390625, 0.96728515625, -0.9912109375, 0.301513671875, -0.1072998046875, 0.99853515625, -0.498779296875, 0.76123046875, 0.6181640625, 0.31396484375, 0.21337890625, -0.12005615234375, 0.3603515625, -0.31396484375, -1.0791015625, 0.2408447265625, -1.396484375, -0.066162109375, -0.3583984375, -1.5615234375, -0.354736328125, 1.0810546875, 0.1314697265625, 1.5732421875, 0.78125, -1.0791015625, -0.720703125, 1.470703125, 0.275634765625, 0.6669921875, -0.99462890625, -1.189453125, -1.1962890625, -0.5595703125, 0.53369140625, 0.406982421875, 0.39453125, 0.1715087890625, 0.8759765625, -0.287109375, 1.021484375, -0.07440185546875, -1.091796875, 0.39208984375, 0.5947265625, 0.662109375, -1.2060546875, 0.607421875, -0.54736328125, 1.1708984375, 0.09747314453125, 0.96337890625, 0.84033203125, -1.25390625, 0.98681640625, -0.49462890625, -1.283203125, 0.955078125, 1.283203125, -0.666015625, 0.56494140625, 0.28759765625, -0.03338623046875, -1.0615234375, -0.11444091796875, -0.34326171875, 1.5712890625, 0.191650390625, 0.3798828125, -0.144775390625, 0.6376953125, -0.28125, -1.330078125, -0.1419677734375, -0.5341796875, -0.5234375, 0.861328125, -0.88720703125, 0.8388671875, 1.1533203125, -1.7607421875, -1.4775390625, -1.755859375, 0.076171875, -1.078125, 1.4404296875, -0.110595703125, 0.57666015625, -0.169189453125, -0.06402587890625, 1.0380859375, 0.90673828125, -0.4755859375, -0.87060546875, 0.144775390625, 1.9033203125, 0.390380859375, -0.03936767578125, -0.80126953125, -0.49560546875, -0.361572265625, 0.5849609375, -1.15625, -0.143310546875, -0.1947021484375, -0.0855712890625, 1.39453125, 0.5966796875, -0.48291015625, -0.3662109375, -1.3271484375, 1.6953125, 2.06640625, -0.2340087890625, 0.70751953125, 0.580078125, 0.268310546875, -2.05859375, 0.5341796875, -0.53515625, -0.86376953125, -0.02349853515625, 1.171875, 0.398681640625, -0.19873046875, -1.15625, -0.316650390625, 0.9404296875, -1.146484375], dtype=torch.float64).reshape((1, 1, 1, 256)).to(torch.float64)

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
    if lse is not None:
        EXPECTED_LSE = torch.tensor([0.7462525367736816], dtype=torch.float64).reshape((1, 1, 1)).to(torch.float64)
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
