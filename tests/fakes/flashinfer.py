"""A fake FlashInfer 0.7.2: the documented semantics of its single / batch prefill and decode entry points in plain
torch, recording every call (`calls`), so the adapters' argument translation is tested on the CPU.

Bands are bottom-right aligned (off = kv_len - qo_len); causal sets right = 0; window_left >= 0 keeps keys
j >= i + off - window_left (-1: unbounded); logits_soft_cap caps the scaled logits; the LSE is returned in base 2,
[qo_len, h] per request. Paged caches are read through kv_indptr / kv_indices / kv_last_page_len only, in the
layout the wrapper was built with (NHD: pages [page_size, hk, d], HND: [hk, page_size, d]); the fake checks
1 <= kv_last_page_len <= page_size as the docs demand. Knobs: `lse_base` (2, or e to plant a wrong convention) and
`last_page_off` (added to every kv_last_page_len read: +1 plants a read one slot past the cache).
"""

from __future__ import annotations

import math
import sys
import types

import torch

from tests.fakes.attention import attend, band_keep


class Knobs:
    lse_base = 2.0
    last_page_off = 0


def _one(q, k, v, *, causal=False, sm_scale=None, window_left=-1, logits_soft_cap=None, knobs=Knobs):
    """q [qo, h, d], k / v [kv, hk, d] NHD: (out [qo, h, d], lse [qo, h] in knobs.lse_base)."""
    off = k.shape[0] - q.shape[0]
    keep = band_keep(q.shape[0], k.shape[0], off, None if window_left < 0 else window_left, 0 if causal else None,
                     q.device)
    out, lse = attend(q, k, v, keep, scale=sm_scale, softcap=logits_soft_cap or 0.0)
    return out, (lse / math.log(knobs.lse_base)).transpose(0, 1).contiguous()


def _nhd(x, kv_layout):
    return x.transpose(0, 1) if kv_layout == "HND" else x


def make_flashinfer(calls: list, knobs=Knobs) -> dict:
    def single_prefill_with_kv_cache(q, k, v, custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                     sm_scale=None, window_left=-1, logits_soft_cap=None, backend="auto",
                                     return_lse=False, **_):
        calls.append({"fn": "single_prefill_with_kv_cache", "causal": causal, "kv_layout": kv_layout,
                      "window_left": window_left, "sm_scale": sm_scale, "logits_soft_cap": logits_soft_cap,
                      "backend": backend, "k_shape": tuple(k.shape)})
        out, lse = _one(q, _nhd(k, kv_layout), _nhd(v, kv_layout), causal=causal, sm_scale=sm_scale,
                        window_left=window_left, logits_soft_cap=logits_soft_cap, knobs=knobs)
        return (out, lse) if return_lse else out

    def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", sm_scale=None,
                                    window_left=-1, logits_soft_cap=None, **_):
        calls.append({"fn": "single_decode_with_kv_cache", "kv_layout": kv_layout, "window_left": window_left,
                      "sm_scale": sm_scale, "logits_soft_cap": logits_soft_cap, "q_shape": tuple(q.shape)})
        out, _ = _one(q[None], _nhd(k, kv_layout), _nhd(v, kv_layout), sm_scale=sm_scale, window_left=window_left,
                      logits_soft_cap=logits_soft_cap, knobs=knobs)
        return out[0]

    def paged_sequences(indptr, indices, last, cache, kv_layout, page_size):
        k_cache, v_cache = cache
        for n in range(len(indptr) - 1):
            pages = indices[int(indptr[n]):int(indptr[n + 1])].tolist()
            if not 1 <= int(last[n]) <= page_size:
                raise ValueError(f"kv_last_page_len[{n}]={int(last[n])} must be in 1..{page_size}")
            length = (len(pages) - 1) * page_size + int(last[n]) + knobs.last_page_off
            k = torch.cat([_nhd(k_cache[p], kv_layout) for p in pages]) if pages else k_cache[:0].flatten(0, 1)
            v = torch.cat([_nhd(v_cache[p], kv_layout) for p in pages]) if pages else v_cache[:0].flatten(0, 1)
            if length > k.shape[0]:  # past the last named page: the next pool page, as memory would hold it
                k = torch.cat([k, _nhd(k_cache[(pages[-1] + 1) % k_cache.shape[0]], kv_layout)])
                v = torch.cat([v, _nhd(v_cache[(pages[-1] + 1) % v_cache.shape[0]], kv_layout)])
            yield k[:length], v[:length]

    class _Wrapper:
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto", **_):
            self.kv_layout, self.backend, self.plan_args = kv_layout, backend, None

        def _record(self, fn, **kw):
            calls.append({"fn": fn, "kv_layout": self.kv_layout, "backend": self.backend, **kw})

    class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, causal=False, sm_scale=None, window_left=-1,
                 logits_soft_cap=None, q_data_type=None, kv_data_type=None, **_):
            self.plan_args = dict(qo_indptr=qo_indptr.tolist(), kv_indptr=paged_kv_indptr.tolist(),
                                  kv_indices=paged_kv_indices.tolist(), last=paged_kv_last_page_len.tolist(),
                                  page_size=page_size, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                  logits_soft_cap=logits_soft_cap, heads=(num_qo_heads, num_kv_heads, head_dim_qk))

        def run(self, q, paged_kv_cache, return_lse=False, **_):
            a = self.plan_args
            self._record("BatchPrefillWithPagedKVCacheWrapper.run", **a)
            outs, lses = [], []
            seqs = paged_sequences(a["kv_indptr"], torch.tensor(a["kv_indices"]), a["last"], paged_kv_cache,
                                   self.kv_layout, a["page_size"])
            for n, (k, v) in enumerate(seqs):
                q_n = q[a["qo_indptr"][n]:a["qo_indptr"][n + 1]]
                out, lse = _one(q_n, k, v, causal=a["causal"], sm_scale=a["sm_scale"], window_left=a["window_left"],
                                logits_soft_cap=a["logits_soft_cap"], knobs=knobs)
                outs.append(out)
                lses.append(lse)
            out, lse = torch.cat(outs), torch.cat(lses)
            return (out, lse) if return_lse else out

    class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=None,
                 kv_data_type=None, sm_scale=None, **_):
            self.plan_args = dict(kv_indptr=indptr.tolist(), kv_indices=indices.tolist(),
                                  last=last_page_len.tolist(), page_size=page_size, sm_scale=sm_scale,
                                  window_left=window_left, logits_soft_cap=logits_soft_cap,
                                  heads=(num_qo_heads, num_kv_heads, head_dim))

        def run(self, q, paged_kv_cache, return_lse=False, **_):
            a = self.plan_args
            self._record("BatchDecodeWithPagedKVCacheWrapper.run", q_shape=tuple(q.shape), **a)
            outs, lses = [], []
            seqs = paged_sequences(a["kv_indptr"], torch.tensor(a["kv_indices"]), a["last"], paged_kv_cache,
                                   self.kv_layout, a["page_size"])
            for n, (k, v) in enumerate(seqs):
                out, lse = _one(q[n:n + 1], k, v, sm_scale=a["sm_scale"], window_left=a["window_left"],
                                logits_soft_cap=a["logits_soft_cap"], knobs=knobs)
                outs.append(out)
                lses.append(lse)
            out, lse = torch.cat(outs), torch.cat(lses)
            return (out, lse) if return_lse else out

    class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=False, sm_scale=None,
                 window_left=-1, logits_soft_cap=None, q_data_type=None, kv_data_type=None, **_):
            self.plan_args = dict(qo_indptr=qo_indptr.tolist(), kv_indptr=kv_indptr.tolist(), causal=causal,
                                  sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap)

        def run(self, q, k, v, return_lse=False, **_):
            a = self.plan_args
            self._record("BatchPrefillWithRaggedKVCacheWrapper.run", **a)
            outs, lses = [], []
            for n in range(len(a["qo_indptr"]) - 1):
                qs, ks = slice(*a["qo_indptr"][n:n + 2]), slice(*a["kv_indptr"][n:n + 2])
                out, lse = _one(q[qs], k[ks], v[ks], causal=a["causal"], sm_scale=a["sm_scale"],
                                window_left=a["window_left"], logits_soft_cap=a["logits_soft_cap"], knobs=knobs)
                outs.append(out)
                lses.append(lse)
            out, lse = torch.cat(outs), torch.cat(lses)
            return (out, lse) if return_lse else out

    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.7.2+fake"
    for obj in (single_prefill_with_kv_cache, single_decode_with_kv_cache, BatchPrefillWithPagedKVCacheWrapper,
                BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper):
        setattr(fi, obj.__name__, obj)
    return {"flashinfer": fi}


def install(monkeypatch, modules: dict) -> None:
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
