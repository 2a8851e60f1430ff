"""The DotProductAttention call for a case and its spelling: TE's mask type and window, the padding masks, and the
constructor and forward arguments. Shared by the adapter's run() and its repro writer; adapter.py lists which
spelling applies to which case."""

from __future__ import annotations

import torch

from attnfuzz.backends.layout import cu_seqlens, to_layout, visibility_mask
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

SOFTMAX_TYPES = {"vanilla": "vanilla", "off_by_one": "off-by-one", "learnable": "learnable"}
# the attn_mask_type strings TE normalises to the canonical ones (replace(",", "_"), then "causal_padding" ->
# "padding_causal", in DotProductAttention.__init__ and forward; the docstring names 'padding,causal' and
# 'causal,padding'): spelling -> canonical type -> the string passed
MASK_TYPE_ALIASES = {
    "comma-mask-type": {"padding_causal": "padding,causal", "padding_causal_bottom_right": "padding,causal_bottom_right",
                        "causal_bottom_right": "causal,bottom_right"},
    "causal-padding": {"padding_causal": "causal,padding"},
}


def band_kind(case: Case) -> str:
    if case.mask_density is not None:
        return "arbitrary"
    if case.right == 0:
        return "causal"
    return "full" if (case.left, case.right) == (None, None) else "window"


def is_cross(case: Case) -> bool:
    return case.sq != case.skv or case.lens_q != case.lens_kv


def te_mask(case: Case) -> tuple[str, tuple[int, int] | None]:
    """(attn_mask_type, window_size) for the case and its spelling; -1 is TE's unbounded side."""
    spelling, kind = case.spelling, band_kind(case)
    left, right = case.left, case.right
    wide = max(case.sq, case.skv)
    if spelling == "arbitrary" or kind == "arbitrary":
        mask_type, window = "arbitrary", None
    elif kind == "causal" and spelling != "window":
        mask_type = "causal_bottom_right" if case.alignment == "bottom_right" else "causal"
        if spelling == "wide":
            window = (wide if left is None else left, 0)
        elif spelling == "unbounded-window":   # check_set_window_size turns (-1, -1) into (-1, 0) for causal types
            window = (-1, -1)
        elif spelling == "explicit-window" or left is not None:
            window = (-1 if left is None else left, 0)
        else:
            window = None
    else:
        mask_type, window = "no_mask", None
        if kind != "full" or spelling == "wide":
            window = (wide if left is None else left, wide if right is None else right)
        elif spelling == "unbounded-window":
            window = (-1, -1)
    padding = case.padded or case.layout == "thd" or spelling in ("padding", "attention_mask")
    if padding and mask_type != "arbitrary":
        mask_type = "padding" if mask_type == "no_mask" else f"padding_{mask_type}"
    return mask_type, window


def flash_call(case: Case) -> tuple[bool, tuple[int, int], str]:
    """(causal, window_size, entry point) of the flash-attn call TE 2.20.2's FlashAttention backend makes for the case:
    causal is "causal" in the mask type; the window as check_set_window_size leaves it (-1 unbounded: a causal type
    takes (-1, 0) or (left, 0), the others (-1, -1) or the window given, (-1, 0) read as (-1, -1)); flash_attn_func for
    bshd / sbhd without padding, else flash_attn_varlen_func."""
    mask_type, window = te_mask(case)
    causal = "causal" in mask_type
    if causal:
        window = (-1 if window is None else window[0], 0)
    elif window is None or window == (-1, 0):
        window = (-1, -1)
    varlen = case.layout == "thd" or "padding" in mask_type
    return causal, window, "flash_attn_varlen_func" if varlen else "flash_attn_func"


def padding_mask(lens, s: int, device) -> torch.Tensor:
    """bool [b, 1, 1, s], True at the padding positions past each length (TE's attention_mask: True = masked out)."""
    return (torch.arange(s, device=device)[None] >= torch.tensor(lens, device=device)[:, None])[:, None, None, :]


def te_call(case: Case, t: Tensors, backend: str) -> tuple[dict, tuple, dict]:
    """(DotProductAttention kwargs, forward args, forward kwargs) for the case and its spelling."""
    spelling = case.spelling
    bottom_right = case.alignment == "bottom_right"
    mask_type, window = te_mask(case)
    padded = "padding" in mask_type
    cross = is_cross(case) or spelling == "cross"
    init = {"num_attention_heads": case.h,
            "kv_channels": case.d_qk if case.d_qk == case.d_v else (case.d_qk, case.d_v),
            "num_gqa_groups": case.hk, "attention_dropout": 0.0, "qkv_format": case.layout,
            "attn_mask_type": mask_type, "window_size": window, "bottom_right_diagonal": bottom_right,
            "softcap": case.softcap or 0.0, "attention_type": "cross" if cross else "self",
            "softmax_scale": case.scale, "softmax_type": SOFTMAX_TYPES[case.softmax]}
    lens = (case.lens_q, case.lens_kv, case.lens_kv) if case.layout == "thd" else ((), (), ())
    args = tuple(to_layout(case, x, n) for x, n in zip((t.q, t.k, t.v), lens))
    init["attn_mask_type"] = MASK_TYPE_ALIASES.get(spelling, {}).get(mask_type, mask_type)
    kwargs = {}
    if padded and mask_type != "arbitrary" and spelling != "attention_mask":
        kwargs.update(cu_seqlens_q=cu_seqlens(case.lens_q, t.q.device), cu_seqlens_kv=cu_seqlens(case.lens_kv,
                      t.q.device))
        if spelling != "no-max-seqlen":   # thd: TE rounds the longest sequence up to a multiple of 64 itself
            kwargs.update(max_seqlen_q=case.sq, max_seqlen_kv=case.skv)
    if spelling == "attention_mask":
        masks = (padding_mask(case.lens_q, case.sq, t.q.device), padding_mask(case.lens_kv, case.skv, t.q.device))
        kwargs["attention_mask"] = masks if cross else masks[0]
    if mask_type == "arbitrary":
        kwargs["attention_mask"] = ~visibility_mask(case, t, t.q.device)
    if case.alibi_slopes is not None:
        kwargs.update(core_attention_bias_type="alibi", alibi_slopes=t.alibi.float())
    if spelling == "forward-args":
        for name in ("attn_mask_type", "window_size", "bottom_right_diagonal"):
            kwargs[name] = init.pop(name)
    return init, args, kwargs
