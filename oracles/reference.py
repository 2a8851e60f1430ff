"""The attention reference, written from the semantics in strategies/case.py and nothing else.

One reference, two roles: at float64 it is the oracle; at the case's dtype it is the naive baseline whose own error
sets the tolerance. It works one sequence and one chunk of queries at a time, so memory stays bounded by
`chunk_bytes` whatever the sequence length, and it runs on whatever device the tensors are on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnfuzz.oracles.fold import fold, unfold
from attnfuzz.oracles.grad_terms import FP8_TERMS, add_d_terms, add_fp8_terms, add_grad_terms, repeats_rows
from attnfuzz.oracles.hull import row_ranges
from attnfuzz.oracles.masks import band, diagonal_offset, distance
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import saturate
from attnfuzz.strategies.fp8_backward import saturate_grads
from attnfuzz.strategies.materialize import Tensors, torch_dtype

CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Reference:
    """out [b, sq, h, d_v]; lse [b, h, sq] (natural log of the softmax denominator); grads in the inputs' shapes.
    Rows past a sequence's length hold 0 (out) and -inf (lse); they are never graded. `logit_size` is the size a
    visible logit's rounding scales with, the largest of: its dot product's terms, scale * sum_d |q_d k_d| (these
    bound |logit| and set its accumulation error when they cancel), and |logit| after softcap and ALiBi. The
    tolerance's floor grows with it."""

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    logit_size: float = 0.0
    empty: torch.Tensor | None = None  # [b, sq] True where a valid query row sees no key at all
    bias_max: float = 0.0              # the largest |ALiBi bias| at a visible position
    dv_terms: float = 0.0              # max over keys of sum_i P_ij |dO_i|: the terms dV sums, where they can cancel
    d_rounding: float = 0.0            # max over rows of |rowsum(dO * (O rounded to the inputs' dtype - O))|
    row_logit_size: torch.Tensor | None = None  # [b, h, sq]: logit_size of each query row's visible logits
    row_dv_terms: torch.Tensor | None = None    # [b, skv, hk]: dv_terms of each key row
    row_rms: torch.Tensor | None = None         # [b, sq, h]: max over channels of sqrt(sum_j (P_ij V_j)^2)
    row_spread: torch.Tensor | None = None      # [b, sq, h]: max over channels of sum_j P_ij |V_j|, the terms a
    #                                             row's output sums (a weight's relative error moves it by that much)
    row_rest_rms: torch.Tensor | None = None    # [b, h, sq]: sqrt(sum_j P_ij^2) over the keys but the row's largest
    row_rest_mass: torch.Tensor | None = None   # [b, h, sq]: sum_j P_ij over the keys but the row's largest
    row_grad_rms: dict | None = None            # "dq" [b, sq, h], "dk" / "dv" [b, skv, hk]: max over channels of
    #                                             sqrt(sum of the squared terms that a fused backward rounds): dS_ij
    #                                             scale K_j (dq), dS_ij scale Q_i (dk), P_ij dO_i (dv)
    row_d_moves: torch.Tensor | None = None     # [b, sq, h]: max over channels of |sum_j P_ij K_j| (with a softcap
    #                                             sum_j P_ij |K_j|), how far dQ row i moves per unit of error in D_i
    #                                             (before the softmax scale)
    row_d_size: torch.Tensor | None = None      # [b, sq, h]: R_i = sum_c |dO_ic| (u |O_ic| + u rms_i + 1e-7), the
    #                                             size of D_i's error a rounded output gives (u: the inputs' dtype)
    key_mass: torch.Tensor | None = None        # [b, skv, hk]: sum_i P_ij over the queries and a GQA group's heads
    key_d_terms: torch.Tensor | None = None     # [b, skv, hk]: max over channels of sum_i P_ij R_i |Q_i| (a GQA
    #                                             group's heads summed): how far dK row j moves when each D_i is off
    #                                             by R_i
    row_p_max: torch.Tensor | None = None       # [b, sq, h], FP8 cases that round P: the largest weight of the row,
    #                                             the sink's included (oracles/fp8.py)
    row_v_sum: torch.Tensor | None = None       # [b, sq, h], likewise: max over channels of sum_j |V_j| over the
    #                                             keys the row sees
    row_v_lo: torch.Tensor | None = None        # [b, sq, h, d_v]: the least value of each channel over the keys the
    #                                             row sees, 0 included with a sink (oracles/hull.py; rows that see no
    #                                             key or past a sequence's length hold no range)
    row_v_hi: torch.Tensor | None = None        # [b, sq, h, d_v]: likewise the largest
    fp8_d_saturation: torch.Tensor | None = None  # [b, sq, h], an FP8 backward with an FP8 output:
    #                                             |rowsum(dO o (O clamped - O))|, what D taken from the saturated
    #                                             output is off by (oracles/fp8_grads.py)
    fp8_grad_terms: dict | None = None          # an FP8 backward's sums (grad_terms.FP8_TERMS), each the max over
    #                                             channels per row: "dq_*" [b, sq, h], "dk_*" / "dv_*" [b, skv, hk]


class _RoundedWeights(torch.autograd.Function):
    """P rounded to `dtype` where the forward pass multiplies it into V (and so dV = P^T dO sees it rounded); the
    gradient passes through to the unrounded P, from which dS is formed."""

    @staticmethod
    def forward(ctx, p, dtype):
        return p.to(dtype).to(p.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _RoundedGradient(torch.autograd.Function):
    """The identity, whose gradient is rounded to `dtype`: dS rounded before dQ = dS K and dK = dS^T Q."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).to(grad.dtype), None


def _contract(equation: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A matrix product the way a half-precision GEMM does it: products accumulated in fp32, the result rounded to
    the dtype (also ~10x faster on CPUs, which have no native fp16 matmul)."""
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.einsum(equation, a.float(), b.float()).to(a.dtype)
    return torch.einsum(equation, a, b)


def _scores(q: torch.Tensor, k: torch.Tensor, h: int, head_map: str) -> torch.Tensor:
    """q [r, h, d], k [j, hk, d] -> q.k [h, r, j]; query head i reads KV head i // g ("div") or i % hk ("mod")."""
    r, hk = q.shape[0], k.shape[1]
    g = h // hk
    if head_map == "div":
        s = _contract("rkgd,jkd->kgrj", q.reshape(r, hk, g, -1), k)
    else:
        s = _contract("rgkd,jkd->gkrj", q.reshape(r, g, hk, -1), k)
    return s.reshape(h, r, -1)


def _weighted_values(p: torch.Tensor, v: torch.Tensor, head_map: str) -> torch.Tensor:
    """p [h, r, j], v [j, hk, d] -> out [r, h, d], with the same head mapping as _scores."""
    h, r, j = p.shape
    hk = v.shape[1]
    g = h // hk
    if head_map == "div":
        out = _contract("kgrj,jkd->rkgd", p.reshape(hk, g, r, j), v)
    else:
        out = _contract("gkrj,jkd->rgkd", p.reshape(g, hk, r, j), v)
    return out.reshape(r, h, -1)


def _transposed_weights(p: torch.Tensor, dout: torch.Tensor, hk: int, head_map: str) -> torch.Tensor:
    """p [h, r, j], dout [r, h, d] -> P^T dout [j, hk, d]: each KV head sums over the query heads that read it, with
    the same head mapping as _scores."""
    h, r, j = p.shape
    g = h // hk
    if head_map == "div":
        return _contract("kgrj,rkgd->jkd", p.reshape(hk, g, r, j), dout.reshape(r, hk, g, -1))
    return _contract("gkrj,rgkd->jkd", p.reshape(g, hk, r, j), dout.reshape(r, g, hk, -1))


def attend(case: Case, q, k, v, rows, *, mask=None, sink=None, alibi=None, sq_n: int, head_map: str = "div",
           bounds: tuple[int | None, int | None] | None = None, scale: float | None = None, terms: bool = True,
           rounding: torch.dtype | None = None, dout_abs: torch.Tensor | None = None,
           rowsum: torch.dtype | None = None, rest_terms: bool = True):
    """Attention for one sequence: q [r, h, d_qk] holds query rows `rows` (ints), k/v [skv_n, hk, d] its valid
    keys. Returns out [r, h, d_v], lse [h, r] in q's dtype, the largest visible |logit| and |ALiBi bias|, which rows
    see no key, (with `terms`) each row's logit size [h, r] and spread [r, h] (else None), the scaled logits
    (before softcap: their gradient is dS) and P, [h, r, j], (with `dout_abs` [r, h, d_v]) P^T |dO|
    [skv_n, hk, d_v], the terms dV sums (else None), and (with `terms`, where some row's logit size passes
    RANGE_LOGITS) the range of the values each row sees, (lo, hi) [r, h, d_v] (oracles/hull.py; else None).
    `bounds` and `scale` override the case's band and scale (the diagnoses grade against such alternatives; a bound
    may then be negative). `rounding` rounds P (before P V) and
    the logits' gradient dS (before dQ, dK) to that dtype, as a fused backward pass does (reference). `rowsum`: the
    LSE's row sum is taken over P = exp(s - max) rounded to that dtype (reference); `rest_terms` (with `terms`) adds
    the weights but each row's largest, as their root sum of squares and their sum [h, r] (else None)."""
    left, right = bounds if bounds is not None else (case.left, case.right)
    skv_n = k.shape[0]
    cols = torch.arange(skv_n, device=q.device)
    off = diagonal_offset(case.alignment, sq_n, skv_n)
    scale = scale if scale is not None else case.softmax_scale
    s = _scores(q, k, case.h, head_map) * scale                                  # [h, r, j]
    if rounding is not None:
        s = _RoundedGradient.apply(s, rounding)  # dS, with softcap's tanh' in it, rounded as the kernel stores it
    scores = s
    visible = band(rows, cols, off, left, right)                                  # [r, j]
    if mask is not None:
        visible = visible & mask
    # A dot product's rounding scales with the sum of its terms' sizes, which can far exceed |q.k| when they cancel
    # (one more matmul: only for the reference whose logit_size the tolerance reads)
    sizes = _scores(q.detach().abs(), k.detach().abs(), case.h, head_map) * abs(scale) if terms else s.detach().abs()
    hidden = ~visible
    sizes = sizes.masked_fill(hidden, 0) if s.numel() else sizes                 # the visible ones' (read twice)
    terms_max = sizes.amax() if s.numel() else s.new_zeros(())
    if case.softcap is not None:  # rounding happens at the raw logit's size, before the cap squashes it
        s = case.softcap * torch.tanh(s / case.softcap)
    bias_max = s.new_zeros(())
    if alibi is not None:
        bias = alibi.to(s.dtype)[:, None, None] * distance(rows, cols, off).to(s.dtype)
        bias_max = bias.detach().masked_fill(hidden, 0).abs().amax() if bias.numel() else bias_max
        s = s - bias
    row_size = None
    logit_abs = s.detach().masked_fill(hidden, 0).abs() if s.numel() else None  # |visible logits|
    if terms and s.numel():
        row_size = torch.maximum(sizes.amax(-1), logit_abs.amax(-1))
    logit_size = torch.maximum(terms_max, logit_abs.amax() if s.numel() else terms_max)
    s = s.masked_fill(hidden, float("-inf"))
    # The softmax of a textbook implementation in fp16 / bf16 (torch.softmax) works in fp32 and rounds only its
    # result, P: the naive baseline does the same. Taking exp(s - lse) with the LSE rounded to the dtype instead
    # scales a whole row by the LSE's rounding (bf16: 2^-9 * |lse|, 1.6 % on a row of 1024 keys), an error no kernel
    # makes, which made the bound 10-60x what correct kernels show and hid one wrong key on a long row.
    wide = torch.promote_types(s.dtype, torch.float32)
    if sink is not None:
        sink_col = sink.to(s.dtype)[:, None, None].expand(-1, s.shape[1], 1)
        lse = torch.logsumexp(torch.cat([s, sink_col], dim=-1).to(wide), dim=-1)  # [h, r]
    else:
        lse = torch.logsumexp(s.to(wide), dim=-1)
    # A row with no visible key: lse is -inf (or the sink) and every weight is 0, so its output is 0. Subtracting a
    # finite stand-in keeps exp() and its gradient free of NaN.
    if rowsum is not None and sink is None and s.numel():
        top = s.to(wide).amax(-1)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        summed = torch.exp(s.to(wide) - top[..., None]).to(rowsum).to(wide).sum(-1)
        lse = torch.where(torch.isfinite(lse), top + torch.log(summed), lse)
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s.to(wide) - lse_safe[..., None]).to(s.dtype)
    if rounding is not None:
        p = _RoundedWeights.apply(p, rounding)
    lse = lse.to(s.dtype)
    spread = rms = fp8_terms = rest = None
    pd = p.detach()
    if terms and (rest_terms or case.fp8_p is not None):
        p_top = pd.amax(-1) if pd.shape[-1] else pd.new_zeros(pd.shape[:2])   # each row's largest weight
    if terms and rest_terms:  # the weights but the row's largest: what a row sum of P rounded to the dtype carries
        rest = (((pd * pd).sum(-1) - p_top * p_top).clamp(min=0).sqrt(), (pd.sum(-1) - p_top).clamp(min=0))
    if terms and v.shape[-1]:
        vd = v.detach()
        spread = _weighted_values(pd, vd.abs(), head_map).amax(-1)
        rms = _weighted_values(pd * pd, vd * vd, head_map).sqrt().amax(-1)
        if case.fp8_p is not None:  # what the subnormals of P's FP8 rounding can move a row by (oracles/fp8.py)
            if sink is not None:
                p_top = torch.maximum(p_top, torch.exp(sink.to(lse.dtype)[:, None] - lse_safe).to(p_top.dtype))
            fp8_terms = (p_top.T, _weighted_values(visible.to(vd.dtype).expand_as(pd), vd.abs(), head_map).amax(-1))
    # P^T |dO| straight from P: the gradient of out . |dO| with respect to v, without a backward pass for it
    dv_terms = _transposed_weights(pd, dout_abs, v.shape[1], head_map) if dout_abs is not None else None
    span = row_ranges(case, visible, v, row_size, sink is not None)   # on rows with large logits: oracles/hull.py
    return (_weighted_values(p, v, head_map), lse, torch.stack([logit_size, bias_max]), ~visible.any(-1), row_size,
            spread, rms, (scores, pd), dv_terms, fp8_terms, rest, span)


def reference(case: Case, t: Tensors, *, dtype: torch.dtype = torch.float64, device=None, head_map: str = "div",
              bounds: tuple[int | None, int | None] | None = None, scale: float | None = None,
              grads: bool | None = None, chunk_bytes: int = CHUNK_BYTES, terms: bool = True,
              rounding: torch.dtype | None = None, d_terms: bool = True, fold_batch: bool = True,
              rowsum: torch.dtype | None = None, rest_terms: bool = True) -> Reference:
    """Output, LSE and (when the case asks, through autograd) dQ, dK, dV computed in `dtype` from the case's own
    low-precision inputs. `head_map`, `bounds` and `scale` give the alternative references the diagnoses use.
    `terms=False` skips dv_terms and d_rounding (an extra backward pass) and the sizes of the logits' terms
    (logit_size is then the largest |logit|), which only the oracle's own reference feeds to the tolerance: the naive
    baselines and the diagnoses' alternatives do not need them. `rounding` (with `dtype` float32) is the backward
    pass of a fused kernel: fp32 everywhere, P and dS rounded to `rounding` before the products that take them, dK /
    dV rounded per query head before a GQA group's sum, every gradient rounded once to `rounding` at the end.
    `rowsum` (with `dtype` float32): the LSE of a kernel that sums P as its P V matmul takes it, rounded to that
    dtype (FlashInfer's prefill: tolerance.ROWSUM_OF_ROUNDED_P); `rest_terms=False` skips row_rest_rms and
    row_rest_mass, which only the LSE of such a family reads. `d_terms=False` skips the D terms (row_d_moves,
    row_d_size, key_mass, key_d_terms), which only grading against the fused baseline reads. A batch of whole
    sequences without an explicit mask is computed in one pass, its sequences folded into the heads (oracles/fold.py;
    `fold_batch=False`: one sequence at a time)."""
    folded = fold(case, t) if fold_batch and head_map == "div" else None
    if folded is not None:  # (the folded tensors have no FP8 inputs: the output is saturated here, as below)
        return _saturated(case, t, unfold(reference(*folded, dtype=dtype, device=device, bounds=bounds, scale=scale,
                                grads=grads, chunk_bytes=chunk_bytes, terms=terms, rounding=rounding, d_terms=d_terms,
                                rowsum=rowsum, rest_terms=rest_terms), case))
    device = device if device is not None else t.q.device
    grads = case.grads if grads is None else grads
    out = torch.zeros(case.b, case.sq, case.h, case.d_v, dtype=dtype, device=device)
    lse = torch.full((case.b, case.h, case.sq), float("-inf"), dtype=dtype, device=device)
    dq = torch.zeros(case.b, case.sq, case.h, case.d_qk, dtype=dtype, device=device) if grads else None
    dk = torch.zeros(case.b, case.skv, case.hk, case.d_qk, dtype=dtype, device=device) if grads else None
    dv = torch.zeros(case.b, case.skv, case.hk, case.d_v, dtype=dtype, device=device) if grads else None
    sink = t.sink.to(device, dtype) if t.sink is not None and case.softmax != "vanilla" else None
    alibi = t.alibi.to(device, dtype) if t.alibi is not None else None
    maxima = torch.zeros(2, dtype=dtype, device=device)  # largest visible |logit|, largest |ALiBi bias|
    empty = torch.zeros(case.b, case.sq, dtype=torch.bool, device=device)
    logit_terms, terms = terms, grads and terms
    row_logit_size = torch.zeros(case.b, case.h, case.sq, dtype=dtype, device=device) if logit_terms else None
    row_spread = torch.zeros(case.b, case.sq, case.h, dtype=dtype, device=device) if logit_terms else None
    row_rms = torch.zeros(case.b, case.sq, case.h, dtype=dtype, device=device) if logit_terms else None
    row_rest = torch.zeros(2, case.b, case.h, case.sq, dtype=dtype, device=device) if logit_terms and rest_terms \
        else None
    fp8_rows = logit_terms and case.fp8_p is not None
    row_p_max = torch.zeros(case.b, case.sq, case.h, dtype=dtype, device=device) if fp8_rows else None
    row_v_sum = torch.zeros(case.b, case.sq, case.h, dtype=dtype, device=device) if fp8_rows else None
    span = None   # the value ranges (oracles/hull.py), made when a chunk keeps one; rows of other chunks unbounded
    dv_terms = torch.zeros(case.b, case.skv, case.hk, case.d_v, dtype=dtype, device=device) if terms else None
    grad_terms = {name: torch.zeros(case.b, *((case.sq, case.h) if name == "dq" else (case.skv, case.hk)),
                                    case.d_v if name == "dv" else case.d_qk, dtype=dtype, device=device)
                  for name in ("dq", "dk", "dv")} if terms else None
    fp8_terms = {name: torch.zeros(case.b, *((case.sq, case.h) if name.startswith("dq") else (case.skv, case.hk)),
                                   case.d_v if name.startswith("dv") else case.d_qk, dtype=dtype, device=device)
                 for name in FP8_TERMS} if terms and case.fp8_dout is not None else None
    d_terms = {"moves": torch.zeros(case.b, case.sq, case.h, dtype=dtype, device=device),
               "size": torch.zeros(case.b, case.sq, case.h, dtype=dtype, device=device),
               "dk": torch.zeros(case.b, case.skv, case.hk, case.d_qk, dtype=dtype, device=device),
               "mass": torch.zeros(case.b, case.skv, case.hk, dtype=dtype, device=device)} if terms and d_terms else None
    # A fused kernel that serves GQA computes dK / dV per query head and rounds them to the dtype before summing the
    # group (FlashAttention-2 writes dk_expanded in the dtype, then sums it): the baseline keeps them per head, in
    # fp32 over every chunk of queries, and rounds them once at the end.
    per_head = grads and rounding is not None and head_map == "div" and case.h != case.hk
    if per_head:
        dk = torch.zeros(case.b, case.skv, case.h, case.d_qk, dtype=dtype, device=device)
        dv = torch.zeros(case.b, case.skv, case.h, case.d_v, dtype=dtype, device=device)
    for n, (sq_n, skv_n) in enumerate(zip(case.lens_q, case.lens_kv)):
        if sq_n == 0:
            continue
        q_n = t.q[n, :sq_n].to(device, dtype)
        k_n = t.k[n, :skv_n].to(device, dtype).requires_grad_(grads)
        v_n = t.v[n, :skv_n].to(device, dtype).requires_grad_(grads)
        equal_ds = grads and terms and repeats_rows(v_n.detach())   # only then can a row's dS repeat
        per_row = max(1, case.h * max(skv_n, 1) * torch.finfo(dtype).bits // 8 * 3)
        step = max(1, min(sq_n, chunk_bytes // per_row))
        for r0 in range(0, sq_n, step):
            r1 = min(r0 + step, sq_n)
            rows = torch.arange(r0, r1, device=device)
            q_c = q_n[r0:r1].clone().requires_grad_(grads)   # a copy, as indexing by `rows` made: a leaf of its own
            m = t.mask[n, 0, r0:r0 + len(rows), :skv_n].to(device) if t.mask is not None else None
            with torch.set_grad_enabled(grads):
                k_c, v_c = k_n, v_n
                if head_map == "div" and case.h != case.hk:
                    # Textbook GQA repeats the KV heads, so dK / dV are per-query-head sums rounded in the dtype
                    # before the group sum: the naive baseline must carry that rounding too.
                    k_c, v_c = (x.repeat_interleave(case.h // case.hk, dim=1) for x in (k_n, v_n))
                d_c = t.dout[n, r0:r1].to(device, dtype) if grads else None
                o_c, l_c, m_c, e_c, size_c, spread_c, rms_c, (s_c, p_c), dv_c, fp8_c, rest_c, span_c = attend(
                    case, q_c, k_c, v_c, rows, mask=m, sink=sink, alibi=alibi, sq_n=sq_n, head_map=head_map,
                    bounds=bounds, scale=scale, terms=logit_terms, rounding=rounding, rowsum=rowsum,
                    rest_terms=rest_terms, dout_abs=d_c.abs() if terms else None)
            # rows r0..r1 written as slices: the same values as indexing by `rows`, without a scatter per tensor
            if size_c is not None:
                row_logit_size[n, :, r0:r1] = size_c
            if rest_c is not None:
                row_rest[:, n, :, r0:r1] = torch.stack(rest_c)
            if spread_c is not None:
                row_spread[n, r0:r1], row_rms[n, r0:r1] = spread_c, rms_c
            if fp8_c is not None:
                row_p_max[n, r0:r1], row_v_sum[n, r0:r1] = fp8_c
            if span_c is not None:
                span = span or tuple(torch.full((case.b, case.sq, case.h, case.d_v), fill, dtype=dtype, device=device)
                                     for fill in (float("-inf"), float("inf")))
                span[0][n, r0:r1], span[1][n, r0:r1] = span_c
            out[n, r0:r1] = o_c.detach()
            maxima = torch.maximum(maxima, m_c)
            empty[n, r0:r1] = e_c
            lse[n, :, r0:r1] = l_c.detach()
            if grads:
                if terms:  # P^T |dO|, summed over the query heads of each KV head (a repeated v's gradient)
                    if head_map == "div" and case.h != case.hk:  # head i of the repeated KV is KV head i // g
                        dv_c = dv_c.unflatten(1, (case.hk, case.h // case.hk)).sum(2)
                    dv_terms[n, :skv_n] += dv_c
                wrt = (q_c, k_c, v_c) if per_head else (q_c, k_n, v_n)
                if terms:
                    g_q, g_k, g_v, g_s = torch.autograd.grad(o_c, (*wrt, s_c), d_c)
                    add_grad_terms(case, grad_terms, n, r0, r1, case.softmax_scale if scale is None else scale,
                                   g_s, p_c, q_c.detach(), k_c.detach(), d_c, equal_ds)
                    if fp8_terms is not None:
                        add_fp8_terms(case, fp8_terms, n, r0, r1, case.softmax_scale if scale is None else scale,
                                      g_s, p_c, q_c.detach(), k_c.detach(), d_c)
                    if d_terms is not None:
                        add_d_terms(case, d_terms, n, r0, r1, p_c, q_c.detach(), k_c.detach(), o_c.detach(), d_c,
                                    rms_c)
                else:
                    g_q, g_k, g_v = torch.autograd.grad(o_c, wrt, d_c)
                dq[n, r0:r1] = g_q
                dk[n, :skv_n] += g_k
                dv[n, :skv_n] += g_v
    if grads and rounding is not None:
        def rounded(x: torch.Tensor) -> torch.Tensor:
            return x.to(rounding).to(dtype)
        if per_head:
            dk, dv = (rounded(x).unflatten(2, (case.hk, case.h // case.hk)).sum(3) for x in (dk, dv))
        dq, dk, dv = rounded(dq), rounded(dk), rounded(dv)
    d_rounding = 0.0
    if terms and out.numel():
        # Backward passes of the FlashAttention kind take D = rowsum(dO * O) from the output they stored, rounded to
        # the inputs' dtype: D moves by this much, and dQ / dK with it (oracles/grade.py, _gradient_terms).
        shift = ((out.to(t.q.dtype).to(dtype) - out) * t.dout.to(device, dtype)).sum(-1)
        d_rounding = float(shift.abs().max())
    return _saturated(case, t, Reference(out=out, lse=lse, dq=dq, dk=dk, dv=dv, logit_size=float(maxima[0]), empty=empty,
                     bias_max=float(maxima[1]),
                     dv_terms=float(dv_terms.abs().max()) if terms and dv_terms.numel() else 0.0,
                     row_dv_terms=dv_terms.abs().amax(-1) if terms and dv_terms.numel() else None,
                     d_rounding=d_rounding, row_logit_size=row_logit_size, row_spread=row_spread,
                     row_rms=row_rms, row_rest_rms=None if row_rest is None else row_rest[0],
                     row_rest_mass=None if row_rest is None else row_rest[1],
                     row_grad_rms={name: x.sqrt().amax(-1) for name, x in grad_terms.items()} if terms else None,
                     **({} if d_terms is None else dict(
                         row_d_moves=d_terms["moves"], row_d_size=d_terms["size"], key_mass=d_terms["mass"],
                         key_d_terms=d_terms["dk"].amax(-1) if case.d_qk else None)),
                     row_p_max=row_p_max, row_v_sum=row_v_sum, row_v_lo=span and span[0],
                     row_v_hi=span and span[1],
                     fp8_grad_terms=fp8_terms and {name: x.amax(-1) for name, x in fp8_terms.items()}))


def _saturated(case: Case, t: Tensors, ref: Reference) -> Reference:
    """An FP8 output and FP8 gradients saturate at their format's largest value (strategies/fp8.py,
    fp8_backward.py): the reference's clamped."""
    if t.fp8 is None or (case.fp8_out is None and case.fp8_dqkv is None):
        return ref
    out = saturate(case, ref.out, t.fp8)
    clamped = None
    if case.fp8_dout is not None and case.fp8_out is not None and ref.dq is not None:
        clamped = ((out - ref.out) * t.dout.to(out)).sum(-1).abs()
    return dataclasses.replace(ref, out=out, fp8_d_saturation=clamped,
                               **saturate_grads(case, {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}, t.fp8))
