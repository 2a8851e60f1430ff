"""The FlashInfer adapters' standalone repro source: the call run() makes, with the paged cache rebuilt from the
logical k / v through the very kv_indptr / kv_indices the run used (embedded), garbage in every slot no sequence
owns, and the same workspace, plan and run arguments; an FP8 KV cache's pool holds the encodings (k / k_scale, exact)
in its FP8 dtype, and run() gets k_scale / v_scale. Needs only torch and flashinfer."""

from __future__ import annotations

import torch

from attnfuzz.backends import layout
from attnfuzz.backends import source as src
from attnfuzz.backends.flashinfer import common as fic
from attnfuzz.backends.flashinfer import fp8kv
from attnfuzz.backends.flashinfer import spelling as fis
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.fp8 import LARGEST, TORCH_FP8
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.paged import GARBAGE_K, GARBAGE_V, paged_kv


def block_table_of(kv_indptr, kv_indices):
    """The block table [b, most pages] that kv_indptr / kv_indices flatten (rows padded with page 0): sequence n's
    pages are kv_indices[kv_indptr[n]:kv_indptr[n + 1]], in order."""
    rows = [kv_indices[int(kv_indptr[n]):int(kv_indptr[n + 1])] for n in range(len(kv_indptr) - 1)]
    table = torch.zeros(len(rows), max([len(row) for row in rows] + [1]), dtype=torch.int32)
    for n, row in enumerate(rows):
        table[n, :len(row)] = row
    return table


def flashinfer_source(backend, case: Case) -> str | None:
    """Source defining `attention(q, k, v)` for a FlashInfer adapter, or None for a case it refuses."""
    if backend.unsupported(case) is not None:
        return None
    spelling = backend.spelled(case)
    kv_layout, lse = spelling.kv_layout, not spelling.lse if backend.entry_point.lse_by_default else bool(spelling.lse)
    t = materialize(case, "cpu")
    mask = fis.mask_kwargs(case, spelling, t, single=backend.single)
    named = {name.upper(): (value, f"{name}, as the adapter passes it") for name, value in mask.items()}
    kwargs = {**{name: f"{name.upper()}.to(q.device)" for name in mask},
              **{name: repr(value) for name, value in backend.kwargs(case).items()}}
    typed = {"q_data_type": "q.dtype", "kv_data_type": "k.dtype"}
    lens = f"lens_q, lens_kv = {list(case.lens_q)!r}, {list(case.lens_kv)!r}  # valid tokens per sequence"
    body, functions = ["import flashinfer", "", lens], [layout.pack, layout.unpack, layout.cu_seqlens]
    hnd = ".transpose(0, 1).contiguous()" if kv_layout == "HND" else ""
    workspace = f"workspace = torch.zeros({fic.WORKSPACE_BYTES}, dtype=torch.uint8, device=q.device)"
    returned = "out, lse = " if lse else "out = "
    fp8 = backend.serves_fp8
    scales = ""
    if fp8:   # an FP8 KV cache: the encodings in the pool, their per-tensor descales as k_scale / v_scale
        named.update({name.upper(): (value, f"run()'s {name}: the case's {name[0]} descale")
                      for name, value in fp8kv.scales(t).items()})
        typed["kv_data_type"], scales = "k_cache.dtype", ", k_scale=K_SCALE, v_scale=V_SCALE"
        body += [f"q = q.to(torch.{case.dtype})  # q unquantised, in the case's dtype",
                 "k, v = k / K_SCALE, v / V_SCALE  # the FP8 encodings' values (exact: value = encoding * descale)"]
    if backend.paged:
        cache = paged_kv(case, t.k, t.v)
        indptr, indices, last = fic.paged_metadata(cache)
        named.update({"KV_INDPTR": (indptr, "kv_indptr, as the adapter passes it"),
                      "KV_INDICES": (indices, "kv_indices: pool pages in shuffled order, shared prefix pages repeated"),
                      "KV_LAST_PAGE_LEN": (last, "kv_last_page_len")})
        functions += [block_table_of, layout.pool_from_table]
        body += ["block_table = block_table_of(KV_INDPTR, KV_INDICES)",
                 f"k_cache, v_cache = pool_from_table(k, v, block_table, lens_kv, {case.page_size}, "
                 f"{cache.k_cache.shape[0]}, {GARBAGE_K!r}, {GARBAGE_V!r})",
                 "indptr, indices, last = (x.to(q.device) for x in (KV_INDPTR, KV_INDICES, KV_LAST_PAGE_LEN))"]
        if fp8:
            fmt = case.fp8[1]
            body.append(f"k_cache, v_cache = (x.clamp(-{LARGEST[fmt]!r}, {LARGEST[fmt]!r}).to({TORCH_FP8[fmt]}) "
                        f"for x in (k_cache, v_cache))  # the FP8 pool, garbage saturated")
        if kv_layout == "HND":
            body.append("k_cache, v_cache = (x.transpose(1, 2).contiguous() for x in (k_cache, v_cache))  # HND")
        pages = ("torch.stack([k_cache, v_cache], dim=1)  # one tensor, k and v on dim 1" if spelling.cache
                 else "(k_cache, v_cache)")
        body += [f"pages = {pages}", workspace]
        cores = ", use_tensor_cores=True" if spelling.cores else ""
        body.append(f"wrapper = flashinfer.{backend.entry}(workspace, {kv_layout!r}{cores}, "
                    f"backend={backend.kernel_backend!r})")
        heads = [str(case.h), str(case.hk), str(case.d_qk), str(case.page_size)]
        if backend.decode:
            body += [src.call("wrapper.plan", ["indptr", "indices", "last", *heads], {**typed, **kwargs}),
                     f"{returned}wrapper.run(q[:, 0], pages, return_lse={lse}{scales})",
                     "return out[:, None]  # one query per sequence"]
        else:
            body += [src.call("wrapper.plan", ["cu_seqlens(lens_q, q.device)", "indptr", "indices", "last", *heads],
                              {**typed, **kwargs}),
                     f"{returned}wrapper.run(pack(q, lens_q), pages, return_lse={lse}{scales})",
                     f"return unpack(out, lens_q, {case.sq})"]
    elif backend.single:
        kv = f"k[0, :lens_kv[0]]{hnd}, v[0, :lens_kv[0]]{hnd}"
        if backend.decode:
            extra = {"use_tensor_cores": "True"} if spelling.cores else {}
            extra.update({"return_lse": "True"} if lse else {})
            call = src.call("flashinfer.single_decode_with_kv_cache", ["q[0, 0]", kv],
                            {"kv_layout": repr(kv_layout), **extra, **kwargs})
            body += [f"{returned}{call}", "return out[None, None]"]
        else:
            call = src.call("flashinfer.single_prefill_with_kv_cache", ["q[0, :lens_q[0]]", kv],
                            {**{n: kwargs.pop(n) for n in mask}, "kv_layout": repr(kv_layout),
                             "backend": repr(backend.kernel_backend), "return_lse": repr(lse), **kwargs})
            body += [f"{returned}{call}", f"return unpack(out, lens_q, {case.sq})"]
    else:
        body += [workspace,
                 f"wrapper = flashinfer.{backend.entry}(workspace, 'NHD', backend={backend.kernel_backend!r})",
                 src.call("wrapper.plan", ["cu_seqlens(lens_q, q.device)", "cu_seqlens(lens_kv, q.device)",
                                           str(case.h), str(case.hk), str(case.d_qk)], {**kwargs, **typed}),
                 f"{returned}wrapper.run(pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv), return_lse={lse})",
                 f"return unpack(out, lens_q, {case.sq})"]
    doc = (f"FlashInfer's {backend.entry} as attnfuzz's {backend.name} adapter calls it (kv_layout {kv_layout}, "
           f"backend {backend.kernel_backend!r}, spelling {case.spelling!r}).")
    return src.preamble(functions, named) + src.attention(doc, body)
