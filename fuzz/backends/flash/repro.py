"""The flash-attn adapters' (FA2 / FA3 / FA4) standalone repro source: the very call run() makes, its keyword
arguments taken from the adapter's own `call_kwargs(case, tensors)` (the spelling's causal flag and window_size,
softcap, scale, alibi_slopes, learnable_sink) and written out as source, with the inputs batched, packed through
cu_seqlens (varlen) or padded in place through seqused_q / seqused_k, as the adapter's `route(case)` says."""

from __future__ import annotations

import torch

from attnfuzz.backends.flash import common as fc
from attnfuzz.backends import layout
from attnfuzz.backends import source as src
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize


def spelled_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """(the tensor arguments, every argument as source): a tensor is named by its upper-cased name (a module-level
    literal, moved to q's device), anything else by its repr."""
    tensors = {name: x for name, x in kwargs.items() if isinstance(x, torch.Tensor)}
    return tensors, {name: f"{name.upper()}.to(q.device)" if name in tensors else repr(x)
                     for name, x in kwargs.items()}


def flash_source(backend, case: Case, *, module: str, library: str, positional_varlen: bool,
                 prelude: tuple[str, ...] = ()) -> str | None:
    """Source defining `attention(q, k, v)` for `backend` (a flash-attn adapter with call_kwargs and route), or
    None for a case it refuses. `positional_varlen`: FA2 / FA3 take cu_seqlens and max lengths positionally;
    `prelude`: lines run first on the logical [b, s, h, d] q, k, v (FP8 encoding)."""
    if backend.unsupported(case) is not None:
        return None
    t = materialize(case, "cpu")
    tensors, spelled = spelled_kwargs(backend.call_kwargs(case, t))
    route = backend.route(case)
    fn = route.split("[")[0]
    body = [f"from {module} import {fn}", "", *prelude]
    args = ["q", "k", "v"]
    functions = [layout.pack, layout.unpack, layout.cu_seqlens] if route in (fc.VARLEN, fc.PAGED_PACKED) else []
    named = {}
    if route in (fc.PAGED, fc.PAGED_PACKED):
        body += [f"lens_q, lens_kv = {list(case.lens_q)!r}, {list(case.lens_kv)!r}  # valid tokens per sequence",
                 kvcache_inputs_call("cache", fc.kvcache_arguments(case, t), named)]
        args = ["q", 'cache["k_cache"]', 'cache["v_cache"]']
        lengths = {"seqused_k": 'cache["cache_seqlens"]', "page_table": 'cache["block_table"]',
                   "max_seqlen_q": str(case.sq), "max_seqlen_k": str(case.skv)}
        if route == fc.PAGED_PACKED:
            body.append("q = pack(q, lens_q)  # [total, heads, d]")
            lengths["cu_seqlens_q"] = "cu_seqlens(lens_q, q.device)"
        elif case.lens_q != (case.sq,) * case.b:
            lengths["seqused_q"] = "torch.tensor(lens_q, dtype=torch.int32, device=q.device)"
        spelled = {**lengths, **spelled}
        functions += [layout.pool_from_table, fc.kvcache_inputs]
    elif route == fc.VARLEN:
        body += [f"lens_q, lens_kv = {list(case.lens_q)!r}, {list(case.lens_kv)!r}  # valid tokens per sequence",
                 "q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # varlen: [total, heads, d]"]
        lengths = {"cu_seqlens_q": "cu_seqlens(lens_q, q.device)", "cu_seqlens_k": "cu_seqlens(lens_kv, q.device)",
                   "max_seqlen_q": str(case.sq), "max_seqlen_k": str(case.skv)}
        if positional_varlen:
            args += list(lengths.values())
        else:
            spelled = {**lengths, **spelled}
    elif route == fc.SEQUSED:
        spelled = {"seqused_q": f"torch.tensor({list(case.lens_q)!r}, dtype=torch.int32, device=q.device)",
                   "seqused_k": f"torch.tensor({list(case.lens_kv)!r}, dtype=torch.int32, device=q.device)",
                   "max_seqlen_q": str(case.sq), "max_seqlen_k": str(case.skv), **spelled}
    elif case.layout == "sbhd" and case.memory == "contiguous":
        body.append("q, k, v = (x.transpose(0, 1).contiguous().transpose(0, 1) for x in (q, k, v))  # sbhd buffers, "
                    "[b, s, h, d] views")
    packing = fc.split_packing(case.spelling)[1]
    if packing:   # fa2_fa3's packed entry points: k, v (and q) stacked as one tensor
        stacked = ["k", "v"] if packing == "kvpacked" else ["q", "k", "v"]
        name = "kv" if packing == "kvpacked" else "qkv"
        body.append(f"{name} = torch.stack([{', '.join(stacked)}], dim=-3)  # [..., {len(stacked)}, heads, d]")
        fn = fc.packed_name(fn, packing)
        body[0] = f"from {module} import {fn}"
        rest = args[3:]
        if packing == "qkvpacked" and route == fc.VARLEN:
            rest = rest[:1] + rest[2:3]   # one cu_seqlens and one max_seqlen: q and k share their lengths
        args = (["q", "kv"] if packing == "kvpacked" else ["qkv"]) + rest
    body += ["out = " + src.call(fn, args, spelled) + "[0]",
             f"return unpack(out, lens_q, {case.sq})" if route in (fc.VARLEN, fc.PAGED_PACKED) else "return out"]
    doc = (f"{library} ({module}.{fn}) as attnfuzz's {backend.name} adapter calls it for spelling "
           f"{case.spelling!r}" + (", padding in place through seqused_q / seqused_k." if route == fc.SEQUSED
                                   else "."))
    named.update({name.upper(): (x, f"{name}, as the adapter passes it") for name, x in tensors.items()})
    return src.preamble(functions, named) + src.attention(doc, body)


def kvcache_inputs_call(target: str, arguments: dict, named: dict) -> str:
    """The source line `target = kvcache_inputs(k, v, lens_kv, ...)` for fc.kvcache_arguments' `arguments`, with a
    block table added to `named` as BLOCK_TABLE; the script's k, v and lens_kv stand for the logical ones."""
    table = "None"
    if arguments["block_table"] is not None:
        named["BLOCK_TABLE"] = (arguments["block_table"], "pool pages of each sequence, in shuffled order")
        table = "BLOCK_TABLE.to(q.device)"
    rest = [repr(arguments[name]) for name in ("page_size", "num_pages", "garbage_k", "garbage_v")]
    return src.call(f"{target} = kvcache_inputs", ["k", "v", "lens_kv", repr(arguments["new"]), table, *rest], {})
