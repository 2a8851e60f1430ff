"""How a case is written for one FlashInfer entry point: its spellings and the arguments each one passes.

A spelling is '+'-joined, in this order; "" is the adapters' own call (kv_layout "NHD", k / v or the pool as two
tensors, the band as causal + window_left, sm_scale and logits_soft_cap as numbers or None, the LSE asked for where
the entry point returns one by default in the adapters):
  layout  hnd            kv_layout="HND" (single entry points and paged caches)
  cache   kv_tensor      paged caches only: the pool as one [num_pages, 2, ...] tensor, not a (k, v) tuple
                         (utils._unpack_paged_kv_cache unbinds dim 1)
  mask    wide_window    an unbounded left side as window_left = max(sq, skv) instead of -1: every key stays
                         visible, but the kernel is the sliding-window one (use_sliding_window is window_left >= 0)
          custom_mask    prefill only: the band as a boolean custom_mask (single: [qo_len, kv_len]; batch wrappers:
                         the requests' masks flattened and concatenated), causal=False, window_left=-1
          packed_custom_mask  the same mask bit-packed little-endian, as packed_custom_mask (single prefill, and
                         batch wrappers of one request: their plan() offsets request n's packed mask by
                         sum(qo * kv) of the requests before it, which the kernel reads as a byte offset)
  scale   default_scale  sm_scale=None for a case with the default scale (FlashInfer takes 1/sqrt(head_dim))
  cap     softcap_zero   logits_soft_cap=0.0 for a case without softcap (the kernels cap only when it is > 0)
  lse     no_lse         return_lse=False (entry points the adapters ask for the LSE)
          return_lse     return_lse=True (single decode, which the adapters call without it)
  cores   tensor_cores   decode only: use_tensor_cores=True, the prefill kernels run on one query per sequence
Left out: use_fp16_qk_reduction (a deliberately less precise q·k, not the same arithmetic), pos_encoding_mode other
than "NONE" (RoPE changes q and k; ALIBI brings FlashInfer's own slopes), backend="auto" (another kernel, chosen by
the adapter's kernel_backend).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import torch

from attnfuzz.backends.flash.common import wide_bound
from attnfuzz.backends.layout import visibility_mask
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

MASKS = ("wide_window", "custom_mask", "packed_custom_mask")
PARTS = ("layout", "cache", "mask", "scale", "cap", "lse", "cores")


@dataclass(frozen=True)
class Spelling:
    """One FlashInfer spelling: each field is its part of the name, "" when the call keeps the adapters' default."""

    layout: str = ""
    cache: str = ""
    mask: str = ""
    scale: str = ""
    cap: str = ""
    lse: str = ""
    cores: str = ""

    @property
    def name(self) -> str:
        return "+".join(p for p in (getattr(self, part) for part in PARTS) if p)

    @property
    def kv_layout(self) -> str:
        return "HND" if self.layout else "NHD"

    @property
    def custom(self) -> bool:
        return self.mask in ("custom_mask", "packed_custom_mask")


@dataclass(frozen=True)
class EntryPoint:
    """What decides an entry point's spellings: one request, decode, paged cache, whether its default call asks for
    the LSE."""

    single: bool
    decode: bool
    paged: bool
    lse_by_default: bool


def spelling_names(entry: EntryPoint, case: Case) -> tuple[str, ...]:
    """The names of the entry point's spellings for the case, "" first."""
    return tuple(s.name for s in spellings(entry, case))


def parse(entry: EntryPoint, case: Case) -> Spelling | None:
    """case.spelling as a Spelling, None when the entry point has no such spelling for the case."""
    return next((s for s in spellings(entry, case) if s.name == case.spelling), None)


def spellings(entry: EntryPoint, case: Case) -> tuple[Spelling, ...]:
    return _listed(entry, case.paged, case.b == 1, case.left is None, case.scale is None, case.softcap is None)


@lru_cache(maxsize=256)
def _listed(entry: EntryPoint, paged: bool, one_request: bool, unbounded_left: bool, default_scale: bool,
            no_softcap: bool) -> tuple[Spelling, ...]:
    masks = ["", *(("wide_window",) if unbounded_left else ())]
    if not entry.decode:
        masks += ["custom_mask", *(("packed_custom_mask",) if entry.single or one_request else ())]
    groups = (("", "hnd") if entry.single or paged else ("",),
              ("", "kv_tensor") if paged else ("",),
              tuple(masks),
              ("", "default_scale") if default_scale else ("",),
              ("", "softcap_zero") if no_softcap else ("",),
              ("", "no_lse" if entry.lse_by_default else "return_lse"),
              ("", "tensor_cores") if entry.decode else ("",))
    return tuple(Spelling(*parts) for parts in itertools.product(*groups))


def kwargs(case: Case, spelling: Spelling, causal: bool, window_left: int, decode: bool) -> dict:
    """The keyword arguments every entry point shares, spelled: causal (prefill only), window_left, sm_scale,
    logits_soft_cap; `causal` and `window_left` are the case's band in FlashInfer's terms (common.band)."""
    if spelling.mask == "wide_window":
        window_left = wide_bound(case)
    if spelling.custom:
        causal, window_left = False, -1
    out = {"sm_scale": None if spelling.scale else case.softmax_scale, "window_left": window_left,
           "logits_soft_cap": 0.0 if spelling.cap else case.softcap}
    return out if decode else {"causal": causal, **out}


def mask_kwargs(case: Case, spelling: Spelling, t: Tensors, single: bool) -> dict:
    """custom_mask or packed_custom_mask for a custom-mask spelling ({} otherwise): the case's visibility per request,
    [qo_len, kv_len] for a single request, else the requests' masks flattened and concatenated."""
    if not spelling.custom:
        return {}
    mask = request_masks(case, t)
    if spelling.mask == "packed_custom_mask":
        return {"packed_custom_mask": packbits_little(mask.flatten())}
    return {"custom_mask": mask.reshape(case.lens_q[0], case.lens_kv[0]) if single else mask}


def request_masks(case: Case, t: Tensors) -> torch.Tensor:
    """bool, flat: request n's [lens_q[n], lens_kv[n]] visibility (True = seen), row-major, request after request."""
    keep = visibility_mask(case, t, t.q.device)[:, 0]
    return torch.cat([keep[n, :lq, :lk].flatten() for n, (lq, lk) in enumerate(zip(case.lens_q, case.lens_kv))])


def packbits_little(bits: torch.Tensor) -> torch.Tensor:
    """uint8 [ceil(n / 8)]: bit i of byte m is bits[8 m + i] (numpy.packbits with bitorder="little"), zero-padded."""
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[:bits.numel()] = bits.to(torch.uint8)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=bits.device)
    return (padded.view(-1, 8) * weights).sum(-1).to(torch.uint8)


def paged_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, spelling: Spelling):
    """The paged_kv_cache argument: (k, v) pages, or one tensor with k and v stacked on dim 1 (kv_tensor)."""
    return torch.stack([k_cache, v_cache], dim=1) if spelling.cache else (k_cache, v_cache)
