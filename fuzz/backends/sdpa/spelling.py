"""How a case is written for torch SDPA: its spellings (mask, mask form, scale, GQA, module), and its tensors and
masks in them.

A spelling is '+'-joined, in this order; "" is the first spelling the kernel takes for the case:
  mask    no_mask | is_causal | causal_upper_left | causal_lower_right | bool_mask | float_mask | float32_mask
          The causal spellings exist for plain causal cases only (top-left: is_causal, causal_upper_left; bottom-right:
          causal_lower_right; a square case has all three). Windows, padding, the explicit mask and ALiBi always go
          through a dense mask from fuzz/backends/layout.py; ALiBi only as an additive float bias. float32_mask is the
          additive mask in float32 for a float16 / bfloat16 query: SDPA's input check takes a mask that is bool,
          float32 or of the query's dtype ("Expected attn_mask dtype to be bool or float or to match query dtype").
  form    (dense masks only; "" is [b, 1, sq, skv], [b, h, sq, skv] with ALiBi)
          mask_2d [sq, skv] | mask_3d [1 or h, sq, skv] | mask_1_1 [1, 1, sq, skv] | mask_1_h [1, h, sq, skv]
          (these four where the mask is the same for every sequence, the 2-d and 1_1 ones where it is the same for
          every head) | mask_b_h [b, h, sq, skv] | mask_key_row [b, 1, 1, skv] (padding of the keys alone: no band,
          no explicit mask, no ALiBi; query rows past a sequence's length are not graded) | mask_expanded (the
          smallest of those shapes expanded with stride 0 to [b, h, sq, skv]) | mask_transposed (the default shape,
          its values in a [..., skv, sq] buffer seen transposed)
  padding key_padding_mask   (nn.MultiheadAttention only: the padding of the keys as its boolean key_padding_mask)
  heads   enable_gqa | repeat_kv   (GQA cases only: SDPA's own broadcast, or K/V repeated per query head)
  scale   explicit_scale   (cases with the default scale: 1/sqrt(d_qk) passed as a number)
  module  mha_batch_first | mha_seq_first   (through nn.MultiheadAttention, fuzz/backends/sdpa/modules.py: bshd
          cases batch-first, sbhd cases sequence-first; its masks are bool_mask / float_mask as attn_mask (3-d
          [b * h, sq, skv], or mask_2d), is_causal (square causal: the hint with the mask of
          nn.Transformer.generate_square_subsequent_mask), no_mask, each with or without key_padding_mask)
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch

from attnfuzz.backends import layout
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors, materialize, stored, torch_dtype


DENSE = ("bool_mask", "float_mask", "float32_mask")
FORMS = ("mask_2d", "mask_3d", "mask_1_1", "mask_1_h", "mask_b_h", "mask_key_row", "mask_expanded", "mask_transposed")
MODULES = ("mha_batch_first", "mha_seq_first")


@dataclass(frozen=True)
class Spelling:
    """How one case is written for SDPA: the mask spelling, the dense mask's form, nn.MultiheadAttention's key
    padding mask, the GQA spelling ("" when h == hk), the scale and the module called ("": SDPA itself)."""

    mask: str
    heads: str = ""
    form: str = ""
    scale: str = ""
    module: str = ""
    padding: str = ""

    @property
    def name(self) -> str:
        return "+".join(p for p in (self.mask, self.form, self.padding, self.heads, self.scale, self.module) if p)

    @property
    def dense(self) -> bool:
        return self.mask in DENSE


def mask_spellings(case: Case) -> tuple[str, ...]:
    """The mask spellings SDPA has for this case, the preferred one first."""
    banded_only = not case.padded and case.mask_density is None and case.alibi_slopes is None and case.left is None
    half = ("float32_mask",) if case.dtype in ("float16", "bfloat16") else ()
    if banded_only and case.right is None:
        return ("no_mask", "bool_mask", "float_mask", *half)
    if banded_only and case.right == 0:
        square = case.sq == case.skv
        top_left = ("is_causal", "causal_upper_left") if case.alignment == "top_left" or square else ()
        bottom_right = ("causal_lower_right",) if case.alignment == "bottom_right" or square else ()
        return (*top_left, *bottom_right, "bool_mask", "float_mask", *half)
    return ("float_mask", *half) if case.alibi_slopes is not None else ("bool_mask", "float_mask", *half)


def same_per_sequence(case: Case) -> bool:
    return case.b == 1 or (len(set(case.lens_q)) == 1 and len(set(case.lens_kv)) == 1 and case.mask_density is None)


def same_per_head(case: Case) -> bool:
    return case.alibi_slopes is None or case.h == 1


def keys_only(case: Case) -> bool:
    """Whether what a query sees depends on the key alone (on the graded rows): padding, no band, mask or ALiBi."""
    return (case.left is None and case.right is None and case.mask_density is None and case.alibi_slopes is None)


def mask_forms(case: Case) -> tuple[str, ...]:
    """The forms the dense mask takes for this case, "" (the default shape) first."""
    batch, head = same_per_sequence(case), same_per_head(case)
    return ("", *(f for f, ok in (("mask_2d", batch and head), ("mask_3d", batch), ("mask_1_1", batch and head),
                                  ("mask_1_h", batch), ("mask_b_h", True), ("mask_key_row", keys_only(case)),
                                  ("mask_expanded", True), ("mask_transposed", True)) if ok))


def module_spellings(case: Case) -> list[Spelling]:
    """nn.MultiheadAttention's spellings of the case: where it computes pure attention of q, k, v (identity
    projections; modules.py) with the default scale, one head per KV head and d_qk == d_v."""
    if case.h != case.hk or case.d_qk != case.d_v or case.scale is not None or case.layout == "thd":
        return []
    module = "mha_batch_first" if case.layout == "bshd" else "mha_seq_first"
    square_causal = (case.right == 0 and case.left is None and case.sq == case.skv and case.mask_density is None
                     and case.alibi_slopes is None and (not case.padded or case.alignment == "top_left"))
    masks = [Spelling(m, module=module) for m in mask_spellings(case) if m in ("bool_mask", "float_mask")]
    masks += [Spelling(m.mask, form="mask_2d", module=module) for m in list(masks)
              if same_per_sequence(case) and same_per_head(case)]
    plain = []
    if keys_only(case):
        plain.append(Spelling("no_mask", module=module, padding="key_padding_mask" if case.padded else ""))
    if square_causal:
        plain.append(Spelling("is_causal", module=module, padding="key_padding_mask" if case.padded else ""))
    return plain + masks


def all_spellings(case: Case) -> list[Spelling]:
    """Every spelling: the mask and GQA ones first (in the order of before), then the mask forms, the explicit
    scale and the module calls."""
    return list(_spelled(case)[0])


def spelling_names(case: Case) -> tuple[str, ...]:
    """The names of all_spellings(case), in its order."""
    return _spelled(case)[1]


def parse(case: Case) -> Spelling | None:
    """The explicitly named spelling of case.spelling, or None when SDPA has no such spelling for this case."""
    return _spelled(case)[2].get(case.spelling)


def _spelled(case: Case) -> tuple[tuple[Spelling, ...], tuple[str, ...], dict[str, Spelling]]:
    """all_spellings, their names, and the spellings by name: listed once per case, which is drawn, checked and run
    twice (its own spelling left out of the key: it changes none of them)."""
    return _listed(case.replace(spelling="") if case.spelling else case)


@lru_cache(maxsize=64)
def _listed(case: Case) -> tuple[tuple[Spelling, ...], tuple[str, ...], dict[str, Spelling]]:
    sdpa, names = _sdpa_spellings(mask_spellings(case), mask_forms(case), case.hk < case.h, case.scale is None)
    modules = tuple(module_spellings(case))
    options, names = sdpa + modules, names + tuple(s.name for s in modules)
    return options, names, dict(zip(names, options))


@lru_cache(maxsize=256)
def _sdpa_spellings(masks: tuple[str, ...], forms: tuple[str, ...], gqa: bool,
                    default_scale: bool) -> tuple[tuple[Spelling, ...], tuple[str, ...]]:
    """The SDPA call's spellings and their names, from what they depend on: a case's mask spellings, mask forms,
    whether it is GQA and whether its scale is the default (about a hundred spellings, shared by many cases)."""
    heads = ("enable_gqa", "repeat_kv") if gqa else ("",)
    base = [Spelling(m, g) for m, g in itertools.product(masks, heads) if m != "float32_mask"]
    dense = [m for m in masks if m in DENSE]
    formed = [Spelling(m, g, form=f) for m, f, g in itertools.product(dense, forms, heads)
              if f or m == "float32_mask"]
    scaled = [Spelling(s.mask, s.heads, s.form, "explicit_scale") for s in base + formed] if default_scale else []
    options = tuple(base + formed + scaled)
    return options, tuple(s.name for s in options)


def formed(mask: torch.Tensor, case: Case, form: str) -> torch.Tensor:
    """The default-shaped dense mask (`mask`, [b, 1 or h, sq, skv]) in `form`; FORM_SOURCE writes the same."""
    b, h = case.b, case.h
    full = (b, h, case.sq, case.skv)
    if form == "mask_2d":
        return mask[0, 0]
    if form == "mask_3d":
        return mask[0]
    if form == "mask_1_1":
        return mask[:1, :1]
    if form == "mask_1_h":
        return mask[:1].expand(1, h, *full[2:]).contiguous()
    if form == "mask_b_h":
        return mask.expand(full).contiguous()
    if form == "mask_expanded":
        small = mask[:1] if same_per_sequence(case) else mask
        return (small[:, :1] if same_per_head(case) else small).expand(full)
    if form == "mask_transposed":
        return mask.transpose(-1, -2).contiguous().transpose(-1, -2)
    return mask


# the same forms as source, for repro scripts: MASK is the default-shaped mask
FORM_SOURCE = {"": "MASK", "mask_2d": "MASK[0, 0]", "mask_3d": "MASK[0]", "mask_1_1": "MASK[:1, :1]",
               "mask_1_h": "MASK[:1].expand(1, {h}, {sq}, {skv}).contiguous()",
               "mask_b_h": "MASK.expand({b}, {h}, {sq}, {skv}).contiguous()",
               "mask_expanded": "MASK[{rows}, {heads}].expand({b}, {h}, {sq}, {skv})  # stride 0",
               "mask_transposed": "MASK.transpose(-1, -2).contiguous().transpose(-1, -2)  # a [..., skv, sq] buffer",
               "mask_key_row": "MASK"}


def form_source(case: Case, form: str) -> str:
    rows = ":1" if same_per_sequence(case) else ":"
    heads = ":1" if same_per_head(case) else ":"
    return FORM_SOURCE[form].format(b=case.b, h=case.h, sq=case.sq, skv=case.skv, rows=rows, heads=heads)


def key_row(case: Case, device) -> torch.Tensor:
    """bool [b, 1, 1, skv]: True on each sequence's valid keys (the form mask_key_row)."""
    j = torch.arange(case.skv, device=device)
    return (j[None, :] < torch.tensor(case.lens_kv, device=device)[:, None])[:, None, None, :]


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
    """attn_mask for the public call: None, a CausalBias, or a boolean mask or an additive float mask (float32 for
    float32_mask) in the spelling's form."""
    if spelling.mask in ("no_mask", "is_causal"):
        return None
    if spelling.mask in ("causal_upper_left", "causal_lower_right"):
        from torch.nn.attention import bias
        make = bias.causal_upper_left if spelling.mask == "causal_upper_left" else bias.causal_lower_right
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lower right ... NaNs when seq_len_q > seq_len_kv": graded, not warned
            return make(case.sq, case.skv)
    return formed(dense_mask(case, tensors, spelling, dtype, device), case, spelling.form)


def dense_mask(case: Case, tensors: Tensors, spelling: Spelling, dtype, device) -> torch.Tensor:
    """The dense mask in its default shape ([b, 1 or h, sq, skv]; [b, 1, 1, skv] for mask_key_row), before its
    form: boolean for bool_mask, additive in the query's dtype for float_mask, in float32 for float32_mask."""
    dtype = torch.float32 if spelling.mask == "float32_mask" else dtype
    if spelling.form == "mask_key_row":
        keep = key_row(case, device)
        return keep if spelling.mask == "bool_mask" else torch.zeros(keep.shape, dtype=dtype,
                                                                     device=device).masked_fill(~keep, float("-inf"))
    if spelling.mask == "bool_mask":
        return layout.visibility_mask(case, tensors, device)
    return additive_mask(case, tensors, dtype, device)


def redrawn(case: dict, spelling: str) -> tuple[Case, Tensors, Spelling]:
    """A repro script's case (Case.to_dict), its tensors drawn again on the CPU from its seed, and the spelling named
    `spelling`: what a mask too large to write into the script is rebuilt from."""
    drawn = Case.from_dict(case)
    return drawn, materialize(drawn, "cpu"), parse(drawn.replace(spelling=spelling))


def regenerated_mask(case: dict, spelling: str) -> torch.Tensor:
    """The dense mask a repro script of `case` passes under the spelling named `spelling`, rebuilt (redrawn)."""
    drawn, tensors, spelled = redrawn(case, spelling)
    return dense_mask(drawn, tensors, spelled, torch_dtype(drawn), "cpu")


def aligned_bias(bias: torch.Tensor, h: int) -> torch.Tensor:
    """The bias as the public path hands it to the efficient / cuDNN ops: rows padded to 8 elements, then sliced,
    expanded to [b, h, sq, skv]."""
    b, heads, sq, skv = bias.shape  # heads is 1 for a mask, h for an ALiBi bias
    padded = bias.new_zeros(b, heads, sq, skv + (-skv % 8))
    padded[..., :skv] = bias
    return padded[..., :skv].expand(b, h, sq, skv)
