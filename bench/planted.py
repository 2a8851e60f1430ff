"""Planted kernels: one trusted CPU attention with exactly one small bug each, for the sensitivity benchmark and for
`attnfuzz run --backend bench.planted:NAME` (run from the repository root).

The trusted computation is written here from the semantics in strategies/case.py, the way a fused kernel computes:
logits as fp32 sums of exact products (fp64 for fp64 inputs), softcap, ALiBi, the band, padding and the explicit
mask, softmax with the sink in fp32, P V in fp32, the output rounded once to the inputs' dtype, the LSE in fp32.
Its backward is autograd through that fp32 math, rounded once at the end: the kernels declare the fused family
(fuzz/backends/custom.py), whose gradient baseline is a fused backward. `correct` is it without a bug (the control
that must pass). Each planted bug touches one batch (0) and one query
head (the last); where it touches one row, that row is `PLANT["row"]` when set (the benchmark draws it), else the
middle valid row of sequence 0. `LAST["active"]` says whether the last call's bug changed anything a correct kernel
computes (a leak needs a hidden valid key, a drop a row that sees two keys, ...).
"""

from __future__ import annotations

import torch

PLANT: dict = {"row": None}
LAST: dict = {"active": False}


def _visible(q, k, *, causal, window, bottom_right, mask, seqlens_q, seqlens_kv) -> torch.Tensor:
    """[b, 1, sq, skv]: query i of sequence n sees key j (the case's semantics)."""
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    lq = seqlens_q.tolist() if seqlens_q is not None else [sq] * b
    lk = seqlens_kv.tolist() if seqlens_kv is not None else [skv] * b
    left, right = window[0], 0 if causal else window[1]
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
    rows = []
    for n in range(b):
        off = lk[n] - lq[n] if bottom_right else 0
        keep = (i < lq[n]) & (j < lk[n])
        if left is not None:
            keep &= j >= i + off - left
        if right is not None:
            keep &= j <= i + off + right
        rows.append(keep)
    vis = torch.stack(rows)[:, None].to(q.device)
    return vis & mask.to(q.device) if mask is not None else vis


def _offsets(q, k, bottom_right, seqlens_q, seqlens_kv) -> torch.Tensor:
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    lq = seqlens_q.tolist() if seqlens_q is not None else [sq] * b
    lk = seqlens_kv.tolist() if seqlens_kv is not None else [skv] * b
    return torch.tensor([lk[n] - lq[n] if bottom_right else 0 for n in range(b)])


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by `factor` where `where` is True (all elements if None)."""

    @staticmethod
    def forward(ctx, x, factor, where):
        ctx.factor, ctx.where = factor, where
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.where is None:
            return g * ctx.factor, None, None
        return torch.where(ctx.where, g * ctx.factor, g), None, None


def trusted(q, k, v, *, causal, window, bottom_right, scale, softcap=None, alibi_slopes=None, sink_logits=None,
            mask=None, seqlens_q=None, seqlens_kv=None, edit_visible=None, softmax_dtype=None):
    """out [b, sq, h, d_v] in q's dtype and lse [b, h, sq] in fp32. `edit_visible(vis [b, h, sq, skv])` plants a
    mask bug; `softmax_dtype` plants a softmax computed in a lower precision."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    h, hk = q.shape[2], k.shape[2]
    kf, vf = (x.to(compute).repeat_interleave(h // hk, dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(compute), kf) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    vis = _visible(q, k, causal=causal, window=window, bottom_right=bottom_right, mask=mask, seqlens_q=seqlens_q,
                   seqlens_kv=seqlens_kv).expand(-1, h, -1, -1).clone()
    if alibi_slopes is not None:
        off = _offsets(q, k, bottom_right, seqlens_q, seqlens_kv).to(q.device)
        dist = (torch.arange(q.shape[1], device=q.device)[None, :, None] + off[:, None, None]
                - torch.arange(k.shape[1], device=q.device)[None, None, :]).abs()
        s = s - alibi_slopes.to(compute)[None, :, None, None] * dist[:, None].to(compute)
    if edit_visible is not None:
        vis = edit_visible(vis)
    if softmax_dtype is not None:
        s = s.to(softmax_dtype)
    s = s.masked_fill(~vis, float("-inf"))
    if sink_logits is not None:
        sink = sink_logits.to(s.dtype)[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(compute), vf)
    return out.to(q.dtype), lse.float()


def _row(seqlens_q, sq: int) -> int:
    n = int(seqlens_q[0]) if seqlens_q is not None else sq
    return PLANT["row"] if PLANT["row"] is not None else max(n // 2, 0)


def correct(q, k, v, **kw):
    LAST["active"] = False
    return trusted(q, k, v, **kw)


def leak_key(q, k, v, **kw):
    """One hidden key made visible on one row: the first hidden valid key past the row's last visible one, else the
    last one before its first (a band edge), else a hole of the explicit mask."""
    r = _row(kw.get("seqlens_q"), q.shape[1])

    def edit(vis):
        seen = vis[0, -1, r]
        lk = int(kw["seqlens_kv"][0]) if kw.get("seqlens_kv") is not None else k.shape[1]
        hidden = ~seen.clone()
        hidden[lk:] = False
        LAST["active"] = bool(seen.any()) and bool(hidden.any())
        if LAST["active"]:
            idx = torch.nonzero(seen).flatten()
            after = torch.nonzero(hidden & (torch.arange(seen.numel(), device=seen.device) > idx[-1])).flatten()
            before = torch.nonzero(hidden & (torch.arange(seen.numel(), device=seen.device) < idx[0])).flatten()
            j = after[0] if after.numel() else before[-1] if before.numel() else torch.nonzero(hidden).flatten()[0]
            vis[0, -1, r, j] = True
        return vis
    return trusted(q, k, v, edit_visible=edit, **kw)


def drop_key(q, k, v, **kw):
    """The first visible key of one row dropped (a key lost at the start of a block)."""
    r = _row(kw.get("seqlens_q"), q.shape[1])

    def edit(vis):
        idx = torch.nonzero(vis[0, -1, r]).flatten()
        LAST["active"] = idx.numel() >= 2
        if LAST["active"]:
            vis[0, -1, r, idx[0]] = False
        return vis
    return trusted(q, k, v, edit_visible=edit, **kw)


def scaled_row(eps: float):
    def kernel(q, k, v, **kw):
        out, lse = trusted(q, k, v, **kw)
        r = _row(kw.get("seqlens_q"), q.shape[1])
        out = out.clone()
        LAST["active"] = bool((out[0, r, -1] != 0).any())
        out[0, r, -1] = (out[0, r, -1].to(torch.float64) * (1 + eps)).to(out.dtype)
        return out, lse
    kernel.__name__ = f"row_times_1p{eps:g}"
    return kernel


def zero_last(rows: int):
    """The last `rows` valid rows of one head left at 0 (a tail tile never written)."""
    def kernel(q, k, v, **kw):
        out, lse = trusted(q, k, v, **kw)
        n = int(kw["seqlens_q"][0]) if kw.get("seqlens_q") is not None else q.shape[1]
        lo = max(n - rows, 0)
        out = out.clone()
        LAST["active"] = bool((out[0, lo:n, -1] != 0).any())
        out[0, lo:n, -1] = 0
        return out, lse
    kernel.__name__ = f"zero_last_{rows}"
    return kernel


def softmax_bf16(q, k, v, **kw):
    """Logits and softmax in bf16 (the weights carry bf16 rounding of logits that can be large)."""
    LAST["active"] = True
    return trusted(q, k, v, softmax_dtype=torch.bfloat16, **kw)


def grads_times(factor: float, one_row: bool, which: str = "qkv"):
    """Every gradient, or one query row of dQ and one key row of dK and dV, times `factor`; `which` names the
    gradients touched (q, k, v)."""
    def kernel(q, k, v, **kw):
        where_q = where_k = None
        if one_row:
            r = _row(kw.get("seqlens_q"), q.shape[1])
            where_q = torch.zeros(q.shape, dtype=torch.bool, device=q.device)
            where_q[0, r, -1] = True
            where_k = torch.zeros(k.shape, dtype=torch.bool, device=k.device)
            where_k[0, min(r, k.shape[1] - 1), -1] = True
            where_v = torch.zeros(v.shape, dtype=torch.bool, device=v.device)
            where_v[0, min(r, k.shape[1] - 1), -1] = True
        else:
            where_v = None
        LAST["active"] = q.requires_grad
        if one_row and which == "k":
            # dK_j = scale sum_i dS_ij Q_i is exactly 0 where no query sees key j (a window past it) or q is 0 (probe
            # values): scaling it changes nothing then
            seen = _visible(q, k, causal=kw["causal"], window=kw["window"], bottom_right=kw["bottom_right"],
                            mask=kw.get("mask"), seqlens_q=kw.get("seqlens_q"), seqlens_kv=kw.get("seqlens_kv"))
            LAST["active"] &= bool(seen[0, :, :, min(r, k.shape[1] - 1)].any()) and bool(q.detach().any())
        q2 = _ScaleGrad.apply(q, factor, where_q) if "q" in which else q
        k2 = _ScaleGrad.apply(k, factor, where_k) if "k" in which else k
        v2 = _ScaleGrad.apply(v, factor, where_v) if "v" in which else v
        return trusted(q2, k2, v2, **kw)
    kernel.__name__ = f"grads_times_{factor:g}_{'row' if one_row else 'all'}{'' if which == 'qkv' else '_d' + which}"
    return kernel


zero_row = zero_last(1)
zero_8_rows = zero_last(8)
row_times_1p01 = scaled_row(0.01)
row_times_1p001 = scaled_row(0.001)
grads_1p01_all = grads_times(1.01, False)
grads_1p05_all = grads_times(1.05, False)
grads_1p01_row = grads_times(1.01, True)
grads_1p05_row = grads_times(1.05, True)
grads_1p05_dq_row = grads_times(1.05, True, "q")
grads_1p05_dk_row = grads_times(1.05, True, "k")

# the benchmark's name -> the module attribute `attnfuzz run --backend bench.planted:ATTRIBUTE` takes
BUGS = {"leak_key": "leak_key", "drop_key": "drop_key", "row_x1.01": "row_times_1p01", "zero_row": "zero_row",
        "zero_8_rows": "zero_8_rows", "softmax_bf16": "softmax_bf16", "grads_x1.01_all": "grads_1p01_all",
        "grads_x1.05_all": "grads_1p05_all", "grads_x1.01_row": "grads_1p01_row", "grads_x1.05_row": "grads_1p05_row",
        "dq_x1.05_row": "grads_1p05_dq_row", "dk_x1.05_row": "grads_1p05_dk_row"}
GRADIENT_BUGS = tuple(n for n in BUGS if n.startswith(("grads", "dq", "dk")))
for _name in ("correct", *BUGS.values()):
    globals()[_name].supports = lambda case: case.dtype != "float64" or "the benchmark grades fp16 / bf16 / fp32"
    # The trusted backward is autograd through fp32 (fp64) math, rounded once to the dtype at the end: more precise
    # than a fused kernel's, so graded against the fused baseline (oracles/tolerance.py, FUSED_BACKWARD).
    globals()[_name].family = "fused"
