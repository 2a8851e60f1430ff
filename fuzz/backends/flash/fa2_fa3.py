"""What FA2 and FA3 share: flash_attn_func / flash_attn_varlen_func with bottom-right bands and unbounded spelled -1,
and the repro writer for that call."""

from __future__ import annotations

import importlib

from attnfuzz.backends.base import Backend, Unsupported, first_reason
from attnfuzz.backends.flash.common import (BATCHED, VARLEN, bottom_right_band, cuda_arch, flash_inputs, gradients,
                                            logical_lse, logical_out, mask_spellings, refusal, spelled_mask,
                                            spelling_refusal)
from attnfuzz.backends.flash.repro import flash_source
from attnfuzz.oracles.verdict import Output
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors


class NegativeUnboundedBand(Backend):
    """What FA2 and FA3 share: bottom-right bands, unbounded spelled -1 (so no negative-bound spellings), the same
    flash_attn_func / flash_attn_varlen_func call. A subclass names its library and API module, gives its capability
    table as `refusals(case)` and its keyword arguments as `call_kwargs(case, tensors)`."""

    library = ""             # for messages, e.g. "flash-attn 2"
    api = ""                 # the module holding flash_attn_func and flash_attn_varlen_func
    min_arch = 80
    build_hint = ""          # how the library is installed, said when it is not
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
        return spelled_mask(band, case.spelling, case, unbounded=-1)

    def unsupported(self, case: Case) -> str | None:
        return first_reason(*self.refusals(case), spelling_refusal(self.name, case, self.spellings(case)))

    def spellings(self, case: Case) -> tuple[str, ...]:
        band, _ = bottom_right_band(case)
        return mask_spellings(band, with_negative=False) if band is not None else ("",)

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
        try:
            if fn == VARLEN:
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
        ran = f"{fn}(causal={kwargs['causal']}, window_size={kwargs['window_size']})"
        return Output(out=out.detach(), lse=logical_lse(case, x, lse), dq=dq, dk=dk, dv=dv, ran=ran)
