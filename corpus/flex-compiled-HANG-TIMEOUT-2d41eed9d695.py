"""attnfuzz repro: flex-compiled HANG:TIMEOUT
flex-compiled: no answer within 300s; worker killed (the same case went silent for 288 s, until the run was
killed, in a run of the same seed one call earlier)

Run with: python3 flex-compiled-HANG-TIMEOUT-2d41eed9d695.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'flex-compiled'
DEVICE = 'cuda'
CASE = {'b': 1, 'sq': 52, 'skv': 52, 'h': 6, 'hk': 3, 'd_qk': 72, 'd_v': 72, 'dtype': 'float32', 'seqlens_q': [52], 'seqlens_kv': [52], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': [0.3968502629920499, 0.15749013123685915, 0.0625, 0.024803141437003122, 0.009843133202303695, 0.00390625], 'softmax': 'vanilla', 'layout': 'thd', 'memory': 'transposed', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': True, 'spelling': ''}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [52]  # graded query rows per sequence (rows past them are padding)
try:
    from attnfuzz.store.repro_bounds import graded_bounds  # too many bounds to write out: recomputed
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)
_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)
ROW_BOUNDS = _BOUNDS['out']  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 1.5869860058325546e-05  # the largest, for the summary line
LSE_BOUNDS = _BOUNDS['lse']  # per LSE row (batch, head, query): the grader's bound (inf: not graded)
GRAD_ROW_BOUNDS = {'dq': _BOUNDS['dq'], 'dk': _BOUNDS['dk'], 'dv': _BOUNDS['dv']}  # per dQ row (batch, query, head) and dK / dV row (batch, key, KV head): the grader's bound


# mask_mods and score_mods, verbatim from attnfuzz's flex adapter (fuzz/backends/flex/mods.py)

def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


def padding(lens_q: torch.Tensor, lens_kv: torch.Tensor):
    """Query i sees key j iff i < lens_q[b] and j < lens_kv[b]."""
    return _named(lambda b, h, q_idx, kv_idx: (q_idx < lens_q[b]) & (kv_idx < lens_kv[b]),
                  f"padding(q={lens_q.tolist()}, kv={lens_kv.tolist()})")


def alibi(slopes: torch.Tensor, off: torch.Tensor):
    """s -> s - slopes[h] * |i + off[b] - j|."""
    return _named(lambda s, b, h, q_idx, kv_idx: s - slopes[h] * (q_idx + off[b] - kv_idx).abs(),
                  f"alibi({[round(x, 4) for x in slopes.tolist()]})")


def all_of(*mods):
    """Query i sees key j iff every mask_mod says so."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = mods[0](b, h, q_idx, kv_idx)
        for mod in mods[1:]:
            keep = keep & mod(b, h, q_idx, kv_idx)
        return keep
    return _named(mask_mod, " & ".join(m.__name__ for m in mods))


def documents(mod, doc_q, doc_kv, start_q, start_kv, sq: int, skv: int):
    """Packed sequences (thd): query i sees key j iff both belong to sequence n = doc_q[i] and `mod` (None: any) sees
    them at their positions in n. Positions are clamped so a pair across sequences still indexes in range."""
    def mask_mod(b, h, q_idx, kv_idx):
        n = doc_q[q_idx]
        same = n == doc_kv[kv_idx]
        if mod is None:
            return same
        return same & mod(n, h, (q_idx - start_q[n]).clamp(0, sq - 1), (kv_idx - start_kv[n]).clamp(0, skv - 1))
    return _named(mask_mod, f"documents({mod.__name__ if mod is not None else 'all'})")


def per_document(mod, doc_q, doc_kv, start_q, start_kv, sq: int, skv: int):
    """A score_mod applied at positions within the query's packed sequence."""
    def score_mod(s, b, h, q_idx, kv_idx):
        n = doc_q[q_idx]
        return mod(s, n, h, (q_idx - start_q[n]).clamp(0, sq - 1), (kv_idx - start_kv[n]).clamp(0, skv - 1))
    return _named(score_mod, f"per_document({mod.__name__})")


def chain(*mods):
    """The score_mods applied in order (the case language's order: softcap, then ALiBi, then the mask)."""
    def score_mod(s, b, h, q_idx, kv_idx):
        for mod in mods:
            s = mod(s, b, h, q_idx, kv_idx)
        return s
    return _named(score_mod, " -> ".join(m.__name__ for m in mods))


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


LENS_Q = [52]  # valid queries per sequence
LENS_KV = [52]  # valid keys per sequence


def attention(q, k, v):
    """torch flex_attention, compiled (a fresh graph of this one call), as attnfuzz's flex adapter ran it:
    spelling '' (block mask, enable_gqa), layout thd."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = q.device
    lens_q, lens_kv = torch.tensor(LENS_Q, device=device), torch.tensor(LENS_KV, device=device)
    off = torch.zeros_like(lens_q)  # top-left diagonal
    q = pack(q, LENS_Q).permute(1, 0, 2)[None]  # thd: one packed sequence, [1, h, total, d]
    k, v = (pack(x, LENS_KV).permute(1, 0, 2)[None] for x in (k, v))
    mask_mod = all_of(padding(lens_q, lens_kv))
    score_mods = [alibi(torch.tensor([0.3968502629920499, 0.15749013123685915, 0.0625, 0.024803141437003122, 0.009843133202303695, 0.00390625], dtype=torch.float32, device=device), off)]
    seqs = torch.arange(1, device=device)
    doc_q, doc_kv = seqs.repeat_interleave(lens_q), seqs.repeat_interleave(lens_kv)  # each packed token's sequence
    start_q, start_kv = lens_q.cumsum(0) - lens_q, lens_kv.cumsum(0) - lens_kv  # each one's first token
    docs = (doc_q, doc_kv, start_q, start_kv, 52, 52)
    mask_mod = documents(mask_mod, *docs)  # masks at positions in a sequence
    score_mods = [per_document(mod, *docs) for mod in score_mods]
    block_mask = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device=device)
    score_mod = chain(*score_mods)
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    out = compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=None, enable_gqa=True)
    return unpack(out[0].transpose(0, 1), LENS_Q, 52)


def main():
    from attnfuzz.strategies import Case, materialize  # too large to inline: regenerated from the seed
    _t = materialize(Case.from_dict(CASE), DEVICE)
    q, k, v = _t.q, _t.k, _t.v
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    from attnfuzz.oracles.reference import reference
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED = _ref.out
    DOUT = _t.dout
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED_GRADS = {'dq': _ref.dq, 'dk': _ref.dk, 'dv': _ref.dv}

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
        EXPECTED_LSE = _ref.lse
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
    # the fuzzer saw this case hang: give up after WATCHDOG_S seconds and exit 1, as for any bug still there
    import os
    import threading
    WATCHDOG_S = float(os.environ.get("ATTNFUZZ_REPRO_WATCHDOG", 900))  # the worker's 300 s, then 600 s more

    def _give_up():
        print(f"{BACKEND}: no answer within {WATCHDOG_S:g}s: the hang is still there", flush=True)
        os._exit(1)  # from this thread: the main one may be stuck inside a kernel or a compile

    _watchdog = threading.Timer(WATCHDOG_S, _give_up)
    _watchdog.daemon = True
    _watchdog.start()
    try:
        code = main()
    except ImportError as e:  # the backend's library (imported by the call), or attnfuzz where the script needs it
        print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is",
              file=sys.stderr)
        sys.exit(2)  # not 1: 1 says the bug is there
    sys.exit(code)
