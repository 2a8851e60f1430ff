"""attnfuzz repro: flex-compiled CRASH:InductorError
InductorError: RuntimeError: No valid triton configs. OutOfMemoryError: out of resource:
triton_tem_fused__to_copy_flex_attention_ones_slice_sort_sum_transpose_zeros_2 Required: 327680 Hardware
limit:232448 Reducing block sizes or `num_stages` may help.  Set TORCHDYNAMO_VERBOSE=1 for the internal stack
trace (please do this especially if you're reporting a bug to PyTorch). For even more developer context, set
TORCH_LOGS="+dynamo"  (at triton_heuristics.py:664)

Run with: python3 flex-compiled-CRASH-InductorError-db327348210e.py   (exits 1 while the bug is there, 2 when torch or the backend's library cannot be imported here)
"""
import sys

BACKEND = 'flex-compiled'
DEVICE = 'cuda'
CASE = {'b': 2, 'sq': 3456, 'skv': 192, 'h': 8, 'hk': 2, 'd_qk': 160, 'd_v': 512, 'dtype': 'bfloat16', 'seqlens_q': None, 'seqlens_kv': None, 'causal': True, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'transposed', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 4238683122, 'grads': False, 'spelling': 'score_mask+prescale'}

try:
    import torch
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)  # not 1: 1 says the bug is there

VALID_ROWS = [3456, 3456]  # graded query rows per sequence (rows past them are padding)
try:
    from attnfuzz.store.repro_bounds import graded_bounds  # too many bounds to write out: recomputed
except ImportError as e:
    print(f"{BACKEND}: cannot run this repro here: {e}; install it or run the script where it is", file=sys.stderr)
    sys.exit(2)
_BOUNDS = graded_bounds(CASE, BACKEND, DEVICE)
ROW_BOUNDS = _BOUNDS['out']  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 0.08660320614543193  # the largest, for the summary line
LSE_BOUNDS = _BOUNDS['lse']  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


# mask_mods and score_mods, verbatim from attnfuzz's flex adapter (fuzz/backends/flex/mods.py)

def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


def band_right(right: torch.Tensor, off: torch.Tensor):
    """Query i sees key j iff j <= i + off[b] + right."""
    return _named(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + off[b] + right, f"band_right({int(right)})")


def all_of(*mods):
    """Query i sees key j iff every mask_mod says so."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = mods[0](b, h, q_idx, kv_idx)
        for mod in mods[1:]:
            keep = keep & mod(b, h, q_idx, kv_idx)
        return keep
    return _named(mask_mod, " & ".join(m.__name__ for m in mods))


def masked_scores(mask_mod):
    """s -> s where the mask_mod keeps the key, -inf elsewhere (masking without a block mask)."""
    return _named(lambda s, b, h, q_idx, kv_idx: torch.where(mask_mod(b, h, q_idx, kv_idx), s, float("-inf")),
                  f"masked({mask_mod.__name__})")


def chain(*mods):
    """The score_mods applied in order (the case language's order: softcap, then ALiBi, then the mask)."""
    def score_mod(s, b, h, q_idx, kv_idx):
        for mod in mods:
            s = mod(s, b, h, q_idx, kv_idx)
        return s
    return _named(score_mod, " -> ".join(m.__name__ for m in mods))


RETURNS_LSE = True  # attention returns (out, lse): the script checks both
LENS_Q = [3456, 3456]  # valid queries per sequence
LENS_KV = [192, 192]  # valid keys per sequence


def attention(q, k, v):
    """torch flex_attention, compiled (a fresh graph of this one call), as attnfuzz's flex adapter ran it:
    spelling 'score_mask+prescale' (mask as -inf in the score_mod, enable_gqa, kernel_options
    {'PRESCALE_QK': True}), layout bshd."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    device = q.device
    lens_q, lens_kv = torch.tensor(LENS_Q, device=device), torch.tensor(LENS_KV, device=device)
    off = torch.zeros_like(lens_q)  # top-left diagonal
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views
    mask_mod = all_of(band_right(torch.tensor(0, device=device), off))
    score_mods = [masked_scores(mask_mod)]  # the mask as -inf
    score_mod = chain(*score_mods)
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    out, aux = compiled(
        q, k, v, score_mod=score_mod, block_mask=None, scale=None, enable_gqa=True,
        kernel_options={'PRESCALE_QK': True}, return_aux=AuxRequest(lse=True))
    return out.transpose(1, 2), aux.lse


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
