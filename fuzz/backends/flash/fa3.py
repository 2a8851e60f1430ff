"""flash-attn 3 (hopper/, module `flash_attn_interface`), unverified on hardware.

Written against the documented API of the hopper interface: flash_attn_func(q, k, v, softmax_scale, causal, ...,
window_size=(-1, -1), softcap, ..., return_attn_probs) and flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, ...). Bands are bottom-right aligned and -1 means an unbounded side, as in FA2; head dims
are multiples of 8 up to 256, and d_v may differ from d_qk only in the combinations the C++ API checks (Hopper).
No ALiBi, no sinks. A build records its FLASH_ATTENTION_DISABLE_* switches in the module `flash_attn_config`
(hopper/setup.py's create_build_config_file); the head-dim pairs a build left out are refused, since the C++ API
would run them through a kernel of another V head dim. FP8 inputs go to fa3-fp8 (flash/fa3_fp8.py). No run of this
adapter has been graded on a GPU yet.
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata

from attnfuzz.backends.flash import common as fc
from attnfuzz.backends.flash.fa2_fa3 import NegativeUnboundedBand
from attnfuzz.strategies.case import Case
from attnfuzz.strategies.materialize import Tensors

LIBRARY = "flash-attn 3"
MODULE = "flash_attn_interface"
DISTRIBUTIONS = ("flash_attn_3", "flash-attn-3")
DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8
MIN_ARCH = 80
CONFIG_MODULE = "flash_attn_config"


@functools.lru_cache(maxsize=1)
def build_flags() -> dict:
    """The installed build's switches ({"FLASHATTENTION_DISABLE_FP8": True, ...}); {} where none is recorded."""
    try:
        return dict(importlib.import_module(CONFIG_MODULE).CONFIG.get("build_flags", {}))
    except (ImportError, AttributeError):
        return {}


def _mixed_head_dims_ok(d_qk: int, d_v: int) -> bool:
    """The d_qk != d_v combinations FA3 accepts: q/k in (128, 192] with v in (96, 128], or q/k <= 64 with v <= 512."""
    return (128 < d_qk <= 192 and 96 < d_v <= 128) or (d_qk <= 64 and d_v <= 512)


def capability_refusals(case: Case) -> list[tuple[bool, str]]:
    """FA3's capability table: (refused, reason) rows, first match wins."""
    _, band_reason = fc.bottom_right_band(case)
    dims = (case.d_qk, case.d_v)
    left_out = build_flags()
    return [
        (case.dtype not in DTYPES, f"dtype {case.dtype}: FA3 takes {' / '.join(DTYPES)}"),
        (case.d_qk > MAX_HEAD_DIM, f"d_qk={case.d_qk} > {MAX_HEAD_DIM}"),
        (any(d % HEAD_DIM_MULTIPLE for d in dims), f"head dims {dims}: FA3 needs multiples of {HEAD_DIM_MULTIPLE}"),
        (case.d_qk != case.d_v and not _mixed_head_dims_ok(*dims),
         f"d_qk={case.d_qk}, d_v={case.d_v}: FA3 takes d_v != d_qk only for q/k in (128, 192] with v in (96, 128], "
         f"or q/k <= 64 with v <= 512"),
        (case.d_qk <= 64 < case.d_v and left_out.get("FLASH_ATTENTION_DISABLE_HDIMDIFF64", False),
         f"d_qk={case.d_qk}, d_v={case.d_v}: this FA3 build has no (64, 256) / (64, 512) kernels "
         f"(FLASH_ATTENTION_DISABLE_HDIMDIFF64)"),
        (128 < case.d_qk <= 192 and case.d_v <= 128 and left_out.get("FLASH_ATTENTION_DISABLE_HDIMDIFF192", False),
         f"d_qk={case.d_qk}, d_v={case.d_v}: this FA3 build has no (192, 128) kernels "
         f"(FLASH_ATTENTION_DISABLE_HDIMDIFF192)"),
        (case.mask_density is not None, "explicit boolean mask: FA3 takes no mask tensor"),
        (case.softmax != "vanilla", f"softmax={case.softmax}: FA3 has no attention sink"),
        (case.alibi_slopes is not None, "ALiBi: FA3 has no alibi_slopes"),
        (band_reason is not None, band_reason or ""),
    ]


class FlashAttn3(NegativeUnboundedBand):
    name = "fa3"
    family = "fa3"

    library, api, min_arch = LIBRARY, MODULE, MIN_ARCH
    build_hint, arch_hint = "it builds from source (hopper/)", " (Hopper for its full feature set)"

    def refusals(self, case: Case) -> list[tuple[bool, str]]:
        return [(case.fp8 is not None, f"fp8={case.fp8!r}: FP8 inputs go to fa3-fp8 (flash/fa3_fp8.py)"),
                *capability_refusals(case)]

    def call_kwargs(self, case: Case, t: Tensors) -> dict:
        """The keyword arguments of the FA3 call for this case and spelling (shared by run() and the tests)."""
        causal, window = self.causal_window(case)
        return {"softmax_scale": case.scale, "causal": causal, "window_size": window,
                "softcap": case.softcap or 0.0, "deterministic": False, "return_attn_probs": True}

    def version(self) -> str:
        for dist in DISTRIBUTIONS:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        try:
            return str(getattr(importlib.import_module(MODULE), "__version__", "unknown"))
        except ImportError:
            return ""


BACKENDS = {"fa3": FlashAttn3}
