"""flex_attention's standalone repro source: the case's mask_mod and score_mods built from the adapter's own factories
(embedded verbatim from fuzz/backends/flex/mods.py), the block mask or score-side mask, the layout and the call
(with the spelling's kernel_options), as FlexBackend.run() makes them. Compiled flex is a fresh
torch.compile(fullgraph=True, dynamic=False) of the call.
flex-paged (paged_source): PagedAttention's caches rebuilt from the logical k / v by the adapter's own builders
(fuzz/backends/flex/pages.py, embedded) through the embedded block table, then FlexPaged.run()'s block mask, score_mod
and eager call over them."""

from __future__ import annotations

import torch

from attnfuzz.backends import layout
from attnfuzz.backends.flex import mods, pages
from attnfuzz.backends.flex.knobs import kernel_options
from attnfuzz.backends import source as src
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize
from attnfuzz.strategies.paged import GARBAGE_K, GARBAGE_V, paged_kv


def _mods(case: Case, key_padding: bool = True) -> tuple[list[str], list[str], list]:
    """(mask_mod expressions, score_mod expressions, the factories they call), in mods.mods_of's order (its
    `key_padding` too)."""
    masks, scores, used = [], [], [mods._named]
    if case.left is not None:
        masks.append(f"band_left(torch.tensor({case.left}, device=device), off)")
        used.append(mods.band_left)
    if case.right is not None:
        masks.append(f"band_right(torch.tensor({case.right}, device=device), off)")
        used.append(mods.band_right)
    if case.padded and key_padding:
        masks.append("padding(lens_q, lens_kv)")
        used.append(mods.padding)
    elif case.lens_q != (case.sq,) * case.b:
        masks.append("query_padding(lens_q)")
        used.append(mods.query_padding)
    if case.mask_density is not None:
        masks.append("explicit(MASK.to(device))")
        used.append(mods.explicit)
    if case.softcap is not None:
        score_dtype = "torch.float64" if case.dtype == "float64" else "torch.float32"
        scores.append(f"softcap(torch.tensor({case.softcap!r}, dtype={score_dtype}, device=device))")
        used.append(mods.softcap)
    if case.alibi_slopes is not None:
        scores.append(f"alibi(torch.tensor({list(case.alibi_slopes)!r}, dtype=torch.float32, device=device), off)")
        used.append(mods.alibi)
    if masks:
        used.append(mods.all_of)
    return masks, scores, used


def _layout(case: Case) -> tuple[list[str], str]:
    """(lines turning the logical q, k, v into the [b, h, s, d] tensors flex is given, the output's way back)."""
    if case.layout == "thd":
        return (["q = pack(q, LENS_Q).permute(1, 0, 2)[None]  # thd: one packed sequence, [1, h, total, d]",
                 "k, v = (pack(x, LENS_KV).permute(1, 0, 2)[None] for x in (k, v))"],
                f"unpack(out[0].transpose(0, 1), LENS_Q, {case.sq})")
    if case.layout == "sbhd" and case.memory == "contiguous":
        return (["q, k, v = (x.transpose(0, 1).contiguous().permute(1, 2, 0, 3) for x in (q, k, v))"
                 "  # sbhd buffers, [b, h, s, d] views"], "out.transpose(1, 2)")
    return ["q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views"], "out.transpose(1, 2)"


def flex_source(case: Case, compiled: bool, with_lse: bool = False) -> str:
    """Source defining `attention(q, k, v)` (and the helpers it calls) for flex-eager or flex-compiled; `with_lse`
    (not for thd, whose LSE is packed): it returns (out, lse [b, h, sq]), as the adapter's call asks for it."""
    with_lse = with_lse and case.layout != "thd"
    parts = set(case.spelling.split("+")) - {""}
    packed = case.layout == "thd"
    gqa = case.hk < case.h and "repeat_kv" not in parts
    masks, scores, used = _mods(case)
    to_flex, back = _layout(case)
    body = ["from torch.nn.attention.flex_attention import ...", "", "device = q.device"]
    diagonal = any(x is not None for x in (case.left, case.right, case.alibi_slopes))
    lengths = diagonal or case.padded or packed
    if lengths:
        body += ["lens_q, lens_kv = torch.tensor(LENS_Q, device=device), torch.tensor(LENS_KV, device=device)"]
    if diagonal:
        body.append("off = lens_kv - lens_q  # bottom-right: query i's diagonal is key i + off[b]"
                    if case.alignment == "bottom_right" else "off = torch.zeros_like(lens_q)  # top-left diagonal")
    body += to_flex
    if "repeat_kv" in parts:
        body.append(f"k, v = (x.repeat_interleave({case.h // case.hk}, dim=1) for x in (k, v))  # GQA by repeated KV")
    if masks:
        body.append(src.call("mask_mod = all_of", masks, {}))
    if scores:
        body.append("score_mods = [" + ",\n              ".join(scores) + "]")
    if packed:
        used += [mods.documents] + ([mods.per_document] if scores else [])
        body += [f"seqs = torch.arange({case.b}, device=device)",
                 "doc_q, doc_kv = seqs.repeat_interleave(lens_q), seqs.repeat_interleave(lens_kv)  # each packed "
                 "token's sequence",
                 "start_q, start_kv = lens_q.cumsum(0) - lens_q, lens_kv.cumsum(0) - lens_kv  # each one's first token",
                 f"docs = (doc_q, doc_kv, start_q, start_kv, {case.sq}, {case.skv})",
                 f"mask_mod = documents({'mask_mod' if masks else None}, *docs)  # masks at positions in a sequence"]
        if scores:
            body.append("score_mods = [per_document(mod, *docs) for mod in score_mods]")
    has_mask = bool(masks) or packed
    block_mask = "None"
    if has_mask and "score_mask" in parts:
        used.append(mods.masked_scores)
        body.append(f"score_mods = [{'*score_mods, ' if scores else ''}masked_scores(mask_mod)]  # the mask as -inf")
    elif has_mask:
        batched = not packed and (case.padded or case.mask_density is not None)
        body.append(f"block_mask = create_block_mask(mask_mod, {case.b if batched else None}, None, q.shape[2], "
                    f"k.shape[2], device=device)")
        block_mask = "block_mask"
    score_mod = "None"
    if scores or (has_mask and "score_mask" in parts):
        used.append(mods.chain)
        body.append("score_mod = chain(*score_mods)")
        score_mod = "score_mod"
    names = "create_block_mask, flex_attention" if block_mask != "None" else "flex_attention"
    names = "AuxRequest, " + names if with_lse else names
    body[0] = f"from torch.nn.attention.flex_attention import {names}"
    fn = "flex_attention"
    if compiled:
        body.append("compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)")
        fn = "compiled"
    options = kernel_options(parts)
    call_kwargs = {"score_mod": score_mod, "block_mask": block_mask, "scale": repr(case.scale), "enable_gqa": repr(gqa)}
    if options:
        call_kwargs["kernel_options"] = repr(options)
    if with_lse:
        call_kwargs["return_aux"] = "AuxRequest(lse=True)"
        body += ["out, aux = " + src.call(fn, ["q", "k", "v"], call_kwargs), f"return {back}, aux.lse"]
    else:
        body += ["out = " + src.call(fn, ["q", "k", "v"], call_kwargs), f"return {back}"]
    how = ["no mask" if not has_mask else "mask as -inf in the score_mod" if "score_mask" in parts
           else "block mask", "KV heads repeated" if "repeat_kv" in parts else "enable_gqa" if gqa else "",
           f"kernel_options {options}" if options else ""]
    doc = (f"torch flex_attention, {'compiled (a fresh graph of this one call)' if compiled else 'eager'}, as "
           f"attnfuzz's flex adapter ran it: spelling {case.spelling!r} ({', '.join(h for h in how if h)}), "
           f"layout {case.layout}.")
    named = {"RETURNS_LSE": (True, "attention returns (out, lse): the script checks both")} if with_lse else {}
    if lengths:
        named.update(LENS_Q=(list(case.lens_q), "valid queries per sequence"),
                     LENS_KV=(list(case.lens_kv), "valid keys per sequence"))
    if case.mask_density is not None:
        named["MASK"] = (materialize(case, "cpu").mask, "the explicit mask drawn from the seed, True = keep")
    header = "\n\n# mask_mods and score_mods, verbatim from attnfuzz's flex adapter (fuzz/backends/flex/mods.py)"
    functions = used + ([layout.pack, layout.unpack] if packed else [])
    return header + src.preamble(functions, named) + src.attention(doc, body)


def paged_source(case: Case, *, q_block: int, assign: bool) -> str:
    """Source defining `attention(q, k, v)` for flex-paged: the caches built as its run() builds them (`assign`:
    through PagedAttention's reserve() / assign(), else its page table filled from the block table), a logical block
    mask of (q_block, page_size) blocks over whole pages, converted to physical blocks and kv_len-bounded by
    PagedAttention, and the eager flex call."""
    size, t = case.page_size, materialize(case, "cpu")
    cache = paged_kv(case, t.k, t.v)
    logical_len = max(1, -(-case.skv // size)) * size
    masks, scores, used = _mods(case, key_padding=False)
    used += [pages.flat, pages.assigned_cache] if assign else [layout.pool_from_table, pages.flat,
                                                              pages.page_table_cache]
    body = ["from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention", "",
            "device = q.device"]
    diagonal = any(x is not None for x in (case.left, case.right, case.alibi_slopes))
    if diagonal or case.lens_q != (case.sq,) * case.b:
        body.append("lens_q, lens_kv = torch.tensor(LENS_Q, device=device), torch.tensor(LENS_KV, device=device)")
    if diagonal:
        body.append("off = lens_kv - lens_q  # bottom-right: query i's diagonal is key i + off[b]"
                    if case.alignment == "bottom_right" else "off = torch.zeros_like(lens_q)  # top-left diagonal")
    cache_args = [str(size), str(pages.pool_pages(cache)), repr(GARBAGE_K), repr(GARBAGE_V)]
    if assign:
        body.append(src.call("paged, k_flat, v_flat = assigned_cache", ["k", "v", "LENS_KV", *cache_args], {}))
    else:
        body.append(src.call("paged, k_flat, v_flat = page_table_cache", ["k", "v", "BLOCK_TABLE", "LENS_KV",
                                                                          *cache_args], {}))
    body.append("kv_len = torch.tensor(LENS_KV, device=device)  # PagedAttention bounds the keys past each cache")
    mask_mod = "lambda b, h, q_idx, kv_idx: q_idx >= 0"  # nothing masked but the keys past each cache
    if masks:
        body.append(src.call("mask_mod = all_of", masks, {}))
        mask_mod = "mask_mod"
    body += [src.call("block_mask = create_block_mask", [mask_mod, str(case.b), "None", str(case.sq),
                                                         str(logical_len)],
                      {"device": "device", "BLOCK_SIZE": f"({q_block}, {size})"}),
             "physical = paged.convert_logical_block_mask(block_mask, kv_len=kv_len)  # logical pages -> physical"]
    score_mod = "None"
    if scores:
        used.append(mods.chain)
        body += ["score_mods = [" + ",\n              ".join(scores) + "]",
                 "score_mod = paged.get_score_mod(chain(*score_mods), kv_len)"]
        score_mod = "score_mod"
    body += ["out, aux = " + src.call("flex_attention", ["q.transpose(1, 2)", "k_flat", "v_flat"],
                                      {"score_mod": score_mod, "block_mask": "physical", "scale": repr(case.scale),
                                       "enable_gqa": repr(case.hk < case.h),
                                       "return_aux": "AuxRequest(lse=True)"}, indent=14),
             "return out.transpose(1, 2), aux.lse"]
    filled = "filled by assign()" if assign else "page table filled from the block table"
    doc = (f"torch flex_attention, eager, over PagedAttention's caches ({filled}, {size}-slot pages) as attnfuzz's "
           f"flex-paged adapter runs it for spelling {case.spelling!r}.")
    named = {"RETURNS_LSE": (True, "attention returns (out, lse): the script checks both"),
             "LENS_Q": (list(case.lens_q), "valid queries per sequence"),
             "LENS_KV": (list(case.lens_kv), "keys in each sequence's cache")}
    if not assign:
        named["BLOCK_TABLE"] = (cache.block_table, "pool pages of each sequence, in shuffled "
                                "order; entries past its pages name a page of garbage")
    if case.mask_density is not None:
        named["MASK"] = (torch.nn.functional.pad(t.mask, (0, logical_len - case.skv), value=False),
                         "the explicit mask drawn from the seed, True = keep, False past skv to the last page's end")
    header = ("\n\n# mask_mods, score_mods and PagedAttention's caches, verbatim from attnfuzz's flex-paged adapter "
              "(fuzz/backends/flex/mods.py, pages.py)")
    return header + src.preamble(list(dict.fromkeys(used)), named) + src.attention(doc, body)
