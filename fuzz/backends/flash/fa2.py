"""flash-attn 2 (`flash_attn.flash_attn_func` / `flash_attn_varlen_func`, v2.7+ API).

Written against the documented API of flash-attn 2.8 (flash_attn/flash_attn_interface.py): causal and windows are
bottom-right aligned, -1 means an unbounded side, ALiBi adds -slope * |i + skv - sq - j|, LSE comes back with
return_attn_probs=True as [b, h, sq] (batched) or [h, total_q] (varlen). Run on an H200 with 2.8.3.post2 built for
sm90 (docs/backends.md); under causal masking its LSE with ALiBi departs from that bias (corpus: fa2-FAIL-LSE-*).
"""

from __future__ import annotations

import importlib

from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.flash.fa2_fa3 import NegativeUnboundedBand
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

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


class FlashAttn2(NegativeUnboundedBand):
    name = "fa2"
    family = "fa2"

    library, api, min_arch = LIBRARY, f"{MODULE}.flash_attn_interface", MIN_ARCH
    build_hint = "it builds from source against CUDA"
    packings = fc.PACKINGS

    def _module(self):
        return importlib.import_module(MODULE)

    def refusals(self, case: Case) -> list[tuple[bool, str]]:
        return capability_refusals(case)

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        """The keyword arguments of the FA2 call for this case and spelling (shared by run() and the tests)."""
        causal, window = self.causal_window(case)
        return {"dropout_p": 0.0, "softmax_scale": case.scale, "causal": causal, "window_size": window,
                "softcap": case.softcap or 0.0, "alibi_slopes": t.alibi, "deterministic": False,
                "return_attn_probs": True}

    def version(self) -> str:
        try:
            return str(getattr(self._module(), "__version__", "unknown"))
        except ImportError:
            return ""


BACKENDS = {"fa2": FlashAttn2}
