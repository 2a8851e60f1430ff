"""TransformerEngine DotProductAttention's standalone repro source: the NVTE_* switches leaving only the adapter's
backend eligible (selection.ENV), then the module's construction arguments and the forward call exactly as the
adapter's `te_call(case, tensors, backend)` makes them (qkv_format bshd / sbhd / thd with cu_seqlens,
attn_mask_type, window_size, bottom_right_diagonal, padding or arbitrary attention_mask, ALiBi, softmax sinks)."""

from __future__ import annotations

import torch

from attnfuzz.backends import layout
from attnfuzz.backends import source as src
from attnfuzz.backends.te import selection as sel
from attnfuzz.backends.te.call import padding_mask, te_call
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import materialize

WHY = {"attention_mask": "the arbitrary mask, True = masked out (TE's convention)",
       "alibi_slopes": "ALiBi slopes, one per query head"}


def _forward_kwargs(case: Case, kwargs: dict) -> tuple[dict[str, str], dict[str, tuple[torch.Tensor, str]]]:
    """(forward keyword arguments as source, the tensor constants they name, with what each holds). Lengths are
    written as the helper calls that make them; any other tensor becomes a constant holding its exact value."""
    spelled, constants = {}, {}
    for name, x in kwargs.items():
        if name in ("cu_seqlens_q", "cu_seqlens_kv"):
            spelled[name] = f"cu_seqlens({'lens_q' if name.endswith('_q') else 'lens_kv'}, q.device)"
        elif name == "attention_mask" and case.spelling == "attention_mask":
            masks = [f"padding_mask(lens_q, {case.sq}, q.device)", f"padding_mask(lens_kv, {case.skv}, q.device)"]
            spelled[name] = f"({', '.join(masks)})" if isinstance(x, tuple) else masks[0]
        elif isinstance(x, torch.Tensor):
            constants[name.upper()] = (x, WHY.get(name, f"{name}, as the adapter passes it"))
            spelled[name] = f"{name.upper()}.to(q.device)"
        else:
            spelled[name] = repr(x)
    return spelled, constants


def construction(init: dict, *, learnable: bool, suffix: str = "") -> list[str]:
    """Body lines: the NVTE_* switches (constant NVTE) set before TE is imported, DotProductAttention(**init) built
    as `dpa` (`suffix` appended, e.g. ".to(device)"), and its learnable sink logits copied from the constant SINK."""
    lines = ["import os", "", "os.environ.update(NVTE)  # before TE is imported: only one backend eligible",
             "import transformer_engine.pytorch as te", "",
             "dpa = " + src.call("te.DotProductAttention", [], {name: repr(x) for name, x in init.items()}) + suffix]
    if learnable:
        lines += ["with torch.no_grad():", "    dpa.softmax_offset.copy_(SINK.to(dpa.softmax_offset))"]
    return lines


def te_source(backend, case: Case) -> str:
    """Source defining `attention(q, k, v)` for a TransformerEngineAttention adapter (te-flash / -fused / -unfused)."""
    t = materialize(case, "cpu")
    init, _, kwargs = te_call(case, t, backend.te_backend)
    spelled, constants = _forward_kwargs(case, kwargs)
    if case.softmax == "learnable":
        constants["SINK"] = (t.sink, "the learnable sink logits drawn from the seed")
    body = [*construction(init, learnable=case.softmax == "learnable"), f"dpa.train({case.grads})"]
    if case.layout == "thd" or "cu_seqlens_q" in kwargs or case.spelling == "attention_mask":
        body.append(f"lens_q, lens_kv = {list(case.lens_q)!r}, {list(case.lens_kv)!r}  # valid tokens per sequence")
    if case.layout == "thd":
        body.append("q, k, v = pack(q, lens_q), pack(k, lens_kv), pack(v, lens_kv)  # thd: [total, heads, d]")
    elif case.layout == "sbhd":
        seq_major = "x.transpose(0, 1).contiguous()" if case.memory == "contiguous" else "x.transpose(0, 1)"
        body.append(f"q, k, v = ({seq_major} for x in (q, k, v))  # sbhd")
    body.append("out = " + src.call("dpa", ["q", "k", "v"], spelled))
    if case.layout == "thd":
        body.append(f"return unpack(out.reshape(out.shape[0], {case.h}, {case.d_v}), lens_q, {case.sq})")
    else:
        body.append(f"out = out.reshape(*out.shape[:2], {case.h}, {case.d_v})  # heads split out of h * d_v")
        body.append("return out.transpose(0, 1)" if case.layout == "sbhd" else "return out")
    doc = (f"TransformerEngine DotProductAttention with only {backend.te_backend} enabled (NVTE_*), as attnfuzz's "
           f"{backend.name} adapter builds and calls it for spelling {case.spelling!r}.")
    used = ([layout.pack, layout.unpack] if case.layout == "thd" else []) + (
        [layout.cu_seqlens] if "cu_seqlens_q" in kwargs else []) + (
        [padding_mask] if case.spelling == "attention_mask" else [])
    named = {"NVTE": (sel.ENV[backend.te_backend], f"only {backend.te_backend} eligible"), **constants}
    return src.preamble(used, named) + src.attention(doc, body)


def fp8_source(backend, case: Case, init: dict, kwargs: dict, named: dict[str, tuple[object, str]]) -> str:
    """Source defining `attention(q, k, v)` for te-fused-fp8 (fuzz/backends/te/fp8.py), from its construction and
    forward arguments and `named` constants: Q_DESCALE, K_DESCALE, V_DESCALE, P_SCALE, O_SCALE (and OUT_DESCALE for
    an FP8 output). q, k, v (the dequantised values) are divided by their descales back into their e4m3 encodings
    (exact) and handed over as Float8Tensors with those descales; P's and O's scales are set in the module's fp8_meta
    inside the FP8 autocast, as run() does."""
    spelled, constants = _forward_kwargs(case, kwargs)
    constants.update(named)
    fmt = "E4M3" if case.spelling == "e4m3-format" else "HYBRID"
    body = construction(init, learnable=False)
    at = body.index("import transformer_engine.pytorch as te") + 1
    body[at:at] = ["from transformer_engine.common.recipe import DelayedScaling, Format",
                   "from transformer_engine.pytorch.cpp_extensions.fused_attn import META_O, META_S"]
    body.append("dpa.train(False)")
    if "cu_seqlens_q" in kwargs:
        body.append(f"lens_q, lens_kv = {list(case.lens_q)!r}, {list(case.lens_kv)!r}  # valid tokens per sequence")
    seq_major = ".transpose(0, 1)" if case.layout == "sbhd" else ""
    body += ["pairs = ((q, Q_DESCALE), (k, K_DESCALE), (v, V_DESCALE))",
             f"encoded = [((x / d.to(x.device)){seq_major}.contiguous().to(torch.float8_e4m3fn), d.to(x.device))",
             f"           for x, d in pairs]  # the e4m3 encodings (exact){', sbhd' if seq_major else ''}",
             f"q, k, v = (te.Float8Tensor(shape=x.shape, dtype=torch.{case.dtype}, data=x.view(torch.uint8), "
             f"fp8_scale_inv=d,",
             "                           fp8_dtype=te.DType.kFloat8E4M3, requires_grad=False, device=x.device)",
             "           for x, d in encoded)",
             f"recipe = DelayedScaling(fp8_format=Format.{fmt}, fp8_dpa=True)",
             "with torch.no_grad(), te.autocast(enabled=True, recipe=recipe):",
             "    dpa.init_fp8_metadata(num_gemms=3)  # the S and O scales exist from here",
             "    dpa.fp8_meta['scaling_fwd'].scale[META_S] = P_SCALE",
             "    dpa.fp8_meta['scaling_fwd'].scale[META_O] = O_SCALE",
             "    out = " + src.call("dpa", ["q", "k", "v"], spelled, indent=8).replace("\n", "\n    ")]
    if kwargs["fp8_output"]:
        body.append("out = out._data.view(torch.float8_e4m3fn).float() * OUT_DESCALE  # dequantised e4m3 encodings")
    body.append(f"out = out.reshape(*out.shape[:2], {case.h}, {case.d_v})  # heads split out of h * d_v")
    body.append("return out.transpose(0, 1)" if case.layout == "sbhd" else "return out")
    doc = (f"TransformerEngine DotProductAttention with only FusedAttention enabled (NVTE_*) under FP8 attention "
           f"(DelayedScaling, fp8_dpa), as attnfuzz's {backend.name} adapter builds and calls it for spelling "
           f"{case.spelling!r}.")
    used = [layout.cu_seqlens] if "cu_seqlens_q" in kwargs else []
    switches = {"NVTE": (sel.ENV[backend.te_backend], f"only {backend.te_backend} eligible")}
    return src.preamble(used, {**switches, **constants}) + src.attention(doc, body)
