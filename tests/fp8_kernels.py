"""FP8 kernels of the bring-your-own-kernel contract (fuzz/backends/fp8_contract.py), in plain torch on the CPU: a
correct one and one planted bug each, written with torch's float8 dtypes.

    python3 -m attnfuzz run --backend tests.fp8_kernels:fp8_attention

The correct kernel dequantises q, k and v with their descales, computes the logits and the softmax in fp32, quantises
P as cuDNN's FP8 forward does where the case asks (exp(s - max) times p_scale, rounded to p_dtype, divided back; the
row sum from the unrounded weights), and writes the output in the dtype, or in FP8: O / out_descale saturated at the
format's largest value and rounded.
"""

from __future__ import annotations

import torch

LARGEST = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _descales(descale, n, skv, hk, block_table, page_size, bug):
    """Sequence n's descale of each key, [skv, hk]: per KV head ([hk]) or per pool page ([num_pages, hk])."""
    if descale.dim() == 2:
        j = torch.arange(skv)
        logical = j // page_size
        if bug == "page_scale_off":   # the first key of every page but the first reads the previous page's scale
            logical = torch.where((j % page_size == 0) & (j > 0), logical - 1, logical)
        return descale[block_table[n, logical].long()]
    d = descale.clone()
    if bug == "head_scale_swapped" and d.shape[0] > 1:   # the first KV head reads the last one's scale, and back
        d[0], d[-1] = descale[-1], descale[0]
    return d[None, :].expand(skv, hk)


def _keys(x8, n, skv, block_table):
    """Sequence n's first skv keys [skv, hk, d]: from the pages through the block table, or from x8."""
    if block_table is None:
        return x8[n, :skv]
    return x8[block_table[n].long()].flatten(0, 1)[:skv]


def _biased(s, n, left, right, bottom_right, alibi_slopes, mask):
    """Sequence n's logits s [h, sq, skv] with ALiBi's bias, and the keys each query sees [sq, skv]."""
    sq_n, skv_n = s.shape[-2:]
    i, j = torch.arange(sq_n)[:, None], torch.arange(skv_n)[None, :]
    off = skv_n - sq_n if bottom_right else 0
    if alibi_slopes is not None:
        s = s - alibi_slopes.float()[:, None, None] * (i + off - j).abs()
    keep = torch.ones(sq_n, skv_n, dtype=torch.bool)
    if left is not None:
        keep &= j >= i + off - left
    if right is not None:
        keep &= j <= i + off + right
    if mask is not None:
        keep &= mask[n, 0, :sq_n, :skv_n]
    return s, keep


def _attention(q, k, v, *, causal, window, bottom_right, scale, q_descale, k_descale, v_descale, out_dtype,
               out_descale, p_dtype, p_scale, softcap, alibi_slopes, sink_logits, mask, seqlens_q, seqlens_kv,
               block_table, k_cache, v_cache, cache_seqlens, bug=None):
    paged = block_table is not None
    k8, v8 = (k_cache, v_cache) if paged else (k, v)
    if bug == "e5m2_as_e4m3" and v8.dtype == torch.float8_e5m2:   # e5m2 bits decoded as e4m3
        v8 = v8.view(torch.float8_e4m3fn)
    b, sq, h, _ = q.shape
    hk, d_v = k8.shape[2], v8.shape[3]
    lens_q = seqlens_q.tolist() if seqlens_q is not None else [sq] * b
    lens_kv = (cache_seqlens.tolist() if paged else seqlens_kv.tolist() if seqlens_kv is not None
               else [k8.shape[1]] * b)
    dq = q_descale * q_descale if bug == "scale_twice" else q_descale
    out = torch.zeros(b, sq, h, d_v)
    lse = torch.full((b, h, sq), float("-inf"))
    left, right = window[0], 0 if causal else window[1]
    for n in range(b):
        sq_n, skv_n = lens_q[n], lens_kv[n]
        if sq_n == 0:
            continue
        page = k8.shape[1] if paged else None
        kd, vd = (_descales(d, n, skv_n, hk, block_table, page, bug) for d in (k_descale, v_descale))
        qf = q[n, :sq_n].float() * dq[None, :, None]
        kf = (_keys(k8, n, skv_n, block_table).float() * kd[..., None]).repeat_interleave(h // hk, 1)
        vf = (_keys(v8, n, skv_n, block_table).float() * vd[..., None]).repeat_interleave(h // hk, 1)
        s = torch.einsum("qhd,khd->hqk", qf, kf) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        s, keep = _biased(s, n, left, right, bottom_right, alibi_slopes, mask)
        s = s.masked_fill(~keep, float("-inf"))
        m = s.amax(-1, keepdim=True) if skv_n else torch.full((h, sq_n, 1), float("-inf"))
        if sink_logits is not None:   # the sink in the maximum: exp(sink - m) must not overflow on far rows
            m = torch.maximum(m, sink_logits.float()[:, None, None])
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        total = e.sum(-1, keepdim=True)
        if sink_logits is not None:
            total = total + torch.exp(sink_logits.float()[:, None, None] - m)
        if p_dtype is not None:   # P in FP8 before P V (the row sum above is the unrounded one)
            e = (e * p_scale).to(p_dtype).float() / p_scale
        o = torch.einsum("hqk,khd->qhd", e, vf) / torch.where(total > 0, total, 1.0).transpose(0, 1)
        out[n, :sq_n] = o
        lse[n, :, :sq_n] = (m + torch.log(total)).squeeze(-1)
    if out_descale is None:
        return out.to(out_dtype), lse
    x = out / out_descale
    largest = LARGEST[out_dtype]
    if bug == "no_saturation":   # a non-saturating convert: past the largest value e4m3 gives NaN, e5m2 inf
        over = x.abs() > largest * 1.0625
        return torch.where(over, float("nan") if out_dtype == torch.float8_e4m3fn else x.sign() * float("inf"),
                           x).to(out_dtype), lse
    return x.clamp(-largest, largest).to(out_dtype), lse


def _kernel(bug, doc):
    def attention(q, k, v, *, causal, window, bottom_right, scale, q_descale, k_descale, v_descale, out_dtype=None,
                  out_descale=None, p_dtype=None, p_scale=None, softcap=None, alibi_slopes=None, sink_logits=None,
                  mask=None, seqlens_q=None, seqlens_kv=None, block_table=None, k_cache=None, v_cache=None,
                  cache_seqlens=None):
        return _attention(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale,
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
                          out_descale=out_descale, p_dtype=p_dtype, p_scale=p_scale, softcap=softcap,
                          alibi_slopes=alibi_slopes, sink_logits=sink_logits, mask=mask, seqlens_q=seqlens_q,
                          seqlens_kv=seqlens_kv, block_table=block_table, k_cache=k_cache, v_cache=v_cache,
                          cache_seqlens=cache_seqlens, bug=bug)
    attention.__name__ = attention.__qualname__ = bug or "fp8_attention"
    attention.__doc__ = doc
    return attention


fp8_attention = _kernel(None, "Correct.")
scale_twice = _kernel("scale_twice", "Planted: q's descale applied twice.")
head_scale_swapped = _kernel("head_scale_swapped", "Planted: the first and last KV heads' k / v descales swapped.")
e5m2_as_e4m3 = _kernel("e5m2_as_e4m3", "Planted: an e5m2 v decoded as e4m3 (its bits read in the other format).")
no_saturation = _kernel("no_saturation", "Planted: the FP8 output converted without saturation (NaN / inf past "
                                         "the largest value).")
page_scale_off = _kernel("page_scale_off", "Planted: the first key of each page after the first takes the previous "
                                           "page's descale.")
BUGS = ("scale_twice", "head_scale_swapped", "e5m2_as_e4m3", "no_saturation", "page_scale_off")
