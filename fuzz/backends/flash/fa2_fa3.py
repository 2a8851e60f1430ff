"""What FA2 and FA3 share: flash_attn_func / flash_attn_varlen_func with bottom-right bands and unbounded spelled -1,
and the repro writer for that call.

An adapter may also list `packings`: the API's packed entry points, each a spelling part after the mask's
("causal+kvpacked"): "kvpacked" hands k and v over stacked as kv [..., 2, hk, d] (flash_attn_kvpacked_func,
flash_attn_varlen_kvpacked_func), "qkvpacked" q, k and v as qkv [..., 3, h, d] (flash_attn_qkvpacked_func,
flash_attn_varlen_qkvpacked_func: one length and one head count for all three). The stacked tensor is what a fused
projection hands over; the kernel reads q, k and v as strided views of it."""

from __future__ import annotations

import importlib

import torch

from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.flash.common import (BATCHED, VARLEN, bottom_right_band, cuda_arch, flash_inputs, gradients,
                                            logical_lse, logical_out, mask_spellings, packed_name, refusal,
                                            spelled_mask, spelling_refusal, split_packing)
from attnfuzz.backends.flash.repro import flash_source
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


def packed_call(api, fn: str, packing: str, x, case: Case, kwargs: dict):
    """The packed entry point's call on FlashInputs x (batched or varlen), autograd flowing into x's leaves."""
    if packing == "kvpacked":
        kv = torch.stack([x.k, x.v], dim=-3)
        if fn == VARLEN:
            return api.flash_attn_varlen_kvpacked_func(x.q, kv, x.cu_q, x.cu_k, case.sq, case.skv, **kwargs)
        return api.flash_attn_kvpacked_func(x.q, kv, **kwargs)
    qkv = torch.stack([x.q, x.k, x.v], dim=-3)
    if fn == VARLEN:
        return api.flash_attn_varlen_qkvpacked_func(qkv, x.cu_q, case.sq, **kwargs)
    return api.flash_attn_qkvpacked_func(qkv, **kwargs)


class NegativeUnboundedBand(Backend):
    """What FA2 and FA3 share: bottom-right bands, unbounded spelled -1 (so no negative-bound spellings), the same
    flash_attn_func / flash_attn_varlen_func call. A subclass names its library and API module, gives its capability
    table as `refusals(case)` and its keyword arguments as `call_kwargs(case, tensors)`."""

    library = ""             # for messages, e.g. "flash-attn 2"
    api = ""                 # the module holding flash_attn_func and flash_attn_varlen_func
    min_arch = 80
    build_hint = ""          # how the library is installed, said when it is not
    packings: tuple[str, ...] = ()   # the packed entry points it has (common.PACKINGS)
    arch_hint = ""           # said after the minimum architecture

    def __init__(self, device: str = "cuda") -> None:
        self.device = device

    @property
    def library_module(self) -> str:
        return self.api

    def load(self) -> str | None:
        try:
            importlib.import_module(self.api)
        except ImportError as e:
            return f"{self.library} is not installed or does not load ({e}); {self.build_hint}"
        return None

    def available(self) -> str | None:
        missing = self.load()
        if missing is not None:
            return missing
        arch = cuda_arch(self.device)
        if arch is None:
            return f"{self.library} needs a CUDA device (device={self.device!r})"
        if arch < self.min_arch:
            return f"{self.library} needs sm{self.min_arch}+{self.arch_hint}, this GPU is sm{arch}"
        return None

    def refusals(self, case: Case) -> list[tuple[bool, str]]:
        raise NotImplementedError

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        raise NotImplementedError

    def causal_window(self, case: Case) -> tuple:
        """(causal, window_size) of the call for the case's band and spelling, unbounded spelled -1."""
        band, reason = bottom_right_band(case)
        if band is None:
            raise Unsupported(reason)
        return spelled_mask(band, split_packing(case.spelling)[0], case, unbounded=-1)

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*self.refusals(case), spelling_refusal(self.name, case, self.spellings(case)))

    def spellings(self, case: Case) -> tuple[str, ...]:
        band, _ = bottom_right_band(case)
        masks = mask_spellings(band, with_negative=False) if band is not None else ("",)
        packings = [p for p in self.packings if p != "qkvpacked" or (
            case.h == case.hk and case.lens_q == case.lens_kv and (case.sq == case.skv or case.layout == "thd"))]
        return tuple(masks) + tuple("+".join(p for p in (m, k) if p) for k in packings for m in masks)

    def route(self, case: Case) -> str:
        """Which call takes the case: VARLEN (packed through cu_seqlens: thd, or padding) or BATCHED."""
        return VARLEN if case.layout == "thd" or case.padded else BATCHED

    def repro_source(self, case: Case) -> str | None:
        """Source of `attention(q, k, v)` making run()'s call, for standalone repro scripts (fuzz/store/repro.py); None
        for a case the adapter cannot spell."""
        return flash_source(self, case, module=self.api, library=self.library, positional_varlen=True)

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        api = importlib.import_module(self.api)
        kwargs = self.call_kwargs(case, tensors)
        fn = self.route(case)
        x = flash_inputs(case, tensors, packed=fn == VARLEN)
        packing = split_packing(case.spelling)[1]
        try:
            if packing:
                result = packed_call(api, fn, packing, x, case, kwargs)
            elif fn == VARLEN:
                result = api.flash_attn_varlen_func(x.q, x.k, x.v, x.cu_q, x.cu_k, case.sq, case.skv, **kwargs)
            else:
                result = api.flash_attn_func(x.q, x.k, x.v, **kwargs)
        except Exception as e:  # the library's own input checks are refusals; anything else is a crash
            refused = refusal(e, self.library)
            if refused is None:
                raise
            raise refused from e
        out, lse = (result[0], result[1]) if isinstance(result, (tuple, list)) else (result, None)
        out = logical_out(case, x, out)
        dq, dk, dv = gradients(case, x, out, tensors)
        ran = f"{packed_name(fn, packing)}(causal={kwargs['causal']}, window_size={kwargs['window_size']})"
        return Output(out=out.detach(), lse=logical_lse(case, x, lse), dq=dq, dk=dk, dv=dv, ran=ran)
