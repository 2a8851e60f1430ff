"""torch SDPA reached through nn.MultiheadAttention, as models call it: the spellings mha_batch_first (bshd cases)
and mha_seq_first (sbhd cases) of fuzz/backends/sdpa/spelling.py.

The module computes pure attention of the case's q, k, v: embed_dim = h * d, in_proj the identity (three stacked
identities), both biases 0, out_proj the identity, so its output is SDPA's on q, k, v split into heads the way the
module splits them (channel c of the embedding is head c // d, feature c % d) and the oracle grades it as any other
spelling. These projections are exact in every dtype (each output element is one input element times 1 plus zeros).
q, k and v are distinct tensors, so the module never takes its fused self-attention fast path
(torch._native_multi_head_attention), and need_weights=False sends it to F.scaled_dot_product_attention
(torch/nn/functional.py, multi_head_attention_forward), which the adapter forces to one kernel as for a direct call.

What the module hands SDPA (multi_head_attention_forward in torch 2.13):
  - a boolean attn_mask means True = masked out (SDPA's is the inverse); it is turned into a float mask of the query's
    dtype (_canonical_mask) before SDPA sees it. A 2-d [sq, skv] mask reaches SDPA as [1, 1, sq, skv], a 3-d
    [b * h, sq, skv] one as [b, h, sq, skv].
  - key_padding_mask [b, skv] (True = padding) is merged into attn_mask, or is SDPA's whole mask [b, h, 1, skv].
  - is_causal=True needs an attn_mask (nn.Transformer.generate_square_subsequent_mask gives one) and, without a
    key_padding_mask, drops it and calls SDPA with is_causal=True: top-left causal, so only square causal cases are
    spelled that way. With a key_padding_mask the mask is used and the hint dropped; that mask is float32 whatever
    the inputs' dtype (as models call it), so a half-precision case hands SDPA a float32 mask (the float32_mask
    trait of fuzz/store/known.py).
The nn.Transformer* layers call their self_attn with query = key = value = the (normed) input and add the residual
and layer norms around it: they cannot be made to compute attention of three distinct q, k, v, so they are not
spelled.
"""

from __future__ import annotations

import contextlib

import torch

from attnfuzz.backends import layout
from attnfuzz.backends.sdpa.spelling import Spelling, additive_mask, formed, key_row, redrawn
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, torch_dtype


def identity_mha(case: Case, batch_first: bool, dtype, device) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention of embed_dim h * d_qk and h heads whose projections are the identity (no gradients)."""
    e = case.h * case.d_qk
    mha = torch.nn.MultiheadAttention(e, case.h, dropout=0.0, bias=True, batch_first=batch_first, device=device,
                                      dtype=dtype)
    with torch.no_grad():
        eye = torch.eye(e, dtype=dtype, device=device)
        mha.in_proj_weight.copy_(torch.cat([eye, eye, eye]))
        mha.in_proj_bias.zero_()
        mha.out_proj.weight.copy_(eye)
        mha.out_proj.bias.zero_()
    return mha.requires_grad_(False).eval()


def embedded(case: Case, leaf: torch.Tensor) -> torch.Tensor:
    """A leaf in the case's layout (bshd [b, s, h, d] / sbhd [s, b, h, d]) as the module's [b, s, E] / [s, b, E]."""
    return leaf.reshape(*leaf.shape[:2], -1)


def unembedded(case: Case, out: torch.Tensor) -> torch.Tensor:
    """The module's output back in the logical [b, sq, h, d_v]."""
    out = out.reshape(*out.shape[:2], case.h, case.d_v)
    return out if case.layout == "bshd" else out.transpose(0, 1)


def module_masks(case: Case, tensors: Tensors | None, spelling: Spelling, dtype, device) -> dict:
    """attn_mask, key_padding_mask and is_causal for the module call. Without tensors (a probe of the dispatcher)
    the masks have the shapes and dtypes of the real ones and nothing masked."""
    kwargs = {"attn_mask": None, "key_padding_mask": None, "is_causal": spelling.mask == "is_causal"}
    if spelling.mask == "is_causal":
        kwargs["attn_mask"] = torch.nn.Transformer.generate_square_subsequent_mask(case.sq, device=device)
    if spelling.padding:
        kwargs["key_padding_mask"] = (~key_row(case, device)[:, 0, 0] if tensors is not None
                                      else torch.zeros(case.b, case.skv, dtype=torch.bool, device=device))
    if spelling.mask in ("bool_mask", "float_mask"):
        heads = case.h if case.alibi_slopes is not None else 1
        if tensors is None:
            mask = torch.zeros(case.b, heads, case.sq, case.skv, device=device,
                               dtype=torch.bool if spelling.mask == "bool_mask" else dtype)
        elif spelling.mask == "bool_mask":
            mask = ~layout.visibility_mask(case, tensors, device)  # the module's True is "masked out"
        else:
            mask = additive_mask(case, tensors, dtype, device)
        if spelling.form == "mask_2d":
            kwargs["attn_mask"] = formed(mask, case, "mask_2d")
        else:
            kwargs["attn_mask"] = mask.expand(case.b, case.h, case.sq, case.skv).reshape(-1, case.sq, case.skv)
    return kwargs


def call(mha: torch.nn.MultiheadAttention, query, key, value, masks: dict) -> torch.Tensor:
    out, weights = mha(query, key, value, need_weights=False, **masks)
    assert weights is None
    return out


@contextlib.contextmanager
def dispatch_only(attention):
    """The module's own code runs, but its projections only give tensors of their shapes (uninitialised) and its
    F.scaled_dot_product_attention call goes to `attention(q, k, v, attn_mask, dropout_p, is_causal)`, which must
    return a tensor of the output's shape: the module hands SDPA exactly what a real call would (views, masks,
    is_causal, requires_grad), at no GEMM or kernel cost. The adapter asks torch's dispatcher there, so a probe of a
    module spelling builds no cuDNN graph and compiles nothing. Patches torch.nn.functional for the block's duration
    (multi_head_attention_forward looks both names up there)."""
    functional = torch.nn.functional
    saved = functional.linear, functional.scaled_dot_product_attention

    def shaped(input, weight, bias=None):
        out = input.new_empty(*input.shape[:-1], weight.shape[0])
        return out.requires_grad_(torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))

    functional.linear, functional.scaled_dot_product_attention = shaped, attention
    try:
        yield
    finally:
        functional.linear, functional.scaled_dot_product_attention = saved


def regenerated_module_mask(case: dict, spelling: str, name: str) -> torch.Tensor | None:
    """The module call's `name` mask ("attn_mask" or "key_padding_mask") that a repro script of `case` (Case.to_dict)
    passes under the spelling named `spelling`, rebuilt on the CPU from its seed: for masks too large to write out."""
    drawn, tensors, spelled = redrawn(case, spelling)
    return module_masks(drawn, tensors, spelled, torch_dtype(drawn), "cpu")[name]


# -- the same call as source, for repro scripts ---------------------------------------------------------------------
def repro_source(case: Case, spelling: Spelling, kernel: str, tensors: Tensors) -> str:
    """Source of `attention(q, k, v)` calling nn.MultiheadAttention with identity projections as the adapter does."""
    from attnfuzz.backends.source import written_mask
    masks = module_masks(case, tensors, spelling, torch_dtype(case), "cpu")
    attn = ("torch.nn.Transformer.generate_square_subsequent_mask(q.shape[1], device=q.device)"
            if spelling.mask == "is_causal" else "ATTN_MASK.to(q.device) if ATTN_MASK is not None else None")
    written, imports = {}, {}
    for name in ("attn_mask", "key_padding_mask"):
        written[name], imports[name] = written_mask(masks[name], "attnfuzz.backends.sdpa.modules",
                                                    "regenerated_module_mask", f"CASE, {spelling.name!r}, {name!r}")
    rebuilt = imports["attn_mask"] or imports["key_padding_mask"]
    batch_first = case.layout == "bshd"
    return (f"\n{rebuilt}ATTN_MASK = {written['attn_mask'] if spelling.mask != 'is_causal' else 'None'}"
            "  # nn.MultiheadAttention's attn_mask: True / -inf = masked out\n"
            f"KEY_PADDING_MASK = {written['key_padding_mask']}  # True = padding\n\n\n"
            "def attention(q, k, v):\n"
            f"    \"\"\"torch SDPA through nn.MultiheadAttention(batch_first={batch_first}) with identity projections "
            f"(pure attention), forced to {kernel}, spelled {spelling.name!r}.\"\"\"\n"
            "    from torch.nn.attention import SDPBackend, sdpa_kernel\n"
            "    b, sq, h, d = q.shape\n"
            "    e = h * d\n"
            f"    mha = torch.nn.MultiheadAttention(e, h, bias=True, batch_first={batch_first}, device=q.device, "
            "dtype=q.dtype)\n"
            "    with torch.no_grad():\n"
            "        eye = torch.eye(e, dtype=q.dtype, device=q.device)\n"
            "        mha.in_proj_weight.copy_(torch.cat([eye, eye, eye]))\n"
            "        mha.in_proj_bias.zero_()\n"
            "        mha.out_proj.weight.copy_(eye)\n"
            "        mha.out_proj.bias.zero_()\n"
            "    mha.requires_grad_(False).eval()\n"
            + ("    x = [t.reshape(t.shape[0], t.shape[1], e) for t in (q, k, v)]  # [b, s, E]\n" if batch_first else
               "    x = [t.transpose(0, 1).reshape(t.shape[1], t.shape[0], e) for t in (q, k, v)]  # [s, b, E]\n")
            + "    kpm = KEY_PADDING_MASK.to(q.device) if KEY_PADDING_MASK is not None else None\n"
            f"    with sdpa_kernel([SDPBackend.{kernel}]):\n"
            f"        out, _ = mha(*x, attn_mask={attn}, key_padding_mask=kpm, need_weights=False, "
            f"is_causal={spelling.mask == 'is_causal'})\n"
            "    out = out.reshape(out.shape[0], out.shape[1], h, v.shape[-1])\n"
            + ("    return out\n" if batch_first else "    return out.transpose(0, 1)\n"))
