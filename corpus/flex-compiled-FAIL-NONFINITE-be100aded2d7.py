"""attnfuzz repro: flex-compiled FAIL:NONFINITE
non-finite output, first at [1, 0, 0, 0]: nan

Run with: python3 flex-compiled-FAIL-NONFINITE-be100aded2d7.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'flex-compiled'
DEVICE = 'cuda'
CASE = {'b': 2, 'sq': 128, 'skv': 125, 'h': 4, 'hk': 4, 'd_qk': 64, 'd_v': 64, 'dtype': 'float32', 'seqlens_q': [0, 128], 'seqlens_kv': [115, 3], 'causal': False, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'thd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': 'rows_safe'}

try:
    import torch  # exits 2 without it: 1 says the bug is there
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)

VALID_ROWS = [0, 128]  # graded query rows per sequence (rows past them are padding)
try:
    from attnfuzz.store.repro_bounds import graded_bounds  # too many bounds to write out: recomputed
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)
_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)
ROW_BOUNDS = _BOUNDS['out']  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 1.1939399346007155e-05  # the largest, for the summary line
LSE_BOUNDS = _BOUNDS['lse']  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


# mask_mods and score_mods, verbatim from attnfuzz's flex adapter (fuzz/backends/flex/mods.py)

def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


def padding(lens_q: torch.Tensor, lens_kv: torch.Tensor):
    """Query i sees key j iff i < lens_q[b] and j < lens_kv[b]."""
    return _named(lambda b, h, q_idx, kv_idx: (q_idx < lens_q[b]) & (kv_idx < lens_kv[b]),
                  f"padding(q={lens_q.tolist()}, kv={lens_kv.tolist()})")


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


LENS_Q = [0, 128]  # valid queries per sequence
LENS_KV = [115, 3]  # valid keys per sequence


def attention(q, k, v):
    """torch flex_attention, compiled (a fresh graph of this one call), as attnfuzz's flex adapter ran it:
    spelling 'rows_safe' (block mask, kernel_options {'ROWS_GUARANTEED_SAFE': True}), layout thd."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = q.device
    lens_q, lens_kv = torch.tensor(LENS_Q, device=device), torch.tensor(LENS_KV, device=device)
    q = pack(q, LENS_Q).permute(1, 0, 2)[None]  # thd: one packed sequence, [1, h, total, d]
    k, v = (pack(x, LENS_KV).permute(1, 0, 2)[None] for x in (k, v))
    mask_mod = all_of(padding(lens_q, lens_kv))
    seqs = torch.arange(2, device=device)
    doc_q, doc_kv = seqs.repeat_interleave(lens_q), seqs.repeat_interleave(lens_kv)  # each packed token's sequence
    start_q, start_kv = lens_q.cumsum(0) - lens_q, lens_kv.cumsum(0) - lens_kv  # each one's first token
    docs = (doc_q, doc_kv, start_q, start_kv, 128, 125)
    mask_mod = documents(mask_mod, *docs)  # masks at positions in a sequence
    block_mask = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device=device)
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    out = compiled(
        q, k, v, score_mod=None, block_mask=block_mask, scale=None, enable_gqa=False,
        kernel_options={'ROWS_GUARANTEED_SAFE': True})
    return unpack(out[0].transpose(0, 1), LENS_Q, 128)


def main():
    from attnfuzz.strategies import Case, materialize  # too large to inline: regenerated from the seed
    _t = materialize(Case.from_dict(CASE), DEVICE)
    q, k, v = _t.q, _t.k, _t.v
    from attnfuzz.oracles.reference import reference
    _ref = reference(Case.from_dict(CASE), _t)
    EXPECTED = _ref.out

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
