"""flash-attn 2 (`flash_attn.flash_attn_func` / `flash_attn_varlen_func`, v2.7+ API), unverified on hardware.

Written against the documented API of flash-attn 2.8 (flash_attn/flash_attn_interface.py): causal and windows are
bottom-right aligned, -1 means an unbounded side, ALiBi adds -slope * |i + skv - sq - j|, LSE comes back with
return_attn_probs=True as [b, h, sq] (batched) or [h, total_q] (varlen). No run of this adapter has been graded on a
GPU yet: the GPU runner has no FA2 build.
"""

from __future__ import annotations

import importlib

from fuzz.backends import flash_common as fc
from fuzz.backends.base import Unsupported
from oracles.verdict import Output
from strategies.case import Case
from strategies.materialize import Tensors

LIBRARY = "flash-attn 2"
MODULE = "flash_attn"
DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 256
MIN_ARCH = 80


def capability_refusals(case: Case) -> list[tuple[bool, str]]:
    """FA2's capability table: (refused, reason) rows, first match wins."""
    _, band_reason = fc.bottom_right_band(case)
    return [
        (case.dtype not in DTYPES, f"dtype {case.dtype}: FA2 takes {' / '.join(DTYPES)}"),
        (case.d_qk != case.d_v, f"d_qk={case.d_qk} != d_v={case.d_v}: FA2 needs one head dim for q, k and v"),
        (case.d_qk > MAX_HEAD_DIM, f"head dim {case.d_qk} > {MAX_HEAD_DIM}"),
        (case.mask_density is not None, "explicit boolean mask: FA2 takes no mask tensor"),
        (case.softmax != "vanilla", f"softmax={case.softmax}: FA2 has no attention sink"),
        (band_reason is not None, band_reason or ""),
        (fc.alibi_reason(case) is not None, fc.alibi_reason(case) or ""),
    ]


class FlashAttn2(fc.NegativeUnboundedBand):
    name = "fa2"
    family = "fa2"

    def __init__(self, device: str = "cuda") -> None:
        self.device = device

    def _module(self):
        return importlib.import_module(MODULE)

    def available(self) -> str | None:
        try:
            importlib.import_module(f"{MODULE}.flash_attn_interface")
        except ImportError as e:
            return f"{LIBRARY} is not installed or does not load ({e}); it builds from source against CUDA"
        arch = fc.cuda_arch(self.device)
        if arch is None:
            return f"{LIBRARY} needs a CUDA device (device={self.device!r})"
        if arch < MIN_ARCH:
            return f"{LIBRARY} needs sm{MIN_ARCH}+, this GPU is sm{arch}"
        return None

    def refusals(self, case: Case) -> list[tuple[bool, str]]:
        return capability_refusals(case)

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        """The keyword arguments of the FA2 call for this case and spelling (shared by run() and the tests)."""
        band, reason = fc.bottom_right_band(case)
        if band is None:
            raise Unsupported(reason)
        causal, window = fc.spelled_mask(band, case.spelling, case, unbounded=-1)
        return {"dropout_p": 0.0, "softmax_scale": case.scale, "causal": causal, "window_size": window,
                "softcap": case.softcap or 0.0, "alibi_slopes": t.alibi, "deterministic": False,
                "return_attn_probs": True}

    def run(self, case: Case, tensors: Tensors) -> Output:
        reason = self.unsupported(case)
        if reason:
            raise Unsupported(reason)
        api = importlib.import_module(f"{MODULE}.flash_attn_interface")
        kwargs = self.call_kwargs(case, tensors)
        packed = case.layout == "thd" or case.padded
        x = fc.flash_inputs(case, tensors, packed=packed)
        try:
            if packed:
                fn = "flash_attn_varlen_func"
                result = api.flash_attn_varlen_func(x.q, x.k, x.v, x.cu_q, x.cu_k, case.sq, case.skv, **kwargs)
            else:
                fn = "flash_attn_func"
                result = api.flash_attn_func(x.q, x.k, x.v, **kwargs)
        except Exception as e:  # the library's own input checks are refusals; anything else is a crash
            refused = fc.refusal(e, LIBRARY)
            if refused is None:
                raise
            raise refused from e
        out = fc.logical_out(case, x, result[0])
        dq, dk, dv = fc.gradients(case, x, out, tensors)
        ran = f"{fn}(causal={kwargs['causal']}, window_size={kwargs['window_size']})"
        return Output(out=out.detach(), lse=fc.logical_lse(case, x, result[1]), dq=dq, dk=dk, dv=dv, ran=ran)

    def version(self) -> str:
        try:
            return str(getattr(self._module(), "__version__", "unknown"))
        except ImportError:
            return ""


BACKENDS = {"fa2": FlashAttn2}
