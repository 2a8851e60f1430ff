"""How a case is written for torch SDPA: its spellings (mask and GQA), and its tensors and masks in them.

A spelling is '+'-joined; "" is the first spelling the kernel takes for the case:
  mask   no_mask | is_causal | causal_upper_left | causal_lower_right | bool_mask | float_mask
         The causal spellings exist for plain causal cases only (top-left: is_causal, causal_upper_left; bottom-right:
         causal_lower_right; a square case has all three). Windows, padding, the explicit mask and ALiBi always go
         through a dense mask from fuzz/backends/layout.py; ALiBi only as an additive float bias.
  heads  enable_gqa | repeat_kv   (GQA cases only: SDPA's own broadcast, or K/V repeated per query head)
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import torch

from attnfuzz.backends import layout
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, stored, torch_dtype


@dataclass(frozen=True)
class Spelling:
    """How one case is written for SDPA: the mask spelling and the GQA spelling ("" when h == hk)."""

    mask: str
    heads: str = ""

    @property
    def name(self) -> str:
        return "+".join(part for part in (self.mask, self.heads) if part)


def mask_spellings(case: Case) -> tuple[str, ...]:
    """The mask spellings SDPA has for this case, the preferred one first."""
    banded_only = not case.padded and case.mask_density is None and case.alibi_slopes is None and case.left is None
    if banded_only and case.right is None:
        return ("no_mask", "bool_mask", "float_mask")
    if banded_only and case.right == 0:
        square = case.sq == case.skv
        top_left = ("is_causal", "causal_upper_left") if case.alignment == "top_left" or square else ()
        bottom_right = ("causal_lower_right",) if case.alignment == "bottom_right" or square else ()
        return (*top_left, *bottom_right, "bool_mask", "float_mask")
    return ("float_mask",) if case.alibi_slopes is not None else ("bool_mask", "float_mask")


def all_spellings(case: Case) -> list[Spelling]:
    heads = ("enable_gqa", "repeat_kv") if case.hk < case.h else ("",)
    return [Spelling(m, g) for m, g in itertools.product(mask_spellings(case), heads)]


def parse(case: Case) -> Spelling | None:
    """The explicitly named spelling of case.spelling, or None when SDPA has no such spelling for this case."""
    named = {s.name: s for s in all_spellings(case)}
    return named.get(case.spelling)


# -- tensors in SDPA's spelling --------------------------------------------------------------------------------------
def skeleton(case: Case, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty q, k, v with the logical shapes, memory formats and storage materialize() gives the case."""
    dtype = torch_dtype(case)

    def make(s: int, heads: int, d: int, kv: bool) -> torch.Tensor:
        if kv and case.memory == "expanded_kv":
            return torch.empty(case.b, s, 1, d, dtype=dtype, device=device).expand(case.b, s, heads, d)
        if case.memory == "transposed":
            return torch.empty(case.b, heads, s, d, dtype=dtype, device=device).transpose(1, 2)
        return torch.empty(case.b, s, heads, d, dtype=dtype, device=device)

    plain = (make(case.sq, case.h, case.d_qk, False), make(case.skv, case.hk, case.d_qk, True),
             make(case.skv, case.hk, case.d_v, True))
    return tuple(stored(x, kind) for x, kind in zip(plain, case.storage))


def sdpa_inputs(case: Case, q, k, v, spelling: Spelling, grads: bool = False):
    """(leaves in the case's layout, the [b, h, s, d] views SDPA is given). sbhd leaves are seq-major buffers seen
    through a permuted view, so SDPA meets their strides."""
    leaves = []
    for x, lens in ((q, case.lens_q), (k, case.lens_kv), (v, case.lens_kv)):
        leaves.append(layout.to_layout(case, x, lens).detach().requires_grad_(grads))
    views = [leaf.permute(1, 2, 0, 3) if case.layout == "sbhd" else leaf.transpose(1, 2) for leaf in leaves]
    if spelling.heads == "repeat_kv":
        views[1:] = [x.repeat_interleave(case.h // case.hk, dim=1) for x in views[1:]]
    return leaves, views


def logical_grad(case: Case, grad: torch.Tensor, s: int) -> torch.Tensor:
    """A leaf's gradient back in the logical [b, s, heads, d]."""
    return layout.from_layout(case, grad, (), s)


def additive_mask(case: Case, tensors: Tensors, dtype, device) -> torch.Tensor:
    """The float mask: 0 where visible, -inf elsewhere, plus the ALiBi bias when the case has one."""
    keep = layout.visibility_mask(case, tensors, device)
    base = (layout.alibi_bias(case, tensors, device, dtype) if case.alibi_slopes is not None
            else torch.zeros(keep.shape, dtype=dtype, device=device))
    return base.masked_fill(~keep, float("-inf"))


def public_mask(case: Case, tensors: Tensors, spelling: Spelling, dtype, device):
    """attn_mask for the public call: None, a CausalBias, a boolean mask or an additive float mask."""
    if spelling.mask in ("no_mask", "is_causal"):
        return None
    if spelling.mask in ("causal_upper_left", "causal_lower_right"):
        from torch.nn.attention import bias
        make = bias.causal_upper_left if spelling.mask == "causal_upper_left" else bias.causal_lower_right
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lower right ... NaNs when seq_len_q > seq_len_kv": graded, not warned
            return make(case.sq, case.skv)
    if spelling.mask == "bool_mask":
        return layout.visibility_mask(case, tensors, device)
    return additive_mask(case, tensors, dtype, device)


def aligned_bias(bias: torch.Tensor, h: int) -> torch.Tensor:
    """The bias as the public path hands it to the efficient / cuDNN ops: rows padded to 8 elements, then sliced,
    expanded to [b, h, sq, skv]."""
    b, heads, sq, skv = bias.shape  # heads is 1 for a mask, h for an ALiBi bias
    padded = bias.new_zeros(b, heads, sq, skv + (-skv % 8))
    padded[..., :skv] = bias
    return padded[..., :skv].expand(b, h, sq, skv)
