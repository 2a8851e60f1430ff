"""A fake FlashInfer 0.7.2: the documented semantics of its single / batch prefill and decode entry points in plain
torch, recording every call (`calls`), so the adapters' argument translation is tested on the CPU.

Bands are bottom-right aligned (off = kv_len - qo_len); causal sets right = 0; window_left >= 0 keeps keys
j >= i + off - window_left (-1: unbounded); logits_soft_cap caps the scaled logits; the LSE is returned in base 2,
[qo_len, h] per request. Paged caches are read through kv_indptr / kv_indices / kv_last_page_len only, in the
layout the wrapper was built with (NHD: pages [page_size, hk, d], HND: [hk, page_size, d]); the fake checks
1 <= kv_last_page_len <= page_size as the docs demand. A custom_mask (bool, [qo_len, kv_len] or the requests'
masks flattened) or packed_custom_mask (little-endian bits) replaces causal and the window; the paged cache is a
(k, v) tuple or one tensor with k and v on dim 1; sm_scale None is 1/sqrt(head_dim), logits_soft_cap 0 or None
caps nothing. Knobs, each planting one wrong convention:
  lse_base          2, or e: the LSE in the wrong base
  last_page_off     added to every kv_last_page_len read: +1 reads one slot past the cache
  wide_window_empty a window_left >= kv_len hides every key (a bound read past the sequence as "nothing")
  packed_bitorder   "big": the packed custom mask read most-significant bit first
  cap_zero_is_cap   logits_soft_cap=0.0 taken as a cap: 0 * tanh(x / 0)
  kv_tensor_swapped the one-tensor pool unbound with k and v swapped
  tensor_cores_gqa  use_tensor_cores: query head i reads KV head i % hk instead of i // (h / hk)
  default_scale     what sm_scale=None stands for (None: 1/sqrt(head_dim))
  decode_lse_squeezed  single_decode_with_kv_cache(use_tensor_cores=True, return_lse=True) squeezes dim 0 of its
                    [h] LSE, as FlashInfer 0.7.2.post1's decode.py does: a 0-d LSE for one head
The paged wrappers take an FP8 KV cache as FlashInfer 0.7.2.post1 does: plan(q_data_type=, kv_data_type=) names
the dtypes and run() refuses q or k_cache in another (ValueError); the FP8 pages are read as values, sm_scale is
multiplied by run(k_scale=) before the kernel and the output (in q's dtype) by v_scale after it. FP8 knobs:
  v_scale_ignored   run()'s v_scale never applied
  k_scale_twice     sm_scale multiplied by k_scale twice
  e5m2_as_e4m3      an e5m2 cache's bytes read as e4m3
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
    wide_window_empty = False
    packed_bitorder = "little"
    cap_zero_is_cap = False
    kv_tensor_swapped = False
    tensor_cores_gqa = False
    default_scale = None
    decode_lse_squeezed = False
    v_scale_ignored = False
    k_scale_twice = False
    e5m2_as_e4m3 = False


def _one(q, k, v, *, causal=False, sm_scale=None, window_left=-1, logits_soft_cap=None, keep=None, cores=False,
         knobs=Knobs):
    """q [qo, h, d], k / v [kv, hk, d] NHD, keep a custom mask [qo, kv] or None: (out [qo, h, d], lse [qo, h] in
    knobs.lse_base)."""
    off = k.shape[0] - q.shape[0]
    if keep is None:
        keep = band_keep(q.shape[0], k.shape[0], off, None if window_left < 0 else window_left,
                         0 if causal else None, q.device)
        if knobs.wide_window_empty and window_left >= k.shape[0]:
            keep = torch.zeros_like(keep)
    if sm_scale is None:
        sm_scale = knobs.default_scale
    if cores and knobs.tensor_cores_gqa:
        order = torch.arange(q.shape[1]) % k.shape[1]          # head i reads KV head i % hk
        k, v = k[:, order], v[:, order]
    out, lse = attend(q, k, v, keep, scale=sm_scale, softcap=logits_soft_cap or 0.0)
    if knobs.cap_zero_is_cap and logits_soft_cap == 0.0:
        out, lse = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
    return out, (lse / math.log(knobs.lse_base)).transpose(0, 1).contiguous()


def _unpacked(packed, count, bitorder):
    """bool [count] from packed_custom_mask bytes."""
    shifts = torch.arange(8) if bitorder == "little" else torch.arange(7, -1, -1)
    bits = (packed.to(torch.int64)[:, None] >> shifts) & 1
    return bits.flatten()[:count].bool()


def _masks(custom_mask, packed_custom_mask, shapes, knobs):
    """Per request the [qo, kv] custom mask (None without one); packed_custom_mask wins, as documented."""
    if custom_mask is None and packed_custom_mask is None:
        return [None] * len(shapes)
    total = sum(q * kv for q, kv in shapes)
    flat = (_unpacked(packed_custom_mask, total, knobs.packed_bitorder) if packed_custom_mask is not None
            else custom_mask.flatten())
    masks, at = [], 0
    for q, kv in shapes:
        masks.append(flat[at:at + q * kv].view(q, kv))
        at += q * kv
    return masks


def _pool(cache, kv_layout, knobs):
    """(k pages, v pages) from a tuple or one tensor with k and v on dim 1."""
    if isinstance(cache, tuple):
        return cache
    k, v = cache.unbind(1)
    return (v, k) if knobs.kv_tensor_swapped else (k, v)


def _read_kv(x, knobs):
    """A KV page's values in float32: FP8 encodings as their values (or an e5m2 page's bytes as e4m3)."""
    if x.dtype == torch.float8_e5m2 and knobs.e5m2_as_e4m3:
        return x.view(torch.float8_e4m3fn).float()
    return x.float()


def _scaled(sm_scale, head_dim, k_scale, knobs):
    """The sm_scale the kernel runs with: the planned one (None: the default) times k_scale, as run() folds it."""
    scale = sm_scale if sm_scale is not None else knobs.default_scale or 1.0 / math.sqrt(head_dim)
    for _ in range(2 if knobs.k_scale_twice else 1):
        scale = scale * (1.0 if k_scale is None else k_scale)
    return scale


def _dtypes_checked(q, cache, plan_args, kv_layout, knobs):
    k_cache = _pool(cache, kv_layout, knobs)[0]
    for name, x, want in (("q", q, plan_args["q_data_type"]), ("k", k_cache, plan_args["kv_data_type"])):
        if want is not None and x.dtype != want:
            raise ValueError(f"The dtype of {name} {x.dtype} does not match the {name[0]}"
                             f"{'v' if name == 'k' else ''}_data_type {want} specified in plan function.")


def _v_scaled(out, v_scale, knobs):
    return out if v_scale is None or knobs.v_scale_ignored else out * v_scale


def _nhd(x, kv_layout):
    return x.transpose(0, 1) if kv_layout == "HND" else x


def make_flashinfer(calls: list, knobs=Knobs) -> dict:
    def single_prefill_with_kv_cache(q, k, v, custom_mask=None, packed_custom_mask=None, causal=False,
                                     kv_layout="NHD", pos_encoding_mode="NONE", sm_scale=None, window_left=-1,
                                     logits_soft_cap=None, backend="auto", return_lse=False, **_):
        calls.append({"fn": "single_prefill_with_kv_cache", "causal": causal, "kv_layout": kv_layout,
                      "window_left": window_left, "sm_scale": sm_scale, "logits_soft_cap": logits_soft_cap,
                      "backend": backend, "k_shape": tuple(k.shape), "return_lse": return_lse,
                      "custom_mask": custom_mask, "packed_custom_mask": packed_custom_mask})
        k, v = _nhd(k, kv_layout), _nhd(v, kv_layout)
        if custom_mask is not None and tuple(custom_mask.shape) != (q.shape[0], k.shape[0]):
            raise ValueError(f"custom_mask shape {tuple(custom_mask.shape)} must be [qo_len, kv_len]")
        keep, = _masks(custom_mask, packed_custom_mask, [(q.shape[0], k.shape[0])], knobs)
        out, lse = _one(q, k, v, causal=causal, sm_scale=sm_scale, window_left=window_left,
                        logits_soft_cap=logits_soft_cap, keep=keep, knobs=knobs)
        return (out, lse) if return_lse else out

    def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
                                    sm_scale=None, window_left=-1, logits_soft_cap=None, return_lse=False, **_):
        calls.append({"fn": "single_decode_with_kv_cache", "kv_layout": kv_layout, "window_left": window_left,
                      "sm_scale": sm_scale, "logits_soft_cap": logits_soft_cap, "q_shape": tuple(q.shape),
                      "use_tensor_cores": use_tensor_cores, "return_lse": return_lse})
        out, lse = _one(q[None], _nhd(k, kv_layout), _nhd(v, kv_layout), sm_scale=sm_scale, window_left=window_left,
                        logits_soft_cap=logits_soft_cap, cores=use_tensor_cores, knobs=knobs)
        lse = lse[0].squeeze(0) if knobs.decode_lse_squeezed and use_tensor_cores else lse[0]
        return (out[0], lse) if return_lse else out[0]

    def paged_sequences(indptr, indices, last, cache, kv_layout, page_size):
        k_cache, v_cache = _pool(cache, kv_layout, knobs)
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
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                     backend="auto", **_):
            self.kv_layout, self.backend, self.plan_args = kv_layout, backend, None
            self.cores = use_tensor_cores

        def _record(self, fn, **kw):
            calls.append({"fn": fn, "kv_layout": self.kv_layout, "backend": self.backend, **kw})

        def _planned_masks(self, custom_mask, packed_custom_mask, qo_indptr, kv_lens):
            qo = [b - a for a, b in zip(qo_indptr, qo_indptr[1:])]
            return dict(custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                        masks=_masks(custom_mask, packed_custom_mask, list(zip(qo, kv_lens)), knobs))

    class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
                 causal=False, sm_scale=None, window_left=-1, logits_soft_cap=None, q_data_type=None,
                 kv_data_type=None, **_):
            indptr, last = paged_kv_indptr.tolist(), paged_kv_last_page_len.tolist()
            kv_lens = [(b - a - 1) * page_size + n for a, b, n in zip(indptr, indptr[1:], last)]
            self.plan_args = dict(qo_indptr=qo_indptr.tolist(), kv_indptr=indptr,
                                  kv_indices=paged_kv_indices.tolist(), last=last,
                                  page_size=page_size, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                  logits_soft_cap=logits_soft_cap, heads=(num_qo_heads, num_kv_heads, head_dim_qk),
                                  q_data_type=q_data_type, kv_data_type=kv_data_type,
                                  **self._planned_masks(custom_mask, packed_custom_mask, qo_indptr.tolist(), kv_lens))

        def run(self, q, paged_kv_cache, return_lse=False, k_scale=None, v_scale=None, **_):
            a = dict(self.plan_args)
            masks = a.pop("masks")
            self._record("BatchPrefillWithPagedKVCacheWrapper.run", return_lse=return_lse,
                         kv_tensor=not isinstance(paged_kv_cache, tuple), k_scale=k_scale, v_scale=v_scale,
                         **{n: (repr(x) if n.endswith("data_type") else x) for n, x in a.items()})
            _dtypes_checked(q, paged_kv_cache, a, self.kv_layout, knobs)
            outs, lses = [], []
            seqs = paged_sequences(a["kv_indptr"], torch.tensor(a["kv_indices"]), a["last"], paged_kv_cache,
                                   self.kv_layout, a["page_size"])
            scale = _scaled(a["sm_scale"], q.shape[-1], k_scale, knobs)
            for n, (k, v) in enumerate(seqs):
                q_n = q[a["qo_indptr"][n]:a["qo_indptr"][n + 1]]
                out, lse = _one(q_n, _read_kv(k, knobs), _read_kv(v, knobs), causal=a["causal"], sm_scale=scale,
                                window_left=a["window_left"], logits_soft_cap=a["logits_soft_cap"], keep=masks[n],
                                knobs=knobs)
                outs.append(out)
                lses.append(lse)
            out, lse = _v_scaled(torch.cat(outs), v_scale, knobs), torch.cat(lses)
            return (out, lse) if return_lse else out

    class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=None,
                 kv_data_type=None, sm_scale=None, **_):
            self.plan_args = dict(kv_indptr=indptr.tolist(), kv_indices=indices.tolist(),
                                  last=last_page_len.tolist(), page_size=page_size, sm_scale=sm_scale,
                                  window_left=window_left, logits_soft_cap=logits_soft_cap,
                                  heads=(num_qo_heads, num_kv_heads, head_dim), q_data_type=q_data_type,
                                  kv_data_type=kv_data_type)

        def run(self, q, paged_kv_cache, return_lse=False, k_scale=None, v_scale=None, **_):
            a = self.plan_args
            self._record("BatchDecodeWithPagedKVCacheWrapper.run", q_shape=tuple(q.shape), return_lse=return_lse,
                         use_tensor_cores=self.cores, kv_tensor=not isinstance(paged_kv_cache, tuple),
                         k_scale=k_scale, v_scale=v_scale,
                         **{n: (repr(x) if n.endswith("data_type") else x) for n, x in a.items()})
            _dtypes_checked(q, paged_kv_cache, a, self.kv_layout, knobs)
            outs, lses = [], []
            seqs = paged_sequences(a["kv_indptr"], torch.tensor(a["kv_indices"]), a["last"], paged_kv_cache,
                                   self.kv_layout, a["page_size"])
            scale = _scaled(a["sm_scale"], q.shape[-1], k_scale, knobs)
            for n, (k, v) in enumerate(seqs):
                out, lse = _one(q[n:n + 1], _read_kv(k, knobs), _read_kv(v, knobs), sm_scale=scale,
                                window_left=a["window_left"], logits_soft_cap=a["logits_soft_cap"], cores=self.cores,
                                knobs=knobs)
                outs.append(out)
                lses.append(lse)
            out, lse = _v_scaled(torch.cat(outs), v_scale, knobs), torch.cat(lses)
            return (out, lse) if return_lse else out

    class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
                 custom_mask=None, packed_custom_mask=None, causal=False, sm_scale=None, window_left=-1,
                 logits_soft_cap=None, q_data_type=None, kv_data_type=None, **_):
            kv = kv_indptr.tolist()
            self.plan_args = dict(qo_indptr=qo_indptr.tolist(), kv_indptr=kv, causal=causal,
                                  sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
                                  **self._planned_masks(custom_mask, packed_custom_mask, qo_indptr.tolist(),
                                                        [b - a for a, b in zip(kv, kv[1:])]))

        def run(self, q, k, v, return_lse=False, **_):
            a = dict(self.plan_args)
            masks = a.pop("masks")
            self._record("BatchPrefillWithRaggedKVCacheWrapper.run", return_lse=return_lse, **a)
            outs, lses = [], []
            for n in range(len(a["qo_indptr"]) - 1):
                qs, ks = slice(*a["qo_indptr"][n:n + 2]), slice(*a["kv_indptr"][n:n + 2])
                out, lse = _one(q[qs], k[ks], v[ks], causal=a["causal"], sm_scale=a["sm_scale"],
                                window_left=a["window_left"], logits_soft_cap=a["logits_soft_cap"], keep=masks[n],
                                knobs=knobs)
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
