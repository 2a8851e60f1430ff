"""Fake flash-attn 2 / 3 / 4 modules: the documented call semantics in plain torch, recording every call.

All three align bands bottom-right (off = skv_n - sq_n) and map query head i to KV head i // (h / hk).
FA2 / FA3: -1 is an unbounded side, causal=True sets right = 0; FA2 adds ALiBi -slope * |i + off - j|.
FA4: None is unbounded; a pair of two negative bounds means (None, None); causal=True sets right = 0. How a pair with
ONE negative bound is read is the #2490 change (seed story 003): `fa4_semantics="post_2490"` keeps it literally
(causal with (-1, 0) is an empty band: zeros), "pre_2490" widens any pair summing below zero to full attention.
"""

from __future__ import annotations

import sys
import types

import torch

from tests.fakes.attention import alibi_bias, attend, band_keep


def _lengths(cu, used, batched_len, b):
    if used is not None:
        return [int(x) for x in used]
    if cu is not None:
        return [int(cu[n + 1] - cu[n]) for n in range(len(cu) - 1)]
    return [batched_len] * b


def run_band(q, k, v, *, cu_q=None, cu_k=None, used_q=None, used_k=None, left, right, scale, softcap, alibi=None,
         sink=None):
    """Attention per sequence over batched [b, s, h, d] or packed [t, h, d] inputs; LSE [b, h, s] or [h, t]."""
    packed = q.dim() == 3
    b = (len(cu_q) - 1) if cu_q is not None else q.shape[0]
    lens_q = _lengths(cu_q, used_q, None if packed else q.shape[1], b)
    lens_k = _lengths(cu_k, used_k, None if packed else k.shape[1], b)
    outs, lses = [], []
    for n in range(b):
        if packed:
            q_n = q[int(cu_q[n]):int(cu_q[n + 1])]
            k_n, v_n = (x[int(cu_k[n]):int(cu_k[n + 1])] for x in (k, v))
        else:
            q_n, k_n, v_n = q[n, :lens_q[n]], k[n, :lens_k[n]], v[n, :lens_k[n]]
        off = lens_k[n] - lens_q[n]
        keep = band_keep(lens_q[n], lens_k[n], off, left, right, q.device)
        bias = None
        if alibi is not None:
            bias = alibi_bias(alibi, lens_q[n], lens_k[n], off, q.device)
        o, lse = attend(q_n, k_n, v_n, keep, scale=scale, softcap=softcap, bias=bias, sink=sink)
        if not packed:
            pad = q.shape[1] - lens_q[n]
            o = torch.cat([o, o.new_zeros(pad, *o.shape[1:])])
            lse = torch.cat([lse, lse.new_full((lse.shape[0], pad), float("-inf"))], dim=1)
        outs.append(o)
        lses.append(lse)
    if packed:
        return torch.cat(outs), torch.cat(lses, dim=1)
    return torch.stack(outs), torch.stack(lses)


def gather_pages(k_cache, v_cache, table, lens, extra=0):
    """Batched [b, max_len, hk, d] k / v read through a block table (sequence n's pages table[n], in order), each
    sequence's first lens[n] + extra slots filled (extra = 1: a planted read of one slot past the cache)."""
    ps = k_cache.shape[1]
    width = max(1, max(lens) + extra)
    ks, vs = [], []
    for n, length in enumerate(lens):
        pages = table[n, :-(-(length + extra) // ps)].long()
        ks.append(k_cache[pages].flatten(0, 1)[:width])
        vs.append(v_cache[pages].flatten(0, 1)[:width])

    def padded(x):
        return torch.cat([x, x.new_zeros(width - x.shape[0], *x.shape[1:])])

    return torch.stack([padded(x) for x in ks]), torch.stack([padded(x) for x in vs])


def _fa2_bounds(causal, window):
    left, right = (None if w < 0 else w for w in window)
    return left, (0 if causal else right)


def make_fa2(calls: list, kvcache_bug: str | None = None, packed_bug: str | None = None) -> dict:
    """sys.modules entries of a fake flash-attn 2.8. `kvcache_bug` plants a bug in flash_attn_with_kvcache:
    "read_past" reads one slot past each sequence's cache, "no_append" attends without the appended keys.
    `packed_bug` one in the packed entry points: "v_from_k" reads v from k's slot of the stacked tensor."""
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        calls.append({"fn": "flash_attn_func", "causal": causal, "window_size": window_size,
                      "softmax_scale": softmax_scale, "softcap": softcap, "alibi_slopes": alibi_slopes,
                      "shape": tuple(q.shape)})
        left, right = _fa2_bounds(causal, window_size)
        out, lse = run_band(q, k, v, left=left, right=right, scale=softmax_scale, softcap=softcap, alibi=alibi_slopes)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        calls.append({"fn": "flash_attn_varlen_func", "causal": causal, "window_size": window_size,
                      "softmax_scale": softmax_scale, "softcap": softcap, "alibi_slopes": alibi_slopes,
                      "cu_seqlens_q": cu_seqlens_q.tolist(), "cu_seqlens_k": cu_seqlens_k.tolist(),
                      "shape": tuple(q.shape)})
        left, right = _fa2_bounds(causal, window_size)
        out, lse = run_band(q, k, v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, left=left, right=right, scale=softmax_scale,
                        softcap=softcap, alibi=alibi_slopes)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
        calls.append({"fn": "flash_attn_with_kvcache", "causal": causal, "window_size": window_size,
                      "num_splits": num_splits, "paged": block_table is not None, "appended": 0 if k is None
                      else k.shape[1], "cache_seqlens": cache_seqlens.tolist(), "shape": tuple(q.shape)})
        if block_table is not None and k_cache.shape[1] % 256:
            raise RuntimeError("Paged KV cache block size must be divisible by 256")
        lens = cache_seqlens.tolist()
        seqlen_k = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
        rows = q.shape[1]   # flash_api.cpp folds a GQA group into one query's rows first, then checks them
        if (rows == 1 and q.shape[2] > k_cache.shape[2] and min(window_size) < 0 and max(window_size) < 0
                and q.shape[3] % 8 == 0 and alibi_slopes is None):
            rows = q.shape[2] // k_cache.shape[2]
        if k is not None and rows > seqlen_k:  # flash_api.cpp's check compares the queries, not the keys
            raise RuntimeError("If key is supplied, it must have seqlen <= the seqlen of the KV cache")
        if k is not None:   # written into the cache in place, as the kernel does
            for n, start in enumerate(lens):
                for i in range(k.shape[1]):
                    pos = start + i
                    if block_table is None:
                        k_cache[n, pos], v_cache[n, pos] = k[n, i], v[n, i]
                    else:
                        page = int(block_table[n, pos // k_cache.shape[1]])
                        k_cache[page, pos % k_cache.shape[1]] = k[n, i]
                        v_cache[page, pos % v_cache.shape[1]] = v[n, i]
            if kvcache_bug != "no_append":
                lens = [n + k.shape[1] for n in lens]
        extra = 1 if kvcache_bug == "read_past" else 0
        if block_table is None:
            kb, vb = k_cache, v_cache
            used = [min(n + extra, k_cache.shape[1]) for n in lens]
        else:
            kb, vb = gather_pages(k_cache, v_cache, block_table, lens, extra)
            used = [n + extra for n in lens]
        left, right = _fa2_bounds(causal, window_size)
        out, lse = run_band(q, kb, vb, used_k=used, left=left, right=right, scale=softmax_scale, softcap=softcap,
                            alibi=alibi_slopes)
        return (out, lse) if return_softmax_lse else out

    def unstacked(packed, first):
        """The views a packed entry point reads: slot `first` onward of dim -3 (v at k's slot under "v_from_k")."""
        views = [packed.select(-3, i) for i in range(first, packed.shape[-3])]
        if packed_bug == "v_from_k":
            views[-1] = views[-2]
        return views

    def flash_attn_kvpacked_func(q, kv, **kwargs):
        assert kv.shape[-3] == 2, f"kv must be [..., 2, hk, d], got {tuple(kv.shape)}"
        calls.append({"fn": "flash_attn_kvpacked_func", "shape": tuple(kv.shape)})
        return flash_attn_func(q, *unstacked(kv, 0), **kwargs)

    def flash_attn_qkvpacked_func(qkv, **kwargs):
        assert qkv.shape[-3] == 3, f"qkv must be [..., 3, h, d], got {tuple(qkv.shape)}"
        calls.append({"fn": "flash_attn_qkvpacked_func", "shape": tuple(qkv.shape)})
        return flash_attn_func(qkv.select(-3, 0), *unstacked(qkv, 1), **kwargs)

    def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
        assert kv.dim() == 4 and kv.shape[1] == 2, f"kv must be [total, 2, hk, d], got {tuple(kv.shape)}"
        calls.append({"fn": "flash_attn_varlen_kvpacked_func", "shape": tuple(kv.shape)})
        return flash_attn_varlen_func(q, *unstacked(kv, 0), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      **kwargs)

    def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, **kwargs):
        assert qkv.dim() == 4 and qkv.shape[1] == 3, f"qkv must be [total, 3, h, d], got {tuple(qkv.shape)}"
        calls.append({"fn": "flash_attn_varlen_qkvpacked_func", "shape": tuple(qkv.shape)})
        return flash_attn_varlen_func(qkv.select(-3, 0), *unstacked(qkv, 1), cu_seqlens, cu_seqlens, max_seqlen,
                                      max_seqlen, **kwargs)

    iface = types.ModuleType("flash_attn.flash_attn_interface")
    iface.flash_attn_func, iface.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    iface.flash_attn_with_kvcache = flash_attn_with_kvcache
    for fn in (flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func,
               flash_attn_varlen_qkvpacked_func):
        setattr(iface, fn.__name__, fn)
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []
    pkg.__version__ = "2.8.3+fake"
    pkg.flash_attn_interface = iface
    pkg.flash_attn_func, pkg.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    pkg.flash_attn_with_kvcache = flash_attn_with_kvcache
    for name in ("flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
                 "flash_attn_varlen_qkvpacked_func"):
        setattr(pkg, name, getattr(iface, name))
    return {"flash_attn": pkg, "flash_attn.flash_attn_interface": iface}


FA3_FP8_BUGS = ("k_descale_twice", "v_descale_heads_swapped")


def fa3_fp8_values(q, k, v, q_descale, k_descale, v_descale, bug=None):
    """FA3's FP8 inputs [b, s, heads, d] as real values: float32 encodings times their [b, hk] descales (q's per KV head, shared by
    its group), checked as mha_fwd checks them; `bug` (FA3_FP8_BUGS) plants a scale mistake."""
    if q.dtype != torch.float8_e4m3fn or k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("FlashAttention only supports fp16, bf16, and fp8_e4m3 data type")
    b, hk = k.shape[0], k.shape[-2]
    group = q.shape[-2] // hk
    scales = {}
    for name, d in (("q", q_descale), ("k", k_descale), ("v", v_descale)):
        d = torch.ones(b, hk) if d is None else d.float()
        if tuple(d.shape) != (b, hk):
            raise RuntimeError(f"{name}_descale must have shape (batch_size, num_heads_k)")
        scales[name] = d
    if bug == "k_descale_twice":
        scales["k"] = scales["k"] * scales["k"]
    if bug == "v_descale_heads_swapped" and hk > 1:
        scales["v"] = scales["v"][:, [1, 0, *range(2, hk)]]

    def real(x, d, per_head):
        return x.float() * d.repeat_interleave(per_head, dim=1)[:, None, :, None]

    return real(q, scales["q"], group), real(k, scales["k"], 1), real(v, scales["v"], 1)


def make_fa3(calls: list, fp8_bug: str | None = None) -> dict:
    """sys.modules entries of a fake FA3 hopper build (`flash_attn_interface`); FP8 inputs come back in BF16."""
    def fp8(q, k, v, descales):
        if q.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) and k.dtype not in (torch.float8_e4m3fn,
                                                                                         torch.float8_e5m2):
            return q, k, v, None
        q, k, v = fa3_fp8_values(q, k, v, *descales, bug=fp8_bug)
        return q, k, v, torch.bfloat16

    def described(descales):
        return {f"{n}_descale": None if d is None else d.tolist() for n, d in zip("qkv", descales)}

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                        v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                        pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
        descales = (q_descale, k_descale, v_descale)
        calls.append({"fn": "flash_attn_func", "causal": causal, "window_size": window_size,
                      "softmax_scale": softmax_scale, "softcap": softcap, "shape": tuple(q.shape),
                      **({"dtype": repr(q.dtype), **described(descales)} if q.element_size() == 1 else {})})
        q, k, v, out_dtype = fp8(q, k, v, descales)
        left, right = _fa2_bounds(causal, window_size)
        out, lse = run_band(q, k, v, left=left, right=right, scale=softmax_scale, softcap=softcap)
        out = out if out_dtype is None else out.to(out_dtype)
        return (out, lse) if return_attn_probs else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                               seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None,
                               k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                               num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                               return_attn_probs=False):
        descales = (q_descale, k_descale, v_descale)
        calls.append({"fn": "flash_attn_varlen_func", "causal": causal, "window_size": window_size,
                      "softmax_scale": softmax_scale, "softcap": softcap, "cu_seqlens_q": cu_seqlens_q.tolist(),
                      "cu_seqlens_k": cu_seqlens_k.tolist(), "shape": tuple(q.shape),
                      **({"dtype": repr(q.dtype), **described(descales)} if q.element_size() == 1 else {})})
        out_dtype = None
        if q.element_size() == 1:   # per sequence: each one's row of the [b, hk] descales
            b = len(cu_seqlens_q) - 1
            pieces = [fa3_fp8_values(*(x[int(cu[n]):int(cu[n + 1])][None] for x, cu in (
                (q, cu_seqlens_q), (k, cu_seqlens_k), (v, cu_seqlens_k))),
                *(None if d is None else d[n:n + 1] for d in descales), bug=fp8_bug) for n in range(b)]
            q, k, v = (torch.cat([p[i][0] for p in pieces]) for i in range(3))
            out_dtype = torch.bfloat16
        left, right = _fa2_bounds(causal, window_size)
        out, lse = run_band(q, k, v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, left=left, right=right, scale=softmax_scale,
                        softcap=softcap)
        out = out if out_dtype is None else out.to(out_dtype)
        return (out, lse) if return_attn_probs else out

    iface = types.ModuleType("flash_attn_interface")
    iface.flash_attn_func, iface.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    iface.__version__ = "3.0.0+fake"
    return {"flash_attn_interface": iface}


def resolve_fa4_window(causal, window, semantics):
    """FA4's reading of (causal, window_size) as (left, right), None = unbounded, per release semantics."""
    left, right = window
    if left is not None and right is not None:
        if semantics == "pre_2490" and left + right < 0:
            left = right = None
        elif left < 0 and right < 0:
            left = right = None
    if causal:
        right = 0
    return left, right


FA4_FORM_BUGS = ("explicit_scale_log2", "softcap_none_is_cap", "no_lse_drops_sink", "half_sink_dropped",
                 "pack_mha_head0", "max_seqlen_tensor_short")


def make_fa4(calls: list, semantics: str = "post_2490", paged_bug: str | None = None,
             form_bug: str | None = None) -> dict:
    """sys.modules entries of a fake flash-attn-4 (`flash_attn.cute`). `form_bug` plants a bug in one argument form:
    "explicit_scale_log2" multiplies a given softmax_scale by log2(e) (None still takes 1/sqrt(d)),
    "softcap_none_is_cap" reads softcap=None as a cap of 1.0, "no_lse_drops_sink" drops learnable_sink when
    return_lse=False, "half_sink_dropped" drops a learnable_sink that is not float32, "pack_mha_head0" reads KV head
    0 for every query head under pack_gqa=True without GQA, "max_seqlen_tensor_short" reads a tensor max_seqlen_q
    as one less and leaves each sequence's rows from there on zero (varlen, unpaged)."""
    if semantics not in ("pre_2490", "post_2490"):
        raise ValueError(f"semantics={semantics!r}: one of 'pre_2490', 'post_2490'")
    if form_bug not in (None, *FA4_FORM_BUGS):
        raise ValueError(f"form_bug={form_bug!r}: one of {FA4_FORM_BUGS} or None")

    def planted(k, v, softmax_scale, softcap, learnable_sink, return_lse, pack_gqa, h):
        """(k, v, softmax_scale, softcap, learnable_sink) as the planted form bug reads them."""
        if form_bug == "explicit_scale_log2" and softmax_scale is not None:
            softmax_scale *= 1.4426950408889634
        if form_bug == "softcap_none_is_cap" and softcap is None:
            softcap = 1.0
        if learnable_sink is not None and ((form_bug == "no_lse_drops_sink" and not return_lse)
                                           or (form_bug == "half_sink_dropped"
                                               and learnable_sink.dtype != torch.float32)):
            learnable_sink = None
        if form_bug == "pack_mha_head0" and pack_gqa is True and k.shape[-2] == h:
            k, v = (x[..., :1, :].expand(x.shape) for x in (k, v))
        return k, v, softmax_scale, softcap, learnable_sink

    def record(fn, q, causal, window_size, softmax_scale, learnable_sink, softcap, **extra):
        calls.append({"fn": fn, "causal": causal, "window_size": window_size, "softmax_scale": softmax_scale,
                      "learnable_sink": learnable_sink, "softcap": softcap, "shape": tuple(q.shape), **extra})

    def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                        window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                        deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                        aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None,
                        return_lse=False, **_):
        record("flash_attn_func", q, causal, window_size, softmax_scale, learnable_sink, softcap,
               num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic, return_lse=return_lse)
        k, v, softmax_scale, softcap, learnable_sink = planted(k, v, softmax_scale, softcap, learnable_sink,
                                                               return_lse, pack_gqa, q.shape[-2])
        left, right = resolve_fa4_window(causal, window_size, semantics)
        out, lse = run_band(q, k, v, left=left, right=right, scale=softmax_scale, softcap=softcap, sink=learnable_sink)
        return out, (lse if return_lse else None)

    def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                               gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                               pack_gqa=None, deterministic=False, return_lse=False, **_):
        record("flash_attn_varlen_func", q, causal, window_size, softmax_scale, learnable_sink, softcap,
               num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic,
               cu_seqlens_q=None if cu_seqlens_q is None else cu_seqlens_q.tolist(),
               seqused_q=None if seqused_q is None else seqused_q.tolist(),
               seqused_k=None if seqused_k is None else seqused_k.tolist(), paged=page_table is not None,
               return_lse=return_lse, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
        k, v, softmax_scale, softcap, learnable_sink = planted(k, v, softmax_scale, softcap, learnable_sink,
                                                               return_lse, pack_gqa, q.shape[-2])
        left, right = resolve_fa4_window(causal, window_size, semantics)
        if page_table is not None:   # "read_past": one slot past each cache; "consecutive": pages read in pool order
            lens = seqused_k.tolist()
            table = page_table
            if paged_bug == "consecutive":
                table = torch.arange(page_table.numel(), dtype=torch.int32).reshape(page_table.shape)
                table = table.clamp(max=k.shape[0] - 1)
            extra = 1 if paged_bug == "read_past" else 0
            k, v = gather_pages(k, v, table, lens, extra)
            seqused_k = torch.tensor([n + extra for n in lens], dtype=torch.int32)
            if cu_seqlens_q is not None:   # packed queries over a batched (gathered) cache: per sequence
                starts = cu_seqlens_q.tolist()
                outs, lses = [], []
                for n in range(len(starts) - 1):
                    o, l = run_band(q[None, starts[n]:starts[n + 1]], k[n:n + 1], v[n:n + 1],
                                    used_k=seqused_k[n:n + 1], left=left, right=right, scale=softmax_scale,
                                    softcap=softcap, sink=learnable_sink)
                    outs.append(o[0])
                    lses.append(l[0])
                return torch.cat(outs), (torch.cat(lses, dim=1) if return_lse else None)
        out, lse = run_band(q, k, v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, used_q=seqused_q, used_k=seqused_k,
                        left=left, right=right, scale=softmax_scale, softcap=softcap, sink=learnable_sink)
        if form_bug == "max_seqlen_tensor_short" and isinstance(max_seqlen_q, torch.Tensor):
            rows = torch.arange(out.shape[-3])
            if cu_seqlens_q is not None:   # packed: the row's place in its own sequence
                starts = cu_seqlens_q.long()
                rows = rows - starts[torch.searchsorted(starts, rows, right=True) - 1]
            out = out * (rows < int(max_seqlen_q) - 1).to(out.dtype)[:, None, None]
        return out, (lse if return_lse else None)

    cute = types.ModuleType("flash_attn.cute")
    cute.__path__ = []
    cute.__version__ = "4.0.0b36+fake"
    cute.flash_attn_func, cute.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []
    pkg.cute = cute
    return {"flash_attn": pkg, "flash_attn.cute": cute}


def install(monkeypatch, modules: dict) -> None:
    """Put fake modules into sys.modules for one test (monkeypatch undoes it)."""
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
