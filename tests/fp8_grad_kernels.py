"""FP8 kernels with an FP8 backward (fuzz/backends/fp8_contract.py, strategies/fp8_backward.py), in plain torch on
the CPU with torch's float8 dtypes: a correct one and one planted bug each.

    python3 -m attnfuzz run --backend tests.fp8_grad_kernels:fp8_attention_grads

The forward is tests/fp8_kernels.py's. The backward follows cuDNN's sdpa_fp8_backward graph: P = exp(S - lse)
recomputed in fp32; dV = P^T dO with P times p_scale rounded to p_dtype (divided back); dP = dO V^T;
D = rowsum(dO o O) over the output the forward returned (dequantised where FP8); dS = scale * P o (dP - D) (times
softcap's tanh'), rounded as dS * ds_scale to ds_dtype (divided back); dQ = dS K, dK = dS^T Q; each gradient
returned in grad_dtype: sat(round(dX / descale)) per head where FP8.
"""

from __future__ import annotations

import torch

from tests.fp8_kernels import LARGEST, _attention, _biased


def _encoded(x: torch.Tensor, dtype, descale, bug_head: bool = False) -> torch.Tensor:
    """x [b, s, heads, d] in `dtype`: sat(round(x / descale)) per head where dtype is FP8."""
    if dtype not in LARGEST:
        return x.to(dtype)
    d = descale.roll(1) if bug_head and descale.shape[0] > 1 else descale   # head g takes head g - 1's descale
    return (x / d[None, None, :, None]).clamp(-LARGEST[dtype], LARGEST[dtype]).to(dtype)


def _backward(q, k, v, out, lse, dout, *, causal, window, bottom_right, scale, q_descale, k_descale, v_descale,
              dout_descale, p_dtype, p_scale, ds_dtype, ds_scale, softcap, alibi_slopes, mask, seqlens_q,
              seqlens_kv, bug):
    b, sq, h, d_qk = q.shape
    skv, hk, d_v = k.shape[1], k.shape[2], v.shape[3]
    g = h // hk
    dq, dk, dv = torch.zeros(b, sq, h, d_qk), torch.zeros(b, skv, hk, d_qk), torch.zeros(b, skv, hk, d_v)
    lens_q = seqlens_q.tolist() if seqlens_q is not None else [sq] * b
    lens_kv = seqlens_kv.tolist() if seqlens_kv is not None else [skv] * b
    do_scale = torch.ones_like(dout_descale) if bug == "dout_descale_ignored" else dout_descale
    left, right = window[0], 0 if causal else window[1]
    for n in range(b):
        sq_n, skv_n = lens_q[n], lens_kv[n]
        if sq_n == 0 or skv_n == 0:
            continue
        qf = q[n, :sq_n].float() * q_descale[None, :, None]
        kf = (k[n, :skv_n].float() * k_descale[None, :, None]).repeat_interleave(g, 1)
        vf = (v[n, :skv_n].float() * v_descale[None, :, None]).repeat_interleave(g, 1)
        do = dout[n, :sq_n].float() * do_scale[None, :, None]
        raw = torch.einsum("qhd,khd->hqk", qf, kf) * scale
        s, slope = raw, torch.ones_like(raw)
        if softcap is not None:
            s = softcap * torch.tanh(raw / softcap)
            slope = 1 - (s / softcap).square()
        s, keep = _biased(s, n, left, right, bottom_right, alibi_slopes, mask)
        row_lse = lse[n, :, :sq_n, None]
        p = torch.where(keep & torch.isfinite(row_lse), torch.exp(s - torch.where(torch.isfinite(row_lse), row_lse, 0)),
                        0.0)                                                             # [h, q, k]
        pv = p
        if p_dtype is not None:   # P rounded before dV = P^T dO, with the forward's p_scale
            pv = (p * p_scale).to(p_dtype).float()
            pv = pv if bug == "dv_p_scale_kept" else pv / p_scale   # the bug: p_scale not divided out
        dv[n, :skv_n] = torch.einsum("hqk,qhd->khd", pv, do).unflatten(1, (hk, g)).sum(2)
        dp = torch.einsum("qhd,khd->hqk", do, vf)
        d_row = (do * out[n, :sq_n].float()).sum(-1).T[..., None]                      # [h, q, 1], from the output
        ds = scale * p * (dp - d_row) * slope
        if ds_dtype is not None:
            quant = (p_scale or 1.0) if bug == "ds_forward_scale" else ds_scale   # the forward's P scale for dS's
            ds = (ds * quant).to(ds_dtype).float() / ds_scale
        dq[n, :sq_n] = torch.einsum("hqk,khd->qhd", ds, kf)
        dk[n, :skv_n] = torch.einsum("hqk,qhd->khd", ds, qf).unflatten(1, (hk, g)).sum(2)
    return dq, dk, dv


def _kernel(bug, doc):
    def attention(q, k, v, *, causal, window, bottom_right, scale, q_descale, k_descale, v_descale, dout=None,
                  dout_descale=None, out_dtype=None, out_descale=None, p_dtype=None, p_scale=None, ds_dtype=None,
                  ds_scale=None, grad_dtype=None, dq_descale=None, dk_descale=None, dv_descale=None, softcap=None,
                  alibi_slopes=None, sink_logits=None, mask=None, seqlens_q=None, seqlens_kv=None):
        out, lse = _attention(q, k, v, causal=causal, window=window, bottom_right=bottom_right, scale=scale,
                              q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
                              out_descale=out_descale, p_dtype=p_dtype, p_scale=p_scale, softcap=softcap,
                              alibi_slopes=alibi_slopes, sink_logits=sink_logits, mask=mask, seqlens_q=seqlens_q,
                              seqlens_kv=seqlens_kv, block_table=None, k_cache=None, v_cache=None,
                              cache_seqlens=None)
        if dout is None:
            return out, lse
        real_out = out.float() * out_descale if out_descale is not None else out.float()
        dq, dk, dv = _backward(q, k, v, real_out, lse, dout, causal=causal, window=window, bottom_right=bottom_right,
                               scale=scale, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                               dout_descale=dout_descale, p_dtype=p_dtype, p_scale=p_scale, ds_dtype=ds_dtype,
                               ds_scale=ds_scale, softcap=softcap, alibi_slopes=alibi_slopes, mask=mask,
                               seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, bug=bug)
        return (out, lse, _encoded(dq, grad_dtype, dq_descale),
                _encoded(dk, grad_dtype, dk_descale, bug_head=bug == "dk_head_scale"),
                _encoded(dv, grad_dtype, dv_descale))
    attention.__name__ = attention.__qualname__ = bug or "fp8_attention_grads"
    attention.__doc__ = doc
    return attention


fp8_attention_grads = _kernel(None, "Correct.")
dout_descale_ignored = _kernel("dout_descale_ignored", "Planted: dO's descale not applied.")
ds_forward_scale = _kernel("ds_forward_scale", "Planted: dS quantised with the forward's P scale (p_scale, 1 where P "
                                               "is not rounded) and divided back by ds_scale.")
dv_p_scale_kept = _kernel("dv_p_scale_kept", "Planted: dV from P quantised with p_scale not divided out.")
dk_head_scale = _kernel("dk_head_scale", "Planted: each FP8 dK head quantised with the previous KV head's descale.")
BUGS = ("dout_descale_ignored", "ds_forward_scale", "dv_p_scale_kept", "dk_head_scale")
